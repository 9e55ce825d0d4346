"""Logical replication stand-up and management for PostgreSQL change capture.

Everything that talks to the server about slots lives here: ordinary SQL
through psycopg 3, slot creation through psycopg2's
``LogicalReplicationConnection``, and streaming through
:class:`~combined.connectors.postgres._walstream.WalChannel` (psycopg 3's
libpq binding), which reports only the positions it is told to confirm.
Publications are in :mod:`~combined.connectors.postgres._publication`, on
this module's connections.

Stand-up order (docs/architecture.md, section 5): ``ensure_publication``, then
:func:`create_slot`, which returns a :class:`SlotHandle` holding the slot's
consistent LSN and its exported snapshot, and has already confirmed that the
slot retains WAL. The snapshot is read (by the snapshot source, inside
``SET TRANSACTION SNAPSHOT``) while the handle is open; then
:meth:`SlotHandle.release_snapshot`. The stream is applied from the
consistent LSN with :class:`ReplicationStream`.

A slot that is missing or whose WAL was removed raises :class:`SlotLost`:
the changes in between are gone, and only a new slot plus a new snapshot
(``combined cdc teardown`` then ``setup``) can close the gap.

psycopg2 loads only where a slot is created: a capture that streams from its
slot never imports it (its import cost ~80 ms of CPU: a third copy of libpq
and of OpenSSL in the process).

Every connection, the replication ones included, is opened from the
source's :class:`~combined.connectors.postgres._connect.Settings`: the same
connection string, password, ``connect_timeout`` and ``application_name``
as the source's ordinary sessions, and its failures are classified as
theirs are (:func:`~combined.connectors.postgres._connect.connect_failure`).
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from functools import partial
from types import TracebackType
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict

from combined.connectors.postgres._connect import (
    Settings,
    connect_failure,
    detail_lines,
    detail_of,
    query_error,
    replication_limit,
    sqlstate_of,
)
from combined.connectors.postgres._pgoutput import array_type_of, lsn_to_text, text_to_lsn
from combined.connectors.postgres._preflight import refuse_wal_level
from combined.connectors.postgres._slot_owner import DROP_SQL, refuse_changed, refuse_foreign_slot
from combined.connectors.postgres._slot_status import SlotStatus
from combined.connectors.postgres._walstream import WalChannel
from combined.errors import (
    AuthRejected,
    CombinedError,
    ConfigError,
    NeedsSnapshot,
    SourceError,
    SourceUnavailable,
    StreamGap,
)

__all__ = [
    "RECOVER_HINT",
    "SESSION_SETTINGS",
    "ReplicationStream",
    "SlotHandle",
    "SlotLost",
    "SlotStatus",
    "advance_slot",
    "create_slot",
    "current_wal_lsn",
    "drop_slot",
    "emit_end_marker",
    "emit_heartbeat",
    "require_own_slot",
    "require_slot",
    "resolve_user_types",
    "slot_status",
]

#: Settings of the replication session: pgoutput renders values with the
#: walsender's settings, and the batcher parses exactly these text forms.
SESSION_SETTINGS: dict[str, str] = {
    "DateStyle": "ISO",
    "TimeZone": "UTC",
    "IntervalStyle": "iso_8601",
    "extra_float_digits": "3",
    "bytea_output": "hex",
}

_SLOT_NAME = re.compile(r"^[a-z0-9_]{1,63}$")
RECOVER_HINT = (
    "run `combined cdc teardown` then `combined cdc setup` for the source: "
    "a new slot and a new snapshot close the gap"
)


class SlotLost(NeedsSnapshot):
    """The replication slot is missing or lost its WAL: changes may be gone.

    Never resumed silently: recovery is a new slot and a new snapshot, which a
    person takes (``needs_review``: no retry can succeed).
    """


#: SQLSTATEs (psycopg2.errorcodes' DUPLICATE_OBJECT and OBJECT_IN_USE).
_DUPLICATE_OBJECT, _OBJECT_IN_USE = "42710", "55006"


def _check_slot_name(slot: str) -> None:
    if not _SLOT_NAME.match(slot):
        raise ConfigError(
            f"invalid replication slot name {slot!r}",
            hint="use 1 to 63 lower-case letters, digits and underscores",
        )


def _options(dsn: str) -> str:
    """The ``options`` connection parameter: the DSN's own plus the session settings."""
    own = conninfo_to_dict(dsn).get("options", "")
    settings = " ".join(f"-c {k}={v}" for k, v in SESSION_SETTINGS.items())
    return f"{own} {settings}".strip()


