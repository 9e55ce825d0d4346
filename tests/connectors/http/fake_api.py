"""A real HTTP server on 127.0.0.1, in the test process, serving a small mutable API.

Every endpoint serves the same orders (``api.orders``, by id), paged in
another style, behind a bearer token. Tests mutate the orders between
captures, queue faults (``api.fail``) and read what was requested
(``api.requests``). An error response echoes the Authorization header it got,
as careless APIs do: no error of Combined may carry it on.
"""

from __future__ import annotations

import gzip
import json
import re
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

TOKEN = "tok-7f3a9c1e5b2d4068"


@dataclass
class Request:
    """One request the server saw."""

    path: str
    query: dict[str, str]
    headers: dict[str, str]
    #: When the server got it (``time.monotonic()``).
    at: float = field(default_factory=time.monotonic)


@dataclass
class FakeAPI:
    """The server's state: orders, the token it accepts, queued faults, requests seen."""

    port: int = 0
    token: str = TOKEN
    page_size: int = 2
    orders: dict[int, dict[str, Any]] = field(default_factory=dict)
    faults: list[tuple[str, int, dict[str, str], dict[str, str]]] = field(default_factory=list)
    #: Called (with the lock held) each time a fault is served: a change mid-read.
    on_fault: Callable[[], None] | None = None
    requests: list[Request] = field(default_factory=list)
    #: The origin ``/v1/orders/origin`` links its next page to (a test sets it).
    next_origin: str = ""
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def base_url(self) -> str:
        """The API's root."""
        return f"http://127.0.0.1:{self.port}/v1"

    def fail(
        self,
        path: str,
        status: int,
        times: int = 1,
        headers: dict[str, str] | None = None,
        query: dict[str, str] | None = None,
    ) -> None:
        """Answer the next ``times`` requests of ``path`` (with ``query``) with ``status``."""
        with self.lock:
            self.faults.extend([(path, status, dict(headers or {}), dict(query or {}))] * times)

    def seen(self, path: str) -> list[Request]:
        """The requests of ``path`` so far."""
        with self.lock:
            return [r for r in self.requests if r.path == path]

    def rows(self, since: str | None = None) -> list[dict[str, Any]]:
        """The orders by id; with ``since``, those updated at or after it (inclusive)."""
        out = [self.orders[k] for k in sorted(self.orders)]
        if since is not None:
            out = [o for o in out if o.get("updated_at") is None or o["updated_at"] >= since]
        return out


def order(i: int, status: str = "placed", day: int = 1, **extra: Any) -> dict[str, Any]:
    """One order record as the API writes it."""
    return {
        "id": i,
        "status": status,
        "total": i * 10,
        "updated_at": f"2024-05-{day:02d}T00:00:{i:02d}Z",
        "customer": {"name": f"c{i}", "tags": ["a"]},
        **extra,
    }


#: Bodies served as written, bytes for bytes (JSON Python would not write).
_BODIES = {
    # JSON's grammar allows a lone surrogate escape; no Unicode text holds one
    "/v1/surrogate/text": rb'[{"id": 1, "s": "ok"}, {"id": 2, "s": "a\ud800"}]',
    "/v1/surrogate/object": rb'[{"id": 1, "o": {"k": "\udc00"}}]',
    "/v1/surrogate/key": rb'[{"id": 1, "\ud800": 1}]',
    # numbers no decimal of the lake holds
    "/v1/past/exponent": b'[{"id": 1, "f": 1e400}]',
    "/v1/past/digits": b'[{"id": 1, "f": 1' + b"0" * 39 + b"}]",
}


