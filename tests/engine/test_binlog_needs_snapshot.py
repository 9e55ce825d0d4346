"""What the binlog holds that only a new snapshot mends ends the Run ``needs_review``.

Rows left or moved without a row event (a partition truncated or dropped, a
table renamed), or a change logged without its whole row: no retry reads
them. The Runs ended ``failed``, which schedules and ``cdc follow`` retried
for ever and alerts told as "retry later", while the hint said to take a new
snapshot.
"""

from __future__ import annotations

from typing import Any

import pytest
from tests.engine.test_binlog_capture import Binlog, binlog, resnapshot

from combined.engine import Engine

__all__ = ["binlog"]

#: The command pair every such error names.
RESNAPSHOT = "`combined cdc teardown <source>` then `combined cdc setup <source>`"


@pytest.mark.parametrize(
    ("statement", "said"),
    [
        ("ALTER TABLE {t} TRUNCATE PARTITION p0", "altered (TRUNCATE PARTITION)"),
        ("ALTER TABLE {t} DROP PARTITION p0", "altered (DROP PARTITION)"),
    ],
)
def test_a_partition_emptied_in_the_backlog_needs_a_new_snapshot(
    binlog: Binlog, statement: str, said: str
) -> None:
    """The partition's rows leave without row events: the capture stops, ``needs_review``,
    naming the command pair, and that pair's new snapshot lands the table as it is."""
    binlog.sql(
        "ALTER TABLE {t} PARTITION BY RANGE (id) "
        "(PARTITION p0 VALUES LESS THAN (100), PARTITION p1 VALUES LESS THAN MAXVALUE)"
    )
    engine = Engine.open(binlog.project())
    try:
        (run,) = engine.capture()
        assert run.state == "succeeded", run.error
        binlog.sql("DELETE FROM {t} WHERE id = 300", statement)
        (run,) = engine.capture()
        assert run.state == "needs_review", run.error
        assert said in (run.error or "") and RESNAPSHOT in (run.error or "")
        assert len(engine.run(run.id)["attempts"]) == 1  # not retried
        assert engine.sql("SELECT count(*) AS n FROM db.items").column("n")[0].as_py() == 500
        resnapshot(engine, binlog)
    finally:
        engine.close()


def test_a_key_column_dropped_in_the_backlog_needs_a_new_snapshot(binlog: Binlog) -> None:
    """A row image without the dataset's key cannot be matched to its lake row."""
    engine = Engine.open(binlog.project())
    try:
        engine.capture()
        binlog.sql("ALTER TABLE {t} DROP COLUMN id", "UPDATE {t} SET note = 'x' WHERE qty = 5")
        (run,) = engine.capture()
        assert run.state == "needs_review", run.error
        assert "lacks key column 'id'" in (run.error or "") and RESNAPSHOT in (run.error or "")
    finally:
        engine.close()


def test_follow_stops_at_a_renamed_table_as_at_a_purged_position(
    binlog: Binlog, tools: Any
) -> None:
    """`cdc follow` ends at once with exit 3 (a person must act) on a RENAME TABLE of the
    captured table in the backlog; it went on failing every capture, exit 1 at its end."""
    binlog.project()
    root = binlog.root
    setup = tools.cli(root, "cdc", "setup", "db")
    assert setup.returncode == 0, setup.stdout + setup.stderr
    binlog.sql(
        "UPDATE {t} SET qty = 0 WHERE id = 1",
        f"RENAME TABLE {{t}} TO old_{binlog.table}",
        "CREATE TABLE {t} (id BIGINT PRIMARY KEY, qty INT, note VARCHAR(40))",
    )
    follow = tools.cli(root, "cdc", "follow", "db", "--every", "0", "--iterations", "3")
    assert follow.returncode == 3, follow.stdout + follow.stderr
    runs = [ln for ln in follow.stdout.splitlines() if " run " in ln]
    assert len(runs) == 1 and "needs_review" in runs[0], follow.stdout
    assert "renamed" in follow.stderr and RESNAPSHOT in follow.stderr
