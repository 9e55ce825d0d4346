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

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from tests.connectors.postgres.test_cdc_end import Slot, _stand_up

from combined.connectors.postgres import _assemble, _batch, _replication

pytestmark = pytest.mark.postgres

#: Rows of the backlog, in this many transactions.
ROWS, TRANSACTIONS = 20_000, 4


@pytest.fixture
def backlog(dsn: str) -> Iterator[Slot]:
    """A slot with a backlog of ROWS inserts, in TRANSACTIONS transactions."""
    for env in _stand_up(dsn):
        step = ROWS // TRANSACTIONS
        with psycopg.connect(dsn, autocommit=True) as conn:
            for lo in range(0, ROWS, step):
                conn.execute(
                    f"INSERT INTO {env.table} SELECT g, 'v' || g "
                    "FROM generate_series(%s::int, %s::int) g",
                    (lo + 1, lo + step),
                )
        yield env


def test_a_trickling_stream_is_fed_a_transaction_at_a_time(
    backlog: Slot, monkeypatch: pytest.MonkeyPatch
) -> None:
    feeds: list[int] = []
    feed_rows = _assemble._Assembler.feed_rows

    def counted(self: Any, rows: Any) -> Any:
        feeds.append(len(rows))
        return feed_rows(self, rows)

    monkeypatch.setattr(_assemble._Assembler, "feed_rows", counted)
    ids, _ = backlog.read()  # (its last state final)
    assert ids == list(range(1, ROWS + 1))  # every row once, in commit order
    assert sum(feeds) == ROWS
    # Each transaction's rows: fed 4,096 at a time, and what is left before its commit.
    assert len(feeds) <= TRANSACTIONS * (ROWS // TRANSACTIONS // 4096 + 1), feeds[:50]


#: Single-row transactions of the second backlog.
SINGLE = 3_000


def test_single_row_transactions_are_parsed_and_handed_over_in_few_rounds(
    dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A busy OLTP source commits a row at a time. Each transaction's one row
    # took a numpy round (~35 us) to be fed, and a reader that caught up with
    # the walsender between two transactions drained a batch of the few rows
    # it held each time: 6.3k changes/s where transactions of many rows drain
    # at 50-100k. Rows of a few are now fed one by one, and a drain waits
    # for the stream to pause: a read that waited and got nothing.
    rounds: list[int] = []
    flushed: list[int] = []
    pauses: list[float] = []
    wire_ops, flush = _batch.wire_ops, _batch.ChangeBatcher.flush
    read = _replication.ReplicationStream.read

    def counted_ops(raw: Any, at: Any) -> Any:
        rounds.append(len(at))
        return wire_ops(raw, at)

    def counted_flush(self: Any) -> Any:
        batch = flush(self)
        if batch is not None:
            flushed.append(batch.num_rows)
        return batch

    def counted_read(self: Any, timeout: float) -> Any:
        got = read(self, timeout)
        if got is None and timeout > 0:
            pauses.append(timeout)
        return got

    monkeypatch.setattr(_assemble, "wire_ops", counted_ops)
    monkeypatch.setattr(_batch.ChangeBatcher, "flush", counted_flush)
    monkeypatch.setattr(_replication.ReplicationStream, "read", counted_read)
    for env in _stand_up(dsn):
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(
                f"DO $$ BEGIN FOR g IN 1..{SINGLE} LOOP "
                f"INSERT INTO {env.table} VALUES (g, 'v' || g); COMMIT; END LOOP; END $$"
            )
        ids, _ = env.read(flush_interval=3600.0)  # (no drain by the clock)
        assert ids == list(range(1, SINGLE + 1))  # every row once, in commit order
    assert rounds == []  # no numpy round for a feed of one row
    assert sum(flushed) == SINGLE
    # One batch at the run's end, and at most one a pause of the stream.
    assert len(flushed) <= len(pauses) + 1, (flushed[:50], len(pauses))
