#!/usr/bin/env python3
"""Connection floods against a running gateway; one scenario per call, a Markdown section out.

  floods.py SCENARIO --pid PID --port P --admin-port A [scale options]

  idle      N connections opened and kept idle (every other one after one keep-alive request, the
            rest silent), two rounds: the gateway's descriptors and RSS before, with them open, and
            after its idle/header timeouts closed them
  flood     connections opened and closed as fast as possible, four kinds in turn: plain close,
            half a request head then close, RST (SO_LINGER 0), half a head then RST; two rounds
  midway    clients that leave mid-request: half a head, a body cut short, a whole request to the
            slow upstream route closed (FIN or RST) before the answer
  limit     against a gateway whose connection_limit is --limit: that many connections held, extra
            ones must be closed at once, the held ones still served, new ones served after they close

A probe thread makes one request on a fresh connection every 50 ms throughout; every probe must be
answered 200. The gateway's descriptors are counted in /proc/PID/fd, its RSS read from
/proc/PID/status. Exit status 1 when a check fails; the section says which.
"""
import argparse
import os
import re
import selectors
import socket
import statistics
import struct
import sys
import threading
import time
import urllib.request

PING = b"GET /ping HTTP/1.1\r\nHost: floods\r\n\r\n"


# ---- the gateway, seen from outside ---------------------------------------------------------

UPSTREAM_PORT = None  # set from --upstream-port


def upstream_sockets(pid):
    """The gateway's descriptors for connections to the upstream (its pool keeps them open)."""
    if UPSTREAM_PORT is None:
        return 0
    inodes = set()
    for name in ("tcp", "tcp6"):
        try:
            with open(f"/proc/{pid}/net/{name}") as f:
                next(f)
                for line in f:
                    fields = line.split()
                    if int(fields[2].rsplit(":", 1)[1], 16) == UPSTREAM_PORT:
                        inodes.add(fields[9])
        except OSError:
            pass
    count = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:[") and target[8:-1] in inodes:
            count += 1
    return count


def fds(pid):
    return len(os.listdir(f"/proc/{pid}/fd"))


def client_fds(pid):
    """Open descriptors, not counting pooled upstream connections (bounded by max_connections,
    kept open by design): what clients can make the gateway hold."""
    return fds(pid) - upstream_sockets(pid)


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def in_flight(admin_port):
    text = urllib.request.urlopen(f"http://127.0.0.1:{admin_port}/metrics", timeout=5).read().decode()
    m = re.search(r"^portico_in_flight_requests(?:\{[^}]*\})? ([0-9.e+-]+)$", text, re.M)
    return float(m.group(1)) if m else None


def settle(pid, target, tolerance, timeout, count=fds):
    """Waits until the descriptor count is within `tolerance` of `target`; returns (count, seconds)."""
    start = time.monotonic()
    while True:
        n = count(pid)
        if n <= target + tolerance or time.monotonic() - start > timeout:
            return n, time.monotonic() - start
        time.sleep(0.1)


class Watch:
    """Samples the gateway's descriptors and RSS every 100 ms (peaks) and probes it every 50 ms."""

    def __init__(self, pid, port, probing=True):
        self.pid, self.port = pid, port
        self.stop_event = threading.Event()
        self.latencies, self.failures = [], []
        self.peak_fds = self.peak_rss = 0
        self.threads = [threading.Thread(target=self.sample, daemon=True)]
        if probing:
            self.threads.append(threading.Thread(target=self.probe, daemon=True))

    def __enter__(self):
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc):
        self.stop_event.set()
        for t in self.threads:
            t.join()

    def sample(self):
        while not self.stop_event.is_set():
            try:
                self.peak_fds = max(self.peak_fds, fds(self.pid))
                self.peak_rss = max(self.peak_rss, rss_kib(self.pid))
            except OSError:
                pass
            self.stop_event.wait(0.1)

    def probe(self):
        request = f"GET /ping HTTP/1.1\r\nHost: probe\r\nConnection: close\r\n\r\n".encode()
        while not self.stop_event.is_set():
            start = time.monotonic()
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=10) as s:
                    s.sendall(request)
                    data = b""
                    while b"\r\n" not in data:
                        chunk = s.recv(4096)
                        if not chunk:
                            break
                        data += chunk
                    status = data.split(b" ", 2)[1].decode() if data.startswith(b"HTTP/") else "none"
                if status == "200":
                    self.latencies.append((time.monotonic() - start) * 1000)
                else:
                    self.failures.append(f"status {status}")
            except OSError as e:
                self.failures.append(type(e).__name__)
            self.stop_event.wait(0.05)

    def summary(self):
        lat = sorted(self.latencies)
        p50 = statistics.median(lat) if lat else float("nan")
        p99 = lat[min(len(lat) - 1, int(len(lat) * 0.99))] if lat else float("nan")
        return {"probes": len(lat) + len(self.failures), "probe_failures": len(self.failures),
                "probe_p50_ms": round(p50, 1), "probe_p99_ms": round(p99, 1),
                "probe_max_ms": round(lat[-1], 1) if lat else float("nan")}


