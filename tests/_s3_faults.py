"""A relay in front of the S3 server that fails the requests it is told to (stdlib only).

Every request passes through to the server unchanged unless a rule matches
it: then the relay answers the rule's status with S3's own error body
(``503 SlowDown``, ``500 InternalError``, ``403 AccessDenied``) instead, the
server never seeing the request; or, with ``"after": true``, forwards it and
then answers the error, as when the store did the work and its answer was
lost on the way back. The rules are a JSON list in a file read at each
request::

    [{"method": "PUT", "contains": "_delta_log", "status": 503, "times": 2}]

``contains`` is matched against the request's path and query, ``times`` is
how many requests the rule fails (``-1``: every one); ``code``, ``message``
and ``extra`` (more XML elements) change the error's body. Each request is logged,
one line each (``METHOD PATH [FAULT STATUS]``), to the log file.

It also makes the server's conditional create (``If-None-Match: *``, how
delta-rs commits a log entry) atomic, as S3's is: moto checks and writes in
two steps, and of two writers racing for one log entry both could be told
they wrote it (one commit lost). Tests of concurrent writers go through it.

Run as ``python tests/_s3_faults.py <port> <server URL> <rules file> <log file>``
in a process of its own (delta-rs calls hold the GIL).
"""

from __future__ import annotations

import http.client
import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

_ERRORS = {
    503: ("SlowDown", "Please reduce your request rate."),
    500: ("InternalError", "We encountered an internal error. Please try again."),
    403: ("AccessDenied", "Access Denied"),
}

#: Request headers not passed on: the relay reads the whole body and sends its length.
_HOP = ("expect", "transfer-encoding", "content-length", "connection")


class _Relay(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    upstream: tuple[str, int]
    rules: str
    log: str
    lock = threading.Lock()
    conditional = threading.Lock()  # one conditional create at a time (see _forward)

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _relay(self) -> None:
        body = self._body()
        rule = self._rule()
        with self.lock, open(self.log, "a") as log:
            fault = f" FAULT {rule['status']}" if rule else ""
            log.write(f"{self.command} {self.path}{fault}\n")
        if rule is None or rule.get("after"):
            status, headers, data = self._forward(body)
            if rule is None:
                return self._answer(status, headers, data)
        code, message = _ERRORS.get(rule["status"], ("Error", "error"))
        code, message = rule.get("code", code), rule.get("message", message)
        extra = rule.get("extra", "")  # more of the body (S3 names the access key id in some)
        error = (
            '<?xml version="1.0" encoding="UTF-8"?>'
            f"<Error><Code>{code}</Code><Message>{message}</Message>{extra}</Error>"
        ).encode()
        self._answer(rule["status"], [("Content-Type", "application/xml")], error)

    do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _relay

    def _body(self) -> bytes:
        if "chunked" not in (self.headers.get("Transfer-Encoding") or ""):
            return self.rfile.read(int(self.headers.get("Content-Length") or 0))
        body = b""
        while size := int(self.rfile.readline().split(b";")[0].strip(), 16):
            body += self.rfile.read(size)
            self.rfile.readline()
        while self.rfile.readline() not in (b"\r\n", b"\n", b""):
            pass  # trailers
        return body

    def _rule(self) -> dict[str, Any] | None:
        with self.lock:
            try:
                with open(self.rules) as f:
                    rules = json.load(f)
            except (OSError, ValueError):
                return None
            for rule in rules:
                left = rule.get("times", 1)
                if left == 0 or rule.get("method", self.command) != self.command:
                    continue
                if rule.get("contains", "") not in self.path:
                    continue
                if left > 0:
                    rule["times"] = left - 1
                    with open(self.rules, "w") as f:
                        json.dump(rules, f)
                return dict(rule)
        return None

    def _forward(self, body: bytes) -> tuple[int, list[tuple[str, str]], bytes]:
        if self.headers.get("If-None-Match") == "*":
            # moto checks that the key is absent, then writes it, in two steps
            # another request can come between (S3 does both at once): of two
            # writers creating one Delta log entry, both could be told they did.
            with self.conditional:
                return self._send(body)
        return self._send(body)

    def _send(self, body: bytes) -> tuple[int, list[tuple[str, str]], bytes]:
        conn = http.client.HTTPConnection(*self.upstream, timeout=120)
        try:
            headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP}
            conn.request(self.command, self.path, body=body, headers=headers)
            response = conn.getresponse()
            return response.status, response.getheaders(), response.read()
        finally:
            conn.close()

    def _answer(self, status: int, headers: list[tuple[str, str]], data: bytes) -> None:
        self.send_response(status)
        length = str(len(data))
        for key, value in headers:
            if key.lower() == "content-length" and self.command == "HEAD":
                length = value  # the object's size, which a HEAD answer names without a body
            elif key.lower() not in (*_HOP, "server", "date"):
                self.send_header(key, value)
        self.send_header("Content-Length", length)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)


def serve(port: int, upstream: str, rules: str, log: str) -> None:
    """Relay 127.0.0.1:``port`` to ``upstream`` until the process ends."""
    parts = urlsplit(upstream)
    _Relay.upstream = (parts.hostname or "127.0.0.1", parts.port or 80)
    _Relay.rules, _Relay.log = rules, log
    ThreadingHTTPServer(("127.0.0.1", port), _Relay).serve_forever()


if __name__ == "__main__":
    serve(int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4])
