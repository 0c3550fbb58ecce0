"""Load for bench/fleet.

    fleet-load.py steady --ports A,B,C --duration S --rate R        R requests/s per replica to /api/steady?n=…
    fleet-load.py sweep --ports A,B,C --urls N [--order same]        each replica asks /api/item/0..N-1 once,
                                                                     all replicas at once (4 connections each)
    fleet-load.py repeat --port P --urls N --times K                  K passes over the N URLs on one replica

Prints a JSON summary (counts by status) and exits non-zero on a connection failure.
"""
import argparse
import collections
import concurrent.futures
import json
import socket
import time


def get(sock, port, path):
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: bench.fleet\r\n\r\n".encode())
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("closed")
        data += chunk
    head, rest = data.split(b"\r\n\r\n", 1)
    status = int(head.split(b" ")[1])
    length = 0
    for line in head.split(b"\r\n")[1:]:
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":")[1])
    while len(rest) < length:
        rest += sock.recv(65536)
    return status


def lane(port, paths):
    counts = collections.Counter()
    sock = socket.create_connection(("127.0.0.1", port))
    for path in paths:
        try:
            counts[get(sock, port, path)] += 1
        except (ConnectionError, OSError):
            sock.close()
            sock = socket.create_connection(("127.0.0.1", port))
            counts[get(sock, port, path)] += 1
    sock.close()
    return counts


parser = argparse.ArgumentParser()
parser.add_argument("mode")
parser.add_argument("--ports", default="")
parser.add_argument("--port", type=int, default=0)
parser.add_argument("--duration", type=float, default=20)
parser.add_argument("--rate", type=float, default=20)
parser.add_argument("--urls", type=int, default=500)
parser.add_argument("--times", type=int, default=1)
args = parser.parse_args()
total = collections.Counter()

if args.mode == "steady":
    ports = [int(p) for p in args.ports.split(",")]

    def steady(port):
        counts = collections.Counter()
        sock = socket.create_connection(("127.0.0.1", port))
        start = time.monotonic()
        n = 0
        while time.monotonic() - start < args.duration:
            n += 1
            counts[get(sock, port, f"/api/steady?n={n}")] += 1
            time.sleep(max(0, start + n / args.rate - time.monotonic()))
        sock.close()
        return counts

    with concurrent.futures.ThreadPoolExecutor(len(ports)) as pool:
        for counts in pool.map(steady, ports):
            total.update(counts)
elif args.mode == "sweep":
    ports = [int(p) for p in args.ports.split(",")]
    jobs = []
    with concurrent.futures.ThreadPoolExecutor(4 * len(ports)) as pool:
        for port in ports:
            paths = [f"/api/item/{i}" for i in range(args.urls)]
            for k in range(4):
                jobs.append(pool.submit(lane, port, paths[k::4]))
        for job in jobs:
            total.update(job.result())
else:
    paths = [f"/api/item/{i}" for i in range(args.urls)] * args.times
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        for counts in pool.map(lambda k: lane(args.port, paths[k::4]), range(4)):
            total.update(counts)
print(json.dumps({str(k): v for k, v in total.items()}))