# ---- clients ----------------------------------------------------------------------------------

def rst_close(s):
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    s.close()


def open_many(port, count, send_every, deadline_s):
    """Opens `count` connections without blocking; every `send_every`-th sends PING and reads its
    answer. Returns (sockets, seconds to open, requests answered 200, failures)."""
    sel = selectors.DefaultSelector()
    socks, answered, failures = [], 0, 0
    start = time.monotonic()
    pending = {}
    for i in range(count):
        s = socket.socket()
        s.setblocking(False)
        s.connect_ex(("127.0.0.1", port))
        socks.append(s)
        pending[s] = [i % send_every == 0, b""]
        sel.register(s, selectors.EVENT_WRITE)
        # Keep at most 512 handshakes outstanding: the listen backlog is the limit, not us.
        while len(pending) >= 512 or (i == count - 1 and pending):
            if time.monotonic() - start > deadline_s:
                break
            for key, ev in sel.select(timeout=1):
                s2 = key.fileobj
                state = pending[s2]
                if ev & selectors.EVENT_WRITE:
                    err = s2.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                    if err:
                        failures += 1
                        sel.unregister(s2)
                        del pending[s2]
                    elif state[0]:
                        s2.send(PING)
                        sel.modify(s2, selectors.EVENT_READ)
                    else:
                        sel.unregister(s2)
                        del pending[s2]
                else:
                    try:
                        chunk = s2.recv(4096)
                    except OSError:
                        chunk = b""
                    state[1] += chunk
                    if not chunk or b"\r\n\r\n" in state[1]:
                        if state[1].startswith(b"HTTP/1.1 200"):
                            answered += 1
                        else:
                            failures += 1
                        sel.unregister(s2)
                        del pending[s2]
        if time.monotonic() - start > deadline_s:
            failures += len(pending)
            break
    sel.close()
    return socks, time.monotonic() - start, answered, failures


def open_count(socks):
    """How many of `socks` the gateway has not closed (no EOF or reset pending)."""
    alive = 0
    for s in socks:
        try:
            data = s.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
            if data:
                alive += 1  # unexpected bytes, but still open
        except BlockingIOError:
            alive += 1
        except OSError:
            pass
    return alive


# ---- scenarios --------------------------------------------------------------------------------

