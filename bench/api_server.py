"""An HTTP JSON API on 127.0.0.1 serving the records of a JSON lines file, a page at a time.

``python api_server.py FILE SIZE`` prints the port it listens on, then answers

* ``GET /orders[?cursor=N]``: ``{"data": [records N .. N+SIZE-1], "next": "N+SIZE"}``
  (``"next": null`` on the last page): the ``cursor`` paging of docs/http.md;
* ``GET /reload``: reads FILE again (after the bench rewrote it), then ``{"records": n}``.

Each record is the file's line as it is (the body joins them): the server's
own CPU stays small and is measured apart from the client's (bench/taps.py).
It imports nothing of Combined and runs until it is terminated.
"""

from __future__ import annotations

import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit


class API:
    """The records served, one bytes line each."""

    def __init__(self, path: str, size: int) -> None:
        self.path = path
        self.size = size
        self.lines: list[bytes] = []
        self.load()

    def load(self) -> None:
        """Read the file again."""
        with open(self.path, "rb") as f:
            self.lines = [line.rstrip(b"\n") for line in f if line.strip()]

    def page(self, start: int) -> bytes:
        """The body of the page starting at record ``start``."""
        end = start + self.size
        nxt = f'"{end}"' if end < len(self.lines) else "null"
        return b'{"data":[' + b",".join(self.lines[start:end]) + b'],"next":' + nxt.encode() + b"}"


class Handler(BaseHTTPRequestHandler):
    """``/orders`` and ``/reload``; keep-alive (HTTP/1.1), as an API's clients expect."""

    protocol_version = "HTTP/1.1"
    api: API

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    def _send(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        parts = urlsplit(self.path)
        if parts.path == "/orders":
            query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
            self._send(200, self.api.page(int(query.get("cursor", "0"))))
        elif parts.path == "/reload":
            self.api.load()
            self._send(200, b'{"records":%d}' % len(self.api.lines))
        else:
            self._send(404, b'{"error":"no such path"}')


def main(path: str, size: int) -> None:
    """Serve until terminated."""
    Handler.api = API(path, size)
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    print(server.server_address[1], flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
