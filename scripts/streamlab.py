#!/usr/bin/env python3
"""An independent upstream and client for Portico's streaming tests and bench (stdlib only).

    streamlab.py serve [--port 0] [--port-file FILE]   the upstream (127.0.0.1); see Handler
    streamlab.py digest N                               SHA-256 of the first N pattern bytes
    streamlab.py get URL                                download, print JSON {status, bytes, sha256, complete, ...}
    streamlab.py put URL --bytes N [--chunked] [--progress FILE]   upload N pattern bytes, print JSON (with
                                                        the sink's answer); FILE: bytes sent so far (every MiB)
    streamlab.py sse-ttfe URL [--repeat 20]             time to first SSE event (ms), JSON {median_ms, all_ms}

The pattern: a fixed 1 MiB + 7 bytes of seeded pseudo-random data, repeated. The odd period means a
lost, repeated or reordered chunk of any usual size changes the SHA-256.

Upstream endpoints (`id` names a transfer; its counters are read at /control/stats?id=...):
    GET /download?bytes=N&framing=length|chunked|close&id=X&sndbuf=B   N pattern bytes; `written`
        counts bytes the kernel accepted, `closed` turns true when the peer went away mid-body
    GET /sse?events=N&id=X&gate=1                       event i (`id: i`, `data: event-i`) is sent
        only after /control/release?id=X was called i+1 times (gate=0: all at once); chunked;
        `sent` counts events (counted as each is written), `closed` turns true when the peer went away (also while waiting)
    GET /sse-ttfe                                       one event at once, then the stream stays
        open until the client leaves (or 30 s): for time-to-first-event
    POST|PUT /upload?id=X&hold=1&rcvbuf=B               hashes the body (Content-Length or chunked)
        and answers {"bytes", "sha256"}; `received` grows as it reads; hold=1 reads nothing until
        /control/release?id=X
    GET /abort?bytes=K&declared=N&framing=length|chunked&how=close|reset   a head promising N
        bytes (or chunked), K bytes, then close (or RST) without the rest/terminating chunk
    GET /control/release?id=X[&count=C]                 opens the gate C (1) more times
    GET /control/stats?id=X                             {"written","closed","done","sent","received",...}
"""
import hashlib
import json
import os
import random
import socket
import struct
import sys
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PERIOD = (1 << 20) + 7
_BASE = random.Random(2126).randbytes(PERIOD)
_DOUBLE = memoryview(_BASE + _BASE)


def pattern(offset, length):
    """`length` (≤ PERIOD) pattern bytes starting at stream offset `offset`, as a memoryview."""
    start = offset % PERIOD
    return _DOUBLE[start:start + length]


def digest(n):
    h = hashlib.sha256()
    offset = 0
    while offset < n:
        size = min(PERIOD, n - offset)
        h.update(pattern(offset, size))
        offset += size
    return h.hexdigest()


class Transfers:
    """Per-id counters and gates, shared by all handler threads."""

    def __init__(self):
        self.lock = threading.Condition()
        self.stats = {}
        self.released = {}

    def update(self, tid, **values):
        if not tid:
            return
        with self.lock:
            self.stats.setdefault(tid, {}).update(values)
            self.lock.notify_all()

    def add(self, tid, key, amount):
        if not tid:
            return
        with self.lock:
            entry = self.stats.setdefault(tid, {})
            entry[key] = entry.get(key, 0) + amount

    def get(self, tid):
        with self.lock:
            return dict(self.stats.get(tid, {}), released=self.released.get(tid, 0))

    def release(self, tid, count):
        with self.lock:
            self.released[tid] = self.released.get(tid, 0) + count
            self.lock.notify_all()

    def wait_released(self, tid, count, gone):
        """Blocks until the gate of `tid` was opened `count` times; False if `gone()` first."""
        with self.lock:
            while self.released.get(tid, 0) < count:
                self.lock.wait(0.05)
                if gone():
                    return False
        return True


TRANSFERS = Transfers()