def scenario_idle(a, out, fail):
    base_fds, base_rss = fds(a.pid), rss_kib(a.pid)
    out["fds before"] = base_fds
    out["RSS before"] = f"{base_rss / 1024:.1f} MiB"
    rounds = []
    with Watch(a.pid, a.port) as watch:
        for r in (1, 2):
            socks, took, answered, failures = open_many(a.port, a.idle, 2, deadline_s=a.idle_timeout * 0.8)
            # The gateway accepts asynchronously: wait until its descriptors stop rising.
            last, stable_since = -1, time.monotonic()
            while time.monotonic() - stable_since < 0.5:
                n = fds(a.pid)
                if n != last:
                    last, stable_since = n, time.monotonic()
                time.sleep(0.1)
            held = open_count(socks)
            open_fds, open_rss = fds(a.pid), rss_kib(a.pid)
            closed_start = time.monotonic()
            while open_count(socks) > 0 and time.monotonic() - closed_start < a.idle_timeout * 3 + 10:
                time.sleep(0.5)
            still_open = open_count(socks)
            closed_after = time.monotonic() - closed_start
            for s in socks:
                s.close()
            after_fds, settle_s = settle(a.pid, base_fds, a.fd_tolerance, 30)
            after_rss = rss_kib(a.pid)
            rounds.append(dict(round=r, opened=len(socks) - failures, open_s=took, answered=answered, failures=failures,
                               held=held, open_fds=open_fds, open_rss=open_rss, closed_s=closed_after,
                               still_open=still_open, after_fds=after_fds, after_rss=after_rss))
            if failures:
                fail(f"round {r}: {failures} of {a.idle} connections failed to open or to get their 200")
            if held < a.idle - failures:
                fail(f"round {r}: only {held} of {a.idle} connections were still open when counted")
            if still_open:
                fail(f"round {r}: {still_open} connections still open {closed_after:.0f} s later")
            if after_fds > base_fds + a.fd_tolerance:
                fail(f"round {r}: {after_fds} descriptors after, baseline {base_fds} (+{a.fd_tolerance})")
    out["rounds"] = "<br>".join(
        f"round {x['round']}: {x['opened']} opened in {x['open_s']:.1f} s ({x['answered']} after a 200), "
        f"{x['held']} open at once: **{x['open_fds']} fds, RSS {x['open_rss'] / 1024:.1f} MiB** "
        f"({(x['open_rss'] - base_rss) / max(1, x['held']):.1f} KiB per connection); "
        f"all closed by the gateway {x['closed_s']:.1f} s later; after: **{x['after_fds']} fds, "
        f"RSS {x['after_rss'] / 1024:.1f} MiB**" for x in rounds)
    growth = rounds[1]["after_rss"] - rounds[0]["after_rss"]
    out["RSS growth after round 1 → after round 2"] = f"{growth / 1024:+.1f} MiB"
    # A leak of 1 KiB per connection would show as N KiB more after the second round. (Peaks are
    # not compared: a round slowed by the machine holds fewer connections at once.)
    if growth > a.idle * 1:
        fail(f"RSS after the connections closed grew {growth} KiB from round 1 to 2 (leak?)")
    return watch


