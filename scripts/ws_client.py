#!/usr/bin/env python3
"""A WebSocket client for Portico's tests (Python's `websockets` package).

    ws_client.py URL SCENARIO [ARG] [--ca CA_FILE]

Prints "ok SCENARIO" and exits 0 when the scenario behaves, else prints what went wrong and
exits 1. URL is the base, ws://host:port, or wss:// with the CA file that signed the server's
certificate (`--ca`).
"""
import asyncio
import os
import resource
import socket
import ssl
import struct
import sys
import time

from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

argv = list(sys.argv)
ca_file = None
if "--ca" in argv:
    at = argv.index("--ca")
    ca_file = argv[at + 1]
    del argv[at:at + 2]
base, scenario = argv[1], argv[2]
arg = argv[3] if len(argv) > 3 else None
# For wss:// URLs: trusts the CA given (None: websockets' default context).
TLS = ssl.create_default_context(cafile=ca_file) if ca_file else None


def fail(message):
    print(f"FAIL {scenario}: {message}", flush=True)
    sys.exit(1)


async def expect_close(ws, timeout, code=None):
    """Waits up to TIMEOUT seconds for the session to close (a message instead fails); then its
    close code must be CODE, unless CODE is None."""
    try:
        await asyncio.wait_for(ws.recv(), timeout)
        fail("a message instead of the close")
    except ConnectionClosed:
        pass
    if code is not None and ws.close_code != code:
        fail(f"close code {ws.close_code}, expected {code}")


async def echo(url, ssl_context=None):
    async with connect(url + "/echo", max_size=None, ping_interval=None, compression=None, ssl=ssl_context) as ws:
        await ws.send("hello")
        if await ws.recv() != "hello":
            fail("text echo")
        await ws.send(b"\x00\x01\xfe\xff")
        if await ws.recv() != b"\x00\x01\xfe\xff":
            fail("binary echo")
        big = os.urandom(16 * 1024 * 1024)
        await ws.send(big)
        if await ws.recv() != big:
            fail("16 MiB echo")
        await ws.send([b"frag", b"men", b"ted"])
        if await ws.recv() != b"fragmented":
            fail("fragmented message")
        await ws.send(["te", "xt"])
        if await ws.recv() != "text":
            fail("fragmented text")
        pong = await ws.ping(b"are you there")
        await asyncio.wait_for(pong, 10)
        # The upstream closes with the code it is asked for: it reaches the client unchanged.
        await ws.send("close:4002")
        await expect_close(ws, 10, 4002)
    # The client closes with its own code: the upstream records it.
    async with connect(url + "/echo", ping_interval=None, ssl=ssl_context) as ws:
        await ws.send("once")
        await ws.recv()
        await ws.close(4001, "client done")


async def refused(url):
    try:
        async with connect(url + "/refuse", ping_interval=None):
            fail("handshake accepted")
    except InvalidStatus as error:
        if error.response.status_code != 403:
            fail(f"status {error.response.status_code}")
        if b"refused" not in error.response.body:
            fail(f"body {error.response.body!r}")


async def reset(url):
    ws = await connect(url + "/echo", ping_interval=None, ssl=TLS)
    await ws.send("before reset")
    await ws.recv()
    sock = ws.transport.get_extra_info("socket")  # under TLS too: the TCP socket beneath
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    ws.transport.abort()


async def upstream_dies(url):
    async with connect(url + "/echo", ping_interval=None, ssl=TLS) as ws:
        await ws.send("die")
        started = time.monotonic()
        # 1006: the connection ended without a close frame, as the upstream's did.
        await expect_close(ws, 10, 1006)
        took = time.monotonic() - started
        print(f"closed {took * 1000:.0f} ms after the upstream was told to drop", flush=True)
        # Portico closes the client's side at once; the margin is for a loaded machine.
        if took > 5:
            fail("close took too long")


