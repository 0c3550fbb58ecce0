"""Fires COUNT concurrent GETs at once, each on its own connection, and prints the seconds from the
first connect to the last answer read (to its Content-Length). Exits non-zero if an answer is not
200. Used by bench/http2-burst.

    python3 bench/lib/burst.py PORT PATH COUNT
"""
import asyncio
import sys
import time

port, path, count = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])


async def one(start):
    await start.wait()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n".encode())
    head = await reader.readuntil(b"\r\n\r\n")
    if not head.startswith(b"HTTP/1.1 200"):
        raise SystemExit(f"{path}: {head[:60]!r}")
    length = next(int(l.split(b":")[1]) for l in head.split(b"\r\n") if l.lower().startswith(b"content-length:"))
    await reader.readexactly(length)
    writer.close()


async def main():
    start = asyncio.Event()
    tasks = [asyncio.create_task(one(start)) for _ in range(count)]
    await asyncio.sleep(0)  # every task waits on the event: they start together
    began = time.monotonic()
    start.set()
    await asyncio.gather(*tasks)
    print(f"{time.monotonic() - began:.3f}")


asyncio.run(main())
