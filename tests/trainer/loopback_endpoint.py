"""A loopback progress endpoint for the trainer's reporter: records (arrival time, body) of every POST. With a CA
(trustme.CA), it serves HTTPS with a certificate that CA issued for localhost, as the chart's progress TLS does."""

from __future__ import annotations

import json
import ssl
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer


class Endpoint:
    def __init__(self, path: str = "/progress", *, ca=None) -> None:
        self.posts: list[tuple[float, dict]] = []  # (time.monotonic() at arrival, body)
        posts = self.posts

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802
                posts.append((time.monotonic(), json.loads(self.rfile.read(int(self.headers["Content-Length"])))))
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args):
                pass
        self.server = HTTPServer(("127.0.0.1", 0), Handler)
        scheme = "http"
        if ca is not None:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ca.issue_cert("localhost", "127.0.0.1").configure_cert(context)
            self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
            scheme = "https"
        self.url = f"{scheme}://127.0.0.1:{self.server.server_port}{path}"

    @property
    def bodies(self) -> list[dict]:
        return [body for _, body in self.posts]

    def __enter__(self) -> "Endpoint":
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()
