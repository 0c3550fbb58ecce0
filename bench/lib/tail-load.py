"""Closed-loop load for bench/tail: CALLERS callers, each on its own keep-alive connection, sending
GET PATH one after another for DURATION seconds (the first WARMUP seconds not counted). A caller
answered 503 waits BACKOFF ms before its next request (a client honouring an immediate refusal).
Prints JSON: counts by status, 200s per second, latency percentiles of 200s and of 503s.

    python3 bench/lib/tail-load.py PORT PATH CALLERS DURATION [WARMUP] [BACKOFF_MS]
"""
import asyncio
import json
import sys
import time

port, path, callers, duration = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
warmup = float(sys.argv[5]) if len(sys.argv) > 5 else 0.0
backoff = float(sys.argv[6]) / 1000 if len(sys.argv) > 6 else 0.05

statuses, ok_latencies, refused_latencies = {}, [], []


async def caller(start, end):
    request = f"GET {path} HTTP/1.1\r\nHost: bench.tail\r\n\r\n".encode()
    reader = writer = None
    while time.monotonic() < end:
        if writer is None:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
        sent = time.monotonic()
        try:
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            length = next((int(l.split(b":")[1]) for l in head.split(b"\r\n") if l.lower().startswith(b"content-length:")), 0)
            await reader.readexactly(length)
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()
            writer = None
            continue
        done = time.monotonic()
        status = int(head.split(b" ", 2)[1])
        if sent >= start + warmup:
            statuses[status] = statuses.get(status, 0) + 1
            (ok_latencies if status == 200 else refused_latencies).append(done - sent)
        if status == 503:
            await asyncio.sleep(backoff)
    if writer:
        writer.close()


def percentile(values, p):
    if not values:
        return None
    values = sorted(values)
    return round(values[min(len(values) - 1, int(len(values) * p))], 4)


async def main():
    start = time.monotonic()
    end = start + duration
    await asyncio.gather(*(caller(start, end) for _ in range(callers)))
    counted = duration - warmup
    print(json.dumps({
        "statuses": {str(k): v for k, v in sorted(statuses.items())},
        "ok_per_second": round(statuses.get(200, 0) / counted, 1),
        "ok_p50_s": percentile(ok_latencies, 0.5), "ok_p99_s": percentile(ok_latencies, 0.99),
        "refused_p50_s": percentile(refused_latencies, 0.5), "refused_p99_s": percentile(refused_latencies, 0.99),
    }))


asyncio.run(main())
