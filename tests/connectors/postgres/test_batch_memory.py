"""A batch of wide row changes is built holding the rows' bytes about once, not three times."""

from __future__ import annotations

from datetime import UTC, datetime

from tests._memory import anonymous_growth

from combined.connectors.postgres._batch import ChangeBatcher
from combined.connectors.postgres._pgoutput import Relation, RelationColumn, TupleData
from combined.connectors.postgres._tuples import encode_tuple
from combined.runtime._memory import tune_allocators

#: 300 text columns of 50 bytes a row, 2,000 rows: 30 MB on the wire.
COLUMNS, ROWS, WIDTH = 300, 2_000, 50


def _batcher() -> ChangeBatcher:
    columns = (RelationColumn("id", 20, -1, True),) + tuple(
        RelationColumn(f"c{i}", 25, -1, False) for i in range(COLUMNS - 1)
    )
    return ChangeBatcher(Relation(7, "public", "wide", "d", columns), batch_rows=ROWS + 1)


def _insert(row: int) -> bytes:
    values = [str(row).encode()] + [
        (b"%d-%d-" % (row, i)).ljust(WIDTH, b"x") for i in range(COLUMNS - 1)
    ]
    tuple_data = TupleData(kinds="t" * COLUMNS, values=tuple(values))
    return b"I" + (7).to_bytes(4, "big") + b"N" + encode_tuple(tuple_data)


def test_a_flush_holds_the_rows_bytes_about_once() -> None:
    # The batch's messages, their bytes joined, every column's values copied
    # out of them and the converted columns were all held at once: a CDC
    # batch of 300-column rows (64 MB of them) peaked its capture at 560 MB.
    # The messages now go once joined, each column's values once converted.
    tune_allocators()  # (as the engine runs: Arrow allocating from the heaps the messages leave)
    b = _batcher()
    when = datetime(2026, 1, 1, tzinfo=UTC)
    for row in range(ROWS):
        b.add_wire(_insert(row), commit_lsn=100, commit_time=when)
    wire = b.nbytes
    assert wire > 29 << 20
    with anonymous_growth() as growth:
        batch = b.flush()
    assert batch is not None and batch.num_rows == ROWS
    assert batch.column("c7")[3].as_py() == "3-7-".ljust(WIDTH, "x")
    (grown,) = growth
    # (the converted batch itself is ~the wire's bytes; here ~1.2 times them, before ~2.2)
    assert grown < 1.6 * wire, f"grew {grown >> 20} MB for {wire >> 20} MB of rows"
