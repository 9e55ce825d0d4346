"""A stream read as the server decodes it is parsed in few, large feeds.

A walsender sends each change as it decodes it: a reader that caught up with
it got a few changes a read (often one, the next one's bytes still on their
way), and fed each read's rows to the assembler on its own: one numpy round
a feed however few rows it took, 8,000-28,000 feeds and 0.3-1.0 CPU-s for a
500,000-change backlog on 2 shared cores (issue 25). The rows of an open
transaction are now gathered across reads and fed together: at most one
feed a transaction beyond one per 4,096 rows, however the reads fell (the
count is bounded whatever the pace; how many reads there were is not).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from combined.connectors.postgres import _assemble
from combined.connectors.postgres._cdc import CdcExtraction
from combined.connectors.postgres._connect import Settings
from combined.connectors.postgres._publication import drop_publication, ensure_publication
from combined.connectors.postgres._replication import create_slot, drop_slot
from combined.protocol import OP_COLUMN, RecordBatchMessage, StateMessage

pytestmark = pytest.mark.postgres

#: Rows of the backlog, in this many transactions.
ROWS, TRANSACTIONS = 20_000, 4


@pytest.fixture
def backlog(dsn: str) -> Iterator[tuple[str, str, str, str, int]]:
    """A slot with a backlog of ROWS inserts; (dsn, table, publication, slot, start)."""
    sfx = f"{os.getpid()}_{uuid.uuid4().hex[:8]}"
    table, pub, slot = f"trickle_{sfx}", f"trickle_pub_{sfx}", f"trickle_slot_{sfx}"
    pg = Settings(dsn)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {table} (id int PRIMARY KEY, v text)")
        try:
            ensure_publication(pg, pub, [table])
            with create_slot(pg, slot) as handle:
                start = handle.consistent_point
            step = ROWS // TRANSACTIONS
            for lo in range(0, ROWS, step):
                conn.execute(
                    f"INSERT INTO {table} SELECT g, 'v' || g "
                    "FROM generate_series(%s::int, %s::int) g",
                    (lo + 1, lo + step),
                )
            yield dsn, table, pub, slot, start
        finally:
            conn.execute(
                "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots "
                "WHERE slot_name = %s AND active_pid IS NOT NULL",
                (slot,),
            )
            drop_slot(pg, slot)
            drop_publication(pg, pub)
            conn.execute(f"DROP TABLE IF EXISTS {table}")


def test_a_trickling_stream_is_fed_a_transaction_at_a_time(
    backlog: tuple[str, str, str, str, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    dsn, table, pub, slot, start = backlog
    feeds: list[int] = []
    feed_rows = _assemble._Assembler.feed_rows

    def counted(self: Any, rows: Any) -> Any:
        feeds.append(len(rows))
        return feed_rows(self, rows)

    monkeypatch.setattr(_assemble._Assembler, "feed_rows", counted)
    ex = CdcExtraction(
        Settings(dsn),
        slot=slot,
        publication=pub,
        datasets={"t": table},
        start_lsn=start,
        end_lsn="current",
    )
    try:
        out = list(ex)
    finally:
        ex.finish("success")
    ids = [
        r["id"]
        for m in out
        if isinstance(m, RecordBatchMessage)
        for r in m.batch.to_pylist()
        if r[OP_COLUMN] == "insert"
    ]
    assert ids == list(range(1, ROWS + 1))  # every row once, in commit order
    assert [m for m in out if isinstance(m, StateMessage)][-1].final
    assert sum(feeds) == ROWS
    # Each transaction's rows: fed 4,096 at a time, and what is left before its commit.
    assert len(feeds) <= TRANSACTIONS * (ROWS // TRANSACTIONS // 4096 + 1), feeds[:50]
