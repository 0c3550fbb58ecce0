#!/usr/bin/env python3
"""Open-loop load for bench/pace: requests on a fixed arrival schedule, one connection each.

    pace-load.py offer --ports 18301,18302 --rate 60 --duration 30 --path /api/item [--header K:V]
        request i is sent at start + i/rate (round robin over the ports) whether or not earlier
        ones have been answered; prints one JSON summary: statuses, Portico's 429s (no
        X-Served-By) with and without Retry-After, the provider's 429s, latency of the 200s,
        429s among arrivals in the first --fits seconds, and 200s completed per second.
    pace-load.py hold --port N --count 10000 --path /limited
        opens --count connections, sends a request on each and keeps them waiting (--partial:
        all of each request head but its last line, so no request reaches the chain); prints
        "sent N" once every request is written, then waits until killed.
"""
import argparse
import asyncio
import json
import sys
import time


async def one(port, path, headers, timeout):
    """(status, has Retry-After, from the provider, seconds) of one request; status 0 on error."""
    started = time.monotonic()
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), timeout)
        head = f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
        head += "".join(f"{k}: {v}\r\n" for k, v in headers) + "\r\n"
        writer.write(head.encode())
        await writer.drain()
        raw = await asyncio.wait_for(reader.read(-1), timeout)
        writer.close()
    except (OSError, asyncio.TimeoutError):
        return 0, False, False, time.monotonic() - started
    elapsed = time.monotonic() - started
    text = raw.split(b"\r\n\r\n", 1)[0].decode("latin-1").lower().split("\r\n")
    try:
        status = int(text[0].split()[1])
    except (IndexError, ValueError):
        return 0, False, False, elapsed
    names = {line.split(":", 1)[0].strip() for line in text[1:]}
    return status, "retry-after" in names, "x-served-by" in names, elapsed


def percentile(values, p):
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, int(p / 100 * len(values)))]


async def offer(a):
    ports = [int(p) for p in a.ports.split(",")]
    headers = [tuple(h.split(":", 1)) for h in a.header]
    total = int(a.rate * a.duration)
    start = time.monotonic() + 0.2
    start_wall = time.time() + (start - time.monotonic())
    results = []
    lag = 0.0

    async def at(i):
        nonlocal lag
        when = start + i / a.rate
        await asyncio.sleep(max(0.0, when - time.monotonic()))
        lag = max(lag, time.monotonic() - when)
        status, retry_after, provider, seconds = await one(ports[i % len(ports)], a.path, headers, a.timeout)
        results.append((i / a.rate, status, retry_after, provider, seconds))

    await asyncio.gather(*(at(i) for i in range(total)))
    if a.trace:
        with open(a.trace, "w") as f:
            f.write("arrival_s,status,retry_after,from_provider,seconds\n")
            for r in sorted(results):
                f.write(f"{r[0]:.3f},{r[1]},{int(r[2])},{int(r[3])},{r[4]:.3f}\n")
    by_status = {}
    for r in results:
        by_status[str(r[1])] = by_status.get(str(r[1]), 0) + 1
    ok = [r for r in results if r[1] == 200]
    portico_429 = [r for r in results if r[1] == 429 and not r[3]]
    done_per_second = {}
    for r in ok:
        second = int(r[0] + r[4])
        done_per_second[second] = done_per_second.get(second, 0) + 1
    # 200s completed per second over [fits, duration): the steady state once the queue is full
    steady = [done_per_second.get(s, 0) for s in range(int(a.fits), int(a.duration))]
    print(json.dumps({
        "offered": total, "start_wall": start_wall, "duration": a.duration, "max_send_lag_s": round(lag, 3),
        "statuses": by_status,
        "ok": len(ok),
        "portico_429": len(portico_429),
        "portico_429_with_retry_after": sum(1 for r in portico_429 if r[2]),
        "provider_429": sum(1 for r in results if r[1] == 429 and r[3]),
        "waited_over_50ms": sum(1 for r in ok if r[4] > 0.05),
        "ok_latency_p50_s": percentile([r[4] for r in ok], 50),
        "ok_latency_p99_s": percentile([r[4] for r in ok], 99),
        "ok_latency_max_s": max((r[4] for r in ok), default=None),
        "refused_arriving_before_fits": sum(1 for r in results if r[1] != 200 and r[0] < a.fits),
        "steady_ok_per_second": (sum(steady) / len(steady)) if steady else None,
        "ok_per_second": [done_per_second.get(s, 0) for s in range(0, int(a.duration) + int(a.fits) + 2)],
    }), flush=True)


async def hold(a):
    sockets = []
    head = f"GET {a.path} HTTP/1.1\r\nHost: 127.0.0.1\r\n".encode()
    if not a.partial:
        head += b"\r\n"
    gate = asyncio.Semaphore(200)       # connect in waves: the listen backlog is finite

    async def open_one():
        async with gate:
            for _ in range(20):
                try:
                    reader, writer = await asyncio.open_connection("127.0.0.1", a.port)
                    writer.write(head)
                    await writer.drain()
                    sockets.append((reader, writer))
                    return True
                except OSError:
                    await asyncio.sleep(0.2)
            return False

    opened = await asyncio.gather(*(open_one() for _ in range(a.count)))
    print(f"sent {sum(opened)}", flush=True)
    await asyncio.sleep(3600)


def main():
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="mode", required=True)
    o = sub.add_parser("offer")
    o.add_argument("--ports", required=True)
    o.add_argument("--rate", type=float, required=True)
    o.add_argument("--duration", type=float, required=True)
    o.add_argument("--path", default="/")
    o.add_argument("--header", action="append", default=[])
    o.add_argument("--timeout", type=float, default=40)
    o.add_argument("--trace", help="a CSV of every request: arrival, status, Retry-After, provider's, seconds")
    o.add_argument("--fits", type=float, default=1.0, help="arrivals before this many seconds fit max_wait")
    h = sub.add_parser("hold")
    h.add_argument("--port", type=int, required=True)
    h.add_argument("--count", type=int, required=True)
    h.add_argument("--path", default="/")
    h.add_argument("--partial", action="store_true", help="leave each request head unfinished: connections only")
    a = parser.parse_args()
    asyncio.run(offer(a) if a.mode == "offer" else hold(a))


if __name__ == "__main__":
    sys.exit(main())
