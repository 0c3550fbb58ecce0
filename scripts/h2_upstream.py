#!/usr/bin/env python3
"""An HTTP/2 upstream (cleartext, prior knowledge) for Portico's HTTP/2 tests, on Python's `h2`
(PyPI; scripts/test installs it): honest on some paths, hostile on others.

    h2_upstream.py PORT EVENTS_FILE

Each thing it sees or does is one JSON line appended to EVENTS_FILE, which the tests read:
  connection   {conn}                               a connection was accepted
  request      {conn, stream, path, after_goaway}   a request's HEADERS arrived
  goaway       {conn, code, last}                   the gateway's first GOAWAY (code: RFC 9113's number)
  reset        {conn, stream, code}                 the gateway reset a stream (RST_STREAM)
  stream_done  {conn, stream, bytes}                a streamed response was sent to its end
  received     {conn, stream, bytes}                what a stalled upload delivered before it ended
  attack       {conn, kind, frames, bytes, ending, goaway}
               a hostile answer: how many frames and bytes went out before `ending` (`closed`: the
               gateway closed or reset the connection; `timeout`: it neither read nor closed for
               30 s; `cap`: the flood reached its cap still open), and its first GOAWAY's code
  closed       {conn}                               the connection ended

Paths:
  /ok                    200 "ok\\n"
  /echo                  200 with the request body
  /slow?bytes=N&ms=M     200, N bytes of a fixed pattern (byte i = (i * 7 + 3) % 256) in 16 KiB
                         chunks every M ms, within the flow-control windows
  /trailers              200, a chunked body "hello\\n" then trailers (x-checksum, x-status)
  /stall                 reads the request body without opening the stream's window (16 KiB;
                         the connection's window is opened, so other streams flow) and never answers
  /attack/KIND           a hostile answer, KIND one of: huge-headers, many-headers,
                         continuation-flood, settings-flood, ping-flood, rst-flood,
                         empty-data-flood, max-frame-size, malformed-frame;
                         /attack/header-table-size answers 200 after an absurd HEADER_TABLE_SIZE
"""
import json
import select
import socket
import sys
import threading
import time
from urllib.parse import parse_qs, urlsplit

import h2.config
import h2.connection
import h2.events
import h2.exceptions
import h2.settings

PORT = int(sys.argv[1])
EVENTS = sys.argv[2]
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
# A flood stops here if the gateway never closes (the test then fails: `cap`).
FLOOD_CAP_BYTES = 256 * 1024 * 1024
FLOOD_CAP_SECONDS = 60

lock = threading.Lock()
counter = [0]


def record(**event):
    with lock:
        with open(EVENTS, "a") as events:
            events.write(json.dumps(event) + "\n")


def frame(kind, flags, stream, payload=b""):
    return len(payload).to_bytes(3, "big") + bytes([kind, flags]) + stream.to_bytes(4, "big") + payload


DATA, HEADERS, RST_STREAM, SETTINGS, PING, GOAWAY, CONTINUATION = 0, 1, 3, 4, 6, 7, 9
END_STREAM, END_HEADERS = 0x1, 0x4


def hpack_int(value, prefix_bits, first=0):
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes([first | value])
    out = [first | limit]
    value -= limit
    while value >= 128:
        out.append((value & 127) | 128)
        value >>= 7
    out.append(value)
    return bytes(out)


def literal(name, value):
    """A literal header field without indexing, new name, no Huffman (RFC 7541 §6.2.2): it
    leaves the HPACK dynamic tables as they were, so h2's encoder stays in step."""
    return b"\x00" + hpack_int(len(name), 7) + name + hpack_int(len(value), 7) + value


STATUS_200 = b"\x88"  # indexed :status 200


def pattern(start, count):
    return bytes((i * 7 + 3) % 256 for i in range(start, start + count))


