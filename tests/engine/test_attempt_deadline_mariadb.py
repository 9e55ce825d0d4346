"""An Attempt's deadline or a cancel ends a MariaDB statement that does not return."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pymysql
import pytest
from tests.engine.test_attempt_deadline import stopped_at_each_deadline

from combined.catalog import Run
from combined.connectors.mariadb._connect import Settings
from combined.engine import Engine
from combined.runtime._reporter import NullReporter

PROJECT = """\
version: 1
lake: ./lake
sources:
  my:
    connector: mariadb
    config:
      dsn: "{dsn}"
      password: {{secret: "env:COMBINED_TEST_MARIADB_PASSWORD"}}
    datasets:
      {view}: {{key: [id]{cursor}}}
"""
CURSOR = ", strategy: cursor, cursor: {column: id, trust: ids only grow}"

#: What the server's statement sleeps: far past the deadline.
SLEEP_S = 20


def _sql(dsn: str, *statements: str) -> list[tuple[object, ...]]:
    kwargs = Settings.from_config({"dsn": dsn}).connect_kwargs()
    kwargs.pop("conv")
    kwargs.pop("cursorclass")
    rows: list[tuple[object, ...]] = []
    with pymysql.connect(**kwargs) as conn, conn.cursor() as cur:
        for statement in statements:
            cur.execute(statement)
            rows = list(cur.fetchall())
    return rows


@dataclass(frozen=True)
class Stuck:
    """A view whose statement sleeps on the server, read by an account of its own."""

    project: Path
    view: str
    admin_dsn: str

    def running(self) -> int:
        """How many statements on the view run on the server (the asking one left out)."""
        ((count,),) = _sql(
            self.admin_dsn,
            "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE ID <> CONNECTION_ID()"
            f" AND INFO LIKE '%{self.view}%'",
        )
        return int(str(count))


@pytest.fixture
def stuck(
    tmp_path: Path,
    mariadb_database: str,
    monkeypatch: pytest.MonkeyPatch,
    request: pytest.FixtureRequest,
) -> Iterator[Stuck]:
    """``stuck_<hex>``: rows that come only once ``sleep(SLEEP_S)`` returned; the
    account may lock the tables, so a read could take the bulk path."""
    suffix = uuid.uuid4().hex[:8]
    table, view, user, password = f"items_{suffix}", f"stuck_{suffix}", f"k_{suffix}", suffix * 4
    database = mariadb_database.rsplit("/", 1)[1]
    _sql(
        mariadb_database,
        f"CREATE TABLE {table} (id INT PRIMARY KEY)",
        f"INSERT INTO {table} VALUES (1), (2), (3)",
        f"CREATE VIEW {view} AS SELECT i.id FROM {table} i, (SELECT sleep({SLEEP_S})) x",
        f"CREATE USER '{user}'@'%' IDENTIFIED BY '{password}'",
        f"GRANT SELECT, LOCK TABLES ON `{database}`.* TO '{user}'@'%'",
    )
    monkeypatch.setenv("COMBINED_TEST_MARIADB_PASSWORD", password)
    dsn = f"mysql://{user}@{mariadb_database.split('@', 1)[1]}"
    cursor = CURSOR if getattr(request, "param", "snapshot") == "cursor" else ""
    (tmp_path / "combined.yaml").write_text(PROJECT.format(dsn=dsn, view=view, cursor=cursor))
    try:
        yield Stuck(tmp_path / "combined.yaml", view, mariadb_database)
    finally:
        _sql(
            mariadb_database,
            f"DROP USER IF EXISTS '{user}'@'%'",
            f"DROP VIEW IF EXISTS {view}",
            f"DROP TABLE IF EXISTS {table}",
        )


@pytest.mark.parametrize("stuck", ["snapshot", "cursor"], indirect=True)
def test_a_statement_that_does_not_return_is_killed_at_the_attempt_deadline(
    stuck: Stuck, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Reproduction: a view whose rows wait on the server (here ``sleep``) held
    each Attempt until its statement returned, past
    ``COMBINED_ATTEMPT_TIMEOUT_S=2``: the Run took three times the
    statement's duration (60 s for a 20 s sleep). The deadline now ends the
    statement with ``KILL QUERY`` (sent with the source's own account, which
    holds no privilege over other sessions), and each Attempt ends within
    moments of it; a view is read by rows, where the kill reaches it."""
    monkeypatch.setenv("COMBINED_ATTEMPT_TIMEOUT_S", "2")
    monkeypatch.setenv("COMBINED_RETRY_BACKOFF_S", "0")
    stopped_at_each_deadline(stuck.project, f"my.{stuck.view}", 2, within=SLEEP_S)
    assert stuck.running() == 0, "a stopped read's statement still runs on the server"


class Started(NullReporter):
    """Tells the Run's id once it starts."""

    def __init__(self) -> None:
        self.run_id = ""
        self.started = threading.Event()

    def run_started(self, run_id: str, source: str, datasets: list[str]) -> None:
        self.run_id = run_id
        self.started.set()


def test_a_cancel_kills_the_statement_a_read_is_blocked_in(
    stuck: Stuck, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cancel (``combined run cancel``) stopped a read blocked in its statement
    only once the statement returned (20 s here): it now ends the statement."""
    monkeypatch.setenv("COMBINED_CANCEL_POLL_S", "0.2")
    reporter, ended = Started(), list[Run]()

    def capture() -> None:
        engine = Engine.open(stuck.project, reporter)
        try:
            ended.extend(engine.capture())
        finally:
            engine.close()

    worker = threading.Thread(target=capture)
    began = time.monotonic()  # (a thread holding the GIL would stall a later clock too)
    worker.start()
    assert reporter.started.wait(60), "the Run never started"
    deadline = time.monotonic() + 10
    while not stuck.running() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert stuck.running(), "the read's statement never ran"
    engine = Engine.open(stuck.project)
    try:
        engine.cancel(reporter.run_id, by="alice", reason="stuck")
    finally:
        engine.close()
    worker.join(SLEEP_S * 4)
    took = time.monotonic() - began
    (run,) = ended
    assert run.state == "canceled", run.error
    assert took < SLEEP_S / 2, f"the canceled capture took {took:.0f} s"
    assert stuck.running() == 0, "a canceled read's statement still runs on the server"
