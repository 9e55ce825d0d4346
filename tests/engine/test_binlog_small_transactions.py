"""A binlog of single-row transactions: their rows share batches, checkpoints stay at their ends.

A busy OLTP source commits one row at a time. The read gathers many such
transactions' rows into one batch; a state still follows only a transaction's
end and only once every row before it went out. Resuming at any state it
gave reads exactly the rows after that state, and a capture killed before
its commit, then run again, lands the source: nothing lost, nothing twice.
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

from tests.engine._binlog import Binlog, lake

from combined.connectors.abc import ReadRequest
from combined.connectors.mariadb._binlog import BinlogExtraction
from combined.connectors.mariadb._binlog_setup import parse_position
from combined.connectors.mariadb._connect import Settings
from combined.engine import Engine
from combined.protocol import OP_COLUMN, POSITION_COLUMN, RecordBatchMessage, StateMessage

ROUNDS = 150
#: Rows a batch holds at most in these reads (the read flushes at half of it).
BATCH_ROWS = 200


def _round(k: int) -> list[str]:
    """Seven single-row transactions: a key freed by a move is taken again by the next one,
    the moved row comes back onto it after a delete, and a snapshot row changes or goes."""
    b = 10_000 + 10 * k
    return [
        f"INSERT INTO {{t}} VALUES ({b}, {k}, 'i{k}')",
        f"UPDATE {{t}} SET id = {b + 1} WHERE id = {b}",
        f"INSERT INTO {{t}} VALUES ({b}, {-k}, 'again{k}')",
        f"UPDATE {{t}} SET qty = qty + 1000 WHERE id = {b + 1}",
        f"DELETE FROM {{t}} WHERE id = {b}",
        f"UPDATE {{t}} SET id = {b} WHERE id = {b + 1}",
        f"UPDATE {{t}} SET note = CONCAT('u', {k}) WHERE id = {k % 500 + 1}"
        if k % 3
        else f"DELETE FROM {{t}} WHERE id = {k % 500 + 1}",
    ]


def _backlog(binlog: Binlog) -> None:
    """``ROUNDS`` rounds of single-row transactions (autocommit), a TRUNCATE half-way."""
    statements = [s for k in range(ROUNDS) for s in _round(k)]
    half = len(statements) // 2
    binlog.sql(*statements[:half], "TRUNCATE TABLE {t}", *statements[half:])


def _read(binlog: Binlog, state: dict[str, Any]) -> tuple[list[Any], int]:
    """The read's messages from ``state``, and how many table maps it parsed."""
    settings = Settings.from_config({"dsn": binlog.dsn})
    request = ReadRequest(
        dataset="items",
        relation=binlog.table,
        key=("id",),
        strategy="cdc",
        state=state,
        batch_rows=BATCH_ROWS,
    )
    name, _, offset = str(state["binlog"]).rpartition(":")
    extraction = BinlogExtraction(settings, request, start=(name, int(offset)))
    try:
        return list(extraction), extraction.table_maps
    finally:
        extraction.finish("abort")


def _rows(messages: list[Any]) -> list[tuple[str, int | None, str]]:
    """(op, id, position) of each row the messages hold, in order."""
    out: list[tuple[str, int | None, str]] = []
    for m in messages:
        if isinstance(m, RecordBatchMessage):
            b = m.batch
            out += zip(
                b.column(OP_COLUMN).to_pylist(),
                b.column("id").to_pylist(),
                b.column(POSITION_COLUMN).to_pylist(),
                strict=True,
            )
    return out


def test_single_row_transactions_share_batches_and_every_state_resumes_exactly(
    binlog: Binlog,
) -> None:
    start = binlog.first_state()
    _backlog(binlog)
    messages, maps = _read(binlog, start)
    # Each transaction logs the table's map: parsed once while its id holds (then again
    # after the TRUNCATE, which numbers the table anew). Before, ~1,050 parsed here.
    assert maps <= 3
    rows = _rows(messages)
    batches = [m for m in messages if isinstance(m, RecordBatchMessage)]
    changes = len(rows)
    assert changes > 7 * ROUNDS  # (key moves are two rows: a delete and an insert)
    # Before, a batch and a state each transaction: ~1,050 of each here.
    assert len(batches) <= changes // (BATCH_ROWS // 2) + 4
    positions = [parse_position(p) for _, _, p in rows]
    assert positions == sorted(positions)  # log order
    states = [(i, m) for i, m in enumerate(messages) if isinstance(m, StateMessage)]
    assert len(states) >= 5 and states[-1][1].final
    for i, state in states:
        at = parse_position(str(state.state["binlog"]))
        before, after = _rows(messages[:i]), _rows(messages[i:])
        # at a transaction's end: past every row before it, before every row after it
        assert all(parse_position(p) <= at for _, _, p in before)
        assert all(parse_position(p) > at for _, _, p in after)
        if not state.final:  # resumed there: the rows after it, none lost, none twice
            assert _rows(_read(binlog, dict(state.state))[0]) == after
    assert ("truncate", None) in [(op, i) for op, i, _ in rows]


def test_a_capture_killed_before_its_commit_then_run_again_lands_every_transaction(
    binlog: Binlog,
) -> None:
    binlog.first_state()
    _backlog(binlog)
    env = {**os.environ, "COMBINED_FAULT": "after_staging"}
    killed = subprocess.run(
        [sys.executable, "-c", "from combined.cli import main; main()", "capture"],
        cwd=binlog.root,
        env=env,
        capture_output=True,
        text=True,
    )
    assert killed.returncode == -9, killed.stderr[-2000:]
    engine = Engine.open(binlog.project())
    try:
        (run,) = engine.capture()
        assert run.state == "succeeded", run.error
        assert lake(engine) == binlog.source()
        binlog.sql(*_round(ROUNDS), *_round(ROUNDS + 1))
        (run,) = engine.capture()
        assert run.state == "succeeded", run.error
        assert lake(engine) == binlog.source()
    finally:
        engine.close()
