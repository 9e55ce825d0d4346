"""Which binary log a checkpoint was read from: a position names a file and an offset only.

``RESET MASTER``, a server restored from a backup, or a failover to another
server with the same ``log_basename`` starts a new history of files with
the old names. A checkpoint's ``mysql-bin.000004:1091`` may then name an
event boundary of the new log, and a read resuming there skipped every
transaction before it in silence (found by a MariaDB review: three rows
lost, the capture succeeded). So a checkpoint records, besides its
position, what tells its log from another:

- ``created``: when the file was created, the time of its format event
  (in seconds), which the stream sends first from any position;
- ``log``: the GTID list the file starts with (MariaDB's ``Gtid_list``
  event, MySQL's ``Previous_gtids``), as ``SHOW BINLOG EVENTS`` writes it;
- ``gtid`` and ``gtid_at``: the GTID of the last transaction read before
  the position, and where its GTID event starts (MariaDB).

A read checks ``log`` and ``gtid`` before it streams (:func:`require_resumable`,
which ``combined check`` runs too), ``created`` at the stream's first event
(``check`` asks the file's first event for it). Not covered: a log begun again
within the second its namesake was created, holding the same GTIDs up to
the position (docs/mariadb.md).
"""

from __future__ import annotations

import random
import re
from collections.abc import Mapping
from typing import Any

from combined.connectors.mariadb._binlog_setup import RESNAPSHOT, BinlogGone, require_retained
from combined.connectors.mariadb._connect import (
    DRIVER_ERRORS,
    DriverConnection,
    Session,
    Settings,
    next_event,
    query_error,
    stream_connection,
)
from combined.errors import CombinedError

#: The error of ``SHOW BINLOG EVENTS ... FROM`` a position that starts no event.
_WRONG_OFFSET = 1220


class LogIdentity:
    """The ``log`` of each binlog file a read met, asked of the server once a file."""

    def __init__(self, session: Session) -> None:
        self.session = session
        self._known: dict[str, str | None] = {}

    def __call__(self, name: str) -> str | None:
        if name not in self._known:
            self._known[name] = _first_gtids(self.session, name)
        return self._known[name]


def _first_gtids(session: Session, name: str) -> str | None:
    """The GTID list the binlog file ``name`` starts with, or None when it has none."""
    rows = session.rows(
        f"SHOW BINLOG EVENTS IN {session.literal(name)} LIMIT 3",
        "reading the first events of the binary log",
    )
    for row in rows:
        if str(row[2]) in ("Gtid_list", "Previous_gtids"):
            return str(row[5] or "")
    return None


def file_created(settings: Settings, name: str) -> int | None:
    """When the binlog file ``name`` was created (its format event's time), or None."""
    from pymysqlreplication import BinLogStreamReader
    from pymysqlreplication.event import FormatDescriptionEvent

    stream = BinLogStreamReader(
        connection_settings=stream_connection(settings),
        server_id=random.randint(1 << 20, (1 << 31) - 1),
        log_file=name,
        log_pos=4,
        resume_stream=True,
        blocking=False,
        only_events=[FormatDescriptionEvent],
        pymysql_wrapper=DriverConnection,
    )
    try:
        event = next_event(stream)
    except DRIVER_ERRORS as exc:
        raise query_error(exc, settings, "reading the binary log's first event") from None
    finally:
        stream.close()
    if event is None or not event.timestamp:
        return None
    return int(event.timestamp)


def origin(
    identity: LogIdentity,
    position: str,
    gtid: tuple[str, int] | None,
    before: Mapping[str, Any],
    created: int | None = None,
) -> dict[str, Any]:
    """The checkpoint's ``created``, ``log``, ``gtid`` and ``gtid_at`` at ``position``.

    ``gtid``: the last transaction read before it (its GTID and its event's
    start); else what the checkpoint ``before`` held, if at the same file.
    ``created``: the file's (else ``before``'s, if at the same file).
    """
    name = position.rpartition(":")[0]
    out: dict[str, Any] = {}
    same = str(before.get("binlog", "")).rpartition(":")[0] == name
    if created is not None or (same and before.get("created")):
        out["created"] = created if created is not None else before["created"]
    log = identity(name)
    if log is not None:
        out["log"] = log
    if gtid is not None:
        out["gtid"], out["gtid_at"] = gtid
    elif before.get("gtid") and same:
        out["gtid"], out["gtid_at"] = before["gtid"], before.get("gtid_at")
    return out


