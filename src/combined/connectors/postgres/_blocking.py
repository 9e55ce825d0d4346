"""A replication command's wait that a signal still reaches, and that says what it waits for."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

_log = logging.getLogger(__name__)

#: Seconds a slot's creation waits before the wait is told, then between tellings.
TELL_AFTER_S = 3.0
TELL_EVERY_S = 60.0
#: The transactions named in one telling (the oldest first); the rest are counted.
_NAMED = 5

# What creating a slot waits for: every transaction of the server that holds
# an xid. A prepared transaction has no session: pg_stat_activity never shows
# it, and it outlives its client and the server's restarts.
_OPEN_SQL = """
SELECT 'prepared', gid, database::text, prepared::text, owner::text, NULL::text
  FROM pg_prepared_xacts
UNION ALL
SELECT 'session', pid::text, datname::text, xact_start::text, usename::text, state
  FROM pg_stat_activity WHERE backend_xid IS NOT NULL AND pid <> pg_backend_pid()
ORDER BY 4 NULLS LAST
"""


def interruptible(
    rconn: Any, cur: Any, command: str, waiting: Callable[[], None] | None = None
) -> Any:
    """``command``'s one row, read while this thread stays free to take a signal.

    Creating a slot waits for every transaction open on the server to end
    (its snapshot needs them settled): a session left idle in transaction,
    or a prepared transaction, holds it for as long as it stays open.
    psycopg2 waits in C, where no signal reaches Python: SIGINT (Ctrl-C) and
    SIGTERM waited with it. The statement runs in a thread; an exception the
    wait meets cancels it. ``waiting`` is called when the command has waited
    :data:`TELL_AFTER_S` seconds, then every :data:`TELL_EVERY_S`.
    """
    box: list[Any] = []

    def run() -> None:
        try:
            cur.execute(command)
            box.append(cur.fetchone())
        except BaseException as exc:  # handed to the waiting thread
            box.append(exc)

    worker = threading.Thread(target=run, name="create-slot", daemon=True)
    worker.start()
    told = time.monotonic() - TELL_EVERY_S + TELL_AFTER_S
    try:
        while worker.is_alive():
            worker.join(0.2)
            if (
                waiting is not None
                and worker.is_alive()
                and time.monotonic() - told >= TELL_EVERY_S
            ):
                told = time.monotonic()
                waiting()
    except BaseException:
        rconn.cancel()  # the server ends the statement: no slot is made
        worker.join(10)
        raise
    if isinstance(box[0], BaseException):
        raise box[0]
    return box[0]


def tell_slot_wait(conninfo: str, slot: str) -> None:
    """Log (a warning) that creating ``slot`` waits, naming the open transactions
    it waits for and how to end each."""
    import psycopg

    try:
        with psycopg.connect(conninfo, autocommit=True) as conn:
            rows: Sequence[tuple[Any, ...]] | None = conn.execute(_OPEN_SQL).fetchall()
    except psycopg.Error:
        rows = None  # the wait is still told, without its transactions
    _log.warning("%s", slot_wait_message(slot, rows))


def slot_wait_message(slot: str, rows: Sequence[tuple[Any, ...]] | None) -> str:
    """What creating ``slot`` waits for, from :data:`_OPEN_SQL`'s ``rows`` (None: unread)."""
    head = (
        f"creating replication slot {slot!r} waits for the transactions open on the server "
        "to end (the slot's snapshot needs them settled)"
    )
    if rows is None:
        found = "they could not be read"
    elif not rows:
        found = "none is visible to this role (pg_read_all_stats shows other roles' sessions)"
    else:
        found = "; ".join(_open(*row) for row in rows[:_NAMED])
        if len(rows) > _NAMED:
            found += f"; and {len(rows) - _NAMED} more"
    return (
        f"{head}: {found}. A prepared transaction outlives its session and the server's "
        "restarts. Ctrl-C stops this wait and leaves no slot"
    )


def _open(kind: str, name: str, database: str, since: str, role: str, state: str | None) -> str:
    if kind == "prepared":
        gid = name.replace("'", "''")
        return (
            f"prepared transaction '{gid}' (database {database}, by {role}, since {since}): "
            f"COMMIT PREPARED '{gid}' or ROLLBACK PREPARED '{gid}', run in {database}, ends it"
        )
    return (
        f"session pid {name} (database {database}, by {role}, {state}, since {since}): "
        f"its COMMIT or ROLLBACK ends it, or SELECT pg_terminate_backend({name})"
    )
