"""The binlog position of a MySQL snapshot, anchored by a brief read lock on the table.

MariaDB pins a binlog position to every consistent snapshot
(``Binlog_snapshot_file``/``_position``). MySQL does not, and its binary
log is written before a transaction's commit becomes visible, so a position
read beside a snapshot may name a transaction the snapshot misses (a gap)
or precede one it holds. :class:`TableLock` closes that window for the
captured table: another session takes ``LOCK TABLES t READ``, which waits
for every transaction writing ``t`` to end and admits no new one; the
snapshot opens; the server's binlog position is read; the lock is released.
Every transaction that wrote ``t`` before the position is then in the
snapshot, every later one commits after it. Writers of ``t`` wait for the
time the snapshot takes to open (milliseconds); other tables are not held.

The lock waits at most :data:`LOCK_WAIT_SECONDS` for the transactions
writing the table (the server's ``lock_wait_timeout`` is a day on MariaDB, a
year on MySQL): behind a long writer the request fails instead, so new
writers of the table never queue behind a waiting read lock for longer.

The account needs ``LOCK TABLES`` on the database besides ``SELECT``.
"""

from __future__ import annotations

from combined.connectors.mariadb import _catalog as catalog
from combined.connectors.mariadb._binlog_setup import binlog_status
from combined.connectors.mariadb._connect import Session, Settings, quote_ident
from combined.errors import CombinedError, SourceError, SourceUnavailable

#: Seconds ``LOCK TABLES t READ`` waits for the transactions writing ``t``
#: (the session's ``lock_wait_timeout``); every new writer of ``t`` queues
#: behind the waiting request meanwhile.
LOCK_WAIT_SECONDS = 5

#: The server's error for a lock wait that timed out.
_LOCK_WAIT = 1205


class TableLock:
    """Hold a read lock on ``relation`` while a snapshot opens; read the binlog position."""

    def __init__(self, settings: Settings, relation: str) -> None:
        self._settings = settings
        self._relation = relation
        self._session: Session | None = None

    @property
    def session(self) -> Session | None:
        """The session holding the lock (``None`` when not held)."""
        return self._session

    def hold(self) -> None:
        """Lock the table for reading; waits :data:`LOCK_WAIT_SECONDS` for its writers at most.

        Raises :class:`~combined.errors.SourceUnavailable` when a transaction
        writing the table (or another lock on it) outlasts the wait; nothing
        stays open on any failure.
        """
        db, table = catalog.parse_relation(self._relation, self._settings.database)
        self._session = session = Session(self._settings)
        failure: CombinedError | None = None
        try:
            session.run(
                f"SET SESSION lock_wait_timeout = {LOCK_WAIT_SECONDS}", "bounding the lock's wait"
            )
            session.run(
                f"LOCK TABLES {quote_ident(db)}.{quote_ident(table)} READ",
                "locking the table to anchor the binlog position (needs the LOCK TABLES grant)",
            )
        except BaseException as exc:
            self.release()
            if not isinstance(exc, CombinedError) or exc.context.get("code") != _LOCK_WAIT:
                raise
            failure = SourceUnavailable(
                f"the read lock on {self._relation} was not granted within "
                f"{LOCK_WAIT_SECONDS} s: a transaction writing the table (or a lock on it) is open",
                hint="the attempt can be retried once that transaction ends",
                detail=exc.context.get("detail"),
            )
        if failure is not None:
            raise failure

    def position(self) -> str:
        """The server's binlog position while the lock is held, as ``file:offset``."""
        session = self._session
        if session is None:
            raise SourceError("the table lock is not held", hint="call hold() first")
        rows = binlog_status(session)
        if not rows:
            raise SourceError(
                "the server reports no binlog position: the binary log is off",
                hint="turn log_bin on (`combined check` names the settings)",
            )
        return f"{rows[0][0]}:{rows[0][1]}"

    def release(self) -> None:
        """Unlock (closing the session releases the lock in any case)."""
        session, self._session = self._session, None
        if session is not None:
            session.close()


def pins_snapshots(settings: Settings) -> bool:
    """Whether the server pins a binlog position to each snapshot (MariaDB does)."""
    session = Session(settings)
    try:
        ((version,),) = session.rows("SELECT VERSION()", "reading the server version")
    finally:
        session.close()
    return "mariadb" in str(version).lower()
