"""A heavy-tail upstream for bench/tail/hedge: answers GET with a small body after FAST_MS, or
after SLOW_MS for a random SLOW_FRACTION of requests (seeded). Listens on the same port at each
HOST given (two endpoints of one upstream); GET /stats answers {"requests": N, "slow": S} (not
counted), POST /reset zeroes them.

    python3 bench/lib/hedge-upstream.py --port PORT --hosts 127.0.0.1,127.0.0.2 \
        [--slow-fraction 0.05] [--slow-ms 500] [--fast-ms 2] [--seed 1]
"""
import argparse
import asyncio
import json
import random

parser = argparse.ArgumentParser()
parser.add_argument("--port", type=int, required=True)
parser.add_argument("--hosts", default="127.0.0.1,127.0.0.2")
parser.add_argument("--slow-fraction", type=float, default=0.05)
parser.add_argument("--slow-ms", type=float, default=500)
parser.add_argument("--fast-ms", type=float, default=2)
parser.add_argument("--seed", type=int, default=1)
args = parser.parse_args()
rng = random.Random(args.seed)
counts = {"requests": 0, "slow": 0, "closed_early": 0}
BODY = b'{"items":[1,2,3]}\n'


def answer(status, body):
    return (f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body


async def serve(reader, writer):
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            line = head.split(b"\r\n", 1)[0].decode()
            method, target = line.split(" ")[:2]
            length = 0
            for field in head.split(b"\r\n")[1:]:
                if field.lower().startswith(b"content-length:"):
                    length = int(field.split(b":", 1)[1])
            if length:
                await reader.readexactly(length)
            if target == "/stats":
                writer.write(answer("200 OK", json.dumps(counts).encode()))
            elif target == "/reset":
                for key in counts:
                    counts[key] = 0
                writer.write(answer("200 OK", b"{}"))
            else:
                counts["requests"] += 1
                slow = rng.random() < args.slow_fraction
                if slow:
                    counts["slow"] += 1
                await asyncio.sleep((args.slow_ms if slow else args.fast_ms) / 1000)
                if reader.at_eof():
                    # The client gave up on this one (a hedge's loser): nothing to answer.
                    counts["closed_early"] += 1
                    break
                writer.write(answer("200 OK", BODY))
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()


async def main():
    servers = [await asyncio.start_server(serve, host, args.port, backlog=1024) for host in args.hosts.split(",")]
    await asyncio.gather(*(server.serve_forever() for server in servers))


asyncio.run(main())
