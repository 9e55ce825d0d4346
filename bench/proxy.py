"""A TCP relay on 127.0.0.1 that counts the bytes a client sends to a server.

Put in front of the S3 server (``AWS_ENDPOINT_URL`` pointed at the relay), it
measures what a capture uploads: every byte of every request (bodies and
HTTP headers) on its way to the store, and every byte back.

The relay runs in a process of its own (``python -m bench.proxy UPSTREAM``):
delta-rs calls hold the GIL, and would stall a relay thread of the process
making them. It prints ``PORT CONTROL_PORT``; a connection to the control
port that sends ``get`` (or ``reset``) is answered ``SENT RECEIVED``.
:class:`CountingProxy` starts it and asks it.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit


class _Relay:
    """The relay itself (in the relay's process)."""

    def __init__(self, upstream: str) -> None:
        parts = urlsplit(upstream)
        self.upstream = (parts.hostname or "127.0.0.1", parts.port or 80)
        self.lock = threading.Lock()
        self.sent = self.received = 0

    def serve(self) -> None:
        listener = socket.create_server(("127.0.0.1", 0))
        control = socket.create_server(("127.0.0.1", 0))
        threading.Thread(target=self._control, args=(control,), daemon=True).start()
        print(listener.getsockname()[1], control.getsockname()[1], flush=True)
        while True:
            client, _ = listener.accept()
            upstream = socket.create_connection(self.upstream)
            for src, dst, up in ((client, upstream, True), (upstream, client, False)):
                threading.Thread(target=self._pump, args=(src, dst, up), daemon=True).start()

    def _control(self, control: socket.socket) -> None:
        while True:
            conn, _ = control.accept()
            with conn:
                asked = conn.recv(64).strip()
                with self.lock:
                    answer = f"{self.sent} {self.received}\n".encode()
                    if asked == b"reset":
                        self.sent = self.received = 0
                conn.sendall(answer)

    def _pump(self, src: socket.socket, dst: socket.socket, upload: bool) -> None:
        try:
            while chunk := src.recv(1 << 16):
                with self.lock:
                    if upload:
                        self.sent += len(chunk)
                    else:
                        self.received += len(chunk)
                dst.sendall(chunk)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                s.close()


class CountingProxy:
    """A relay process from 127.0.0.1:<port> to ``upstream`` (``http://host:port``)."""

    def __init__(self, upstream: str) -> None:
        repo = str(Path(__file__).resolve().parents[1])
        self._process = subprocess.Popen(
            [sys.executable, "-c", "import sys; from bench.proxy import main; main()", upstream],
            cwd=repo,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self._process.stdout is not None
        port, control = self._process.stdout.readline().split()
        self._port, self._control = int(port), int(control)

    @property
    def url(self) -> str:
        """The relay's URL (what the client is pointed at)."""
        return f"http://127.0.0.1:{self._port}"

    def _ask(self, what: bytes) -> tuple[int, int]:
        with socket.create_connection(("127.0.0.1", self._control)) as conn:
            conn.sendall(what + b"\n")
            sent, received = conn.makefile().readline().split()
        return int(sent), int(received)

    @property
    def sent(self) -> int:
        """Bytes sent to the server through the relay since the start or the last reset."""
        return self._ask(b"get")[0]

    def reset(self) -> None:
        """Start counting from zero."""
        self._ask(b"reset")

    def close(self) -> None:
        """Stop the relay (its connections end with it)."""
        self._process.terminate()
        self._process.wait(timeout=30)
        if self._process.stdout is not None:
            self._process.stdout.close()


@contextmanager
def counting(upstream: str) -> Iterator[CountingProxy]:
    """A :class:`CountingProxy` to ``upstream`` for the block."""
    proxy = CountingProxy(upstream)
    try:
        yield proxy
    finally:
        proxy.close()


def main() -> None:
    """``python -m bench.proxy UPSTREAM``: relay until terminated."""
    _Relay(sys.argv[1]).serve()


if __name__ == "__main__":
    main()
