#!/usr/bin/env python3
"""Closed-loop HTTP/1.1 load that accounts for every request (used by bench/faults).

Each worker thread owns one connection at a time and sends GET requests, either back to back on a
keep-alive connection (`ka`), one connection per request (`close`), or on a keep-alive connection
that idles 50-150 ms between requests (`idle`: the connection is often idle when a fault hits). Every request ends in exactly one
outcome:

  refused        connect() failed: nothing was sent (expected once a draining server stopped listening);
                 other connect failures are tallied as "connect-error <errno>", also not sent
  <status>       a complete response (Content-Length or chunked body fully read); a JSON error body's
                 "error" code is kept with the status, e.g. "503 credentials_unavailable"
  lost:*         the request was written but no complete response came back:
                   lost:no-response   the connection closed before any response byte
                   lost:truncated     it closed in the middle of a response
                   lost:timeout       nothing complete within --timeout (a hang)
                   lost:send-failed   the connection broke while the request was being written
                 each also says whether the connection was fresh or a reused keep-alive one, because
                 a reused connection the server closed while idle is the one case RFC 9112 §9.3.1 lets a
                 client retry; they are still counted as lost.

Outcomes are tallied per phase, in the phase where they end (a slow request sent before SIGTERM and
answered during the drain counts in the drain): the orchestrator writes the current phase name into
--phase-file, polled every 20 ms. Bodies of paths given with --record-body are tallied too (reload versions).
The run stops after --duration seconds or when --stop-file exists; the tally is written as JSON.
"""
import argparse
import errno
import json
import os
import random
import socket
import threading
import time

READ_CHUNK = 65536
MAX_HEAD = 64 * 1024


class Truncated(Exception):
    pass


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--worker", action="append", required=True,
                   help="MODE:COUNT:PATH, MODE ka (keep-alive), close or idle (keep-alive, pausing); repeatable")
    p.add_argument("--duration", type=float, required=True)
    p.add_argument("--timeout", type=float, default=10.0, help="whole-request deadline (a longer wait is a hang)")
    p.add_argument("--phase-file", required=True)
    p.add_argument("--stop-file")
    p.add_argument("--record-body", action="append", default=[], help="a path whose 200 bodies are tallied")
    p.add_argument("--out", required=True)
    return p.parse_args()


class Tally:
    def __init__(self):
        self.lock = threading.Lock()
        self.phases = {}   # phase -> {"outcomes": {name: n}, "latency": [..], "paths": {path: {outcome: n}}}
        self.bodies = {}   # path -> {body: n}
        self.order = []

    def add(self, phase, path, outcome, latency, body=None):
        with self.lock:
            entry = self.phases.get(phase)
            if entry is None:
                entry = self.phases[phase] = {"outcomes": {}, "latency": [], "paths": {}}
                self.order.append(phase)
            entry["outcomes"][outcome] = entry["outcomes"].get(outcome, 0) + 1
            per_path = entry["paths"].setdefault(path, {})
            per_path[outcome] = per_path.get(outcome, 0) + 1
            if outcome != "refused" and not outcome.startswith("connect-error"):
                entry["latency"].append(latency)
            if body is not None:
                seen = self.bodies.setdefault(path, {})
                seen[body] = seen.get(body, 0) + 1


class Phase:
    """The orchestrator's current phase, read from a file by one poller thread."""

    def __init__(self, path):
        self.path = path
        self.value = "start"
        self.read()

    def read(self):
        try:
            with open(self.path) as f:
                text = f.read().strip()
            if text:
                self.value = text
        except OSError:
            pass


def read_response(sock, deadline, buffer, resets):
    """Reads one response; returns (status, headers, body, leftover). Raises Truncated, socket.timeout.
    A connection reset ends the read like EOF; its errno is appended to `resets`."""
    def more():
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise socket.timeout()
        sock.settimeout(remaining)
        try:
            return sock.recv(READ_CHUNK)
        except socket.timeout:
            raise
        except OSError as error:
            resets.append(errno.errorcode.get(error.errno, str(error.errno)))
            return b""  # a reset is an end of the connection, like EOF

    data = buffer
    while b"\r\n\r\n" not in data:
        if len(data) > MAX_HEAD:
            raise Truncated("head too large")
        chunk = more()
        if not chunk:
            raise Truncated("eof in head" if data else "eof before response")
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/1."):
        raise Truncated("bad status line")
    status = int(parts[1])
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers.setdefault(name.strip().lower(), []).append(value.strip())
    if 100 <= status < 200:
        return read_response(sock, deadline, rest, resets)
    if status in (204, 304):
        return status, headers, b"", rest
    if "chunked" in ",".join(headers.get("transfer-encoding", [])).lower():
        body = b""
        while True:
            while b"\r\n" not in rest:
                chunk = more()
                if not chunk:
                    raise Truncated("eof in chunk size")
                rest += chunk
            size_line, _, rest = rest.partition(b"\r\n")
            size = int(size_line.split(b";")[0].strip(), 16)
            if size == 0:
                while b"\r\n\r\n" not in b"\r\n" + rest:  # trailers end with an empty line
                    chunk = more()
                    if not chunk:
                        raise Truncated("eof in trailers")
                    rest += chunk
                _, _, rest = (b"\r\n" + rest).partition(b"\r\n\r\n")
                return status, headers, body, rest
            while len(rest) < size + 2:
                chunk = more()
                if not chunk:
                    raise Truncated("eof in chunk")
                rest += chunk
            body += rest[:size]
            rest = rest[size + 2:]
    if "content-length" in headers:
        length = int(headers["content-length"][0])
        while len(rest) < length:
            chunk = more()
            if not chunk:
                raise Truncated("eof in body")
            rest += chunk
        return status, headers, rest[:length], rest[length:]
    # No length: the body runs to the end of the connection.
    while True:
        chunk = more()
        if not chunk:
            return status, headers, rest, b""
        rest += chunk