def peer_gone(sock):
    """Whether the peer closed its side (or reset), without consuming data."""
    import select
    readable, _, _ = select.select([sock], [], [], 0)
    if not readable:
        return False
    try:
        return sock.recv(1, socket.MSG_PEEK) == b""
    except OSError:
        return True


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "streamlab"

    def log_message(self, format, *args):
        pass

    def query(self):
        parsed = urllib.parse.urlsplit(self.path)
        return parsed.path, {k: v[-1] for k, v in urllib.parse.parse_qs(parsed.query).items()}

    def answer(self, status, body, content_type="application/json"):
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        path, q = self.query()
        tid = q.get("id", "")
        if path == "/control/release":
            TRANSFERS.release(tid, int(q.get("count", "1")))
            return self.answer(200, TRANSFERS.get(tid))
        if path == "/control/stats":
            return self.answer(200, TRANSFERS.get(tid))
        if path == "/download":
            return self.download(tid, int(q.get("bytes", "0")), q.get("framing", "length"), int(q.get("sndbuf", "0")))
        if path == "/sse":
            return self.sse(tid, int(q.get("events", "3")), q.get("gate", "1") == "1")
        if path == "/sse-ttfe":
            return self.sse_ttfe()
        if path == "/abort":
            return self.abort(int(q.get("bytes", "0")), int(q.get("declared", "0")), q.get("framing", "length"),
                              q.get("how", "close"))
        if path == "/ping":
            return self.answer(200, b"pong\n", "text/plain")
        self.answer(404, {"error": "no such endpoint", "path": path})

    def do_POST(self):
        path, q = self.query()
        if path == "/upload":
            return self.upload(q.get("id", ""), q.get("hold") == "1", int(q.get("rcvbuf", "0")))
        self.answer(404, {"error": "no such endpoint", "path": path})

    do_PUT = do_POST

    def send_head(self, headers):
        self.send_response(200)
        for name, value in headers:
            self.send_header(name, value)
        self.end_headers()

    def download(self, tid, total, framing, sndbuf):
        sock = self.connection
        if sndbuf:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, sndbuf)
        headers = [("Content-Type", "application/octet-stream")]
        if framing == "length":
            headers.append(("Content-Length", str(total)))
        elif framing == "chunked":
            headers.append(("Transfer-Encoding", "chunked"))
        else:
            headers.append(("Connection", "close"))
            self.close_connection = True
        TRANSFERS.update(tid, written=0, closed=False, done=False)
        self.send_head(headers)
        offset = 0
        step = 256 * 1024
        try:
            while offset < total:
                size = min(step, total - offset)
                data = pattern(offset, size)
                if framing == "chunked":
                    sock.sendall(b"%x\r\n" % size)
                    sock.sendall(data)
                    sock.sendall(b"\r\n")
                else:
                    sock.sendall(data)
                offset += size
                TRANSFERS.update(tid, written=offset)
            if framing == "chunked":
                sock.sendall(b"0\r\n\r\n")
            TRANSFERS.update(tid, done=True)
        except OSError as error:
            TRANSFERS.update(tid, closed=True, error=str(error))
            self.close_connection = True

    def sse(self, tid, events, gated):
        sock = self.connection
        TRANSFERS.update(tid, sent=0, closed=False, done=False)
        self.send_head([("Content-Type", "text/event-stream"), ("Cache-Control", "no-cache"),
                        ("Transfer-Encoding", "chunked")])
        try:
            for i in range(events):
                if gated and not TRANSFERS.wait_released(tid, i + 1, lambda: peer_gone(sock)):
                    TRANSFERS.update(tid, closed=True)
                    self.close_connection = True
                    return
                event = b"id: %d\ndata: event-%d\n\n" % (i, i)
                # Counted before the write: a client that has the event always finds it counted.
                TRANSFERS.update(tid, sent=i + 1)
                sock.sendall(b"%x\r\n%s\r\n" % (len(event), event))
            sock.sendall(b"0\r\n\r\n")
            TRANSFERS.update(tid, done=True)
        except OSError as error:
            TRANSFERS.update(tid, closed=True, error=str(error))
            self.close_connection = True

    def sse_ttfe(self):
        sock = self.connection
        self.send_head([("Content-Type", "text/event-stream"), ("Cache-Control", "no-cache"),
                        ("Transfer-Encoding", "chunked")])
        event = b"data: first\n\n"
        self.close_connection = True
        try:
            sock.sendall(b"%x\r\n%s\r\n" % (len(event), event))
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and not peer_gone(sock):
                time.sleep(0.02)
        except OSError:
            pass

    def upload(self, tid, hold, rcvbuf):
        sock = self.connection
        if rcvbuf:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        TRANSFERS.update(tid, received=0, done=False)
        if hold and not TRANSFERS.wait_released(tid, 1, lambda: False):
            return
        h = hashlib.sha256()
        received = 0
        buffer = bytearray(1 << 20)
        view = memoryview(buffer)

        def take(n):
            nonlocal received
            while n > 0:
                got = self.rfile.readinto(view[:min(n, len(buffer))])
                if not got:
                    raise ConnectionError("body ended after %d bytes" % received)
                h.update(view[:got])
                received += got
                n -= got
                TRANSFERS.update(tid, received=received)

        try:
            if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
                while True:
                    line = self.rfile.readline(1024)
                    size = int(line.split(b";")[0].strip(), 16)
                    if size == 0:
                        while self.rfile.readline(1024) not in (b"\r\n", b"\n", b""):
                            pass
                        break
                    take(size)
                    self.rfile.readline(8)
            else:
                take(int(self.headers.get("Content-Length", "0")))
        except (OSError, ValueError) as error:
            TRANSFERS.update(tid, closed=True, error=str(error))
            self.close_connection = True
            return
        result = {"bytes": received, "sha256": h.hexdigest()}
        TRANSFERS.update(tid, done=True, **result)
        self.answer(200, result)

    def abort(self, sent, declared, framing, how):
        sock = self.connection
        headers = [("Content-Type", "application/octet-stream")]
        if framing == "chunked":
            headers.append(("Transfer-Encoding", "chunked"))
        else:
            headers.append(("Content-Length", str(declared)))
        self.send_head(headers)
        if framing == "chunked":
            sock.sendall(b"%x\r\n" % sent)
        sock.sendall(pattern(0, sent))
        if framing == "chunked":
            sock.sendall(b"\r\n")
        self.close_connection = True
        if how == "reset":
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        else:
            sock.shutdown(socket.SHUT_WR)


class Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128


def serve(argv):
    port, port_file = 0, None
    while argv:
        option = argv.pop(0)
        if option == "--port":
            port = int(argv.pop(0))
        elif option == "--port-file":
            port_file = argv.pop(0)
    server = Server(("127.0.0.1", port), Handler)
    if port_file:
        with open(port_file + ".tmp", "w") as f:
            f.write(str(server.server_address[1]))
        os.rename(port_file + ".tmp", port_file)
    print("listening", server.server_address[1], flush=True)
    server.serve_forever()


def connect(url, rcvbuf=0):
    parts = urllib.parse.urlsplit(url)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if rcvbuf:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.connect((parts.hostname, parts.port or 80))
    target = parts.path + ("?" + parts.query if parts.query else "")
    return sock, target, "%s:%d" % (parts.hostname, parts.port or 80)


def read_head(sock):
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("closed before the response head")
        data += chunk
    head, rest = data.split(b"\r\n\r\n", 1)
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return status, headers, rest


class Body:
    """Reads a response body after the head, hashing it; `complete` only when its framing ended.

    Received bytes sit in `buffer` from `pos` on (consumed bytes are dropped only when the buffer
    is compacted), so many small chunks cost no quadratic copying."""

    def __init__(self, sock, headers, rest):
        self.sock, self.buffer, self.pos, self.hash, self.bytes = sock, bytearray(rest), 0, hashlib.sha256(), 0
        self.chunked = "chunked" in headers.get("transfer-encoding", "").lower()
        self.length = None if self.chunked else (int(headers["content-length"]) if "content-length" in headers else None)

    def available(self):
        return len(self.buffer) - self.pos

    def fill(self):
        if self.pos > (1 << 20):
            del self.buffer[:self.pos]
            self.pos = 0
        chunk = self.sock.recv(1 << 20)
        if not chunk:
            raise EOFError
        self.buffer += chunk

    def consume(self, n):
        view = memoryview(self.buffer)[self.pos:self.pos + n]
        self.hash.update(view)
        view.release()
        self.pos += n
        self.bytes += n

    def line(self):
        while True:
            end = self.buffer.find(b"\r\n", self.pos)
            if end >= 0:
                text = bytes(self.buffer[self.pos:end])
                self.pos = end + 2
                return text
            self.fill()

    def read_all(self):
        """Returns True when the framing completed, False when the connection ended short of it."""
        try:
            if self.chunked:
                while True:
                    size = int(self.line().split(b";")[0], 16)
                    if size == 0:
                        while self.line() != b"":
                            pass
                        return True
                    while size > 0:
                        if not self.available():
                            self.fill()
                        n = min(size, self.available())
                        self.consume(n)
                        size -= n
                    if self.line() != b"":
                        raise ValueError("no CRLF after a chunk")
            elif self.length is not None:
                while self.bytes < self.length:
                    if not self.available():
                        self.fill()
                    self.consume(min(self.length - self.bytes, self.available()))
                return True
            else:
                while True:
                    if self.available():
                        self.consume(self.available())
                    self.fill()
        except (EOFError, ConnectionResetError):
            if not self.chunked:
                rest = self.available() if self.length is None else min(self.available(), self.length - self.bytes)
                self.consume(rest)
            return self.length is None and not self.chunked


