"""A large MariaDB transaction, and a key change of every row it holds, drain in one capture.

The capture runs in a child process (the CLI) so that its peak RSS is its own.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from bench.measure import timed_child
from tests.engine._binlog import Binlog

from combined.engine import Engine

#: The capture's peak: ~240 MB for a 2-row table on this machine, ~400 MB with this backlog
#: (the same with a 1M-change backlog: the memory is bounded by batches, not the transaction).
CEILING_MB = 480


def _capture(root: Path) -> tuple[int, str, float]:
    """`combined capture` in a child process: its exit code, stderr and peak RSS in MB.

    Measured by a parent of its own (``bench.measure.timed_child``): this
    process's ``RUSAGE_CHILDREN`` would hold the largest child of every test
    it ran before (CI runs this one after others in one process).
    """
    rc, _, rss, _, _, err = timed_child(
        ["-c", "from combined.cli import main; main()", "capture"], cwd=root
    )
    return rc, err, rss


def _totals(rows: list[tuple[object, ...]]) -> list[int]:
    return [int(str(v)) for v in rows[0]]


def _assert_lake_is_source(binlog: Binlog, aggregates: str) -> None:
    """The lake's table and the source's give the same count and ``aggregates``."""
    totals = f"SELECT count(*), {aggregates} FROM "
    source = _totals(binlog.sql(totals + "{t}"))
    engine = Engine.open(binlog.root / "combined.yaml")
    try:
        lake = _totals([tuple(engine.sql(totals + "db.items").to_pylist()[0].values())])
    finally:
        engine.close()
    assert lake == source


@pytest.mark.slow
@pytest.mark.parametrize("rows", [300_000, 500_000])
def test_a_large_update_then_key_changes_of_half_its_rows_drain_in_bounded_memory(
    binlog: Binlog, rows: int
) -> None:
    """Before, this capture failed for DuckDB's memory ("Out of Memory Error ... 61.0 MiB
    used") in 6 of 7 runs at 300k rows (600k changes), and in 1 of 2 at 500k (1M changes):
    the window picking each key's last change ran inside one join with the lake's rows."""
    binlog.sql(
        "DELETE FROM {t}",
        f"INSERT INTO {{t}} SELECT seq, seq, CONCAT('n', seq) FROM seq_1_to_{rows}",
    )
    binlog.project()
    rc, err, _ = _capture(binlog.root)
    assert rc == 0, err
    binlog.sql("START TRANSACTION", "UPDATE {t} SET qty = qty + 1", "COMMIT")
    binlog.sql(f"UPDATE {{t}} SET id = id + 1000000 WHERE id <= {rows // 2}")  # key changes
    rc, err, peak = _capture(binlog.root)
    assert rc == 0, err
    assert peak < CEILING_MB, f"peak RSS {peak:.0f} MB"
    _assert_lake_is_source(binlog, "sum(id), sum(qty), sum(id * qty), min(id), max(id)")


#: What one large transaction of wide rows may add to the peak of a capture of a few
#: changes (its floor: the imports, DuckDB, the lake; ~235 MB here). Measured: +~125 MB;
#: +~310 MB before each staged part's rows were taken a window at a time (a whole part
#: taken at once, ~64 MB of wide rows, stayed whole while the Delivery writers sliced it).
WIDE_GROWTH_MB = 200


@pytest.mark.slow
def test_one_large_transaction_of_wide_rows_drains_in_bounded_memory(binlog: Binlog) -> None:
    """100k rows of ~1.5 KB in one transaction (~150 MB of changes) read as batches and
    delivered a window at a time: the peak stays near a few changes' peak."""
    binlog.sql("ALTER TABLE {t} ADD COLUMN body TEXT")
    binlog.project()
    rc, err, _ = _capture(binlog.root)
    assert rc == 0, err
    binlog.sql("UPDATE {t} SET qty = qty + 1 WHERE id <= 10")
    rc, err, floor = _capture(binlog.root)
    assert rc == 0, err
    binlog.sql(
        "INSERT INTO {t} SELECT seq, seq, CONCAT('n', seq), REPEAT(CONCAT('b', seq), 250) "
        "FROM seq_1001_to_101000"
    )
    rc, err, peak = _capture(binlog.root)
    assert rc == 0, err
    assert peak - floor < WIDE_GROWTH_MB, f"peak RSS {peak:.0f} MB, {floor:.0f} MB for 10 changes"
    _assert_lake_is_source(binlog, "sum(id), sum(qty), sum(length(body))")
