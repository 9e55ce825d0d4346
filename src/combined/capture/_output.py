"""The last step of a reduction: the rows to deliver, with their constant provenance.

Columns constant over a transition are added to each batch as Arrow
constants: DuckDB would print the same strings into every row.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import pyarrow as pa

from combined.delivery import read_part
from combined.protocol import _provenance as prov
from combined.protocol.identity import quote_ident

#: Rows per output batch. DuckDB's reader runs several batches ahead of its
#: consumer: 64k-row batches of a typical table held ~150 MB, 16k-row ones
#: ~80 MB. The Delivery writer gathers them back into full row groups.
OUTPUT_BATCH_ROWS = 16_384

#: Provenance columns holding instants (given as ISO 8601 text in the constants).
_TIMES = frozenset({prov.EMITTED_AT, prov.OBSERVED_AT, prov.INGESTED_AT})


class _Constants:
    """Columns holding one value, built once and sliced for each batch (zero-copy)."""

    def __init__(self, scalars: dict[str, pa.Scalar], rows: int) -> None:
        self.scalars = scalars
        self.arrays = {name: pa.repeat(scalar, rows) for name, scalar in scalars.items()}

    def add(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        """``batch`` with every constant column appended."""
        n = batch.num_rows
        for name, array in self.arrays.items():
            if n > len(array):  # a longer batch than promised: built for it alone
                array = pa.repeat(self.scalars[name], n)
            batch = batch.append_column(name, array.slice(0, n))
        return batch


def constant_columns(
    capture_schema: pa.Schema, constants: dict[str, Any]
) -> tuple[str, dict[str, pa.Scalar]]:
    """The SQL of the provenance the staged rows carry, and the constant provenance's values.

    ``constants`` holds the transition's ``observed_at``, ``ingested_at``,
    ``run_id``, ``producer`` and ``position``; a staged column (a change
    stream's emission time and position) wins over a constant.
    """
    types = {f.name: f.type for f in prov.provenance_fields()}
    fixed: dict[str, Any] = {
        prov.OBSERVED_AT: constants["observed_at"],
        prov.INGESTED_AT: constants.get("ingested_at"),
        prov.RUN_ID: constants["run_id"],
        prov.DELIVERY_ID: None,  # each Delivery's writer stamps its own
        prov.PRODUCER: constants["producer"],
    }
    provenance = ""
    for name in (prov.EMITTED_AT, prov.SOURCE_POSITION):
        if name in capture_schema.names:
            provenance += f", c.{quote_ident(name)} AS {name}"
        else:
            fixed[name] = constants.get("position") if name == prov.SOURCE_POSITION else None
    scalars = {
        name: pa.scalar(
            datetime.fromisoformat(value) if isinstance(value, str) and name in _TIMES else value,
            types[name],
        )
        for name, value in fixed.items()
    }
    return provenance, scalars


def staged_rows(
    paths: Sequence[Path],
    payload: Sequence[str],
    op: str,
    scalars: dict[str, pa.Scalar],
    batch_rows: int,
) -> Iterator[pa.RecordBatch]:
    """Every staged row, part by part, with its operation ``op`` and the constant provenance.

    A part staged before a column appeared lacks it, and a widened
    column keeps its narrower type there: the lake conversion that
    follows fills and casts them, as it does any batch.
    """
    wanted = {*payload, prov.ID, prov.PAYLOAD_HASH, prov.EMITTED_AT, prov.SOURCE_POSITION}
    constants = _Constants({prov.OP: pa.scalar(op, pa.string()), **scalars}, batch_rows)
    for path in paths:
        for batch in read_part(path):
            batch = batch.select([n for n in batch.schema.names if n in wanted])
            for offset in range(0, batch.num_rows, batch_rows):
                yield constants.add(batch.slice(offset, batch_rows))