def flood_round(port, count, workers):
    """Opens and closes `count` connections from `workers` threads; returns (done, errors, seconds)."""
    half = b"GET /ping HTTP/1.1\r\nHost: fl"
    counter = iter(range(count))
    lock = threading.Lock()
    done, errors = [0], {}

    def work():
        while True:
            with lock:
                i = next(counter, None)
            if i is None:
                return
            kind = i % 4
            try:
                s = socket.create_connection(("127.0.0.1", port), timeout=10)
                if kind in (1, 3):
                    s.send(half)
                if kind >= 2:
                    rst_close(s)
                else:
                    s.close()
                with lock:
                    done[0] += 1
            except OSError as e:
                with lock:
                    errors[type(e).__name__] = errors.get(type(e).__name__, 0) + 1

    start = time.monotonic()
    threads = [threading.Thread(target=work) for _ in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return done[0], errors, time.monotonic() - start


def scenario_flood(a, out, fail):
    base_fds, base_rss = fds(a.pid), rss_kib(a.pid)
    out["fds before"] = base_fds
    out["RSS before"] = f"{base_rss / 1024:.1f} MiB"
    lines, after = [], []
    with Watch(a.pid, a.port) as watch:
        for r in (1, 2):
            done, errors, took = flood_round(a.port, a.flood // 2, a.workers)
            after_fds, settle_s = settle(a.pid, base_fds, a.fd_tolerance, 30)
            after_rss = rss_kib(a.pid)
            after.append(after_rss)
            lines.append(f"round {r}: {done} connections in {took:.1f} s ({done / took:.0f}/s; a quarter each plain "
                         f"close, half a head + close, RST, half a head + RST), client errors: "
                         f"{', '.join(f'{k} {v}' for k, v in errors.items()) or 'none'}; after: **{after_fds} fds** "
                         f"(settled in {settle_s:.1f} s), **RSS {after_rss / 1024:.1f} MiB**")
            if errors:
                fail(f"round {r}: client errors {errors}")
            if after_fds > base_fds + a.fd_tolerance:
                fail(f"round {r}: {after_fds} descriptors after, baseline {base_fds} (+{a.fd_tolerance})")
    out["rounds"] = "<br>".join(lines)
    out["peak during flood"] = f"{watch.peak_fds} fds, RSS {watch.peak_rss / 1024:.1f} MiB"
    growth = after[1] - after[0]
    out["RSS growth round 1 → 2"] = f"{growth / 1024:+.1f} MiB"
    if growth > 4096:
        fail(f"RSS grew {growth} KiB from round 1 to round 2 (leak?)")
    return watch


def scenario_midway(a, out, fail):
    base_fds, base_rss = client_fds(a.pid), rss_kib(a.pid)
    out["fds before (not counting pooled upstream connections)"] = base_fds
    out["RSS before"] = f"{base_rss / 1024:.1f} MiB"
    n = a.midway
    lines = []
    with Watch(a.pid, a.port) as watch:
        # 1. half a head, then close (FIN) or RST.
        for i in range(n):
            s = socket.create_connection(("127.0.0.1", a.port), timeout=10)
            s.sendall(b"POST /up/ok HTTP/1.1\r\nHost: midway\r\nContent-Le")
            rst_close(s) if i % 2 else s.close()
        f1, _ = settle(a.pid, base_fds, a.fd_tolerance, 30, client_fds)
        lines.append(f"{n} half heads then close/RST: after **{f1} fds**")
        # 2. a body cut short: Content-Length 100000, 1000 bytes sent.
        socks = []
        for i in range(n):
            s = socket.create_connection(("127.0.0.1", a.port), timeout=10)
            s.sendall(b"POST /up/ok HTTP/1.1\r\nHost: midway\r\nContent-Length: 100000\r\n\r\n" + b"x" * 1000)
            socks.append(s)
        time.sleep(0.2)  # the bodies' first bytes reach the gateway before the clients go
        for i, s in enumerate(socks):
            rst_close(s) if i % 2 else s.close()
        f2, _ = settle(a.pid, base_fds, a.fd_tolerance, 30, client_fds)
        lines.append(f"{n} bodies cut short (1000 of 100000 bytes) then close/RST: after **{f2} fds**")
        # 3. whole requests to the slow route, the client gone before the answer.
        socks = []
        slow = f"GET /up/slow?ms={a.slow_ms} HTTP/1.1\r\nHost: midway\r\n\r\n".encode()
        for i in range(n):
            s = socket.create_connection(("127.0.0.1", a.port), timeout=10)
            s.sendall(slow)
            socks.append(s)
        seen, peak_in_flight = time.monotonic(), 0.0
        # Until every one is in flight (or half the upstream's delay has passed).
        while time.monotonic() - seen < a.slow_ms / 2000 and peak_in_flight < n:
            peak_in_flight = max(peak_in_flight, in_flight(a.admin_port) or 0)
            time.sleep(0.05)
        for i, s in enumerate(socks):
            rst_close(s) if i % 2 else s.close()
        start = time.monotonic()
        while (in_flight(a.admin_port) or 0) > 0 and time.monotonic() - start < 60:
            time.sleep(0.1)
        zero_after = time.monotonic() - start
        final_in_flight = in_flight(a.admin_port)
        f3, _ = settle(a.pid, base_fds, a.fd_tolerance, 30, client_fds)
        lines.append(f"{n} requests to /up/slow?ms={a.slow_ms}, closed (half FIN, half RST) while in flight "
                     f"(peak portico_in_flight_requests {peak_in_flight:.0f}): in flight back to "
                     f"**{final_in_flight:.0f}** {zero_after:.1f} s after the clients left (a suspended request "
                     f"runs to its upstream answer or deadline; nobody reads the answer); after **{f3} fds**")
        if peak_in_flight < n * 0.9:
            fail(f"only {peak_in_flight:.0f} of {n} slow requests were seen in flight")
        if final_in_flight != 0:
            fail(f"in flight {final_in_flight} after the slow requests ended")
        for label, f in (("half heads", f1), ("short bodies", f2), ("slow requests", f3)):
            if f > base_fds + a.fd_tolerance:
                fail(f"{label}: {f} descriptors after, baseline {base_fds} (+{a.fd_tolerance})")
    out["steps"] = "<br>".join(lines)
    out["pooled upstream connections after (not counted above; max_connections 512)"] = upstream_sockets(a.pid)
    out["RSS after"] = f"{rss_kib(a.pid) / 1024:.1f} MiB"
    return watch


def time_to_close(port):
    """Connects, sends a request, and waits for the gateway's verdict: ('closed', seconds) on EOF or
    reset with no answer, ('answered <status>', seconds), or ('hang', seconds) after 10 s."""
    start = time.monotonic()
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    try:
        try:
            s.sendall(PING)
        except OSError:
            return "closed", time.monotonic() - start
        data = s.recv(4096)
        if not data:
            return "closed", time.monotonic() - start
        return "answered " + data.split(b" ", 2)[1].decode(), time.monotonic() - start
    except ConnectionResetError:
        return "closed", time.monotonic() - start
    except socket.timeout:
        return "hang", time.monotonic() - start
    finally:
        s.close()


def scenario_limit(a, out, fail):
    base_fds = fds(a.pid)
    out["connection_limit"] = a.limit
    out["fds before"] = base_fds
    # No probe thread: a probe would take one of the slots. The held connections are the probes.
    with Watch(a.pid, a.port, probing=False) as watch:
        held, took, answered, failures = open_many(a.port, a.limit, 1, deadline_s=30)
        if answered != a.limit:
            fail(f"{answered} of {a.limit} held connections got their 200 ({failures} failed)")
        extra = [time_to_close(a.port) for _ in range(a.extra)]
        closed = [t for verdict, t in extra if verdict == "closed"]
        others = [v for v, _ in extra if v != "closed"]
        out["extra connections"] = (f"{a.extra} past the limit: {len(closed)} closed without an answer, "
                                    f"time to EOF/RST p50 {statistics.median(closed) * 1000 if closed else float('nan'):.1f} ms, "
                                    f"max {max(closed) * 1000 if closed else float('nan'):.1f} ms"
                                    + (f"; other outcomes: {', '.join(others)}" if others else ""))
        if others:
            fail(f"past the limit, {len(others)} connections were not closed: {sorted(set(others))}")
        if closed and max(closed) > 1.0:
            fail(f"closing a connection past the limit took {max(closed):.2f} s")
        # The held connections are still served.
        served = 0
        for s in held:
            s.setblocking(True)
            s.settimeout(10)
            try:
                s.sendall(PING)
                data = s.recv(4096)
                served += data.startswith(b"HTTP/1.1 200")
            except OSError:
                pass
        out["held connections served meanwhile"] = f"{served} of {len(held)}"
        if served != len(held):
            fail(f"only {served} of {len(held)} held connections answered while at the limit")
        for s in held:
            s.close()
        start = time.monotonic()
        verdict = None
        while time.monotonic() - start < 10:
            verdict, _ = time_to_close(a.port)
            if verdict == "answered 200":
                break
            time.sleep(0.02)
        recovered = time.monotonic() - start
        out["after the held ones closed"] = f"{verdict} on a new connection after {recovered * 1000:.0f} ms"
        if verdict != "answered 200":
            fail(f"no new connection served within 10 s after the held ones closed ({verdict})")
        after_fds, _ = settle(a.pid, base_fds, a.fd_tolerance, 30)
        out["fds after"] = after_fds
        if after_fds > base_fds + a.fd_tolerance:
            fail(f"{after_fds} descriptors after, baseline {base_fds} (+{a.fd_tolerance})")
    return watch


TITLES = {
    "idle": "idle connections held until the gateway's timeouts close them",
    "flood": "a flood of new connections (close, half a head, RST)",
    "midway": "clients that disconnect mid-request",
    "limit": "past listen.connection_limit",
}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("scenario", choices=sorted(TITLES))
    p.add_argument("--pid", type=int, required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--admin-port", type=int, required=True)
    p.add_argument("--idle", type=int, default=10000)
    p.add_argument("--idle-timeout", type=float, default=10)
    p.add_argument("--flood", type=int, default=20000)
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--midway", type=int, default=300)
    p.add_argument("--slow-ms", type=int, default=10000)
    p.add_argument("--limit", type=int, default=100)
    p.add_argument("--extra", type=int, default=50)
    p.add_argument("--fd-tolerance", type=int, default=4)
    p.add_argument("--upstream-port", type=int)
    a = p.parse_args()
    global UPSTREAM_PORT
    UPSTREAM_PORT = a.upstream_port
    out, failures = {}, []
    watch = globals()[f"scenario_{a.scenario}"](a, out, failures.append)
    summary = watch.summary()
    if summary["probe_failures"]:
        failures.append(f"{summary['probe_failures']} probes not answered 200 ({', '.join(sorted(set(watch.failures)))})")
    if a.scenario != "limit":
        out["probes (new connection each, every 50 ms)"] = (
            f"{summary['probes']} sent, {summary['probe_failures']} failed, latency p50 {summary['probe_p50_ms']} ms, "
            f"p99 {summary['probe_p99_ms']} ms, max {summary['probe_max_ms']} ms")
    if a.scenario == "idle":
        out["peak"] = f"{watch.peak_fds} fds, RSS {watch.peak_rss / 1024:.1f} MiB"
    print(f"#### {a.scenario}: {TITLES[a.scenario]}")
    print()
    print("| | |")
    print("|---|---|")
    for k, v in out.items():
        print(f"| {k} | {v} |")
    print()
    print("**PASS**" if not failures else "**FAIL**: " + "; ".join(failures))
    print()
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
