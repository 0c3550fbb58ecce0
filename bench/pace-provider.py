#!/usr/bin/env python3
"""A rate-limited provider stand-in for bench/pace.

    pace-provider.py --port N [--rate 20] [--headers ratelimit|x-ratelimit|retry-after]

Allows --rate requests per fixed one-second window (aligned on the wall clock) per X-API-Key;
beyond, 429 with Retry-After (whole seconds until the window's end, at least 1). Every answer
publishes the remaining budget, as structured-field `RateLimit`/`RateLimit-Policy` (ratelimit)
or `X-RateLimit-Limit/-Remaining/-Reset` with a Unix reset time (x-ratelimit), or not at all
(retry-after: only the 429's Retry-After). Every answer it gives carries `X-Served-By:
pace-provider` so a caller can tell the provider's 429 from Portico's.

Counts served, refused, and requests that arrived during a hold it announced (between a 429
and the end of its Retry-After); GET /stats answers them as JSON (and they are printed at exit).
"""
import argparse
import json
import math
import signal
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

args = None
lock = threading.Lock()
windows = {}        # key -> (window start second, count in it)
holds = {}          # key -> (wall time the hold began, wall time until which it was announced)
# during_hold: arrivals while a hold announced for their key ran; during_hold_late: those that
# arrived 100 ms or more after the hold began (time enough, on loopback, for every replica to
# have heard of it: the rest were already on their way); served_by_second: 200s per window.
stats = {"served": 0, "refused": 0, "during_hold": 0, "during_hold_late": 0,
         "first": None, "last": None, "served_by_second": {}}


def decide(key, now):
    """(allowed, remaining, seconds to reset, in hold) for one arrival at wall time now."""
    second = math.floor(now)
    with lock:
        began, until = holds.get(key, (0.0, 0.0))
        in_hold = until > now
        if in_hold:
            stats["during_hold"] += 1
            if now - began >= 0.1:
                stats["during_hold_late"] += 1
        start, count = windows.get(key, (second, 0))
        if start != second:
            start, count = second, 0
        allowed = count < args.rate
        if allowed:
            count += 1
        windows[key] = (start, count)
        reset = start + 1 - now
        if allowed:
            stats["served"] += 1
            by_second = stats["served_by_second"]
            by_second[str(second)] = by_second.get(str(second), 0) + 1
        else:
            stats["refused"] += 1
            retry = max(1, math.ceil(reset))
            holds[key] = (began if in_hold else now, max(until, now + retry))
        stats["first"] = stats["first"] or now
        stats["last"] = now
        return allowed, args.rate - count, reset, in_hold


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *_):
        pass

    def do_GET(self):
        if self.path == "/stats":
            with lock:
                body = json.dumps(stats).encode()
            return self.reply(200, body, [])
        now = time.time()
        key = self.headers.get("X-API-Key", "")
        allowed, remaining, reset, _ = decide(key, now)
        headers = []
        reset_s = max(1, math.ceil(reset))
        if args.headers == "ratelimit":
            headers += [("RateLimit-Policy", f'"default";q={args.rate};w=1'),
                        ("RateLimit", f'"default";r={remaining};t={reset_s}')]
        elif args.headers == "x-ratelimit":
            headers += [("X-RateLimit-Limit", str(args.rate)), ("X-RateLimit-Remaining", str(remaining)),
                        ("X-RateLimit-Reset", str(math.floor(now) + 1))]
        if allowed:
            self.reply(200, b'{"ok":true}\n', headers)
        else:
            self.reply(429, b'{"error":"rate limited"}\n', headers + [("Retry-After", str(reset_s))])

    def reply(self, status, body, headers):
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("X-Served-By", "pace-provider")
        for name, value in headers:
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)


def main():
    global args
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--rate", type=int, default=20)
    parser.add_argument("--headers", choices=["ratelimit", "x-ratelimit", "retry-after"], default="ratelimit")
    args = parser.parse_args()
    # socketserver listens with a backlog of 5: a burst of 20 new connections overflowed it
    # (TcpExtListenOverflows) and the rest retried their SYN a second later, reaching this
    # provider in its next window, counted there with the next burst. A real API's is larger.
    ThreadingHTTPServer.request_queue_size = 128
    server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    server.daemon_threads = True

    def stop(*_):
        with lock:
            print(json.dumps(stats), flush=True)
        sys.exit(0)
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    server.serve_forever()


if __name__ == "__main__":
    main()
