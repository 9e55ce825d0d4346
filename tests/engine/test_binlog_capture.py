"""MariaDB binlog CDC through the engine: stitched snapshot, then the binlog, exactly once.

The table and project: ``_binlog.py``; the ``binlog`` fixture: ``conftest.py``.
"""

from __future__ import annotations

import signal
import time
from typing import Any

import pytest
from tests.engine._binlog import Binlog, lake

from combined.engine import Engine


def test_stitched_snapshot_then_binlog_lands_every_change_once(binlog: Binlog) -> None:
    """Inserts, updates, deletes and a primary-key change stream after the first snapshot.

    Before this change the mariadb connector refused ``strategy: cdc`` outright.
    """
    engine = Engine.open(binlog.project())
    try:
        (run,) = engine.capture()
        assert run.state == "succeeded", run.error
        assert lake(engine) == binlog.source()
        first = binlog.checkpoint()
        assert first["stitched"] is True and ":" in first["binlog"]

        binlog.sql(
            "INSERT INTO {t} VALUES (501, 1, 'new')",
            "DELETE FROM {t} WHERE id BETWEEN 10 AND 14",
            "UPDATE {t} SET qty = 99 WHERE id <= 3",
            "UPDATE {t} SET id = 1000, note = 'moved' WHERE id = 20",  # a primary-key change
        )
        (run,) = engine.capture()
        assert run.state == "succeeded", run.error
        assert run.stats is not None and run.stats["items"]["deletes"] == 6
        assert lake(engine) == binlog.source()
        row = engine.sql(
            "SELECT _combined_op AS op, _combined_source_position AS pos FROM db.items WHERE id = 2"
        ).to_pylist()[0]
        assert row["op"] == "update" and ":" in row["pos"]

        # a quiet capture (another table changes) still moves the checkpoint
        before = binlog.checkpoint()["binlog"]
        binlog.sql("CREATE TABLE other_{t} (id INT)".replace("{t}", binlog.table))
        (run,) = engine.capture()
        assert run.state == "succeeded", run.error
        assert binlog.checkpoint()["binlog"] != before
        assert lake(engine) == binlog.source()
    finally:
        engine.close()


def test_truncate_empties_the_table_and_a_new_column_evolves(binlog: Binlog) -> None:
    """TRUNCATE lands as explicit deletes; ALTER TABLE ADD COLUMN between captures evolves.

    Before this change the mariadb connector refused ``strategy: cdc`` outright.
    """
    from combined.catalog import data as cat

    engine = Engine.open(binlog.project("mysql"))  # the same connector, as `mysql`
    try:
        engine.capture()
        binlog.sql(
            "UPDATE {t} SET qty = 0 WHERE id = 1",
            "TRUNCATE TABLE {t}",
            "INSERT INTO {t} VALUES (1, 5, 'again'), (900, 9, 'z')",
        )
        (run,) = engine.capture()
        assert run.state == "succeeded", run.error
        assert run.stats is not None and run.stats["items"]["deletes"] == 499
        assert lake(engine) == binlog.source()

        binlog.sql(
            "UPDATE {t} SET qty = -1 WHERE id = 1",
            "ALTER TABLE {t} ADD COLUMN extra INT",
            "UPDATE {t} SET extra = 42 WHERE id = 900",
        )
        (run,) = engine.capture()
        assert run.state == "succeeded", run.error
        rows = engine.sql("SELECT id, qty, extra FROM db.items ORDER BY id").to_pylist()
        assert rows == [
            {"id": 1, "qty": -1, "extra": None},
            {"id": 900, "qty": 9, "extra": 42},
        ]
        with engine.catalog.begin() as conn:
            drift = cat.activity(conn, kind="drift")
        assert [(d.body["class"], d.body["field"]) for d in drift] == [("new_field", "extra")]
    finally:
        engine.close()


def test_a_large_transaction_streams_in_bounded_batches(binlog: Binlog) -> None:
    """One 30,000-row transaction is yielded in batches of at most batch_rows, state last.

    Before this change the mariadb connector refused ``strategy: cdc`` outright.
    """
    from combined.connectors.abc import ReadRequest
    from combined.connectors.mariadb import MariaDBSource
    from combined.protocol import RecordBatchMessage, StateMessage

    state = binlog.first_state()
    binlog.sql(
        "START TRANSACTION",
        "INSERT INTO {t} SELECT seq, 1, 'big' FROM seq_1001_to_31000",
        "UPDATE {t} SET qty = -qty WHERE id <= 500",
        "COMMIT",
    )
    source = MariaDBSource({"dsn": binlog.dsn})
    request = ReadRequest("items", binlog.table, ("id",), "cdc", state=state, batch_rows=1000)
    messages = list(source.read(request))
    batches = [m.batch for m in messages if isinstance(m, RecordBatchMessage)]
    states = [m for m in messages if isinstance(m, StateMessage)]
    assert max(b.num_rows for b in batches) <= 1000
    assert sum(b.num_rows for b in batches) == 30_500
    # rows come before the commit that covers them: one state after all of them, then final
    assert isinstance(messages[-1], StateMessage) and messages[-1].final
    assert [s.final for s in states] == [False, True]
    assert messages.index(states[0]) == len(batches)
    assert states[0].state["binlog"] != state["binlog"]