def get(argv):
    url = argv[0]
    sock, target, host = connect(url)
    started = time.monotonic()
    sock.sendall(("GET %s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n" % (target, host)).encode())
    status, headers, rest = read_head(sock)
    body = Body(sock, headers, rest)
    complete = body.read_all()
    elapsed = time.monotonic() - started
    print(json.dumps({"status": status, "bytes": body.bytes, "sha256": body.hash.hexdigest(), "complete": complete,
                      "seconds": elapsed, "headers": headers}))


def put(argv):
    url, total, chunked, progress = argv[0], 0, False, None
    rest = argv[1:]
    while rest:
        option = rest.pop(0)
        if option == "--bytes":
            total = int(rest.pop(0))
        elif option == "--chunked":
            chunked = True
        elif option == "--progress":
            progress = rest.pop(0)

    def report(count):
        # Bytes the kernel accepted so far, for a test watching a held upload.
        if progress:
            with open(progress + ".tmp", "w") as f:
                f.write(str(count))
            os.replace(progress + ".tmp", progress)

    sock, target, host = connect(url)
    framing = "Transfer-Encoding: chunked" if chunked else "Content-Length: %d" % total
    started = time.monotonic()
    sock.sendall(("POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/octet-stream\r\n%s\r\n"
                  "Connection: close\r\n\r\n" % (target, host, framing)).encode())
    sent, step = 0, 256 * 1024
    h = hashlib.sha256()
    error = None
    try:
        while sent < total:
            size = min(step, total - sent)
            data = pattern(sent, size)
            h.update(data)
            if chunked:
                sock.sendall(b"%x\r\n" % size)
            sock.sendall(data)
            if chunked:
                sock.sendall(b"\r\n")
            sent += size
            if sent % (1 << 20) == 0:
                report(sent)
        report(sent)
        if chunked:
            sock.sendall(b"0\r\n\r\n")
    except OSError as e:
        error = str(e)
    try:
        status, headers, rest = read_head(sock)
        body = bytearray(rest)
        length = int(headers.get("content-length", "-1"))
        while length < 0 or len(body) < length:
            chunk = sock.recv(65536)
            if not chunk:
                break
            body += chunk
        answer = bytes(body).decode("utf-8", "replace")
    except (OSError, ConnectionError) as e:
        status, answer, error = 0, "", error or str(e)
    print(json.dumps({"status": status, "sent": sent, "sent_sha256": h.hexdigest(), "answer": answer,
                      "seconds": time.monotonic() - started, "error": error}))


def sse_ttfe(argv):
    url, repeat = argv[0], 20
    if "--repeat" in argv:
        repeat = int(argv[argv.index("--repeat") + 1])
    times = []
    for _ in range(repeat):
        sock, target, host = connect(url)
        started = time.monotonic()
        sock.sendall(("GET %s HTTP/1.1\r\nHost: %s\r\nAccept: text/event-stream\r\n\r\n" % (target, host)).encode())
        data = b""
        sock.settimeout(10)
        try:
            while b"data: first\n\n" not in data:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                data += chunk
        except socket.timeout:
            pass
        sock.close()
        if b"data: first\n\n" not in data:
            # A proxy that holds the stream: once is enough to know (each try costs 10 s).
            times.append(float("inf"))
            break
        times.append((time.monotonic() - started) * 1000)
    ordered = sorted(times)
    print(json.dumps({"median_ms": ordered[len(ordered) // 2], "all_ms": times}))


if __name__ == "__main__":
    command, args = sys.argv[1], sys.argv[2:]
    if command == "serve":
        serve(args)
    elif command == "digest":
        print(digest(int(args[0])))
    elif command == "get":
        get(args)
    elif command == "put":
        put(args)
    elif command == "sse-ttfe":
        sse_ttfe(args)
    else:
        sys.exit("unknown command " + command)
