"""The catalog: the control plane's storage, SQLite by default, PostgreSQL by URL."""

from __future__ import annotations

import functools
import os
import re
import socket
import sqlite3
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Protocol

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from combined._credentials import remember_secret
from combined._owner_only import private_dir, private_file
from combined.catalog import _schema as t
from combined.config import CATALOG_DRIVERS, catalog_kind
from combined.errors import CatalogError, redact
from combined.protocol import utcnow

_MIGRATIONS = Path(__file__).parent / "migrations"
_REVISION = re.compile(r"^(down_revision|revision)\s*=\s*[\"']?(\w+)", re.MULTILINE)


@functools.cache
def _head_revision() -> str:
    """The newest revision of the migrations: the one no other revision follows."""
    revisions: set[str] = set()
    parents: set[str] = set()
    for script in (_MIGRATIONS / "versions").glob("*.py"):
        for name, value in _REVISION.findall(script.read_text()):
            (revisions if name == "revision" else parents).add(value)
    (head,) = revisions - parents
    return head


#: The PostgreSQL advisory lock a catalog upgrade holds ("cmbmigra" in ASCII).
_UPGRADE_LOCK = 0x636D626D69677261
#: How long a SQLite catalog waits for another connection's lock before "database is locked".
_SQLITE_TIMEOUT_S = 30

_URL_HINT = "set `catalog:` in combined.yaml to sqlite:///PATH or postgresql://USER@HOST/DB"


def _engine_url(url: str) -> sa.URL:
    """The SQLAlchemy URL of a catalog URL, with the driver Combined uses for it."""
    kind = catalog_kind(url)
    if kind is None:
        raise CatalogError(
            f"the catalog URL {redact(url)} has an unsupported scheme or driver", hint=_URL_HINT
        )
    try:
        sa_url = sa.engine.make_url(url)
    except (sa.exc.ArgumentError, ValueError) as exc:
        raise CatalogError(
            f"the catalog URL {redact(url)} is malformed: {redact(str(exc))}", hint=_URL_HINT
        ) from None
    return sa_url.set(drivername=f"{kind}+{CATALOG_DRIVERS[kind]}")


def _sqlite_path(url: sa.URL) -> Path | None:
    if url.get_backend_name() != "sqlite" or not url.database or url.database == ":memory:":
        return None
    return Path(url.database)


#: Where a transaction finds its catalog's ledger (``Connection.info``).
LEDGER = "combined.ledger"
#: Where a transaction keeps the log lines of the events it wrote, told once it
#: commits (``Connection.info``): a rolled-back event was never in the feed.
COMMITTED_LOG = "combined.committed_log"


class LedgerSink(Protocol):
    """What keeps the catalog's governance records in the lake, ahead of the catalog."""

    def publication(self, record: Mapping[str, Any]) -> None:
        """A publication with its members, Runs and admissions."""

    def quarantine(self, row: Mapping[str, Any]) -> None:
        """A quarantine entry as it now is (created, decided, its review moved)."""

    def run(self, record: Mapping[str, Any] | None) -> None:
        """A Run that ended, with its admission."""


