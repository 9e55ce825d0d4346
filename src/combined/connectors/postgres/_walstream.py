"""The streaming replication protocol, with feedback only where the caller sends it.

A ``START_REPLICATION`` session over psycopg 3's libpq binding (the
``COPY BOTH`` sub-protocol: ``XLogData`` and keepalive messages in, standby
status updates out). It exists because psycopg2's ``ReplicationCursor``
moves the flush position by itself: once the last delivered message was
confirmed (or before any message arrived), a keepalive's ``walEnd`` becomes
the flush position it reports, so the slot was confirmed past what the lake
holds. Here every status update reports the position last passed to
:meth:`WalChannel.confirm`, and nothing else: ``0`` (which the server
ignores) until the first confirmation.
"""

from __future__ import annotations

import select
import struct
import time
from datetime import UTC, datetime
from typing import Any

import psycopg
from psycopg import pq
from psycopg.errors import error_from_result

__all__ = ["WalChannel"]

_XLOG_DATA = struct.Struct(">cQQq")  # 'w', dataStart, walEnd, sendTime
_KEEPALIVE = struct.Struct(">cQqB")  # 'k', walEnd, sendTime, replyRequested
_STATUS = struct.Struct(">cQQQqB")  # 'r', write, flush, apply, sendTime, replyRequested
_EPOCH = datetime(2000, 1, 1, tzinfo=UTC)
_W, _K = ord("w"), ord("k")  # the first byte of an XLogData and of a keepalive
#: The first payload byte of a row change (insert, update, delete).
_ROW_KINDS = frozenset(b"IUD")


def _now_micros() -> int:
    """Microseconds since 2000-01-01 UTC, the protocol's clock."""
    return int((datetime.now(UTC) - _EPOCH).total_seconds() * 1_000_000)


class WalChannel:
    """One ``START_REPLICATION`` command's stream on a replication connection.

    ``conn`` is a psycopg connection opened with ``replication=database``;
    the channel owns it from then on. A status update goes out every
    ``status_interval`` seconds while reading, when the server asks for one,
    and on :meth:`confirm` and :meth:`request_reply`; each reports
    :attr:`confirmed` as written, flushed and applied.
    """

    def __init__(self, conn: psycopg.Connection[Any], command: str, status_interval: float) -> None:
        self._conn = conn
        self._pg = conn.pgconn
        self._interval = status_interval
        self.wal_end = 0
        self.confirmed = 0
        self._last_status = time.monotonic()
        #: An XLogData that :meth:`read_rows` received but does not return, for :meth:`read`.
        self._held: tuple[bytes, int, int] | None = None
        #: Whether :meth:`read_rows` met the end of the copy stream (:meth:`read` raises).
        self._ended = False
        self._pg.send_query(command.encode())
        result = self._pg.get_result()
        if result is None or result.status != pq.ExecStatus.COPY_BOTH:
            raise self._error(result)

    @property
    def closed(self) -> bool:
        """Whether the connection is closed."""
        return bool(self._conn.closed)

    def read(self, timeout: float) -> tuple[bytes, int] | None:
        """The next ``XLogData`` (payload, ``dataStart``), or ``None`` after ``timeout`` seconds.

        Keepalives are consumed on the way: they move :attr:`wal_end` and
        answer the server when it asks, never moving :attr:`confirmed`.
        """
        if self._held is not None:
            payload, start, end = self._held
            self._held = None
            if end > self.wal_end:
                self.wal_end = end
            return payload, start
        if self._ended:
            raise self._error(self._pg.get_result())
        deadline: float | None = None
        waited = False
        while True:
            now = time.monotonic()
            if now - self._last_status >= self._interval:
                self._send_status(reply=False)
            size, data = self._pg.get_copy_data(1)
            if size == 0:
                if deadline is None:
                    deadline = now + max(timeout, 0.0)
                left = deadline - time.monotonic()
                if left <= 0 or waited:
                    return None
                select.select([self._pg.socket], [], [], left)
                self._pg.consume_input()
                waited = True
                continue
            if size < 0:
                raise self._error(self._pg.get_result())
            kind = data[0]
            if kind == _W:  # the payload is copied once, out of libpq's buffer
                _, start, end, _ = _XLOG_DATA.unpack_from(data)
                if end > self.wal_end:
                    self.wal_end = end
                return bytes(data[_XLOG_DATA.size :]), start
            if kind == _K:
                _, end, _, reply = _KEEPALIVE.unpack_from(data)
                self.wal_end = max(self.wal_end, end)
                if reply:
                    self._send_status(reply=False)

    def read_rows(self, limit: int) -> list[bytes]:
        """Up to ``limit`` row changes (``I``, ``U``, ``D`` payloads) already received, in order.

        Never waits: it stops at the first message that is not a row change
        (kept for :meth:`read`, :attr:`wal_end` not moved past it), or when
        nothing more arrived. A change stream is nearly all row changes: one
        call takes many, where :meth:`read` costs a Python round a message.
        """
        out: list[bytes] = []
        if self._held is not None or self._ended:
            return out
        get, polled, last = self._pg.get_copy_data, False, None
        while len(out) < limit:
            size, data = get(1)
            if size <= 0:
                if size < 0:
                    self._ended = True
                elif not polled:  # what the socket holds, without waiting
                    self._pg.consume_input()
                    polled = True
                    continue
                break
            kind = data[0]
            if kind == _W:
                payload = bytes(data[_XLOG_DATA.size :])
                if payload and payload[0] in _ROW_KINDS:
                    out.append(payload)
                    last = data  # its position is read once, for the last row
                    continue
                _, start, end, _ = _XLOG_DATA.unpack_from(data)
                self._held = (payload, start, end)
                break
            if kind == _K:
                _, end, _, reply = _KEEPALIVE.unpack_from(data)
                self.wal_end = max(self.wal_end, end)
                if reply:
                    self._send_status(reply=False)
        if last is not None:
            _, _, end, _ = _XLOG_DATA.unpack_from(last)
            self.wal_end = max(self.wal_end, end)
        return out

    def confirm(self, lsn: int) -> None:
        """Report ``lsn`` as written, flushed and applied; never moves back."""
        if lsn > self.confirmed:
            self.confirmed = lsn
            self._send_status(reply=False)

    def request_reply(self) -> None:
        """Send a status update that asks the server for a keepalive."""
        self._send_status(reply=True)

    def close(self) -> None:
        """Close the connection; the slot stays at the last confirmed position."""
        self._conn.close()

    def _send_status(self, *, reply: bool) -> None:
        lsn = self.confirmed
        status = _STATUS.pack(b"r", lsn, lsn, lsn, _now_micros(), int(reply))
        if self._pg.put_copy_data(status) != 1 or self._pg.flush() != 0:
            raise psycopg.OperationalError(self._pg.get_error_message())
        self._last_status = time.monotonic()

    def _error(self, result: pq.abc.PGresult | None) -> psycopg.Error:
        if result is None or result.status != pq.ExecStatus.FATAL_ERROR:
            return psycopg.OperationalError(
                self._pg.get_error_message() or "the replication stream ended"
            )
        return error_from_result(result, encoding=self._conn.info.encoding)
