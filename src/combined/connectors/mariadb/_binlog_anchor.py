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

The account needs ``LOCK TABLES`` on the database besides ``SELECT``.
"""

from __future__ import annotations

from combined.connectors.mariadb import _catalog as catalog
from combined.connectors.mariadb._connect import Session, Settings, quote_ident
from combined.errors import SourceError


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
        """Lock the table for reading (waits for the transactions writing it to end)."""
        db, table = catalog.parse_relation(self._relation, self._settings.database)
        self._session = session = Session(self._settings)
        session.run(
            f"LOCK TABLES {quote_ident(db)}.{quote_ident(table)} READ",
            "locking the table to anchor the binlog position (needs the LOCK TABLES grant)",
        )

    def position(self) -> str:
        """The server's binlog position while the lock is held, as ``file:offset``."""
        session = self._session
        if session is None:
            raise SourceError("the table lock is not held", hint="call hold() first")
        try:  # MySQL 8.2 and later; MySQL 8.4 has no SHOW MASTER STATUS
            rows = session.rows("SHOW BINARY LOG STATUS", "reading the binlog position")
        except SourceError:
            rows = session.rows("SHOW MASTER STATUS", "reading the binlog position")
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
