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

from combined.connectors.postgres import _assemble

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
