"""Closed-loop GETs for bench/tail: CONCURRENCY keep-alive connections, each sending its next
request as soon as its last answer is read whole, TOTAL requests in all; prints JSON with the
latency percentiles (milliseconds) and the count of answers other than 200.

    python3 bench/lib/hedge-load.py PORT PATH CONCURRENCY TOTAL
"""
import json
import socket
import sys
import threading
import time

port, path, concurrency, total = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
latencies, errors, lock = [], [0], threading.Lock()
left = [total]


def take():
    with lock:
        if left[0] <= 0:
            return False
        left[0] -= 1
        return True


def client():
    s = socket.create_connection(("127.0.0.1", port))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    request = f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode()
    mine = []
    while take():
        start = time.perf_counter()
        s.sendall(request)
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = s.recv(65536)
            if not chunk:
                raise SystemExit("the gateway closed the connection")
            data += chunk
        head, rest = data.split(b"\r\n\r\n", 1)
        length = next(int(l.split(b":")[1]) for l in head.split(b"\r\n") if l.lower().startswith(b"content-length:"))
        while len(rest) < length:
            rest += s.recv(65536)
        mine.append((time.perf_counter() - start) * 1000)
        if not head.startswith(b"HTTP/1.1 200"):
            with lock:
                errors[0] += 1
    s.close()
    with lock:
        latencies.extend(mine)


threads = [threading.Thread(target=client) for _ in range(concurrency)]
began = time.perf_counter()
for t in threads:
    t.start()
for t in threads:
    t.join()
elapsed = time.perf_counter() - began
latencies.sort()


def pct(p):
    return round(latencies[min(len(latencies) - 1, max(0, int(p / 100 * len(latencies) + 0.999999) - 1))], 2)


print(json.dumps({"requests": len(latencies), "errors": errors[0], "seconds": round(elapsed, 2),
                  "p50": pct(50), "p90": pct(90), "p99": pct(99), "p99.9": pct(99.9), "max": round(latencies[-1], 2)}))