#: Server wordings (up to PostgreSQL 15, and from 16) of a role that lacks the
#: REPLICATION attribute: it may log in, but not stream or manage slots.
_NO_REPLICATION = (
    "must be superuser or replication role",
    "permission denied to start wal sender",
    "permission denied to use replication slots",
)


def _classify(
    exc: Exception, settings: Settings, action: str, *, connecting: bool = False
) -> CombinedError:
    """A Combined error for a failed connection (``connecting``) or replication command.

    A role without REPLICATION is terminal, with the statement that fixes it.
    A failed connection is then classified as the source's ordinary sessions
    classify theirs (refused credentials and a missing database are
    terminal). Anything else is transient. Every line is searched: with
    several hosts libpq reports one failure per attempt. The server's
    scrubbed message is part of the error's message, so that the CLI and the
    Run show the cause.
    """
    lines = detail_lines(exc, settings) or [type(exc).__name__]
    for line in lines:
        if any(s in line.lower() for s in _NO_REPLICATION):
            user = conninfo_to_dict(settings.dsn).get("user") or "<user>"
            role = sql.Identifier(str(user)).as_string(None)
            return AuthRejected(
                f"the postgres role lacks the REPLICATION attribute, needed to {action}: {line}",
                hint=f"as a superuser run ALTER ROLE {role} REPLICATION, "
                "or capture with a role that has it",
                detail=line,
            )
    limit = replication_limit(lines)
    if limit is not None:
        return limit
    if connecting:
        classified = (connect_failure(line) for line in lines)
        terminal = next((e for e in classified if not e.transient), None)
        if terminal is not None:
            return terminal
    return SourceUnavailable(
        f"postgresql failed while trying to {action}: {lines[0]}",
        hint="check that the server is reachable; the run is retried as another attempt",
        detail=lines[0],
    )


def _connect(settings: Settings) -> psycopg.Connection[Any]:
    try:
        return psycopg.connect(settings.conninfo(), autocommit=True)
    except psycopg.Error as exc:
        raise _classify(exc, settings, "connect", connecting=True) from None


@contextmanager
def _control(
    settings: Settings, action: str, *, denied_hint: str | None = None
) -> Iterator[psycopg.Connection[Any]]:
    """An ordinary connection for the statements that ``action`` runs.

    A statement the server refuses is a Combined error, never the driver's:
    a role without REPLICATION as :func:`_classify` tells it, a missing
    privilege (SQLSTATE 42501) as :class:`AuthRejected` with ``denied_hint``,
    anything else as an ordinary session's query failure.
    """
    with _connect(settings) as conn:
        try:
            yield conn
        except psycopg.Error as exc:
            raise _statement_failure(exc, settings, action, denied_hint) from None


def _statement_failure(
    exc: psycopg.Error, settings: Settings, action: str, denied_hint: str | None
) -> CombinedError:
    classified = _classify(exc, settings, action)
    if isinstance(classified, AuthRejected):
        return classified
    if sqlstate_of(exc) == "42501":
        detail = detail_of(exc, settings)
        return AuthRejected(
            f"the postgres role may not {action}: {detail}",
            hint=denied_hint
            or "grant the role the privilege the server names, or use one that has it",
            detail=detail,
            sqlstate="42501",
        )
    return query_error(exc, settings, f"trying to {action}")


