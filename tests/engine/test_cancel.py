"""Cancel: a queued Run at once; a running one (another process asks) stops its read, commits,
acknowledges and bills nothing, and ends ``canceled`` with who canceled it and why."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest
from tests.engine import _binlog as mariadb
from tests.engine.test_cdc_capture import PROJECT

from combined.catalog import Run
from combined.connectors.postgres._connect import Settings
from combined.connectors.postgres._replication import slot_status
from combined.engine import Engine
from combined.runtime._reporter import NullReporter


class SlowReader(NullReporter):
    """Tells when the read is under way, then holds it (as a slow destination would) until
    the cancel was asked, and consumes the rest slowly: the cancel finds it in progress."""

    def __init__(self, delay: float) -> None:
        self.delay = delay
        self.run_id = ""
        self.rows = 0
        self.reading = threading.Event()
        self.asked = threading.Event()

    def run_started(self, run_id: str, source: str, datasets: list[str]) -> None:
        self.run_id = run_id

    def progress(self, dataset: str, rows: int, nbytes: int, deliveries: int) -> None:
        self.rows = rows
        self.reading.set()
        self.asked.wait(120)
        time.sleep(self.delay)


def _project(root: Path, dsn: str, prefix: str, strategy: str) -> Path:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE items (id bigint PRIMARY KEY, qty int, note text)")
        conn.execute("INSERT INTO items SELECT g, g, 'n' || g FROM generate_series(1, 500) g")
    path = root / "combined.yaml"
    # The CDC tests' project, its dataset read in small batches (and as a snapshot, if asked).
    text = PROJECT.format(dsn=dsn, prefix=prefix, table="items")
    path.write_text(text.replace("strategy: cdc", f"strategy: {strategy}\n        batch_rows: 500"))
    return path


def _capture_once(path: Path) -> Run:
    engine = Engine.open(path)
    try:
        (run,) = engine.capture()
        return run
    finally:
        engine.close()


def _cancel_while_reading(path: Path, tools: Any, total: int) -> tuple[Run, SlowReader]:
    """Capture in a thread; once it reads, `combined run cancel` it from another process."""
    reader = SlowReader(delay=0.05)
    ended: list[Run] = []

    def capture() -> None:
        engine = Engine.open(path, reader)
        try:
            ended.extend(engine.capture())
        finally:
            engine.close()

    worker = threading.Thread(target=capture)
    worker.start()
    assert reader.reading.wait(120), "the read never started"
    asked = tools.cli(
        path.parent, "run", "cancel", reader.run_id, "--reason", "wrong window", "--by", "alice"
    )
    reader.asked.set()
    worker.join(120)
    assert not worker.is_alive()
    assert asked.returncode == 0, asked.stderr
    assert "asked to stop (by alice)" in asked.stdout or "canceled by alice" in asked.stdout
    (run,) = ended
    assert reader.rows < total, "the read was not stopped"
    return run, reader


def _lake_state(
    engine: Engine, table: str = "pg.items"
) -> tuple[int, int, list[tuple[int, int, int, int]]]:
    count = engine.sql(f"SELECT count(*) AS n FROM {table}").to_pylist()[0]["n"]
    (status,) = engine.status(slots=False)
    usage = [(u["mar"], u["inserts"], u["updates"], u["deletes"]) for u in engine.usage()]
    return count, status["lake_version"], usage


def _assert_canceled(engine: Engine, run: Run, tools: Any, root: Path) -> None:
    assert run.state == "canceled", run.error
    assert run.canceled_by == "alice" and run.cancel_reason == "wrong window"
    assert run.error is not None and "canceled by alice: wrong window" in run.error
    # The hint captures again what the Run captured (it named the whole source).
    again = " ".join(f"{run.source}.{d}" for d in run.datasets)
    assert f"`combined capture {again}`" in run.error
    info = engine.run(run.id)
    assert [a.outcome for a in info["attempts"]] == ["canceled"]
    assert info["deliveries"] == []
    events = {e["kind"]: e for e in engine.activity(run_id=run.id)}
    assert events["run.cancel_requested"]["body"]["by"] == "alice"
    assert events["run.canceled"]["body"]["reason"] == "wrong window"
    shown = tools.cli(root, "run", "show", run.id)
    assert "canceled" in shown.stdout and "cancel asked by alice" in shown.stdout
    assert "wrong window" in shown.stdout


def test_a_running_snapshot_is_canceled_from_another_process(
    tmp_path: Path, pg_database: str, tools: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COMBINED_CANCEL_POLL_S", "0.2")
    path = _project(tmp_path, pg_database, "unused", "snapshot")
    assert _capture_once(path).state == "succeeded"
    total = 200_000
    with psycopg.connect(pg_database, autocommit=True) as conn:
        conn.execute(
            f"INSERT INTO items SELECT g, g, 'n' || g FROM generate_series(501, {total}) g"
        )
    engine = Engine.open(path)
    try:
        before = _lake_state(engine)
        run, _ = _cancel_while_reading(path, tools, total)
        assert _lake_state(engine) == before  # no new lake version, no row, no MAR
        _assert_canceled(engine, run, tools, tmp_path)
        # Nothing of it stays behind: a later capture reads the whole table.
        (again,) = engine.capture()
        assert again.state == "succeeded", again.error
        assert _lake_state(engine)[0] == total
    finally:
        engine.close()


def test_a_running_cdc_capture_is_canceled_and_its_slot_does_not_advance(
    tmp_path: Path, cdc_db: Any, tools: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COMBINED_CANCEL_POLL_S", "0.2")
    dsn = cdc_db.dsn
    path = _project(tmp_path, dsn, cdc_db.prefix, "cdc")
    slot = cdc_db.slot("public.items")
    assert _capture_once(path).state == "succeeded"
    confirmed = slot_status(Settings(dsn), slot).confirmed_flush_lsn
    changes = 40_000
    with psycopg.connect(dsn, autocommit=True) as conn:
        for start in range(501, 501 + changes, 10_000):
            conn.execute(
                "INSERT INTO items SELECT g, g, 'n' || g "
                f"FROM generate_series({start}, {start + 9_999}) g"
            )
        conn.execute("UPDATE items SET qty = -qty WHERE id <= 100")
    engine = Engine.open(path)
    try:
        before = _lake_state(engine)
        run, _ = _cancel_while_reading(path, tools, changes)
        assert slot_status(Settings(dsn), slot).confirmed_flush_lsn == confirmed
        assert _lake_state(engine) == before
        _assert_canceled(engine, run, tools, tmp_path)
        # The next capture delivers every change, once.
        (again,) = engine.capture()
        assert again.state == "succeeded", again.error
        assert slot_status(Settings(dsn), slot).confirmed_flush_lsn != confirmed
        count, _, usage = _lake_state(engine)
        assert count == 500 + changes
        ((mar, inserts, updates, deletes),) = usage
        assert (inserts, updates, deletes) == (500 + changes, 100, 0)
        with psycopg.connect(dsn) as conn:
            source = conn.execute("SELECT sum(qty) FROM items").fetchone()
        lake = engine.sql("SELECT sum(qty) AS s FROM pg.items").to_pylist()[0]["s"]
        assert source is not None and lake == source[0]
    finally:
        engine.close()


def test_cancel_a_queued_run_and_the_cli_exit_statuses(shop: Path, tools: Any) -> None:
    queued = tools.cli(shop, "capture", "shop.orders", "--enqueue")
    assert queued.returncode == 0, queued.stderr
    engine = Engine.open(shop / "combined.yaml")
    try:
        (run,) = engine.queued()
        done = tools.cli(shop, "run", "cancel", run.id, "--reason", "not today", "--by", "bob")
        assert done.returncode == 0, done.stderr
        assert f"run {run.id} canceled by bob" in done.stdout
        (ended,) = [r for r in engine.runs() if r.id == run.id]
        assert ended.state == "canceled" and ended.ended_at is not None
        assert engine.queued() == []
        assert engine.take_run() is None  # no worker takes it
        kinds = [e["kind"] for e in engine.activity(run_id=run.id)]
        assert "run.canceled" in kinds and "run.cancel_requested" in kinds
    finally:
        engine.close()
    again = tools.cli(shop, "run", "cancel", run.id)
    assert again.returncode == 2
    assert "already ended canceled: there is nothing to cancel" in again.stderr
    unknown = tools.cli(shop, "run", "cancel", "r-no-such-run")
    assert unknown.returncode == 2 and "no run 'r-no-such-run'" in unknown.stderr
    # A finished (succeeded) Run cannot be canceled either.
    captured = tools.cli(shop, "capture", "shop.orders")
    assert captured.returncode == 0, captured.stderr
    finished = captured.stdout.split()[1]
    refused = tools.cli(shop, "run", "cancel", finished)
    assert refused.returncode == 2 and "already ended succeeded" in refused.stderr


def test_a_run_asked_to_stop_whose_process_died_ends_canceled_at_repair(
    shop: Path, tools: Any
) -> None:
    killed = tools.cli(shop, "capture", "shop.orders", env={"COMBINED_FAULT": "after_staging"})
    assert killed.returncode == -9, killed.stderr
    engine = Engine.open(shop / "combined.yaml")
    try:
        (run,) = engine.runs()
        assert run.state == "extracting"
        asked = tools.cli(shop, "run", "cancel", run.id, "--by", "carol")
        assert asked.returncode == 0, asked.stderr
        assert "asked to stop (by carol)" in asked.stdout
        assert tools.cli(shop, "repair").returncode == 0
        (ended,) = engine.runs()
        assert ended.state == "canceled" and ended.canceled_by == "carol"
        assert ended.error is not None and "canceled by carol;" in ended.error
    finally:
        engine.close()


def test_a_running_binlog_capture_is_canceled_and_its_position_is_not_checkpointed(
    binlog: mariadb.Binlog, tools: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COMBINED_CANCEL_POLL_S", "0.2")
    path = binlog.project()
    path.write_text(
        path.read_text().replace("strategy: cdc", "strategy: cdc\n        batch_rows: 500")
    )
    assert _capture_once(path).state == "succeeded"
    position = binlog.checkpoint()
    changes = 40_000
    binlog.sql(
        *[
            "INSERT INTO {t} SELECT seq, seq, CONCAT('n', seq) "
            + f"FROM seq_{start}_to_{start + 199}"
            for start in range(501, 501 + changes, 200)  # a batch per transaction
        ]
    )
    engine = Engine.open(path)
    try:
        before = _lake_state(engine, "db.items")
        run, _ = _cancel_while_reading(path, tools, changes)
        assert binlog.checkpoint() == position  # the binlog position was not checkpointed
        assert _lake_state(engine, "db.items") == before
        _assert_canceled(engine, run, tools, binlog.root)
        (again,) = engine.capture()
        assert again.state == "succeeded", again.error
        assert binlog.checkpoint() != position
        assert mariadb.lake(engine) == binlog.source()
        ((_, inserts, updates, deletes),) = _lake_state(engine, "db.items")[2]
        assert (inserts, updates, deletes) == (500 + changes, 0, 0)
    finally:
        engine.close()
