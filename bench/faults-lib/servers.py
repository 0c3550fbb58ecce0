#!/usr/bin/env python3
"""The processes bench/faults kills, freezes and restarts: an upstream and a token endpoint.

  servers.py upstream --port P --secret S
      GET /ok            200, a small JSON body
      GET /slow?ms=N     the same after N milliseconds (requests in flight while a fault hits)
      GET /auth/...      200 only with `Authorization: Bearer <token>` that `idp` issued with the same
                         secret and that has not expired; 401 otherwise (an invalid token is visible)
  servers.py idp --port P --secret S --client-id ID --client-secret CS --lifetime SECONDS
      POST /token        OAuth2 client credentials grant (client_secret_basic): a signed token
                         carrying its expiry, expires_in = lifetime

HTTP/1.1 keep-alive, one thread per connection, loopback only.
"""
import argparse
import base64
import hashlib
import hmac
import json
import sys
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def sign(secret, expiry_ms):
    mac = hmac.new(secret.encode(), str(expiry_ms).encode(), hashlib.sha256).hexdigest()
    return f"{expiry_ms}.{mac}"


def valid(secret, token):
    expiry, _, mac = token.partition(".")
    if not expiry.isdigit() or not hmac.compare_digest(sign(secret, int(expiry)), token):
        return False
    return time.time() * 1000 <= int(expiry)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    options = None

    def log_message(self, *args):
        pass

    def send(self, status, body, content_type="application/json"):
        data = body.encode()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(data)


class Upstream(Handler):
    def do_GET(self):
        url = urllib.parse.urlsplit(self.path)
        if url.path == "/ok":
            self.send(200, '{"ok":true}')
        elif url.path == "/slow":
            ms = int(urllib.parse.parse_qs(url.query).get("ms", ["1000"])[0])
            time.sleep(ms / 1000)
            self.send(200, '{"ok":true,"slow":%d}' % ms)
        elif url.path.startswith("/auth/"):
            header = self.headers.get("Authorization", "")
            scheme, _, token = header.partition(" ")
            if scheme == "Bearer" and valid(self.options.secret, token):
                self.send(200, '{"ok":true,"authorized":true}')
            else:
                self.send(401, '{"error":"invalid_token"}')
        else:
            self.send(404, '{"error":"not_found"}')


class TokenEndpoint(Handler):
    def do_POST(self):
        length = int(self.headers.get("Content-Length", "0"))
        form = urllib.parse.parse_qs(self.rfile.read(length).decode())
        expected = "Basic " + base64.b64encode(
            f"{urllib.parse.quote(self.options.client_id)}:{urllib.parse.quote(self.options.client_secret)}".encode()).decode()
        if self.path != "/token":
            self.send(404, '{"error":"not_found"}')
        elif form.get("grant_type") != ["client_credentials"]:
            self.send(400, '{"error":"unsupported_grant_type"}')
        elif not hmac.compare_digest(self.headers.get("Authorization", ""), expected):
            self.send(401, '{"error":"invalid_client"}')
        else:
            expiry_ms = int((time.time() + self.options.lifetime) * 1000)
            self.send(200, json.dumps({"access_token": sign(self.options.secret, expiry_ms),
                                       "token_type": "Bearer", "expires_in": self.options.lifetime}))


class Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True  # restarts bind the same port at once
    request_queue_size = 128


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("role", choices=["upstream", "idp"])
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--host", default="127.0.0.1", help="loopback address to bind (Linux routes all of 127/8)")
    p.add_argument("--secret", required=True)
    p.add_argument("--client-id", default="portico")
    p.add_argument("--client-secret", default="")
    p.add_argument("--lifetime", type=int, default=4)
    options = p.parse_args()
    handler = Upstream if options.role == "upstream" else TokenEndpoint
    handler.options = options
    server = Server((options.host, options.port), handler)
    print(f"{options.role} listening on {options.host}:{options.port}", file=sys.stderr, flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