def _replication_connect(settings: Settings) -> Any:
    import psycopg2
    import psycopg2.extras

    try:
        return psycopg2.connect(
            settings.conninfo(),
            connection_factory=psycopg2.extras.LogicalReplicationConnection,
            options=_options(settings.dsn),
        )
    except psycopg2.Error as exc:
        raise _classify(exc, settings, "open a replication connection", connecting=True) from None


def _check_wal_level(conn: psycopg.Connection[Any]) -> None:
    row = conn.execute("SHOW wal_level").fetchone()
    refuse_wal_level(row[0] if row else None)


def _publication_exists(settings: Settings, name: str) -> bool:
    """Whether publication ``name`` exists; True when that cannot be told."""
    try:
        with _control(settings, "read the publication") as conn:
            return (
                conn.execute("SELECT 1 FROM pg_publication WHERE pubname = %s", (name,)).fetchone()
                is not None
            )
    except SourceError:
        return True  # unreachable: the original failure is the one to report


class SlotHandle:
    """A newly created slot, with its consistent LSN and its exported snapshot.

    The exported snapshot stays importable (``SET TRANSACTION SNAPSHOT``)
    only while the creating replication connection runs no other command, so
    the handle keeps that connection open and idle until
    :meth:`release_snapshot` (or ``close``, or leaving a ``with`` block).
    """

    def __init__(
        self, slot: str, consistent_point: int, snapshot_name: str | None, conn: Any
    ) -> None:
        self.slot = slot
        #: The stitch anchor: the snapshot holds every transaction committed
        #: before this LSN, the stream every one committed at or after it.
        self.consistent_point = consistent_point
        self.snapshot_name = snapshot_name
        #: The database the slot belongs to (set once the slot is confirmed).
        self.database = ""
        self._conn = conn

    @property
    def consistent_point_text(self) -> str:
        """The consistent LSN as ``X/Y`` text (the first checkpoint ``{"lsn": ...}``)."""
        return lsn_to_text(self.consistent_point)

    @property
    def snapshot_valid(self) -> bool:
        """Whether the exported snapshot can still be imported."""
        return self._conn is not None and self.snapshot_name is not None

    def release_snapshot(self) -> None:
        """Close the creating connection; the exported snapshot stops existing."""
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()

    close = release_snapshot

    def __enter__(self) -> SlotHandle:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release_snapshot()

    def __repr__(self) -> str:
        return f"SlotHandle({self.slot!r}, consistent_point={self.consistent_point_text!r})"


def create_slot(settings: Settings, slot: str) -> SlotHandle:
    """Create logical slot ``slot`` (pgoutput) exporting its snapshot.

    Before returning, confirms in ``pg_replication_slots`` that the slot
    retains WAL (``restart_lsn`` set, ``wal_status`` not lost): no snapshot
    may be read before that. A slot that does not retain WAL is dropped again.
    """
    import psycopg2

    from combined.connectors.postgres._blocking import interruptible, tell_slot_wait

    _check_slot_name(slot)
    with _control(settings, "create a replication slot") as conn:
        _check_wal_level(conn)
    rconn = _replication_connect(settings)
    try:
        cur = rconn.cursor()
        # PostgreSQL 15 introduced the option list; the bare keyword is older.
        # Quoted: a valid name may start with a digit, which no bare word may.
        if rconn.server_version >= 150000:
            command = f"CREATE_REPLICATION_SLOT \"{slot}\" LOGICAL pgoutput (SNAPSHOT 'export')"
        else:
            command = f'CREATE_REPLICATION_SLOT "{slot}" LOGICAL pgoutput EXPORT_SNAPSHOT'
        told = partial(tell_slot_wait, settings.conninfo(), slot)  # names what it waits for
        _, consistent_point, snapshot_name, _ = interruptible(rconn, cur, command, told)
    except psycopg2.Error as exc:
        rconn.close()
        if getattr(exc, "pgcode", None) == _DUPLICATE_OBJECT:
            raise SourceError(
                f"replication slot {slot!r} already exists",
                hint="`combined cdc status` shows it; teardown drops it",
            ) from None
        raise _classify(exc, settings, "create a replication slot") from None
    handle = SlotHandle(slot, text_to_lsn(consistent_point), snapshot_name, rconn)
    try:
        handle.database = require_slot(settings, slot).database or ""
    except SourceError:
        handle.release_snapshot()
        drop_slot(settings, slot)
        raise
    return handle


