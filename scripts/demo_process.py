"""`portico demo` for the browser checks (scripts/dashboard-check.py, scripts/websocket-browser-check.py):
started on ports the kernel chooses (read from its log), stopped with SIGTERM on the way out."""
import argparse
import contextlib
import os
import re
import signal
import subprocess
import tempfile
import time


def arguments():
    """The browser checks' command line: `[--portico .build/debug/portico] [--chromium /usr/bin/chromium]`."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--portico", default=".build/debug/portico")
    parser.add_argument("--chromium", default="/usr/bin/chromium")
    return parser.parse_args()


def wait_for(what, predicate, timeout=30.0, interval=0.25):
    """Polls `predicate` until it returns something true, and returns that; AssertionError after `timeout` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


class Demo:
    """A running `portico demo`: the proxy's, the admin listener's and the demo upstream's ports, and its log."""

    def __init__(self, log_path, proxy, admin, upstream):
        self.log_path = log_path
        self.proxy, self.admin, self.upstream = proxy, admin, upstream

    def log(self):
        with open(self.log_path) as log:
            return log.read()


@contextlib.contextmanager
def running(portico):
    """`portico demo --port 0 --admin-port 0` once it listens, its log in a temporary directory; on the
    way out SIGTERM, and SIGKILL if it has not exited 30 s later."""
    with tempfile.TemporaryDirectory() as directory:
        log_path = os.path.join(directory, "demo.log")
        with open(log_path, "w") as log:
            process = subprocess.Popen([portico, "demo", "--port", "0", "--admin-port", "0"], stdout=log, stderr=subprocess.STDOUT)
        try:
            def ports():
                with open(log_path) as log:
                    text = log.read()
                if process.poll() is not None:
                    raise AssertionError(f"portico demo exited with {process.returncode}:\n{text}")
                proxy = re.search(r"msg=listening .*?port=(\d+)", text)
                admin = re.search(r'msg="admin listening" .*?port=(\d+)', text)
                upstream = re.search(r"demo upstream on 127\.0\.0\.1:(\d+)", text)
                return proxy and admin and upstream and (int(proxy[1]), int(admin[1]), int(upstream[1]))

            yield Demo(log_path, *wait_for("portico demo to listen", ports, timeout=60))
        finally:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
