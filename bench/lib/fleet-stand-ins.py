"""The IdP and the upstream of bench/fleet, counting what they are asked.

    python3 bench/lib/fleet-stand-ins.py --idp-port P --upstream-port Q [--lifetime 6]

IdP:      POST /token -> a new access token every call, expires_in --lifetime seconds.
Upstream: GET /api/...  -> 200, Cache-Control: public, max-age=600, ETag, a 2 KiB body naming the path.
          The upstream checks every request carries a bearer token the IdP handed out and not expired.
Both:     GET /_stats -> {"token_calls": n, "fetches": n, "distinct": n, "unauthorized": n}
"""
import argparse
import http.server
import json
import socketserver
import threading
import time

parser = argparse.ArgumentParser()
parser.add_argument("--idp-port", type=int, required=True)
parser.add_argument("--upstream-port", type=int, required=True)
parser.add_argument("--lifetime", type=float, default=6)
args = parser.parse_args()

lock = threading.Lock()
stats = {"token_calls": 0, "fetches": 0, "unauthorized": 0}
paths = set()
tokens = {}


class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    allow_reuse_address = True


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    def send(self, status, body, headers=()):
        self.send_response(status)
        for name, value in headers:
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if self.path == "/_stats":
            with lock:
                body = json.dumps(dict(stats, distinct=len(paths))).encode()
            return self.send(200, body, [("Content-Type", "application/json")])
        if self.server.server_port == args.upstream_port:
            auth = self.headers.get("Authorization", "")
            token = auth[7:] if auth.startswith("Bearer ") else None
            with lock:
                stats["fetches"] += 1
                paths.add(self.path)
                expiry = tokens.get(token)
                if token is not None and (expiry is None or expiry < time.time()):
                    stats["unauthorized"] += 1
            body = (self.path + " ").encode() * max(1, 2048 // (len(self.path) + 1))
            return self.send(200, body, [("Cache-Control", "public, max-age=600"), ("ETag", '"%d"' % hash(self.path)),
                                         ("Content-Type", "text/plain")])
        self.send(404, b"")

    def do_POST(self):
        length = int(self.headers.get("Content-Length", "0"))
        self.rfile.read(length)
        with lock:
            stats["token_calls"] += 1
            token = "tok-%d-%f" % (stats["token_calls"], time.time())
            tokens[token] = time.time() + args.lifetime
        body = json.dumps({"access_token": token, "token_type": "Bearer", "expires_in": args.lifetime}).encode()
        self.send(200, body, [("Content-Type", "application/json"), ("Cache-Control", "no-store")])


for port in (args.idp_port, args.upstream_port):
    server = Server(("127.0.0.1", port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
print("ready", flush=True)
threading.Event().wait()