_STATUS_SQL = """
SELECT s.plugin, s.database, s.active, s.active_pid,
       s.restart_lsn::text, s.confirmed_flush_lsn::text, s.wal_status, s.safe_wal_size,
       w.lsn::text,
       pg_wal_lsn_diff(w.lsn, s.confirmed_flush_lsn)::bigint,
       (SELECT EXTRACT(epoch FROM r.flush_lag)::float8
          FROM pg_stat_replication r WHERE r.pid = s.active_pid),
       pg_size_bytes(current_setting('max_slot_wal_keep_size')), current_database()::text,
       current_setting('wal_level')
FROM pg_replication_slots s,
     LATERAL (SELECT CASE WHEN pg_is_in_recovery() THEN pg_last_wal_receive_lsn()
                          ELSE pg_current_wal_lsn() END AS lsn) w
WHERE s.slot_name = %s
"""


# The server's average WAL rate (bytes a second) since its statistics were reset.
_RATE_SQL = """
SELECT wal_bytes::float8 / GREATEST(EXTRACT(epoch FROM now() - stats_reset)::float8, 1)
FROM pg_stat_wal
"""


def slot_status(settings: Settings, slot: str) -> SlotStatus:
    """The slot's state, retention and lag (``exists`` false when it is missing)."""
    with _control(settings, "read the replication slot's status") as conn:
        row = conn.execute(_STATUS_SQL, (slot,)).fetchone()
        rate = conn.execute(_RATE_SQL).fetchone() if conn.info.server_version >= 140000 else None
        if row is None:  # (told with the slot missing: no logical slot is made without it)
            level = conn.execute("SELECT current_setting('wal_level')").fetchone()
            return SlotStatus(slot=slot, exists=False, wal_level=level[0] if level else None)
    plugin, database, active, pid, restart, flushed, wal_status, safe, current, lag, secs = row[:11]
    limit = int(row[11])
    return SlotStatus(
        slot=slot,
        exists=True,
        plugin=plugin,
        database=database,
        active=bool(active),
        active_pid=pid,
        restart_lsn=text_to_lsn(restart) if restart else None,
        confirmed_flush_lsn=text_to_lsn(flushed) if flushed else None,
        wal_status=wal_status,
        safe_wal_size=safe,
        current_lsn=text_to_lsn(current) if current else None,
        lag_bytes=lag,
        lag_seconds=secs,
        wal_keep_limit=None if limit < 0 else limit,
        wal_rate=float(rate[0]) if rate and rate[0] is not None else None,
        connected_to=row[12],
        wal_level=row[13],
    )


def require_slot(settings: Settings, slot: str) -> SlotStatus:
    """The slot's status; raise :class:`SlotLost` unless it exists and retains its WAL."""
    status = slot_status(settings, slot)
    if not status.exists:
        raise SlotLost(f"replication slot {slot!r} does not exist", hint=RECOVER_HINT, slot=slot)
    if status.lost:
        raise SlotLost(
            f"replication slot {slot!r} lost the wal it needs (wal_status {status.wal_status})",
            hint=RECOVER_HINT,
            slot=slot,
        )
    if status.plugin != "pgoutput":
        raise SourceError(
            f"replication slot {slot!r} uses plugin {status.plugin!r}, not pgoutput",
            hint="use another slot name, or drop this slot if it is yours",
        )
    if status.connected_to is not None and status.database != status.connected_to:
        # A slot streams one database's changes: every attempt would be refused.
        raise SourceError(
            f"replication slot {slot!r} was made in database {status.database!r}, and the "
            f"source's dsn now names database {status.connected_to!r}: a slot streams the "
            "changes of its own database only",
            hint=f"point the source's dsn at database {status.database!r} again; to capture "
            f"from {status.connected_to!r} instead, {RECOVER_HINT}; if a capture in "
            f"{status.database!r} made it (slot names are the server's), give this source a "
            "distinct `slot_prefix` instead",
            slot=slot,
        )
    return status


