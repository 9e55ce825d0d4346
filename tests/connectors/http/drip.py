"""A real HTTP server on 127.0.0.1 that answers slowly: a byte at a time, never timing out a read.

Each connection gets the head and body of a valid JSON response (an empty
list padded with spaces), written one byte every ``interval`` seconds from
``drip_from`` on (``head``: from the first header line, ``body``: after the
whole head). No single socket read ever waits ``interval``, so a per-read
timeout never fires; only a deadline over the whole request ends it.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field


@dataclass
class Drip:
    """The running server: its URL and how many requests reached it."""

    port: int
    requests: int = 0
    stop: threading.Event = field(default_factory=threading.Event)

    @property
    def base_url(self) -> str:
        """The server's root."""
        return f"http://127.0.0.1:{self.port}/v1"


def _answer(
    conn: socket.socket, drip: Drip, drip_from: str, body_bytes: int, interval: float
) -> None:
    with conn:
        conn.recv(65536)  # the request (small, in one segment on loopback)
        drip.requests += 1
        body = b"[" + b" " * (body_bytes - 2) + b"]"
        head = (
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(body)}\r\n".encode()
            + b"X-Padding: "
            + b"p" * body_bytes
            + b"\r\n\r\n"
        )
        start = 0 if drip_from == "head" else len(head)
        data = head + body
        try:
            conn.sendall(data[:start])
            for i in range(start, len(data)):
                if drip.stop.wait(interval):
                    return
                conn.sendall(data[i : i + 1])
        except OSError:
            return  # the client gave up: what a deadline should make it do


@contextmanager
def dripping(
    drip_from: str = "body", body_bytes: int = 40, interval: float = 0.25
) -> Iterator[Drip]:
    """Serve dripping responses on a free port of 127.0.0.1 until the block ends."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.1)
    drip = Drip(listener.getsockname()[1])

    def serve() -> None:
        while not drip.stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            threading.Thread(
                target=_answer, args=(conn, drip, drip_from, body_bytes, interval), daemon=True
            ).start()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield drip
    finally:
        drip.stop.set()
        thread.join(5)
        listener.close()
