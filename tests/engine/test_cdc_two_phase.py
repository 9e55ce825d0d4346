"""Two-phase commit (``PREPARE TRANSACTION``) through the real pgoutput stream.

A prepared transaction's changes are streamed when ``COMMIT PREPARED`` is
decoded, and never after ``ROLLBACK PREPARED``. It holds an xid until then:
creating a slot waits for it, like for a session idle in transaction, but no
session shows it. Needs ``max_prepared_transactions`` above 0 (``.ci/run``
sets it; the ``two_phase_db`` fixture skips locally, fails in CI).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

from combined.connectors.postgres._connect import Settings
from combined.connectors.postgres._pgoutput import text_to_lsn
from combined.connectors.postgres._replication import current_wal_lsn, slot_status
from combined.engine import Engine
from combined.lake import LakeTable

pytestmark = pytest.mark.postgres


def _append_project(root: Path, db: Any, tools: Any) -> None:
    with psycopg.connect(db.dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE items (id bigint PRIMARY KEY, qty int)")
        conn.execute("INSERT INTO items SELECT g, g FROM generate_series(1, 3) g")
    project = tools.pg_cdc_project(db.dsn, db.prefix, "public.items", ["id"])
    (root / "combined.yaml").write_text(project + "        sync_mode: append\n")


def _prepare(dsn: str, gid: str, *statements: str) -> None:
    """Run ``statements`` in a transaction, then ``PREPARE TRANSACTION gid``: it stays
    open on the server once the session ends."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("BEGIN")
        for statement in statements:
            conn.execute(statement)
        conn.execute(f"PREPARE TRANSACTION '{gid}'")


def _finish(dsn: str, how: str, gid: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"{how} PREPARED '{gid}'")


def _events(engine: Engine) -> list[tuple[object, ...]]:
    """Every change the lake holds: (id, op, qty), snapshot rows first."""
    rows = engine.sql(
        "SELECT id, _combined_op AS op, qty FROM pg.items "
        "ORDER BY _combined_emitted_at NULLS FIRST, id, qty"
    ).to_pylist()
    return [(r["id"], r["op"], r["qty"]) for r in rows]


def _checkpoint(root: Path) -> int:
    meta = LakeTable(root / "lake" / "pg" / "items", "combined:pg/items").latest_commit()
    assert meta is not None
    return text_to_lsn(str(meta["checkpoint"]["lsn"]))


def _captured(engine: Engine) -> None:
    (run,) = engine.capture()
    assert run.state == "succeeded", run.error


SNAPSHOT = [(1, "snapshot", 1), (2, "snapshot", 2), (3, "snapshot", 3)]


def test_a_transaction_prepared_before_a_capture_and_committed_after_lands_once(
    tmp_path: Path, two_phase_db: Any, tools: Any
) -> None:
    """The capture between PREPARE and COMMIT PREPARED sees none of its changes and
    confirms the slot past the PREPARE record; the server still streams them all at
    COMMIT PREPARED, to the next capture, exactly once."""
    db = two_phase_db
    _append_project(tmp_path, db, tools)
    engine = Engine.open(tmp_path / "combined.yaml")
    try:
        _captured(engine)
        assert _events(engine) == SNAPSHOT
        _prepare(
            db.dsn,
            "tx-across",
            "INSERT INTO items VALUES (10, 10)",
            "UPDATE items SET qty = 50 WHERE id = 1",
        )
        prepared = current_wal_lsn(Settings(db.dsn))
        with psycopg.connect(db.dsn, autocommit=True) as conn:
            conn.execute("INSERT INTO items VALUES (11, 11)")  # committed after the PREPARE
        _captured(engine)
        assert _events(engine) == [*SNAPSHOT, (11, "insert", 11)]
        slot = slot_status(Settings(db.dsn), db.slot("public.items"))
        assert slot.confirmed_flush_lsn is not None
        # Confirmed past the PREPARE, never past what the lake holds.
        assert prepared < slot.confirmed_flush_lsn <= _checkpoint(tmp_path)

        _finish(db.dsn, "COMMIT", "tx-across")
        _captured(engine)
        _captured(engine)  # a quiet capture after it: nothing twice
        assert _events(engine) == [
            *SNAPSHOT,
            (11, "insert", 11),
            (1, "update", 50),  # one commit: its changes in order of id
            (10, "insert", 10),
        ]
    finally:
        engine.close()