def error_code(headers, body):
    if "application/json" not in ",".join(headers.get("content-type", [])):
        return None
    try:
        value = json.loads(body).get("error")
        return value if isinstance(value, str) else None
    except (ValueError, AttributeError):
        return None


def worker(args, mode, path, tally, phase, stop):
    request = (f"GET {path} HTTP/1.1\r\nHost: {args.host}:{args.port}\r\nUser-Agent: portico-faults\r\n"
               + ("Connection: close\r\n" if mode == "close" else "") + "\r\n").encode()
    sock = None
    buffer = b""
    reused = False
    record = path in args.record_body
    while not stop.is_set():
        started = time.monotonic()
        deadline = started + args.timeout
        if sock is None:
            try:
                sock = socket.create_connection((args.host, args.port), timeout=args.timeout)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except ConnectionRefusedError:
                tally.add(phase.value, path, "refused", 0)
                sock = None
                time.sleep(0.02)
                continue
            except OSError as error:
                # A connect that times out or is reset was never a request.
                tally.add(phase.value, path, f"connect-error {errno.errorcode.get(error.errno, error.errno)}", 0)
                sock = None
                time.sleep(0.02)
                continue
            buffer = b""
            reused = False
        where = "reused" if reused else "fresh"
        try:
            sock.settimeout(max(0.001, deadline - time.monotonic()))
            sock.sendall(request)
        except (socket.timeout, OSError):
            tally.add(phase.value, path, f"lost:send-failed ({where})", time.monotonic() - started)
            sock.close()
            sock = None
            continue
        try:
            resets = []
            status, headers, body, buffer = read_response(sock, deadline, buffer, resets)
        except socket.timeout:
            tally.add(phase.value, path, f"lost:timeout ({where})", time.monotonic() - started)
            sock.close()
            sock = None
            continue
        except Truncated as error:
            kind = "no-response" if str(error) == "eof before response" else "truncated"
            how = f", {resets[0]}" if resets else ""
            tally.add(phase.value, path, f"lost:{kind} ({where}{how})", time.monotonic() - started)
            sock.close()
            sock = None
            continue
        latency = time.monotonic() - started
        code = error_code(headers, body) if status >= 400 else None
        outcome = f"{status} {code}" if code else str(status)
        tally.add(phase.value, path, outcome, latency, body.decode("utf-8", "replace").strip() if record and status == 200 else None)
        closing = "close" in ",".join(headers.get("connection", [])).lower()
        if mode == "close" or closing:
            sock.close()
            sock = None
        else:
            reused = True
            if mode == "idle":
                stop.wait(random.uniform(0.05, 0.15))


def percentile(values, fraction):
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def main():
    args = parse_args()
    tally = Tally()
    phase = Phase(args.phase_file)
    stop = threading.Event()
    threads = []
    for spec in args.worker:
        mode, count, path = spec.split(":", 2)
        assert mode in ("ka", "close", "idle"), spec
        for _ in range(int(count)):
            t = threading.Thread(target=worker, args=(args, mode, path, tally, phase, stop), daemon=True)
            threads.append(t)
    for t in threads:
        t.start()
    end = time.monotonic() + args.duration
    while time.monotonic() < end and not (args.stop_file and os.path.exists(args.stop_file)):
        time.sleep(0.02)
        phase.read()
    stop.set()
    # Requests in flight finish (or time out) before the tally is written.
    for t in threads:
        t.join(args.timeout + 5)
    result = {"phases": []}
    with tally.lock:
        for name in tally.order:
            entry = tally.phases[name]
            result["phases"].append({
                "phase": name,
                "outcomes": entry["outcomes"],
                "paths": entry["paths"],
                "latency_p50_ms": round(percentile(entry["latency"], 0.5) * 1000, 1),
                "latency_p99_ms": round(percentile(entry["latency"], 0.99) * 1000, 1),
                "latency_max_ms": round(max(entry["latency"], default=0) * 1000, 1),
            })
        result["bodies"] = tally.bodies
        result["unfinished_workers"] = sum(t.is_alive() for t in threads)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