def require_own_slot(settings: Settings, slot: str) -> None:
    """Raise :class:`ConfigError` when slot ``slot`` exists, made in another database."""
    with _control(settings, "read the replication slot") as conn:
        refuse_foreign_slot(conn, slot)


def drop_slot(
    settings: Settings,
    slot: str,
    *,
    wait_seconds: float = 10.0,
    in_use_hint: str = "stop the capture that streams from it, then retry",
    judged: str | None = None,
) -> bool:
    """Drop the slot; return whether it existed.

    The server never drops a slot that a walsender holds (``active_pid`` set).
    A slot still held by a walsender that is shutting down is retried for up
    to ``wait_seconds``; one held by a live consumer raises ``SourceError``
    naming the slot and its process, with ``in_use_hint`` as the hint. One of
    another database (slot names are the server's) raises ``ConfigError``.
    ``judged`` (what ``_slot_owner`` judged its claimant's): only that very slot is
    dropped, one changed since raises ``SourceError`` (``_slot_owner.DROP_SQL``).
    """
    _check_slot_name(slot)
    deadline = time.monotonic() + wait_seconds
    with _control(settings, "drop the replication slot") as conn:
        refuse_foreign_slot(conn, slot)
        while True:
            try:
                row = conn.execute(DROP_SQL, (slot, judged is None, judged or "")).fetchone()
                if row is None and judged is not None:
                    refuse_changed(conn, slot)
                return row is not None
            except psycopg.errors.ObjectInUse:
                if time.monotonic() >= deadline:
                    holder = conn.execute(
                        "SELECT active_pid FROM pg_replication_slots WHERE slot_name = %s",
                        (slot,),
                    ).fetchone()
                    pid = f" (pid {holder[0]})" if holder and holder[0] is not None else ""
                    raise SourceError(
                        f"replication slot {slot!r} is in use by another process{pid}",
                        hint=in_use_hint,
                        slot=slot,
                    ) from None
                time.sleep(0.1)


def current_wal_lsn(settings: Settings) -> int:
    """The server's current WAL write position: the end of a bounded run."""
    with _control(settings, "read the current wal position") as conn:
        row = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()
    assert row is not None
    return text_to_lsn(row[0])


def emit_heartbeat(settings: Settings) -> int:
    """Write a non-transactional logical message so WAL moves past quiet periods.

    The message is not published (pgoutput sends messages only on request);
    it gives the walsender a position to report in its keepalives.
    """
    with _control(settings, "write a heartbeat message") as conn:
        row = conn.execute(
            "SELECT pg_logical_emit_message(false, 'combined.heartbeat', '')::text"
        ).fetchone()
    assert row is not None
    return text_to_lsn(row[0])


#: The prefix of the logical message that marks where a bounded read ends.
END_PREFIX = "combined.end"


def emit_end_marker(settings: Settings, token: str) -> int | None:
    """Write a read's end marker, a non-transactional logical message; its LSN, or None.

    The slot's stream delivers it (pgoutput's ``messages`` option, PostgreSQL
    14 and later) right after every transaction committed before it, so a
    read that meets it has read all of them. None when the server is older
    or refuses the message (a standby, ``EXECUTE`` revoked): the caller falls
    back to the server's current WAL position.
    """
    try:
        with _control(settings, "write the read's end marker") as conn:
            version = conn.info.server_version
            if version < 140000:
                return None
            # The message alone is not flushed before PostgreSQL 17, and the
            # walsender reads only flushed WAL: the commit of a transaction
            # with an xid flushes it at once, not a wal_writer_delay later.
            with conn.transaction():
                row = conn.execute(
                    "SELECT pg_logical_emit_message(false, %s, %s)::text, pg_current_xact_id()",
                    (END_PREFIX, token),
                ).fetchone()
    except SourceError:
        return None
    assert row is not None
    return text_to_lsn(row[0])


