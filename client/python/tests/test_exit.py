"""A process that exits without closing its client, after calls from several threads, exits
cleanly: the library stays mapped under nng's threads until the process ends (before, about one
exit in four crashed when cffi unloaded it)."""
import subprocess
import sys

SCRIPT = """
import sys, threading, time
import gpucd
c = gpucd.Client(sys.argv[1])
def loop():
    end = time.monotonic() + 0.2
    while time.monotonic() < end:
        c.ping()
loop()
t = threading.Thread(target=loop)
t.start()
t.join()
"""


def test_exit_without_close(daemon):
    codes = [subprocess.run([sys.executable, "-c", SCRIPT, daemon.url]).returncode
             for _ in range(16)]
    assert codes == [0] * 16