class Catalog:
    """Connection management and migrations; repositories take a Connection.

    Every write that must be atomic (a projection, a publication) happens in
    one :meth:`begin` block.
    """

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        #: Given each publication and quarantine entry before its transaction
        #: commits (the lake's governance ledger, ``lake/_ledger.py``); None: none kept.
        self.ledger: LedgerSink | None = None
        # As a person writes it: the driver is Combined's choice, the password hidden.
        url = engine.url.set(drivername=engine.url.get_backend_name())
        self.url = redact(url.render_as_string(hide_password=True))

    @classmethod
    def open(cls, url: str, *, password: str | None = None) -> Catalog:
        """Open (and migrate to the newest revision) the catalog at ``url``."""
        sa_url = _engine_url(url)
        path = _sqlite_path(sa_url)
        if path is not None:
            try:
                private_dir(path.parent)
                private_file(path)  # SQLite gives its journal and WAL the file's mode
            except OSError as exc:
                raise CatalogError(
                    f"cannot create the catalog directory {path.parent}: {exc.strerror}",
                    hint="set `catalog:` in combined.yaml to a writable location",
                ) from exc
        if password is not None:
            # A server may echo the password it was sent in its error: masked there too.
            remember_secret(password)
            sa_url = sa_url.set(password=password)
        kwargs: dict[str, Any] = {}
        if path is not None:
            kwargs["connect_args"] = {"timeout": _SQLITE_TIMEOUT_S}
        else:
            # A server closes idle sessions (idle_session_timeout, a restart, a
            # failover): a pooled connection is tried before each use, and replaced.
            kwargs["pool_pre_ping"] = True
        engine = sa.create_engine(sa_url, **kwargs)
        if path is not None:
            sa.event.listen(engine, "connect", _sqlite_pragmas)
        catalog = cls(engine)
        catalog.migrate()
        return catalog

    def migrate(self) -> None:
        """Bring the schema to the newest numbered revision."""
        if self._at_head():
            return  # nothing to do: Alembic (and its import) is not needed
        if self._create_new():
            return
        from alembic import command
        from alembic.config import Config

        cfg = Config()
        cfg.set_main_option("script_location", str(_MIGRATIONS))
        try:
            with self._connect() as conn, conn.begin():
                # One process upgrades at a time, and Alembic reads the revision
                # only under the lock: workers started together on an older
                # catalog would each read the old revision and apply it again.
                if conn.dialect.name == "sqlite":
                    # The driver would run each DDL statement on its own, outside
                    # the transaction; the whole upgrade is one transaction.
                    conn.exec_driver_sql("BEGIN IMMEDIATE")
                else:
                    conn.execute(sa.text("SELECT pg_advisory_xact_lock(:k)"), {"k": _UPGRADE_LOCK})
                cfg.attributes["connection"] = conn
                command.upgrade(cfg, "head")
        except sa.exc.DBAPIError as exc:
            raise self._unreachable(exc) from exc

    def _connect(self) -> Connection:
        """A connection; a URL option or server the database refuses is a CatalogError."""
        try:
            return self.engine.connect()
        except sa.exc.DBAPIError as exc:
            raise self._unreachable(exc) from exc

    def _unreachable(self, exc: sa.exc.DBAPIError) -> CatalogError:
        """The error of a catalog that cannot be opened (its URL's secret redacted)."""
        return CatalogError(
            f"cannot open the catalog at {self.url}: {redact(str(exc.orig).strip())}",
            hint="check `catalog:` in combined.yaml and that the database is reachable",
        )

    def _create_new(self) -> bool:
        """Create a catalog that holds none of its tables yet; False when it holds some.

        The schema module is the newest revision (``migrations/versions``
        says how it stays so), so a new catalog is that schema plus its
        revision in ``alembic_version``: what the upgrade would leave, without
        loading Alembic (~0.35 s of a first capture). An existing catalog,
        even one behind, goes through Alembic.
        """
        with self._connect() as conn:
            try:
                with conn.begin():
                    if conn.dialect.name == "sqlite":
                        # The driver runs DDL outside any transaction: without
                        # this, a second process starting at the same moment
                        # (two workers on a new project) sees half the tables.
                        conn.exec_driver_sql("BEGIN IMMEDIATE")
                    present = set(sa.inspect(conn).get_table_names())
                    if present & {*t.metadata.tables, "alembic_version"}:
                        return False
                    t.metadata.create_all(conn)
                    conn.execute(
                        sa.text(
                            "CREATE TABLE alembic_version (version_num VARCHAR(32) NOT NULL, "
                            "CONSTRAINT alembic_version_pkc PRIMARY KEY (version_num))"
                        )
                    )
                    conn.execute(
                        sa.text("INSERT INTO alembic_version (version_num) VALUES (:v)"),
                        {"v": _head_revision()},
                    )
            except (sa.exc.IntegrityError, sa.exc.ProgrammingError):
                return False  # another process created it meanwhile: Alembic checks it
            except sa.exc.OperationalError as exc:
                raise self._unreachable(exc) from exc
        return True

    def _at_head(self) -> bool:
        """Whether the catalog already holds the newest revision."""
        try:
            with self.engine.connect() as conn:
                rows = conn.execute(sa.text("SELECT version_num FROM alembic_version")).all()
        except sa.exc.SQLAlchemyError:
            return False  # a new catalog (or an unreachable one: _create_new reports it)
        return [r[0] for r in rows] == [_head_revision()]

    @contextmanager
    def begin(self, *, ledger: bool = True) -> Iterator[Connection]:
        """One catalog transaction; the log lines of its events are written once it commits.

        Without ``ledger``, what it records is not given to the lake's ledger
        first (an ended Run the ledger's store refused: ``runtime._runner``).
        """
        told: list[Callable[[], None]] = []
        try:
            connection = self.engine.connect()
        except sa.exc.DBAPIError as exc:  # (a server restarting, failing over, down)
            if _refused(exc):  # not a passing outage: what the URL says is wrong
                raise self._unreachable(exc) from exc
            raise self._lost(exc, "cannot be reached") from exc
        try:
            with connection as conn, conn.begin():
                conn.info[LEDGER] = self.ledger if ledger else None
                conn.info[COMMITTED_LOG] = told
                try:
                    yield conn
                finally:
                    # (a connection the server closed meanwhile refuses even this)
                    with suppress(sa.exc.SQLAlchemyError):
                        conn.info.pop(COMMITTED_LOG, None)
        except sa.exc.DBAPIError as exc:
            if not exc.connection_invalidated:
                raise
            raise self._lost(exc, "closed its connection") from exc
        for tell in told:
            tell()

    def _lost(self, exc: sa.exc.DBAPIError, what: str) -> CatalogError:
        """The error of a transaction the catalog's server was not there for."""
        return CatalogError(
            f"the catalog at {self.url} {what}: {redact(str(exc.orig).strip())}",
            hint="nothing of the transaction was kept (or, lost while it committed, it may "
            "have been); a worker or scheduler waits a poll, then tries again",
            lost=True,
        )

    def close(self) -> None:
        """Dispose of pooled connections."""
        self.engine.dispose()

    # -- leases ------------------------------------------------------------

    def acquire_lease(
        self, source: str, dataset: str, run_id: str, ttl: timedelta = timedelta(minutes=5)
    ) -> bool:
        """Take the singleton lease of a dataset; False when a live holder has it."""
        now = utcnow()
        holder = worker_identity()
        with self.begin() as conn:
            row = conn.execute(
                sa.select(t.leases)
                .where(t.leases.c.source == source, t.leases.c.dataset == dataset)
                .with_for_update()
            ).first()
            if row is not None:
                if row.run_id != run_id and _live(row.holder, row.expires_at):
                    return False
                # Compare and swap: SQLite ignores FOR UPDATE, so of two takers
                # of one expired lease only the first update still matches.
                taken = conn.execute(
                    t.leases.update()
                    .where(
                        t.leases.c.source == source,
                        t.leases.c.dataset == dataset,
                        t.leases.c.run_id == row.run_id,
                        t.leases.c.holder == row.holder,
                        t.leases.c.expires_at == row.expires_at,
                    )
                    .values(holder=holder, run_id=run_id, expires_at=now + ttl)
                )
                if taken.rowcount != 1:
                    return False
            else:
                try:
                    conn.execute(
                        t.leases.insert().values(
                            source=source,
                            dataset=dataset,
                            holder=holder,
                            run_id=run_id,
                            expires_at=now + ttl,
                        )
                    )
                except sa.exc.IntegrityError:
                    return False
        return True

    def renew_lease(
        self, source: str, dataset: str, run_id: str, ttl: timedelta = timedelta(minutes=5)
    ) -> bool:
        """Extend ``run_id``'s lease by ``ttl`` from now; False when it no longer holds it."""
        return not self.renew_leases([(source, dataset)], run_id, ttl)

    def renew_leases(
        self,
        datasets: Sequence[tuple[str, str]],
        run_id: str,
        ttl: timedelta = timedelta(minutes=5),
    ) -> list[tuple[str, str]]:
        """Extend ``run_id``'s leases of ``datasets`` by ``ttl`` from now; those it no longer holds.

        One transaction for them all: a Run of 200 small tables renewed each
        dataset's lease in a durable commit of its own, twice a table.
        """
        lost: list[tuple[str, str]] = []
        with self.begin() as conn:
            expires = utcnow() + ttl
            for source, dataset in datasets:
                result = conn.execute(
                    t.leases.update()
                    .where(
                        t.leases.c.source == source,
                        t.leases.c.dataset == dataset,
                        t.leases.c.run_id == run_id,
                    )
                    .values(expires_at=expires)
                )
                if result.rowcount != 1:
                    lost.append((source, dataset))
        return lost

    def release_lease(self, source: str, dataset: str, run_id: str) -> None:
        """Give a lease back (only the run holding it can)."""
        self.release_leases([(source, dataset)], run_id)

    def release_leases(self, datasets: Sequence[tuple[str, str]], run_id: str) -> None:
        """Give ``run_id``'s leases of ``datasets`` back, in one transaction."""
        with self.begin() as conn:
            for source, dataset in datasets:
                conn.execute(
                    t.leases.delete().where(
                        t.leases.c.source == source,
                        t.leases.c.dataset == dataset,
                        t.leases.c.run_id == run_id,
                    )
                )

    def break_leases(self, source: str, datasets: Sequence[str], run_id: str) -> bool:
        """Delete ``run_id``'s leases on ``datasets`` when none is live; False when one is.

        Recovery breaks a dead Run's leases before it closes the Run, so a
        process that only stalled cannot renew them afterwards and commit
        (its renewal finds no lease and it stops). All or none: each delete
        matches the row as read (compare and swap, as SQLite ignores FOR
        UPDATE), and a renewal in between keeps every lease.
        """

        class _Renewed(Exception):
            pass

        try:
            with self.begin() as conn:
                rows = conn.execute(
                    sa.select(t.leases)
                    .where(
                        t.leases.c.source == source,
                        t.leases.c.dataset.in_(list(datasets)),
                        t.leases.c.run_id == run_id,
                    )
                    .with_for_update()
                ).all()
                if any(_live(row.holder, row.expires_at) for row in rows):
                    return False
                for row in rows:
                    gone = conn.execute(
                        t.leases.delete().where(
                            t.leases.c.source == source,
                            t.leases.c.dataset == row.dataset,
                            t.leases.c.run_id == run_id,
                            t.leases.c.holder == row.holder,
                            t.leases.c.expires_at == row.expires_at,
                        )
                    )
                    if gone.rowcount != 1:
                        raise _Renewed  # rolls the transaction back
        except _Renewed:
            return False
        return True

    def lease_holder(self, source: str, dataset: str) -> str | None:
        """The run holding a live lease on the dataset, if any."""
        with self.begin() as conn:
            row = conn.execute(
                sa.select(t.leases).where(
                    t.leases.c.source == source, t.leases.c.dataset == dataset
                )
            ).first()
        if row is None or not _live(row.holder, row.expires_at):
            return None
        return str(row.run_id)


