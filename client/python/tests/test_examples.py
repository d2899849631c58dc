"""The examples run and check themselves (exit status 0) against the test daemon."""
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLES = os.path.join(os.path.dirname(HERE), "examples")


def _run(daemon, name, *args):
    env = dict(os.environ, GPUCD_URL=daemon.url)
    out = subprocess.run([sys.executable, os.path.join(EXAMPLES, name), *args], env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


def test_train_loss(daemon):
    out = _run(daemon, "train_loss.py", "--steps", "40")
    assert out.count(" ok") == 2 and "MISMATCH" not in out


def test_vec_env(daemon):
    out = _run(daemon, "vec_env.py", "--workers", "2", "--batch", "8", "--steps", "5",
               "--hidden", "32")
    assert "2 workers x 8 environments, 5 steps each" in out and "p99" in out
