#!/usr/bin/env python3
"""WebSocket load for bench/websocket (Python's `websockets` package).

    ws_bench.py echo URL --sessions 100 --seconds 10 --size 64 [--ca CA_FILE]
        Each of --sessions sessions sends a --size-byte binary message and waits for its echo,
        again and again for --seconds. Prints one line: messages/s, p50 and p99 latency (ms).
        A wss:// URL trusts --ca.
    ws_bench.py idle URL --sessions 1000 --pid PID
        Opens --sessions idle sessions and prints the RSS growth of process PID per session.
    ws_bench.py server PORT
        An echo server (binary and text, as received), for the upstream and the direct case.
"""
import argparse
import asyncio
import os
import resource
import ssl
import statistics
import sys
import time

from websockets.asyncio.client import connect
from websockets.asyncio.server import serve


def raise_descriptor_limit():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


async def echo_server(port):
    async def handler(ws):
        async for message in ws:
            await ws.send(message)

    async with serve(handler, "127.0.0.1", port, max_size=None, ping_interval=None, compression=None):
        print("listening", flush=True)
        await asyncio.Future()


async def echo_load(url, sessions, seconds, size, ca=None):
    payload = os.urandom(size)
    context = ssl.create_default_context(cafile=ca) if ca else None
    latencies = []
    deadline = time.monotonic() + seconds

    async def one():
        async with connect(url, ping_interval=None, compression=None, open_timeout=60, max_size=None,
                           ssl=context) as ws:
            while time.monotonic() < deadline:
                started = time.perf_counter()
                await ws.send(payload)
                await ws.recv()
                latencies.append(time.perf_counter() - started)

    started = time.monotonic()
    await asyncio.gather(*(one() for _ in range(sessions)))
    elapsed = time.monotonic() - started
    latencies.sort()
    p99 = latencies[int(len(latencies) * 0.99) - 1] if latencies else 0
    print(f"{len(latencies) / elapsed:.0f} msg/s  p50 {statistics.median(latencies) * 1000:.3f} ms  "
          f"p99 {p99 * 1000:.3f} ms  ({len(latencies)} messages, {sessions} sessions, {size} B)", flush=True)


def rss(pid):
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


async def idle(url, sessions, pid):
    # A few first sessions warm the allocators up before the baseline.
    warm = [await connect(url, ping_interval=None) for _ in range(10)]
    before = rss(pid)
    held = [await connect(url, ping_interval=None, open_timeout=60) for _ in range(sessions)]
    await asyncio.sleep(1)
    after = rss(pid)
    print(f"{(after - before) / sessions / 1024:.1f} KiB RSS per idle session ({sessions} sessions, "
          f"{(after - before) / 1048576:.1f} MiB in all)", flush=True)
    for ws in held + warm:
        await ws.close()


def main():
    raise_descriptor_limit()
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["echo", "idle", "server"])
    parser.add_argument("target")
    parser.add_argument("--sessions", type=int, default=100)
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--pid", type=int)
    parser.add_argument("--ca")
    args = parser.parse_args()
    if args.mode == "server":
        asyncio.run(echo_server(int(args.target)))
    elif args.mode == "echo":
        asyncio.run(echo_load(args.target, args.sessions, args.seconds, args.size, args.ca))
    else:
        asyncio.run(idle(args.target, args.sessions, args.pid))


if __name__ == "__main__":
    main()