async def wait_close(url, expected):
    async with connect(url + "/hold", ping_interval=None, ssl=TLS) as ws:
        print("open", flush=True)
        await expect_close(ws, 120, expected)


async def slow_frame(url):
    """Sends one 2 MiB binary frame to /hold in 32 KiB pieces, 20 ms apart (raw, masked, so the
    frame is still in progress when the test stops the gateway), then expects a close 1001."""
    payload = os.urandom(2 << 20)
    mask = os.urandom(4)
    masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
    frame = bytes([0x82, 0x80 | 127]) + struct.pack("!Q", len(payload)) + mask + masked
    async with connect(url + "/hold", ping_interval=None, ssl=TLS) as ws:
        print("open", flush=True)
        for start in range(0, len(frame), 32768):
            ws.transport.write(frame[start:start + 32768])
            await asyncio.sleep(0.02)
        print("sent", flush=True)
        await expect_close(ws, 60, 1001)


async def wait_for_file(path, timeout=120):
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            fail(f"{path} never appeared")
        await asyncio.sleep(0.05)


async def many(url, count, release):
    """Opens COUNT idle sessions, says so, holds them until the file RELEASE exists, then checks
    each still echoes."""
    sessions = []
    for _ in range(count):
        sessions.append(await connect(url + "/echo", ping_interval=None, open_timeout=60))
    print(f"open {count}", flush=True)
    with open(release + ".open", "w") as marker:
        marker.write(str(count))
    await wait_for_file(release)
    for ws in sessions:
        await ws.send("still there")
    for ws in sessions:
        if await asyncio.wait_for(ws.recv(), 30) != "still there":
            fail("a session lost its echo")
    for ws in sessions:
        await ws.close()


async def reload_echo(url, go):
    """One session that echoes, waits for the file GO (the test reloads meanwhile), and echoes again."""
    async with connect(url + "/echo", ping_interval=None) as ws:
        await ws.send("before")
        if await ws.recv() != "before":
            fail("echo before")
        await wait_for_file(go)
        await ws.send("after")
        if await asyncio.wait_for(ws.recv(), 10) != "after":
            fail("echo after")


def raise_descriptor_limit():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


async def stall_upstream(url, hold):
    """Sends 64 KiB messages to /stall (an upstream that reads nothing) until a send cannot
    finish within 5 s; prints how much went, then holds the session until the file HOLD exists."""
    chunk, sent = os.urandom(65536), 0
    async with connect(url + "/stall", ping_interval=None, max_queue=1) as ws:
        try:
            while sent < (1 << 30):
                await asyncio.wait_for(ws.send(chunk), 5)
                sent += len(chunk)
            fail("1 GiB went to an upstream that reads nothing")
        except asyncio.TimeoutError:
            print(f"stalled after {sent}", flush=True)
        with open(hold + ".stalled", "w") as marker:
            marker.write(str(sent))
        await wait_for_file(hold)
        ws.transport.abort()


async def ignore_flood(url, hold):
    """Opens /flood and reads nothing until the file HOLD exists."""
    async with connect(url + "/flood", ping_interval=None, max_queue=1) as ws:
        await wait_for_file(hold)
        ws.transport.abort()


async def main():
    raise_descriptor_limit()
    if scenario == "echo":
        await echo(base, TLS)
    elif scenario == "refused":
        await refused(base)
    elif scenario == "reset":
        await reset(base)
    elif scenario == "upstream-dies":
        await upstream_dies(base)
    elif scenario == "wait-close":
        await wait_close(base, int(arg) if arg else None)
    elif scenario == "slow-frame":
        await slow_frame(base)
    elif scenario == "many":
        await many(base, int(arg), sys.argv[4])
    elif scenario == "stall-upstream":
        await stall_upstream(base, arg)
    elif scenario == "ignore-flood":
        await ignore_flood(base, arg)
    elif scenario == "reload-echo":
        await reload_echo(base, arg)
    else:
        fail("unknown scenario")
    print(f"ok {scenario}", flush=True)


asyncio.run(main())
