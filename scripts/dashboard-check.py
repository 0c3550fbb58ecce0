#!/usr/bin/env python3
"""The admin dashboard in a real browser, against `portico demo`.

Starts the demo on free ports, opens http://127.0.0.1:ADMIN/ in headless Chromium (Debian's
/usr/bin/chromium, driven by Playwright from PyPI; no browser is downloaded) and checks that
  1. the page loads with no console error,
  2. it lists the demo's routes,
  3. its numbers change after traffic is sent,
  4. a stopped identity provider shows as failing on the credentials panel,
  5. a stopped demo upstream shows as ejected on the endpoints panel,
  6. the limits panel (from /limits) lists the demo's rate limit with who waits now, and says
     there is no provider limit and no quota (the demo configures neither).
Exits 0 when all hold; otherwise prints what did not and exits 1.

    scripts/dashboard-check.py [--portico .build/debug/portico] [--chromium /usr/bin/chromium]
"""
import sys
import urllib.error
import urllib.request

from playwright.sync_api import sync_playwright

import demo_process
from demo_process import wait_for

DEMO_ROUTES = ["ping", "limited", "paced", "orders", "echo", "reports", "catalog", "flaky", "events", "fast", "pair", "spare", "websocket"]


def request(url, method="GET"):
    """The status of one request (errors included)."""
    try:
        with urllib.request.urlopen(urllib.request.Request(url, method=method, data=b"" if method == "POST" else None), timeout=10) as response:
            response.read()
            return response.status
    except urllib.error.HTTPError as error:
        return error.code


def main():
    args = demo_process.arguments()

    with demo_process.running(args.portico) as demo:
        check(args.chromium, f"http://127.0.0.1:{demo.proxy}", f"http://127.0.0.1:{demo.admin}", f"http://127.0.0.1:{demo.upstream}")
    print("dashboard: ok")


def check(chromium, proxy, admin, upstream):
    problems = []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        page = browser.new_page()
        page.on("console", lambda message: message.type == "error" and problems.append(f"console error: {message.text}"))
        page.on("pageerror", lambda error: problems.append(f"page error: {error}"))
        page.goto(admin + "/")

        # 2. The demo's routes are listed.
        rows = page.locator("#routes tbody tr")
        wait_for("the routes table", lambda: rows.count() == len(DEMO_ROUTES))
        names = [rows.nth(i).locator("td").first.inner_text() for i in range(rows.count())]
        assert names == DEMO_ROUTES, f"routes listed: {names}"

        # 3. Numbers change after traffic: the ping route's total rate, and the cache's hit counter.
        def ping_rate():
            return page.locator("#routes tbody tr", has_text="ping").first.locator("td").nth(3).inner_text()
        before = ping_rate()
        for _ in range(30):
            assert request(proxy + "/ping") == 200
        for _ in range(3):
            assert request(proxy + "/catalog") == 200
        wait_for(f"the ping rate to change from {before}", lambda: ping_rate() != before)
        wait_for("the cache's hits", lambda: page.locator("#caches tbody tr", has_text="cache").count() == 1
                 and page.locator("#caches tbody tr td").nth(2).inner_text() not in ("0", ""))
        wait_for("a chart for the ping route", lambda: page.locator("#routes tbody tr", has_text="ping").first.locator("svg polyline").count() > 0)

        # 4. A stopped IdP shows as failing on the credentials panel.
        assert request(upstream + "/demo/idp/down", method="POST") == 200
        assert request(proxy + "/secure/report") == 503
        credential = page.locator("#credentials tbody tr", has_text="demo-idp")
        wait_for("demo-idp to show as failing", lambda: "failing" in credential.inner_text())
        assert "token endpoint unreachable" in credential.inner_text(), credential.inner_text()

        # 5. A stopped demo upstream (the failover pair's spare) shows as ejected on the endpoints panel.
        assert request(proxy + "/spare/demo/down", method="POST") == 200
        for _ in range(8):
            assert request(proxy + "/pair/orders") == 200
        ejected = page.locator("#endpoints tbody tr", has_text="orders-pair").filter(has_text="ejected")
        wait_for("the stopped spare to show as ejected", lambda: ejected.count() == 1)
        assert "gateway_status" in ejected.inner_text(), ejected.inner_text()
        assert request(proxy + "/spare/demo/up", method="POST") == 200

        # 6. The limits panel: the demo's rate limit, nobody waiting (it refuses, it does not wait).
        limit = page.locator("#limit-rates tbody tr", has_text="limit")
        wait_for("the demo's rate limit on the limits panel", lambda: limit.count() == 1)
        cells = [limit.locator("td").nth(i).inner_text() for i in range(6)]
        assert cells[0] == "limit" and cells[3] == "429" and cells[4] == "0" and cells[5] == "local", f"rate limit row: {cells}"
        assert "no provider limits" in page.locator("#limit-providers").inner_text()
        assert "no quota" in page.locator("#limit-quotas").inner_text()

        # 1. No console error at any point.
        browser.close()
    if problems:
        raise AssertionError("\n".join(problems))


if __name__ == "__main__":
    try:
        main()
    except AssertionError as error:
        print(f"dashboard: FAILED: {error}", file=sys.stderr)
        sys.exit(1)
