"""A TCP relay on loopback that adds latency: each byte reaches the other side DELAY_MS later, both
ways, so a round trip through it costs 2 × DELAY_MS more (the kernel here has no netem). A new
connection's first bytes towards the server also wait one extra round trip, standing in for the
TCP handshake the relay itself answers at once. Order within a direction is kept; no bandwidth
limit. Used by bench/http2-burst.

    python3 bench/lib/delay-relay.py LISTEN_PORT TARGET_PORT DELAY_MS
"""
import asyncio
import sys

listen_port, target_port, delay = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]) / 1000


async def pump(reader, writer, not_before):
    """Copies reader to writer, each chunk DELAY later than it was read (and not before `not_before`)."""
    loop = asyncio.get_running_loop()
    queue = asyncio.Queue()

    async def send():
        while True:
            due, chunk = await queue.get()
            wait = due - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            if chunk is None:
                try:
                    writer.write_eof()
                except OSError:
                    pass
                return
            writer.write(chunk)
            try:
                await writer.drain()
            except OSError:
                return

    sender = asyncio.create_task(send())
    try:
        while True:
            try:
                chunk = await reader.read(65536)
            except OSError:
                chunk = b""
            queue.put_nowait((max(loop.time() + delay, not_before), chunk or None))
            if not chunk:
                break
        await sender
    finally:
        sender.cancel()


async def relay(client_reader, client_writer):
    loop = asyncio.get_running_loop()
    accepted = loop.time()
    try:
        server_reader, server_writer = await asyncio.open_connection("127.0.0.1", target_port)
    except OSError:
        client_writer.close()
        return
    # The client's first bytes leave one round trip (the handshake) plus one way after it connected.
    await asyncio.gather(pump(client_reader, server_writer, accepted + 3 * delay),
                         pump(server_reader, client_writer, 0), return_exceptions=True)
    for w in (client_writer, server_writer):
        w.close()


async def main():
    server = await asyncio.start_server(relay, "127.0.0.1", listen_port, backlog=1024)
    async with server:
        await server.serve_forever()


asyncio.run(main())
