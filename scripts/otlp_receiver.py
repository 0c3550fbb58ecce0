#!/usr/bin/env python3
"""A small OTLP/HTTP trace receiver for Portico's tests: an independent collector.

Decodes `POST /v1/traces` bodies (application/x-protobuf or application/json) with the
`opentelemetry-proto` package from PyPI and appends one JSON line per span to OUT:

  {"trace_id", "span_id", "parent_span_id", "name", "kind", "status", "service",
   "start_ns", "end_ns", "attributes": {...}, "headers": {request headers, lower-case}}

Ids are lower-case hex. Every request's path is also appended to OUT.requests as it arrives.
`--stall` accepts connections and requests but never answers (a hung collector). Usage: otlp_receiver.py PORT OUT [--stall]
"""
import base64
import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

KINDS = {0: "unspecified", 1: "internal", 2: "server", 3: "client", 4: "producer", 5: "consumer"}
STATUS = {0: "unset", 1: "ok", 2: "error"}

lock = threading.Lock()


def value(any_value):
    kind = any_value.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value":
        return [value(v) for v in any_value.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: value(kv.value) for kv in any_value.kvlist_value.values}
    if kind == "bytes_value":
        return any_value.bytes_value.hex()
    return getattr(any_value, kind)


def hex_ids_to_base64(node):
    """OTLP/JSON writes ids as hex (not protobuf JSON's base64): convert them for json_format."""
    if isinstance(node, dict):
        for key, item in node.items():
            if key in ("traceId", "spanId", "parentSpanId") and isinstance(item, str) and len(item) in (16, 32):
                try:
                    node[key] = base64.b64encode(bytes.fromhex(item)).decode()
                except ValueError:
                    pass
            else:
                hex_ids_to_base64(item)
    elif isinstance(node, list):
        for item in node:
            hex_ids_to_base64(item)
    return node


def spans(request, headers):
    for resource_spans in request.resource_spans:
        resource = {kv.key: value(kv.value) for kv in resource_spans.resource.attributes}
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                yield {
                    "trace_id": span.trace_id.hex(),
                    "span_id": span.span_id.hex(),
                    "parent_span_id": span.parent_span_id.hex(),
                    "name": span.name,
                    "kind": KINDS.get(span.kind, str(span.kind)),
                    "status": STATUS.get(span.status.code, str(span.status.code)),
                    "service": resource.get("service.name"),
                    "start_ns": span.start_time_unix_nano,
                    "end_ns": span.end_time_unix_nano,
                    "attributes": {kv.key: value(kv.value) for kv in span.attributes},
                    "headers": headers,
                }


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        with lock, open(self.server.out + ".requests", "a", encoding="utf-8") as requests:
            requests.write(self.path + "\n")
        if self.server.stall:
            time.sleep(3600)
            return
        if self.path != "/v1/traces":
            self.send_error(404)
            return
        request = trace_service_pb2.ExportTraceServiceRequest()
        content_type = (self.headers.get("Content-Type") or "").split(";")[0].strip()
        if content_type == "application/json":
            json_format.ParseDict(hex_ids_to_base64(json.loads(body)), request, ignore_unknown_fields=True)
        else:
            request.ParseFromString(body)
        headers = {name.lower(): v for name, v in self.headers.items()}
        with lock, open(self.server.out, "a", encoding="utf-8") as out:
            for span in spans(request, headers):
                out.write(json.dumps(span, sort_keys=True) + "\n")
        answer = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, *args):
        pass


def main():
    port, out = int(sys.argv[1]), sys.argv[2]
    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    server.daemon_threads = True
    server.out = out
    server.stall = "--stall" in sys.argv[3:]
    open(out, "a").close()
    server.serve_forever()


if __name__ == "__main__":
    main()
