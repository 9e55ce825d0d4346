"""Statements in the binlog that empty, replace or move a captured table's rows.

Each writes no row event: the read must see the statement, however it is
spelled, or the lake keeps rows the source no longer has.
"""

from __future__ import annotations

from typing import Any

import pytest

from combined.connectors.mariadb import MariaDBSource
from combined.errors import SourceError
from combined.protocol import OP_COLUMN, RecordBatchMessage, StateMessage

PARTITIONED = (
    "CREATE TABLE ddl (id INT, p INT, PRIMARY KEY (id, p)) ENGINE=InnoDB "
    "PARTITION BY RANGE (p) (PARTITION p0 VALUES LESS THAN (10), "
    "PARTITION p1 VALUES LESS THAN (50))"
)


def _changes(admin: Any, source: MariaDBSource, make_request: Any, *statements: str) -> Any:
    """The stitched snapshot of ``ddl``, then ``statements``, then the read of the log."""
    first = list(source.read(make_request("ddl", strategy="cdc", key=("id", "p"))))
    (state,) = [m for m in first if isinstance(m, StateMessage)]
    admin.sql(*statements)
    return source.read(make_request("ddl", strategy="cdc", key=("id", "p"), state=state.state))


@pytest.mark.usefixtures("binlog_on")
@pytest.mark.parametrize(
    "statement",
    [
        "TRUNCATE ddl",  # TABLE is optional
        "/* nightly purge */ TRUNCATE TABLE ddl",
        "-- purge\nTRUNCATE `ddl`",
        "/*!40000 TRUNCATE TABLE ddl */",
    ],
)
def test_a_truncate_however_spelled_empties_the_table(
    admin: Any, source: MariaDBSource, make_request: Any, statement: str
) -> None:
    """Before, these spellings went by unseen: the lake kept every row the source had lost."""
    admin.sql(PARTITIONED, "INSERT INTO ddl VALUES (1, 1), (2, 20)")
    changes = list(_changes(admin, source, make_request, statement))
    ops = [
        op
        for m in changes
        if isinstance(m, RecordBatchMessage)
        for op in m.batch.column(OP_COLUMN).to_pylist()
    ]
    assert ops == ["truncate"]


@pytest.mark.usefixtures("binlog_on")
@pytest.mark.parametrize(
    ("statements", "said"),
    [
        (["CREATE OR REPLACE TABLE ddl (id INT, p INT, PRIMARY KEY (id, p))"], "replaced"),
        (["ALTER IGNORE TABLE ddl DROP PARTITION p0"], "drop partition"),
        (["/* archive */ ALTER TABLE ddl TRUNCATE PARTITION p0"], "truncate partition"),
        (["ALTER TABLE ddl CONVERT PARTITION p0 TO TABLE ddl_out"], "convert partition"),
        (
            [
                "CREATE TABLE ddl_in (id INT, p INT, PRIMARY KEY (id, p)) ENGINE=InnoDB",
                "INSERT INTO ddl_in VALUES (3, 70)",
                "ALTER TABLE ddl CONVERT TABLE ddl_in TO PARTITION p2 VALUES LESS THAN (100)",
            ],
            "convert table",
        ),
    ],
)
def test_a_statement_moving_rows_without_row_events_fails_the_read(
    admin: Any, source: MariaDBSource, make_request: Any, statements: list[str], said: str
) -> None:
    """Before, each went by unseen: rows gone (or arrived) in the source, not in the lake."""
    admin.sql(PARTITIONED, "INSERT INTO ddl VALUES (1, 1), (2, 20)")
    with pytest.raises(SourceError, match=f"(?i){said}") as failed:
        list(_changes(admin, source, make_request, *statements))
    assert "combined cdc teardown" in (failed.value.hint or "")


@pytest.mark.usefixtures("binlog_on")
def test_a_comment_naming_a_partition_clause_does_not_fail_the_read(
    admin: Any, source: MariaDBSource, make_request: Any
) -> None:
    """Words inside a comment or a literal are not clauses: the column's comment goes by."""
    admin.sql(PARTITIONED, "INSERT INTO ddl VALUES (1, 1)")
    changes = _changes(
        admin,
        source,
        make_request,
        "ALTER TABLE ddl COMMENT 'drop partition p0 next year' /* truncate partition */",
        "INSERT INTO ddl VALUES (2, 2)",
    )
    rows = [r for m in changes if isinstance(m, RecordBatchMessage) for r in m.batch.to_pylist()]
    assert [(r["id"], r[OP_COLUMN]) for r in rows] == [(2, "insert")]