def advance_slot(
    settings: Settings, slot: str, lsn: int, *, wait_seconds: float = 10.0
) -> int | None:
    """Confirm ``lsn`` on an idle slot (``pg_replication_slot_advance``); never moves it back.

    Used when no replication connection is open to carry the feedback.
    Returns the slot's confirmed position afterwards.
    """
    _check_slot_name(slot)
    with _control(settings, "advance the replication slot") as conn:
        status = slot_status(settings, slot)
        if status.lost:
            raise SlotLost(f"replication slot {slot!r} is lost", hint=RECOVER_HINT, slot=slot)
        if status.confirmed_flush_lsn is not None and status.confirmed_flush_lsn >= lsn:
            return status.confirmed_flush_lsn
        deadline = time.monotonic() + wait_seconds
        while True:
            try:
                conn.execute(
                    "SELECT pg_replication_slot_advance(%s, %s::pg_lsn)", (slot, lsn_to_text(lsn))
                )
                break
            except psycopg.errors.ObjectInUse:
                # The walsender of a just-closed stream may still hold the slot.
                if time.monotonic() >= deadline:
                    raise SourceUnavailable(
                        f"replication slot {slot!r} is in use by another process",
                        hint="the position is confirmed by the next run that acknowledges",
                    ) from None
                time.sleep(0.1)
            except psycopg.Error as exc:
                raise _classify(exc, settings, "advance the replication slot") from None
    return slot_status(settings, slot).confirmed_flush_lsn


def resolve_user_types(settings: Settings, oids: Iterable[int]) -> dict[int, tuple[int, int]]:
    """For user-defined type OIDs, the built-in ``(type oid, modifier)`` to read them as.

    An enum and a string-category base type (``citext``) read as ``text``; a
    domain as its base type (domains of domains are followed); an array of
    any of these as the matching built-in array. Other user types are left
    out: they stay unsupported.
    """
    wanted = sorted(set(oids))
    out: dict[int, tuple[int, int]] = {}
    if wanted:
        with _control(settings, "resolve the source's user-defined types") as conn:
            for oid in wanted:
                found = _resolve_type(conn, oid)
                if found is not None:
                    out[oid] = found
    return out


def _resolve_type(
    conn: psycopg.Connection[Any], oid: int, depth: int = 0
) -> tuple[int, int] | None:
    current, modifier = oid, -1
    for _ in range(16):  # a domain chain is short; the bound guards a cycle
        row = conn.execute(
            "SELECT typtype, typbasetype, typtypmod, typcategory, typelem FROM pg_type "
            "WHERE oid = %s",
            (current,),
        ).fetchone()
        if row is None:
            return None
        typtype, base, typmod, category, element = row
        if typtype == "d":
            current, modifier = int(base), int(typmod) if typmod >= 0 else modifier
            continue
        if typtype == "e" or (typtype == "b" and category == "S" and current >= 16384):
            return 25, -1
        if current < 16384:
            return (current, modifier) if current != oid else None
        if typtype == "b" and category == "A" and element and depth == 0:
            inner = _resolve_type(conn, int(element), depth + 1)
            array = array_type_of(inner[0]) if inner else None
            return (array, inner[1]) if array is not None and inner is not None else None
        return None
    return None


