#!/usr/bin/env python3
"""A WebSocket upstream for Portico's tests (Python's `websockets` package).

    ws_upstream.py PORT EVENTS_FILE

Paths: /echo echoes every message as it came (text stays text, binary binary); a text message
"close:CODE" makes it close with CODE; "die" makes it drop the TCP connection without a close
frame. /refuse answers the handshake 403. /hold sends nothing. /stall reads nothing; /flood
sends 64 KiB messages until a send stalls for 5 s ("flood stalled after BYTES"). Each line of EVENTS_FILE is one
event: "open PATH authorization=VALUE", "refused authorization=VALUE", "message PATH LENGTH" (a
message on a path other than /echo), "closed PATH CODE" (the close code the client sent, or
"none" when the connection ended without one).
"""
import asyncio
import os
import resource
import sys

from websockets.asyncio.server import serve
from websockets.exceptions import ConnectionClosed
from websockets.http11 import Response
from websockets.datastructures import Headers

port = int(sys.argv[1])
events = open(sys.argv[2], "a", buffering=1)


def record(line):
    events.write(line + "\n")
    events.flush()


def process_request(connection, request):
    if request.path == "/refuse":
        record(f"refused authorization={request.headers.get('Authorization', '')}")
        return Response(403, "Forbidden", Headers([("Content-Type", "text/plain"), ("Content-Length", "8")]), b"refused\n")
    return None


async def handler(ws):
    path = ws.request.path
    record(f"open {path} authorization={ws.request.headers.get('Authorization', '')}")
    code = "none"
    if path == "/stall":
        # Reads nothing: what the client sends must stop at Portico's and the kernel's buffers.
        await ws.wait_closed()
        record(f"closed {path} none")
        return
    if path == "/flood":
        # Sends 64 KiB messages until a send cannot finish within 5 s (nobody reads them).
        chunk, sent = os.urandom(65536), 0
        try:
            while True:
                await asyncio.wait_for(ws.send(chunk), 5)
                sent += len(chunk)
                if sent > (1 << 30):
                    break
        except asyncio.TimeoutError:
            record(f"flood stalled after {sent}")
        except ConnectionClosed:
            record(f"flood closed after {sent}")
        ws.transport.abort()
        return
    try:
        async for message in ws:
            if path != "/echo":
                record(f"message {path} {len(message)}")
                continue
            if isinstance(message, str) and message.startswith("close:"):
                await ws.close(int(message.split(":")[1]), "closing as asked")
                break
            if message == "die":
                ws.transport.abort()
                break
            await ws.send(message)
    except ConnectionClosed:
        pass
    finally:
        try:
            await asyncio.wait_for(ws.wait_closed(), 5)
        except Exception:
            pass
        received = ws.protocol.close_rcvd
        if received is not None:
            code = str(received.code)
        record(f"closed {path} {code}")


async def main():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    async with serve(handler, "127.0.0.1", port, process_request=process_request, max_size=None,
                     ping_interval=None, compression=None):
        record("listening")
        await asyncio.Future()


asyncio.run(main())
