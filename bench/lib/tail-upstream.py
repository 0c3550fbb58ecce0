"""Upstreams for bench/tail/balance and bench/tail/overload: asyncio HTTP/1.1 keep-alive servers
answering `ok` on any path but /stats, which answers this port's counts as JSON (requests, and the
most at once: served plus queued).

    python3 bench/lib/tail-upstream.py PORT:DELAY_MS[:CAPACITY] ...

Each PORT answers after DELAY_MS; with CAPACITY, at most that many are served at once and the
rest queue in arrival order (latency grows with the queue, as an overloaded service's does).
Prints "ready" once every port listens.
"""
import asyncio
import collections
import json
import sys


class Port:
    def __init__(self, port, delay_ms, capacity):
        self.port, self.delay, self.capacity = port, delay_ms / 1000, capacity
        self.free = capacity
        self.queue = collections.deque()
        self.requests = 0
        self.now = 0
        self.peak = 0

    async def answer(self):
        self.requests += 1
        self.now += 1
        self.peak = max(self.peak, self.now)
        try:
            if self.capacity:
                await self.acquire()
                try:
                    await asyncio.sleep(self.delay)
                finally:
                    self.release()
            elif self.delay:
                await asyncio.sleep(self.delay)
        finally:
            self.now -= 1

    # A strict FIFO gate (asyncio.Semaphore lets a newcomer take a freed slot before a waiter
    # wakes, which starves some requests for seconds and is not the queue being modelled).
    async def acquire(self):
        if self.free > 0 and not self.queue:
            self.free -= 1
            return
        waiter = asyncio.get_running_loop().create_future()
        self.queue.append(waiter)
        await waiter

    def release(self):
        while self.queue:
            waiter = self.queue.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
        self.free += 1

    async def serve(self, reader, writer):
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                target = head.split(b" ", 2)[1]
                if target == b"/stats":
                    body = json.dumps({"port": self.port, "requests": self.requests, "peak": self.peak}).encode()
                else:
                    await self.answer()
                    body = b"ok\n"
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


async def main():
    servers = []
    for spec in sys.argv[1:]:
        parts = spec.split(":")
        port = Port(int(parts[0]), float(parts[1]), int(parts[2]) if len(parts) > 2 else 0)
        servers.append(await asyncio.start_server(port.serve, "127.0.0.1", port.port, backlog=1024))
    print("ready", flush=True)
    await asyncio.gather(*(s.serve_forever() for s in servers))


asyncio.run(main())
