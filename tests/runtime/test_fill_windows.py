"""A change stream's filled rows, window by window: the same keys and rows as in one window."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from tests.runtime.test_reduce_streamed import CONSTANTS, new_reducer

from combined.capture import _unchanged
from combined.delivery import Limits, PartWriter, StagingArea

SCHEMA = pa.schema(
    [
        ("id", pa.int64()),
        ("n", pa.int64()),
        ("doc", pa.string()),
        ("tags", pa.list_(pa.string())),
        ("_combined_op", pa.string()),
        ("_combined_ordinal", pa.int64()),
        ("_combined_unchanged", pa.list_(pa.string())),
    ]
)


def _changes(ids: int, rounds: int) -> dict[str, list[Any]]:
    """Inserts, then rounds of updates: marked or not, a delete and an insert again."""
    rows: list[tuple[Any, ...]] = [
        (i, 0, f"doc {i} " + "d" * 500, [f"t{i}", "x" * 300], "insert", None) for i in range(ids)
    ]
    for r in range(1, rounds + 1):
        for i in range(ids):
            kind = (i + r) % 5
            if kind == 0:  # a new document: nothing marked
                rows.append((i, r, f"doc {i}.{r} " + "e" * 400, [f"t{i}.{r}"], "update", None))
            elif kind == 4 and r == rounds:  # the row goes
                rows.append((i, r, None, None, "delete", None))
            else:  # the document (and, one in two, the tags) left as they were
                marked = ["doc", "tags"] if kind % 2 else ["doc"]
                tags = None if kind % 2 else [f"u{i}.{r}"]
                rows.append((i, r, None, tags, "update", marked))
    names = ["id", "n", "doc", "tags", "_combined_op", "_combined_unchanged"]
    data = {name: [row[j] for row in rows] for j, name in enumerate(names)}
    return data | {"_combined_ordinal": list(range(len(rows)))}


def _reduced(tmp_path: Path, parts: list[Path]) -> tuple[pa.Table, pa.Table]:
    """The reduction's keys table and its output rows, each in ordinal order."""
    r = new_reducer(tmp_path, parts, SCHEMA, strategy="cdc", baseline=False)
    try:
        r.reduce()
        keys = r.con.sql("SELECT * FROM keys ORDER BY ord").to_arrow_table()
        rows = pa.Table.from_batches(list(r.output(CONSTANTS, 100)))
        return keys, rows.sort_by("_combined_id")
    finally:
        r.close()


def test_filled_rows_hashed_and_delivered_window_by_window_as_in_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    writer = PartWriter(StagingArea(tmp_path / "staging", Limits()), "s/d/capture", 700, 2**40)
    for batch in pa.table(_changes(400, 6), schema=SCHEMA).to_batches(150):
        writer.write(batch)
    parts = writer.close()
    assert len(parts) > 2
    whole = _reduced(tmp_path / "whole", parts)
    cuts: list[tuple[int, ...]] = []
    resolve = _unchanged.resolve_unchanged

    def resolved(*args: Any, **kwargs: Any) -> _unchanged.Resolved:
        out = resolve(*args, **kwargs)
        cuts.append(out.cuts)
        return out

    monkeypatch.setattr(_unchanged, "FILL_WINDOW_BYTES", 20_000)
    monkeypatch.setattr("combined.capture._reduce.resolve_unchanged", resolved)
    windowed = _reduced(tmp_path / "windows", parts)
    assert len(cuts[0]) > 3 * len(parts)  # (windows inside parts, not only at their ends)
    assert windowed[0].equals(whole[0])
    assert windowed[1].equals(whole[1])
    # (no lake: a row deleted in the stream was never there, the others inserted)
    assert set(whole[1].column("_combined_op").to_pylist()) == {"insert"}
    assert whole[1].num_rows == 320
    (row,) = whole[1].filter(pa.compute.equal(whole[1].column("id"), 1)).to_pylist()
    assert row["doc"] == "doc 1.4 " + "e" * 400  # (filled from round 4's)
    assert row["tags"] == ["u1.6"]