class Connection:
    def __init__(self, sock, number):
        self.sock = sock
        self.number = number
        config = h2.config.H2Configuration(client_side=False, header_encoding="utf-8")
        self.h2 = h2.connection.H2Connection(config=config)
        # A 16 KiB stream window (a stalled upload fills it at once; the honest paths open it as they read).
        self.h2.local_settings = h2.settings.Settings(
            client=False, initial_values={h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 16384})
        self.raw = b""            # bytes not yet split into frames (after the preface)
        self.preface_seen = False
        self.goaway_code = None
        self.streams = {}         # stream id -> {"path", "body"}
        self.slow = {}            # stream id -> [sent, total, interval, next time]
        self.stalled = {}         # stream id -> bytes received
        self.known_streams = set()

    def send(self):
        data = self.h2.data_to_send()
        if data:
            self.sock.sendall(data)

    # The gateway's bytes: split into frames here, so that GOAWAY (which would make h2 refuse
    # to send anything more, even on the streams that are to finish) is recorded, not fed to h2.
    def frames_in(self, data):
        self.raw += data
        if not self.preface_seen:
            if len(self.raw) < len(PREFACE):
                return []
            self.preface_seen = True
            self.raw = self.raw[len(PREFACE):]
            passed = [PREFACE]
        else:
            passed = []
        while len(self.raw) >= 9:
            length = int.from_bytes(self.raw[:3], "big")
            if len(self.raw) < 9 + length:
                break
            kind, stream = self.raw[3], int.from_bytes(self.raw[5:9], "big") & 0x7FFFFFFF
            whole, self.raw = self.raw[:9 + length], self.raw[9 + length:]
            if kind == GOAWAY:
                last = int.from_bytes(whole[9:13], "big") & 0x7FFFFFFF
                code = int.from_bytes(whole[13:17], "big")
                if self.goaway_code is None:
                    record(event="goaway", conn=self.number, code=code, last=last)
                    self.goaway_code = code
                continue
            if kind == HEADERS and stream not in self.known_streams:
                self.known_streams.add(stream)
            passed.append(whole)
        return passed

    def serve(self):
        self.h2.initiate_connection()
        self.send()
        while True:
            timeout = 0.005 if self.slow else 1.0
            readable, _, _ = select.select([self.sock], [], [], timeout)
            if readable:
                try:
                    data = self.sock.recv(65536)
                except OSError:
                    data = b""
                if not data:
                    return
                for chunk in self.frames_in(data):
                    try:
                        events = self.h2.receive_data(chunk)
                    except h2.exceptions.ProtocolError as error:
                        record(event="h2_error", conn=self.number, error=str(error))
                        return
                    for event in events:
                        if self.handle(event) == "hostile":
                            return
                self.send()
            self.progress()
            self.send()

    def handle(self, event):
        if isinstance(event, h2.events.RequestReceived):
            headers = dict(event.headers)
            path = headers.get(":path", "/")
            record(event="request", conn=self.number, stream=event.stream_id, path=path,
                   after_goaway=self.goaway_code is not None)
            self.streams[event.stream_id] = {"path": path, "body": b""}
            if path.startswith("/attack/"):
                kind = path[len("/attack/"):]
                if kind == "header-table-size":
                    self.h2.update_settings({h2.settings.SettingCodes.HEADER_TABLE_SIZE: 2**32 - 1})
                    self.send()
                    return None
                self.attack(kind, event.stream_id)
                return "hostile"
            if path == "/stall":
                self.stalled[event.stream_id] = 0
            # Answered at its StreamEnded event (h2 sends one after this, also for a bodiless request).
        elif isinstance(event, h2.events.DataReceived):
            if event.stream_id in self.stalled:
                # The connection's window opens (the other streams flow); the stream's stays shut.
                self.stalled[event.stream_id] += len(event.data)
                if event.flow_controlled_length:
                    self.h2.increment_flow_control_window(event.flow_controlled_length)
                return None
            stream = self.streams.get(event.stream_id)
            if stream is not None:
                stream["body"] += event.data
            self.h2.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
        elif isinstance(event, h2.events.StreamEnded):
            if event.stream_id in self.streams and event.stream_id not in self.stalled:
                self.answer(event.stream_id)
        elif isinstance(event, h2.events.StreamReset):
            record(event="reset", conn=self.number, stream=event.stream_id, code=int(event.error_code))
            self.slow.pop(event.stream_id, None)
            if event.stream_id in self.stalled:
                record(event="received", conn=self.number, stream=event.stream_id,
                       bytes=self.stalled.pop(event.stream_id))
        return None

    def answer(self, stream_id):
        path = self.streams[stream_id]["path"]
        url = urlsplit(path)
        if url.path == "/ok" or url.path == "/attack/header-table-size":
            self.respond(stream_id, b"ok\n")
        elif url.path == "/echo":
            self.respond(stream_id, self.streams[stream_id]["body"])
        elif url.path == "/slow":
            query = parse_qs(url.query)
            total = int(query.get("bytes", ["1048576"])[0])
            interval = int(query.get("ms", ["20"])[0]) / 1000
            self.h2.send_headers(stream_id, [(":status", "200"), ("content-type", "application/octet-stream"),
                                             ("content-length", str(total))])
            self.slow[stream_id] = [0, total, interval, time.monotonic()]
        elif url.path == "/trailers":
            self.h2.send_headers(stream_id, [(":status", "200"), ("content-type", "text/plain")])
            self.h2.send_data(stream_id, b"hello\n")
            self.h2.send_headers(stream_id, [("x-checksum", "abc123"), ("x-status", "done")], end_stream=True)
        else:
            self.respond(stream_id, b"not found\n", status="404")

    def respond(self, stream_id, body, status="200"):
        self.h2.send_headers(stream_id, [(":status", status), ("content-length", str(len(body)))])
        sent = 0
        # Small bodies only (the tests' /ok and /echo): the windows Portico opens hold them.
        while sent < len(body):
            size = min(len(body) - sent, self.h2.local_flow_control_window(stream_id), self.h2.max_outbound_frame_size)
            if size <= 0:
                raise RuntimeError("window shut for a small body")
            self.h2.send_data(stream_id, body[sent:sent + size])
            sent += size
        self.h2.end_stream(stream_id)

    def progress(self):
        now = time.monotonic()
        for stream_id, state in list(self.slow.items()):
            sent, total, interval, due = state
            if now < due:
                continue
            try:
                window = self.h2.local_flow_control_window(stream_id)
            except h2.exceptions.StreamClosedError:
                self.slow.pop(stream_id)
                continue
            size = min(16384, total - sent, window, self.h2.max_outbound_frame_size)
            if size <= 0:
                continue
            self.h2.send_data(stream_id, pattern(sent, size))
            state[0] = sent + size
            state[3] = now + interval
            if state[0] == total:
                self.h2.end_stream(stream_id)
                self.slow.pop(stream_id)
                record(event="stream_done", conn=self.number, stream=stream_id, bytes=total)

    # Hostile answers: h2 is left behind (its state would not follow), the frames are built here.
    def attack(self, kind, stream):
        self.send()
        frames = flood(kind, stream)
        sent_frames = sent_bytes = 0
        ending = "cap"
        self.sock.settimeout(30)
        started = time.monotonic()
        try:
            for item in frames:
                self.sock.sendall(item)
                sent_frames += 1
                sent_bytes += len(item)
                self.drain_input()
                if sent_bytes > FLOOD_CAP_BYTES or time.monotonic() - started > FLOOD_CAP_SECONDS:
                    break
            else:
                # A finite answer: wait (30 s at most) for the gateway to close.
                ending = self.wait_for_close()
        except socket.timeout:
            ending = "timeout"
        except OSError:
            ending = "closed"
        record(event="attack", conn=self.number, kind=kind, frames=sent_frames, bytes=sent_bytes,
               ending=ending, goaway=self.goaway_code)

    def drain_input(self):
        """Reads what the gateway sent (non-blocking), for its GOAWAY; raises once it closed."""
        while True:
            readable, _, _ = select.select([self.sock], [], [], 0)
            if not readable:
                return
            data = self.sock.recv(65536)
            if not data:
                raise ConnectionResetError("closed by the gateway")
            self.frames_in(data)

    def wait_for_close(self):
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            readable, _, _ = select.select([self.sock], [], [], 0.1)
            if readable:
                try:
                    data = self.sock.recv(65536)
                except OSError:
                    return "closed"
                if not data:
                    return "closed"
                self.frames_in(data)
        return "timeout"