def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    cur = dbapi_conn.cursor()
    _write_ahead(cur)
    cur.execute("PRAGMA synchronous=FULL")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.close()


def _write_ahead(cur: Any) -> None:
    """Put the catalog file in WAL mode, waiting out another connection's write.

    Switching needs the file to itself, and SQLite answers "database is locked"
    at once, without its busy timeout, while another connection holds a write
    lock (a process creating the schema of a new catalog, say): waiting there
    could deadlock, so SQLite leaves the wait to the caller.
    """
    from tenacity import Retrying, retry_if_exception, stop_after_delay, wait_random

    for attempt in Retrying(
        retry=retry_if_exception(_sqlite_locked),
        wait=wait_random(0.01, 0.1),
        stop=stop_after_delay(_SQLITE_TIMEOUT_S),
        reraise=True,
    ):
        with attempt:
            (mode,) = cur.execute("PRAGMA journal_mode").fetchone()
            if str(mode).lower() != "wal":
                cur.execute("PRAGMA journal_mode=WAL")


def _sqlite_locked(exc: BaseException) -> bool:
    text = str(exc).lower()
    return isinstance(exc, sqlite3.OperationalError) and ("locked" in text or "busy" in text)


#: What a server says of a connection it refuses for good: its credentials, its database.
_REFUSALS = (
    "password authentication failed",
    "no pg_hba.conf entry",
    "does not exist",
    "access denied",
    "unknown database",
)


