"""A gpucd daemon of the tests' own: a temporary folder, an ipc:// and a tcp:// loopback listener,
the backend asked for (cpu unless $GPUCD_TEST_BACKEND), its log in the folder.  The same way as
tests/integration/harness.c starts its daemons."""
import ctypes
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time

import gpucd

PR_SET_PDEATHSIG = 1


def _die_with_parent():
    # A test process that dies must not leave its daemon behind.
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def _free_tcp_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Daemon:
    def __init__(self, *extra, backend=None, folder=None):
        self.exe = os.environ.get("GPUCD_DAEMON")
        if not self.exe:
            raise RuntimeError("GPUCD_DAEMON must name the gpucd daemon to test against "
                               "(ctest sets it)")
        self.backend = backend or os.environ.get("GPUCD_TEST_BACKEND", "cpu")
        self.extra = list(extra)
        self.dir = folder or tempfile.mkdtemp(prefix="gpucd-pytest-", dir="/tmp")
        self.url = f"ipc://{self.dir}/gpucd.sock"
        self.tcp_url = f"tcp://127.0.0.1:{_free_tcp_port()}"
        self.log_path = os.path.join(self.dir, "gpucd.log")
        self.proc = None

    def start(self, wait_s=60):
        """Starts the daemon and pings it until it answers."""
        argv = [self.exe, "--listen", self.url, "--listen", self.tcp_url, "--stats-listen",
                "none", "--log-level", "debug", "--backend", self.backend, *self.extra]
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                     preexec_fn=_die_with_parent)
        log.close()
        deadline = time.monotonic() + wait_s
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the daemon exited during start ({self.proc.returncode}):\n"
                                   + self.log())
            try:
                with gpucd.Client(self.url, timeout=1.0) as c:
                    c.ping()
                with gpucd.Client(self.tcp_url, timeout=1.0) as c:
                    c.ping()
                return self
            except gpucd.Error:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the daemon did not answer within {wait_s} s:\n"
                                       + self.log()) from None
                time.sleep(0.01)

    def log(self):
        try:
            with open(self.log_path, errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def stop(self, timeout_s=20):
        """SIGTERM; the exit status (a kill after timeout_s is -1000)."""
        if self.proc is None:
            return None
        self.proc.send_signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            rc = -1000
        self.proc = None
        return rc

    def kill(self):
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None

    def remove(self):
        self.kill()
        shutil.rmtree(self.dir, ignore_errors=True)
