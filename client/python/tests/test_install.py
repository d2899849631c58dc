"""`cmake --install` puts the package beside the C library, and it imports and works from there
with nothing else set."""
import os
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

import pytest


def test_installed_package(daemon):
    build = os.environ.get("GPUCD_BUILD_DIR")
    if not build:
        pytest.skip("GPUCD_BUILD_DIR (the build folder to install from) is not set; ctest sets it")
    # A folder of its own (pytest's tmp_path waits on locks other pytest runs on the machine hold)
    with tempfile.TemporaryDirectory(prefix="gpucd-pytest-install-") as tmp:
        _install_and_import(daemon, build, Path(tmp))


def _install_and_import(daemon, build, tmp_path):
    prefix = tmp_path / "prefix"
    subprocess.run(["cmake", "--install", build, "--prefix", str(prefix), "--component", "client"],
                   check=True, capture_output=True)
    version = sysconfig.get_python_version()
    site = prefix / "lib" / f"python{version}" / "dist-packages"
    assert (site / "gpucd" / "__init__.py").is_file() and (site / "gpucd" / "_libpath.py").is_file()
    env = {k: v for k, v in os.environ.items() if k not in ("GPUCD_LIBRARY", "PYTHONPATH")}
    env["PYTHONPATH"] = str(site)
    code = ("import gpucd, numpy as np\n"
            "print(gpucd.__file__, gpucd._ffi._library_path())\n"
            f"with gpucd.Client({daemon.url!r}) as c:\n"
            "    c.ping()\n"
            "    print(c.embedding_forward(np.array([1], np.int32),\n"
            "                              np.eye(2, dtype=np.float32)))\n")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    installed, library = out.stdout.split("\n")[0].split()
    assert installed.startswith(str(site))
    assert os.path.realpath(library).startswith(str(prefix)) and os.path.exists(library)
    assert "[[0. 1.]]" in out.stdout