def test_a_transaction_prepared_then_rolled_back_lands_nothing(
    tmp_path: Path, two_phase_db: Any, tools: Any
) -> None:
    db = two_phase_db
    _append_project(tmp_path, db, tools)
    engine = Engine.open(tmp_path / "combined.yaml")
    try:
        _captured(engine)
        _prepare(
            db.dsn,
            "tx-undone",
            "INSERT INTO items VALUES (20, 20)",
            "DELETE FROM items WHERE id = 2",
        )
        _captured(engine)
        _finish(db.dsn, "ROLLBACK", "tx-undone")
        with psycopg.connect(db.dsn, autocommit=True) as conn:
            conn.execute("INSERT INTO items VALUES (21, 21)")
        _captured(engine)
        assert _events(engine) == [*SNAPSHOT, (21, "insert", 21)]
    finally:
        engine.close()


def _capture_process(root: Path, err: Path) -> subprocess.Popen[str]:
    with err.open("w") as out:  # the child writes to its own copy
        return subprocess.Popen(
            [sys.executable, "-c", "from combined.cli import main; main()", "capture"],
            cwd=root,
            env={**os.environ, "COMBINED_RETRY_BACKOFF_S": "0"},
            stdout=subprocess.DEVNULL,
            stderr=out,
            text=True,
        )


def _until(done: Any, capture: subprocess.Popen[str], err: Path, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while not done():
        assert capture.poll() is None, err.read_text()
        assert time.monotonic() < deadline, err.read_text()
        time.sleep(0.2)


def _stop(capture: subprocess.Popen[str]) -> None:
    if capture.poll() is None:
        capture.kill()
        capture.wait()


def test_a_first_capture_behind_a_prepared_transaction_says_so_and_stops_at_sigint(
    tmp_path: Path, two_phase_db: Any, tools: Any
) -> None:
    """Creating the slot waits for the prepared transaction, which no session shows
    (pg_stat_activity): the capture tells what it waits for and the statements that
    end it, stops at Ctrl-C leaving no slot, and goes on once the transaction
    commits, its rows read once (in the slot's snapshot)."""
    db = two_phase_db
    with psycopg.connect(db.dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE items (id bigint PRIMARY KEY, qty int)")
    (tmp_path / "combined.yaml").write_text(
        tools.pg_cdc_project(db.dsn, db.prefix, "public.items", ["id"])
    )
    gid = f"held-{db.prefix}"
    _prepare(db.dsn, gid, "INSERT INTO items VALUES (1, 1)")
    err = tmp_path / "stderr.txt"
    capture = _capture_process(tmp_path, err)
    try:
        _until(lambda: f"COMMIT PREPARED '{gid}'" in err.read_text(), capture, err)
        told = err.read_text()
        assert f"creating replication slot '{db.slot('public.items')}' waits" in told
        assert f"prepared transaction '{gid}'" in told and f"ROLLBACK PREPARED '{gid}'" in told
        capture.send_signal(signal.SIGINT)
        assert capture.wait(timeout=15) == 130, err.read_text()
    finally:
        _stop(capture)
    assert not slot_status(Settings(db.dsn), db.slot("public.items")).exists

    capture = _capture_process(tmp_path, err)
    try:
        _until(lambda: f"'{gid}'" in err.read_text(), capture, err)
        _finish(db.dsn, "COMMIT", gid)
        assert capture.wait(timeout=60) == 0, err.read_text()
    finally:
        _stop(capture)
    engine = Engine.open(tmp_path / "combined.yaml")
    try:
        assert engine.sql("SELECT id, qty FROM pg.items").to_pylist() == [{"id": 1, "qty": 1}]
        _captured(engine)
        assert engine.sql("SELECT count(*) AS n FROM pg.items").to_pylist() == [{"n": 1}]
    finally:
        engine.close()