def _refused(exc: sa.exc.DBAPIError) -> bool:
    """Whether a failed connect is the catalog refusing it (a wrong URL), not an outage."""
    text = str(exc.orig).lower()
    return any(sign in text for sign in _REFUSALS)


def worker_identity() -> str:
    """``host:pid:start``: who holds a lease (``start``: the process's start time, on Linux)."""
    return f"{socket.gethostname()}:{os.getpid()}:{_start_time(os.getpid()) or ''}"


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (Linux), to tell a reused pid."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat[stat.rfind(b")") + 2 :].split()
    return fields[19].decode() if len(fields) > 19 else None


def _live(holder: str, expires_at: datetime) -> bool:
    """Whether a lease still protects its Run.

    A holder on this host is live exactly while its process is (the same pid,
    started at the same time): a process that stalled past its lease keeps
    it, since it could still commit, and a dead one's lease is free at once.
    A holder on another host is live until its lease expires.
    """
    host, pid, start = _holder_parts(holder)
    if host != socket.gethostname() or pid is None:
        return expires_at > utcnow()
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return not start or _start_time(pid) in (start, None)


def _holder_parts(holder: str) -> tuple[str, int | None, str]:
    """``(host, pid, start)`` of ``host:pid:start`` (or an older ``host:pid``)."""
    parts = holder.rsplit(":", 2)
    if len(parts) == 3 and parts[1].isdigit():
        return parts[0], int(parts[1]), parts[2]
    host, _, pid = holder.rpartition(":")
    return host, (int(pid) if pid.isdigit() else None), ""