def replaced_log(identity: LogIdentity, state: Mapping[str, Any] | None) -> str | None:
    """Why the binlog at the checkpoint's position is not the log it was read from, or None.

    A checkpoint written before these were recorded is taken as it is.
    """
    state = state or {}
    name = str(state.get("binlog", "")).rpartition(":")[0]
    if not name:
        return None
    recorded = state.get("log")
    if recorded is not None:
        now = identity(name)
        if now is not None and now != recorded:
            return f"{name} now starts after the GTIDs {now or '[]'}, not {recorded or '[]'}"
    gtid, start = state.get("gtid"), state.get("gtid_at")
    if gtid and isinstance(start, int):
        found = _event_at(identity.session, name, start)
        if (
            found is None
            or re.search(rf"(?<![\w:-]){re.escape(str(gtid))}(?![\w:-])", found) is None
        ):
            return (
                f"the event at {name}:{start} is {found!r}, not the transaction {gtid} "
                "the lake's checkpoint read there"
            )
    return None


def require_resumable(
    session: Session,
    position: tuple[str, int],
    state: Mapping[str, Any] | None,
    whose: str,
    **context: Any,
) -> LogIdentity:
    """Raise :class:`BinlogGone` unless the server holds ``position`` (the checkpoint
    ``state``'s, of ``whose``) in the log the checkpoint was read from: its file up to
    the offset, starting with the same GTIDs, the same transaction read before it.

    Returns the identity asked, which a read keeps for the checkpoints it writes.
    """
    require_retained(session, position, whose, **context)
    identity = LogIdentity(session)  # (the checkpoint's file asked once)
    require_same_log(replaced_log(identity, state), position, whose, **context)
    return identity


def require_same_log(
    why: str | None, position: tuple[str, int], whose: str, **context: Any
) -> None:
    """Raise :class:`BinlogGone` when the log at ``position`` is not the one the checkpoint
    of ``whose`` was read from (``why``: what tells them apart, None when nothing does)."""
    if why is None:
        return
    at = f"{position[0]}:{position[1]}"
    raise BinlogGone(
        f"the binary log at {at} of {whose} is not the log the lake's checkpoint was read "
        f"from ({why}): RESET MASTER, a restore or a failover began a new log under the old "
        "names, and reading on would skip changes",
        hint=f"take a new snapshot: {RESNAPSHOT}",
        **context,
        position=at,
    )


def _event_at(session: Session, name: str, start: int) -> str | None:
    """What ``SHOW BINLOG EVENTS`` tells of the event starting at ``start``; None if none does."""
    try:
        rows = session.rows(
            f"SHOW BINLOG EVENTS IN {session.literal(name)} FROM {int(start)} LIMIT 1",
            "reading the binary log at the checkpoint",
        )
    except CombinedError as exc:
        if exc.context.get("code") == _WRONG_OFFSET:
            return None
        raise
    return f"{rows[0][2]} {rows[0][5]}" if rows else None


def created_differs(state: Mapping[str, Any] | None, name: str, created: int) -> str | None:
    """Why the file ``name``, created at ``created``, is not the checkpoint's, or None."""
    state = state or {}
    recorded = state.get("created")
    if not recorded or str(state.get("binlog", "")).rpartition(":")[0] != name:
        return None
    if int(recorded) == created:
        return None
    return f"{name} was created at {created} (Unix time), the checkpoint's at {recorded}"


__all__ = [
    "LogIdentity",
    "created_differs",
    "file_created",
    "origin",
    "replaced_log",
    "require_resumable",
    "require_same_log",
]
