#!/usr/bin/env python3
"""A WebSocket from a real browser through Portico, against `portico demo` (issue #35).

Starts the demo on free ports, opens a page in headless Chromium (Debian's /usr/bin/chromium,
driven by Playwright from PyPI, as scripts/dashboard-check.py does) and from it a WebSocket to
the demo's echo route (ws://127.0.0.1:PORT/ws/echo, through Portico to the demo upstream); sends
two messages, a text and a binary one, and expects both back, then closes with 1000.
Exits 0 and prints "websocket-browser: ok" when that holds; otherwise prints what did not and exits 1.

    scripts/websocket-browser-check.py [--portico .build/debug/portico] [--chromium /usr/bin/chromium]
"""
import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

from playwright.sync_api import sync_playwright


def wait_for(what, predicate, timeout=60.0, interval=0.25):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def start_demo(portico, log_path):
    log = open(log_path, "w")
    process = subprocess.Popen([portico, "demo", "--port", "0", "--admin-port", "0"], stdout=log, stderr=subprocess.STDOUT)

    def port():
        text = open(log_path).read()
        if process.poll() is not None:
            raise AssertionError(f"portico demo exited with {process.returncode}:\n{text}")
        found = re.search(r"msg=listening .*?port=(\d+)", text)
        return found and int(found[1])

    return process, wait_for("portico demo to listen", port)


ECHO = """
async (url) => await new Promise((resolve, reject) => {
    const ws = new WebSocket(url);
    ws.binaryType = "arraybuffer";
    const got = [];
    const timer = setTimeout(() => reject(new Error("timed out with " + JSON.stringify(got))), 30000);
    ws.onopen = () => { ws.send("hello from chromium"); ws.send(new Uint8Array([0, 1, 254, 255])); };
    ws.onmessage = (event) => {
        got.push(typeof event.data === "string" ? event.data : Array.from(new Uint8Array(event.data)).join(","));
        if (got.length === 2) ws.close(1000, "done");
    };
    ws.onclose = (event) => { clearTimeout(timer); resolve({got, code: event.code}); };
    ws.onerror = () => { clearTimeout(timer); reject(new Error("websocket error")); };
})
"""


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--portico", default=".build/debug/portico")
    parser.add_argument("--chromium", default="/usr/bin/chromium")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        log_path = os.path.join(directory, "demo.log")
        demo, port = start_demo(args.portico, log_path)
        try:
            with sync_playwright() as playwright:
                browser = playwright.chromium.launch(executable_path=args.chromium, args=["--no-sandbox"])
                page = browser.new_page()
                page.goto(f"http://127.0.0.1:{port}/ping")
                result = page.evaluate(ECHO, f"ws://127.0.0.1:{port}/ws/echo")
                browser.close()
            expected = ["hello from chromium", "0,1,254,255"]
            if result["got"] != expected or result["code"] != 1000:
                print(f"websocket-browser: got {result}, expected {expected} and close 1000")
                print(open(log_path).read()[-3000:])
                sys.exit(1)
        finally:
            demo.send_signal(signal.SIGTERM)
            try:
                demo.wait(timeout=30)
            except subprocess.TimeoutExpired:
                demo.kill()
    print("websocket-browser: ok")


if __name__ == "__main__":
    main()
