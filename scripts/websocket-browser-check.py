#!/usr/bin/env python3
"""A WebSocket from a real browser through Portico, against `portico demo` (issue #35).

Starts the demo on free ports, opens a page in headless Chromium (Debian's /usr/bin/chromium,
driven by Playwright from PyPI, as scripts/dashboard-check.py does) and from it a WebSocket to
the demo's echo route (ws://127.0.0.1:PORT/ws/echo, through Portico to the demo upstream); sends
two messages, a text and a binary one, and expects both back, then closes with 1000.
Exits 0 and prints "websocket-browser: ok" when that holds; otherwise prints what did not and exits 1.

    scripts/websocket-browser-check.py [--portico .build/debug/portico] [--chromium /usr/bin/chromium]
"""
import sys

from playwright.sync_api import sync_playwright

import demo_process


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
    args = demo_process.arguments()
    with demo_process.running(args.portico) as demo:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=args.chromium, args=["--no-sandbox"])
            page = browser.new_page()
            page.goto(f"http://127.0.0.1:{demo.proxy}/ping")
            result = page.evaluate(ECHO, f"ws://127.0.0.1:{demo.proxy}/ws/echo")
            browser.close()
        expected = ["hello from chromium", "0,1,254,255"]
        if result["got"] != expected or result["code"] != 1000:
            print(f"websocket-browser: got {result}, expected {expected} and close 1000")
            print(demo.log()[-3000:])
            sys.exit(1)
    print("websocket-browser: ok")


if __name__ == "__main__":
    main()