class _Handler(BaseHTTPRequestHandler):
    api: FakeAPI

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    def _send(self, status: int, body: Any, headers: dict[str, str] | None = None) -> None:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        # "@raw:0.99999999999999999": a number written as its digits (no Python float holds it)
        data = re.sub(rb'"@raw:([-+0-9.eE]+)"', rb"\1", data)
        self.send_response(status)
        content_type = "application/json"
        for name, value in (headers or {}).items():
            if name.lower() == "content-type":
                content_type = value
            else:
                self.send_header(name, value)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        api = self.api
        parts = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        path = parts.path
        with api.lock:
            api.requests.append(
                Request(path, query, {k.lower(): v for k, v in self.headers.items()})
            )
            fault = next(
                (
                    f
                    for f in api.faults
                    if f[0] == path and all(query.get(k) == v for k, v in f[3].items())
                ),
                None,
            )
            if fault is not None:
                api.faults.remove(fault)
                if api.on_fault is not None:
                    api.on_fault()
        given = self.headers.get("Authorization", "")
        if fault is not None:
            _, status, headers, _ = fault
            # Careless APIs echo what they were sent: the token must not travel on.
            self._send(status, {"error": "injected", "you_sent": given, "q": self.path}, headers)
            return
        if path != "/v1/public" and given != f"Bearer {api.token}":
            self._send(401, {"error": "bad token", "you_sent": given})
            return
        since = query.get("updated_since")
        with api.lock:
            rows = api.rows(since)
        # The API caps the page size: asked for more, it answers short pages.
        size = min(int(query.get("per_page", query.get("limit", api.page_size))), api.page_size)
        base = f"http://127.0.0.1:{api.port}"
        if path in ("/v1/me", "/v1/public"):
            self._send(200, {"ok": True})
        elif path == "/v1/orders/plain":
            self._send(200, rows)
        elif path == "/v1/orders/page":
            page = int(query.get("page", "1"))
            chunk = rows[(page - 1) * size : page * size]
            self._send(200, {"data": {"items": chunk}, "meta": {"page": page}})
        elif path == "/v1/orders/stuck":  # ignores the page parameter
            self._send(200, {"data": {"items": rows[:size]}})
        elif path == "/v1/orders/offset":
            offset = int(query.get("offset", "0"))
            self._send(200, {"results": rows[offset : offset + size]})
        elif path == "/v1/orders/cursor":
            start = int(query.get("cursor", "0"))
            chunk = rows[start : start + size]
            nxt = str(start + size) if start + size < len(rows) else None
            self._send(200, {"items": chunk, "next_cursor": nxt})
        elif path == "/v1/orders/loop":  # always the same next token
            self._send(200, {"items": rows[:size], "next_cursor": "same"})
        elif path == "/v1/orders/link":
            start = int(query.get("from", "0"))
            headers = {}
            if start + size < len(rows):
                nxt = f"{base}/v1/orders/link?from={start + size}"
                headers["Link"] = f'<{nxt}>; rel="next", <{base}/v1/orders/link>; rel="first"'
            self._send(200, rows[start : start + size], headers)
        elif path == "/v1/orders/rels":  # RFC 8288: one link may carry several relations
            start = int(query.get("from", "0"))
            last = (len(rows) - 1) // size * size
            links = [f'<{base}/v1/orders/rels?from=0>; rel="first"']
            if start + size == last:
                links.append(f'<{base}/v1/orders/rels?from={last}>; rel="next last"')
            elif start + size < last:
                links.append(f'<{base}/v1/orders/rels?from={start + size}>; rel="Next"')
                links.append(f'<{base}/v1/orders/rels?from={last}>; rel="last"')
            self._send(200, rows[start : start + size], {"Link": ", ".join(links)})
        elif path == "/v1/orders/bodylink":
            start = int(query.get("from", "0"))
            nxt = f"/v1/orders/bodylink?from={start + size}" if start + size < len(rows) else None
            self._send(200, {"results": rows[start : start + size], "links": {"next": nxt}})
        elif path == "/v1/orders/elsewhere":  # a next link to another host
            self._send(
                200,
                rows[:size],
                {"Link": f'<http://localhost:{api.port}/v1/orders/link?from=2>; rel="next"'},
            )
        elif path == "/v1/orders/origin":  # a next link to the origin a test chose
            nxt = f"{api.next_origin}/v1/orders/link?from={size}"
            self._send(200, rows[:size], {"Link": f'<{nxt}>; rel="next"'})
        elif path == "/v1/moved":
            self._send(302, b"", {"Location": "/v1/orders/plain"})
        elif path == "/v1/away":
            self._send(302, b"", {"Location": f"http://localhost:{api.port}/v1/orders/plain"})
        elif path == "/v1/latin1":  # JSON in the charset its content type names
            body = json.dumps([{"id": 1, "name": "Zoë"}], ensure_ascii=False).encode("latin-1")
            self._send(200, body, {"Content-Type": "application/json; charset=ISO-8859-1"})
        elif path == "/v1/odata":  # parameters other than charset (OData, versioned APIs)
            ctype = "application/json;odata.metadata=minimal;version=2;charset=utf-8"
            self._send(200, json.dumps([{"id": 1, "name": "é"}]).encode(), {"Content-Type": ctype})
        elif path == "/v1/bom":  # UTF-8 with a byte order mark
            self._send(200, b"\xef\xbb\xbf" + json.dumps([{"id": 1, "name": "a"}]).encode())
        elif path == "/v1/deep":  # a value nested far deeper than a record would be
            self._send(200, b'[{"id": 1, "v": ' + b"[" * 20000 + b"]" * 20000 + b"}]")
        elif path == "/v1/gzip":  # compressed, as most APIs answer a client accepting gzip
            accepts = "gzip" in self.headers.get("Accept-Encoding", "")
            body = json.dumps(rows).encode()
            self._send(200, gzip.compress(body) if accepts else body, {"Content-Encoding": "gzip"})
        elif path == "/v1/badgzip":  # says gzip, is not
            self._send(200, json.dumps(rows).encode(), {"Content-Encoding": "gzip"})
        elif path in _BODIES:
            self._send(200, _BODIES[path])
        elif path == "/v1/html":
            self._send(200, b"<html>hello</html>", {"Content-Type": "text/html"})
        else:
            self._send(404, {"error": "no such path", "you_sent": given})


def serve() -> Iterator[FakeAPI]:
    """Run a fake API on 127.0.0.1 (a free port) in a thread; stop it afterwards."""
    api = FakeAPI()
    handler = type("Handler", (_Handler,), {"api": api})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    api.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield api
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def serve_orders() -> Iterator[FakeAPI]:
    """A fake API (see :func:`serve`) serving orders 1 to 5, one a day from May 1st."""
    for fake in serve():
        for i in range(1, 6):
            fake.orders[i] = order(i, day=i)
        yield fake