class ReplicationStream:
    """One ``START_REPLICATION`` session of a pgoutput slot.

    :meth:`read` returns the next message payload and the WAL position of
    its record, or ``None`` when nothing arrived within the timeout.
    :meth:`confirm` tells the server a position is durable; the stream
    repeats the last confirmation every ``status_interval`` seconds while
    reading, and never reports a position it was not given
    (:class:`~._walstream.WalChannel`): the slot is confirmed only as far as
    the lake holds.
    """

    def __init__(
        self,
        settings: Settings,
        slot: str,
        publication: str,
        start_lsn: int,
        *,
        proto_version: int = 1,
        status_interval: float = 10.0,
        extra_options: Iterable[tuple[str, str]] = (),
    ) -> None:
        _check_slot_name(slot)
        self.slot = slot
        self.publication = publication
        self._settings = settings
        options = {"proto_version": str(proto_version), "publication_names": publication}
        options.update(extra_options)
        rendered = ", ".join(f'"{k}" {sql.Literal(v).as_string(None)}' for k, v in options.items())
        command = f'START_REPLICATION SLOT "{slot}" LOGICAL {lsn_to_text(start_lsn)} ({rendered})'
        try:
            conn = psycopg.connect(
                settings.conninfo(),
                autocommit=True,
                replication="database",
                options=_options(settings.dsn),
            )
        except psycopg.Error as exc:
            raise _classify(
                exc, settings, "open a replication connection", connecting=True
            ) from None
        try:
            self._channel = WalChannel(conn, command, status_interval)
        except psycopg.Error as exc:
            conn.close()
            raise self._failure(exc, "start streaming") from None

    @property
    def wal_end(self) -> int:
        """The server's position from the last message or keepalive."""
        return self._channel.wal_end

    @property
    def confirmed(self) -> int:
        """The highest position confirmed through :meth:`confirm`."""
        return self._channel.confirmed

    @property
    def closed(self) -> bool:
        """Whether the connection is closed."""
        return self._channel.closed

    def read(self, timeout: float) -> tuple[bytes, int] | None:
        """The next message (payload, WAL position), or ``None`` after ``timeout`` seconds."""
        try:
            return self._channel.read(timeout)
        except psycopg.Error as exc:
            raise self._failure(exc, "read the replication stream") from None

    def read_rows(self, limit: int) -> list[bytes]:
        """Row changes already received, up to ``limit`` (:meth:`WalChannel.read_rows`)."""
        try:
            return self._channel.read_rows(limit)
        except psycopg.Error as exc:
            raise self._failure(exc, "read the replication stream") from None

    def confirm(self, lsn: int) -> None:
        """Report ``lsn`` as written and flushed (durable in the lake); never moves back."""
        try:
            self._channel.confirm(lsn)
        except psycopg.Error as exc:
            raise self._failure(exc, "confirm the flush position") from None

    def request_reply(self) -> None:
        """Ask the server for a keepalive, which refreshes :attr:`wal_end`."""
        try:
            self._channel.request_reply()
        except psycopg.Error as exc:
            raise self._failure(exc, "ping the replication stream") from None

    def close(self) -> None:
        """Close the connection (the slot stays, at its confirmed position)."""
        self._channel.close()

    def _failure(self, exc: Exception, action: str) -> CombinedError:
        """A lost slot when the slot is gone, otherwise a transient failure."""
        try:
            require_slot(self._settings, self.slot)
        except SourceError as found:
            if not found.transient:  # lost, another plugin's, another database's
                return found
            # the server is unreachable: report the original failure
        else:
            if not _publication_exists(self._settings, self.publication):
                # Dropped while streaming: no attempt can stream its tables again
                # (and one created again would not stream the changes before it).
                return StreamGap(
                    f"publication {self.publication!r} was dropped while its slot streamed: "
                    "the slot streams none of its tables' changes",
                    hint=RECOVER_HINT,
                    publication=self.publication,
                )
        if sqlstate_of(exc) == _OBJECT_IN_USE:
            return SourceUnavailable(
                f"replication slot {self.slot!r} is in use by another process",
                hint="another capture streams from this slot; the run is retried",
            )
        return _classify(exc, self._settings, action)
