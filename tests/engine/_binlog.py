"""The MariaDB binlog tests' table and project (the ``binlog`` fixture: ``conftest.py``).

These need a server with the binary log on (``log_bin``, ``binlog_format=ROW``,
``binlog_row_image=FULL``, ``binlog_row_metadata=FULL``); ``.ci/run``
configures the machine's MariaDB so, and under ``COMBINED_REQUIRE_SERVICES=1``
a server without it fails these tests instead of skipping them.
"""

from __future__ import annotations

import fcntl
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

import pymysql
import pytest

from combined import cdc
from combined.connectors.mariadb._connect import Settings
from combined.engine import Engine
from combined.lake import LakeLayout
from combined.lake._positions import LakePositions

PROJECT = """\
version: 1
lake: ./lake
sources:
  db:
    connector: {connector}
    config:
      dsn: {dsn}
    datasets:
      items:
        relation: {table}
        key: [id]
        strategy: cdc
"""


class Binlog:
    """A table in a database of a server that writes a row-based binlog."""

    def __init__(self, dsn: str, root: Path) -> None:
        self.dsn = dsn
        self.root = root
        self.table = f"items_{uuid.uuid4().hex[:8]}"
        self.lock: IO[str] | None = None

    @contextmanager
    def alone(self) -> Iterator[None]:
        """The server to this test alone while it changes what every test's reads of the
        binlog meet: the other tests of a binlog end first, and none starts meanwhile."""
        assert self.lock is not None
        fcntl.flock(self.lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(self.lock, fcntl.LOCK_SH)

    def sql(self, *statements: str) -> list[tuple[Any, ...]]:
        kwargs = Settings.from_config({"dsn": self.dsn}).connect_kwargs()
        kwargs.pop("conv")
        kwargs.pop("cursorclass")
        out: list[tuple[Any, ...]] = []
        with pymysql.connect(**kwargs) as conn, conn.cursor() as cur:
            for statement in statements:
                cur.execute(statement.replace("{t}", f"`{self.table}`"))
                out = list(cur.fetchall())
        return out

    def project(self, connector: str = "mariadb") -> Path:
        path = self.root / "combined.yaml"
        path.write_text(PROJECT.format(connector=connector, dsn=self.dsn, table=self.table))
        return path

    def project_as(self, user: str, password: str, monkeypatch: pytest.MonkeyPatch) -> Path:
        """The project, reading as ``user`` (its password from the environment)."""
        path = self.project()
        host = self.dsn.split("@", 1)[1]
        path.write_text(
            path.read_text().replace(
                f"dsn: {self.dsn}",
                f"dsn: mysql://{user}@{host}\n"
                '      password: {secret: "env:COMBINED_TEST_BINLOG_PASSWORD"}',
            )
        )
        monkeypatch.setenv("COMBINED_TEST_BINLOG_PASSWORD", password)
        return path

    def source(self) -> list[tuple[Any, ...]]:
        return [tuple(r) for r in self.sql("SELECT id, qty, note FROM {t} ORDER BY id")]

    def first_state(self) -> dict[str, Any]:
        """Capture once (the stitched snapshot); the checkpoint it committed."""
        engine = Engine.open(self.project())
        try:
            engine.capture()
        finally:
            engine.close()
        return self.checkpoint()

    def checkpoint(self) -> dict[str, Any]:
        """Where the next read resumes: the lake's newest commit's checkpoint, or the
        position captures that changed no row kept after it (``lake._positions``)."""
        layout = LakeLayout(self.root / "lake")
        meta = LakePositions(layout).resumed(
            "db", "items", layout.dataset_table("db", "items").latest_commit()
        )
        assert meta is not None
        return dict(meta["checkpoint"])


def lake(engine: Engine) -> list[tuple[Any, ...]]:
    rows = engine.sql("SELECT id, qty, note FROM db.items ORDER BY id").to_pylist()
    return [tuple(r.values()) for r in rows]


def resnapshot(engine: Engine, binlog: Binlog) -> None:
    """The way out a hint names: teardown, then setup's new snapshot lands the source."""
    cdc.teardown(engine, "db")
    _, run = cdc.setup(engine, "db")
    assert run.state == "succeeded", run.error
    assert lake(engine) == binlog.source()


#: Held shared by every test of a binlog, exclusively by one changing what all their reads
#: meet (a global variable, the binlog files): a capture of another test running meanwhile
#: on the other worker failed ("log_bin_compress is ON", a compressed event, a purged file).
_SERVER_LOCK = Path(tempfile.gettempdir()) / "combined-tests-mariadb-server.lock"


@contextmanager
def binlog_table(dsn: str, root: Path) -> Iterator[Binlog]:
    """A table of 500 rows in the database of ``dsn``, the server lock held shared."""
    from tests.conftest import REQUIRE

    b = Binlog(dsn, root)
    ((log_bin,),) = b.sql("SELECT @@log_bin")
    if str(log_bin) != "1":
        message = "the MariaDB server has log_bin OFF (.ci/run turns it on)"
        if REQUIRE:
            pytest.fail(message)
        pytest.skip(message)
    with open(_SERVER_LOCK, "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_SH)
        b.lock = lock
        try:
            b.sql(
                "CREATE TABLE {t} (id BIGINT PRIMARY KEY, qty INT, note VARCHAR(40)) ENGINE=InnoDB",
                "INSERT INTO {t} SELECT seq, seq, CONCAT('n', seq) FROM seq_1_to_500",
            )
            yield b
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
