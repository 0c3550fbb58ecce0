"""Keep-alive GETs over 4 connections, each answer read to its Content-Length; exits non-zero on
an answer other than 200. Used by bench/instructions and scripts/link-order.

    python3 bench/lib/keepalive-gets.py PORT PATH TOTAL
"""
import concurrent.futures
import socket
import sys

port, path, total = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])


def connection(count):
    s = socket.create_connection(("127.0.0.1", port))
    request = f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode()
    for _ in range(count):
        s.sendall(request)
        data = b""
        while b"\r\n\r\n" not in data:
            data += s.recv(65536)
        head, rest = data.split(b"\r\n\r\n", 1)
        if not head.startswith(b"HTTP/1.1 200"):
            sys.exit(f"{path}: {head[:40]!r}")
        length = next(int(l.split(b":")[1]) for l in head.split(b"\r\n") if l.lower().startswith(b"content-length:"))
        while len(rest) < length:
            rest += s.recv(65536)
    s.close()


with concurrent.futures.ThreadPoolExecutor(4) as pool:
    list(pool.map(connection, [max(total // 4, 1)] * 4))
