"""A deadline over one whole HTTP request: connecting, sending, the headers and the body.

httpx's timeouts bound each socket operation, not the request: a server that
drips a byte a second never lets one read time out, and held a capture with
``timeout: 3`` for 42 s. Every socket operation of a session's connections
therefore goes through :class:`_Stream`, which gives it at most what is left
of the current request's deadline and raises a timeout once nothing is left.
The deadline is set per thread around each request (:meth:`Deadline.within`).
"""

from __future__ import annotations

import os
import ssl
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import httpcore
import httpx

SocketOption = Any  # httpcore's SOCKET_OPTION union, passed through untouched


class Deadline:
    """The instant the request in progress (on this thread) must be done by."""

    def __init__(self) -> None:
        self._local = threading.local()

    @contextmanager
    def within(self, seconds: float) -> Iterator[None]:
        """Bound every socket operation inside the block to ``seconds`` in all."""
        self._local.at = time.monotonic() + seconds
        try:
            yield
        finally:
            self._local.at = None

    def bound(self, timeout: float | None, error: type[Exception]) -> float | None:
        """``timeout`` cut to what is left of the deadline; ``error`` once nothing is."""
        at: float | None = getattr(self._local, "at", None)
        if at is None:
            return timeout
        left = at - time.monotonic()
        if left <= 0:
            raise error("the request's deadline passed")
        return left if timeout is None else min(timeout, left)


class _Stream(httpcore.NetworkStream):
    def __init__(self, inner: httpcore.NetworkStream, deadline: Deadline) -> None:
        self._inner = inner
        self._deadline = deadline

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._inner.read(max_bytes, self._deadline.bound(timeout, httpcore.ReadTimeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._inner.write(buffer, self._deadline.bound(timeout, httpcore.WriteTimeout))

    def close(self) -> None:
        self._inner.close()

    def start_tls(
        self,
        ssl_context: ssl.SSLContext,
        server_hostname: str | None = None,
        timeout: float | None = None,
    ) -> httpcore.NetworkStream:
        bounded = self._deadline.bound(timeout, httpcore.ConnectTimeout)
        return _Stream(self._inner.start_tls(ssl_context, server_hostname, bounded), self._deadline)

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


class _Backend(httpcore.NetworkBackend):
    def __init__(self, inner: httpcore.NetworkBackend, deadline: Deadline) -> None:
        self._inner = inner
        self._deadline = deadline

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[SocketOption] | None = None,
    ) -> httpcore.NetworkStream:
        bounded = self._deadline.bound(timeout, httpcore.ConnectTimeout)
        stream = self._inner.connect_tcp(host, port, bounded, local_address, socket_options)
        return _Stream(stream, self._deadline)

    def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,
        socket_options: Iterable[SocketOption] | None = None,
    ) -> httpcore.NetworkStream:
        bounded = self._deadline.bound(timeout, httpcore.ConnectTimeout)
        return _Stream(
            self._inner.connect_unix_socket(path, bounded, socket_options), self._deadline
        )

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)


_CONTEXTS: dict[tuple[str | None, str | None], ssl.SSLContext] = {}
_CONTEXTS_LOCK = threading.Lock()


def verifying_context() -> ssl.SSLContext:
    """The TLS context httpx would make by default, made once a process.

    httpx builds a new one for every client, loading certifi's certificates
    (or those ``SSL_CERT_FILE`` / ``SSL_CERT_DIR`` name): ~30 ms of CPU a
    read of an endpoint. It verifies the server as httpx's does; a change of
    either variable gets a context of its own.
    """
    key = (os.environ.get("SSL_CERT_FILE"), os.environ.get("SSL_CERT_DIR"))
    with _CONTEXTS_LOCK:
        context = _CONTEXTS.get(key)
        if context is None:
            context = _CONTEXTS[key] = httpx.create_ssl_context()
    return context


def bounded_client(timeout: float, headers: Mapping[str, str]) -> tuple[httpx.Client, Deadline]:
    """An httpx client (no redirects followed) whose requests a :class:`Deadline` bounds.

    The client's transports (direct, and one per proxy the environment
    names) each get the deadline's network backend. httpx offers no public
    way to hand one in, so a transport not built as this expects is a
    defect, raised at once rather than left unbounded.
    """
    deadline = Deadline()
    client = httpx.Client(
        timeout=timeout,
        follow_redirects=False,
        headers=dict(headers),
        verify=verifying_context(),
    )
    for transport in (client._transport, *client._mounts.values()):
        if transport is None:
            continue  # a pattern the environment excludes from proxying (NO_PROXY)
        pool = getattr(transport, "_pool", None)
        backend = getattr(pool, "_network_backend", None)
        if not isinstance(backend, httpcore.NetworkBackend):
            client.close()
            raise RuntimeError(
                f"httpx {httpx.__version__} builds its transports unlike the version Combined "
                "was written for: requests could not be bounded by `timeout`"
            )
        pool._network_backend = _Backend(backend, deadline)  # type: ignore[union-attr]
    return client, deadline


__all__ = ["Deadline", "bounded_client"]