def flood(kind, stream):
    if kind == "huge-headers":
        # A 1 MiB header block in 16 KiB frames (within the gateway's MAX_FRAME_SIZE).
        block = STATUS_200 + b"".join(literal(b"x-huge-%05d" % i, b"v" * 1000) for i in range(1024))
        pieces = [block[i:i + 16384] for i in range(0, len(block), 16384)]
        for index, piece in enumerate(pieces):
            last = END_HEADERS if index == len(pieces) - 1 else 0
            yield frame(HEADERS if index == 0 else CONTINUATION, last | (END_STREAM if index == 0 else 0), stream, piece)
    elif kind == "many-headers":
        # 6000 tiny fields: a 30 KB block, a 200 KB header list as RFC 9113 counts (32 bytes a field).
        block = STATUS_200 + literal(b"a", b"b") * 6000
        pieces = [block[i:i + 16384] for i in range(0, len(block), 16384)]
        for index, piece in enumerate(pieces):
            last = END_HEADERS if index == len(pieces) - 1 else 0
            yield frame(HEADERS if index == 0 else CONTINUATION, last | (END_STREAM if index == 0 else 0), stream, piece)
    elif kind == "continuation-flood":
        # HEADERS without END_HEADERS, then CONTINUATION frames without end.
        yield frame(HEADERS, END_STREAM, stream, STATUS_200)
        while True:
            yield frame(CONTINUATION, 0, stream, literal(b"x-flood", b"1"))
    elif kind == "settings-flood":
        while True:
            yield frame(SETTINGS, 0, 0, (0x3).to_bytes(2, "big") + (100).to_bytes(4, "big"))
    elif kind == "ping-flood":
        counter = 0
        while True:
            counter += 1
            yield frame(PING, 0, 0, counter.to_bytes(8, "big"))
    elif kind == "rst-flood":
        # The request's stream reset (INTERNAL_ERROR), then resets of it without end.
        while True:
            yield frame(RST_STREAM, 0, stream, (0x2).to_bytes(4, "big"))
    elif kind == "empty-data-flood":
        # A declared length: the gateway waits for the body before it answers (then 502, not a cut body).
        yield frame(HEADERS, END_HEADERS, stream, STATUS_200 + literal(b"content-length", b"100"))
        while True:
            yield frame(DATA, 0, stream, b"")
    elif kind == "max-frame-size":
        # SETTINGS_MAX_FRAME_SIZE above 2^24-1: a PROTOCOL_ERROR (RFC 9113 §6.5.2).
        yield frame(SETTINGS, 0, 0, (0x5).to_bytes(2, "big") + (2**24).to_bytes(4, "big"))
    elif kind == "malformed-frame":
        # A PING of 7 bytes, not 8: FRAME_SIZE_ERROR (RFC 9113 §6.7).
        yield frame(PING, 0, 0, b"\x00" * 7)
    else:
        raise ValueError(kind)


def run(sock, number):
    record(event="connection", conn=number)
    try:
        Connection(sock, number).serve()
    except Exception as error:  # one connection's end, whatever it was, is not the server's
        record(event="error", conn=number, error=repr(error))
    finally:
        record(event="closed", conn=number)
        sock.close()


def main():
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("127.0.0.1", PORT))
    server.listen(64)
    while True:
        sock, _ = server.accept()
        counter[0] += 1
        threading.Thread(target=run, args=(sock, counter[0]), daemon=True).start()


main()