def test_max_changes_ends_a_read_at_a_transaction_boundary(binlog: Binlog) -> None:
    """`follow --max-changes` reads end after the transaction that reaches the limit, whole.

    Before this change the mariadb connector refused ``strategy: cdc`` outright.
    """
    from combined.connectors.abc import ReadRequest
    from combined.connectors.mariadb import MariaDBSource
    from combined.protocol import RecordBatchMessage, StateMessage

    state = binlog.first_state()
    binlog.sql(
        "UPDATE {t} SET qty = -qty WHERE id <= 10",
        "UPDATE {t} SET qty = -qty WHERE id BETWEEN 11 AND 20",
    )
    source = MariaDBSource({"dsn": binlog.dsn})

    def read(state: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        request = ReadRequest(
            "items", binlog.table, ("id",), "cdc", state=state, options={"max_changes": 5}
        )
        messages = list(source.read(request))
        last = messages[-1]
        assert isinstance(last, StateMessage) and last.final
        rows = sum(m.batch.num_rows for m in messages if isinstance(m, RecordBatchMessage))
        return rows, dict(last.state)

    first, state = read(state)
    second, state = read(state)
    third, _ = read(state)
    assert (first, second, third) == (10, 10, 0)


BOUNDARIES = ["after_staging", "during_commit", "after_commit", "after_projection"]


@pytest.mark.parametrize("boundary", BOUNDARIES)
def test_a_crash_at_any_boundary_loses_and_duplicates_nothing(
    binlog: Binlog, tools: Any, boundary: str
) -> None:
    """SIGKILL at each commit boundary of a binlog capture, then capture again: exactly once.

    The backlog adds a column with a default, whose values the capture reads
    from the source (it failed there before). Before this change the mariadb
    connector refused ``strategy: cdc`` outright.
    """
    binlog.project()
    ok = tools.cli(binlog.root, "capture")
    assert ok.returncode == 0, ok.stderr
    binlog.sql(
        "UPDATE {t} SET qty = qty + 1000 WHERE id <= 300",
        "DELETE FROM {t} WHERE id > 450",
        "ALTER TABLE {t} ADD COLUMN c VARCHAR(10) DEFAULT 'dflt'",
        "INSERT INTO {t} SELECT seq, seq, 'late', 'c' FROM seq_600_to_700",
        "UPDATE {t} SET id = 5000 WHERE id = 7",
    )
    killed = tools.cli(binlog.root, "capture", env={"COMBINED_FAULT": boundary})
    assert killed.returncode == -signal.SIGKILL, (killed.returncode, killed.stderr)
    binlog.sql("INSERT INTO {t} VALUES (9000, 1, 'after the crash', 'x')")
    again = tools.cli(binlog.root, "capture")
    assert again.returncode == 0, again.stderr
    engine = Engine.open(binlog.root / "combined.yaml")
    try:
        assert lake(engine) == binlog.source()
        dup = engine.sql("SELECT count(*) - count(DISTINCT id) AS d FROM db.items").column("d")[0]
        assert dup.as_py() == 0
        filled = engine.sql("SELECT id, c FROM db.items ORDER BY id").to_pylist()
        assert [tuple(r.values()) for r in filled] == binlog.sql(
            "SELECT id, c FROM {t} ORDER BY id"
        )
    finally:
        engine.close()


@pytest.mark.parametrize("anchor", ["pinned", "table_lock"])
def test_writers_during_the_first_snapshot_land_exactly_once(
    binlog: Binlog, anchor: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Transactions committed while the stitched snapshot is read are in it or in the stream.

    Each transaction committed before the anchored position is in the snapshot, every later
    one in the binlog from that position: the lake equals the source, nothing twice. The
    position is MariaDB's pinned one, or (``table_lock``, what a MySQL server gets) the one
    read under a brief read lock on the table while the snapshot opens. Before this change
    the mariadb connector refused ``strategy: cdc`` outright.
    """
    import threading

    from combined.connectors.mariadb import _binlog_stitch, _extract

    if anchor == "table_lock":  # the MySQL path, on this MariaDB server
        monkeypatch.setattr(_binlog_stitch, "pins_snapshots", lambda settings: False)

    binlog.sql("INSERT INTO {t} SELECT seq, seq, 'bulk' FROM seq_501_to_40000")
    stop = threading.Event()
    written = [0]

    def writer() -> None:
        n = 100_000
        while not stop.is_set():
            n += 1
            written[0] += 1
            binlog.sql(
                f"INSERT INTO {{t}} VALUES ({n}, 0, 'w')",
                f"UPDATE {{t}} SET qty = qty + 1 WHERE id = {n % 40000 + 1}",
                f"DELETE FROM {{t}} WHERE id = {n - 5}",
            )

    # The read goes on past its first batch only once the writer has committed
    # ten more transactions: a loaded machine once let the whole read pass
    # while it committed five. (Until the first batch, the bulk read's twin
    # snapshot holds writers back: docs of connectors/mariadb/_arrow_read.py.)
    read = _extract.MariaDBExtraction._whole

    def after_writes(self: Any, work: Any) -> Any:
        messages = read(self, work)
        first = next(messages, None)
        floor, deadline = written[0] + 10, time.monotonic() + 60
        while written[0] < floor and time.monotonic() < deadline:
            time.sleep(0.01)
        if first is not None:
            yield first
        yield from messages

    monkeypatch.setattr(_extract.MariaDBExtraction, "_whole", after_writes)
    thread = threading.Thread(target=writer)
    thread.start()
    engine = Engine.open(binlog.project())
    try:
        try:
            before = written[0]
            (run,) = engine.capture()
            assert run.state == "succeeded", run.error
            assert written[0] > before + 5  # the writer committed while the snapshot was read
        finally:
            stop.set()
            thread.join()
        (run,) = engine.capture()
        assert run.state == "succeeded", run.error
        assert lake(engine) == binlog.source()
    finally:
        engine.close()
