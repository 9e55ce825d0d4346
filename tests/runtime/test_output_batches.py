"""A change stream's joined rows reach the Deliveries in batches of bounded bytes, not rows."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from tests.runtime.test_reduce_change_stream import _change_stream
from tests.runtime.test_reduce_streamed import CONSTANTS

from combined.capture import _deliver as _deliver_module
from combined.capture import _output as _output_module
from combined.capture._output import OUTPUT_BATCH_BYTES, OUTPUT_BATCH_ROWS
from combined.capture._reduce import Reducer
from combined.delivery import StagedParts

#: The payload of every stream here: a key, a text that is large or not, a number.
PAYLOAD = [("id", pa.int64()), ("big", pa.string()), ("n", pa.int64())]


def _stream(tmp_path: Path, columns: dict[str, list[Any]], part_rows: int) -> list[Path]:
    """A change stream of (id, big, n) staged in parts of ``part_rows`` changes."""
    parts, _ = _change_stream(tmp_path, PAYLOAD, columns, part_rows)
    return parts


def _output(
    tmp_path: Path, parts: list[Path], sync_mode: str = "incremental"
) -> list[pa.RecordBatch]:
    """The stream reduced at the default memory, its output batches at the default rows."""
    from combined.delivery import part_schema

    r = Reducer(
        capture_files=parts,
        capture_schema=pa.unify_schemas([part_schema(p) for p in parts]),
        current_files=[],
        key=["id"],
        strategy="cdc",
        sync_mode=sync_mode,
        memory_limit=256 * 2**20,
        spill_dir=tmp_path,
        baseline=False,
    )
    try:
        r.reduce()
        r.release()
        return list(r.output(CONSTANTS))
    finally:
        r.close()


def test_wide_rows_are_delivered_a_few_mb_a_batch(tmp_path: Path) -> None:
    # 3,000 updates staging a 5 kB text each and leaving ``n`` alone (filled
    # from the inserts before them): one 16,384-row batch held all 15 MB
    # until its last chunk was written.
    n = 3000
    big = [f"{i:05d}" + "x" * 5_000 for i in range(n)]
    parts = _stream(
        tmp_path,
        {
            "id": list(range(n)) * 2,
            "big": ["v"] * n + big,
            "n": list(range(n)) + [None] * n,
            "_combined_op": ["insert"] * n + ["update"] * n,
            "_combined_unchanged": [None] * n + [["n"]] * n,
        },
        part_rows=n,
    )
    batches = _output(tmp_path, parts)
    rows = pa.Table.from_batches(batches).sort_by("id").to_pylist()
    assert [(r["id"], r["big"], r["n"]) for r in rows] == [(i, big[i], i) for i in range(n)]
    # (8 MB of 5 kB rows: 1,638, of which the power of two below)
    assert max(b.num_rows for b in batches) == 1024
    assert max(b.nbytes for b in batches) <= OUTPUT_BATCH_BYTES


def test_narrow_filled_rows_keep_the_full_batches(tmp_path: Path) -> None:
    n = 20_000
    parts = _stream(
        tmp_path,
        {
            "id": list(range(n)) * 2,
            "big": [f"v{i}" for i in range(n)] + [None] * n,
            "n": [0] * n + list(range(n)),
            "_combined_op": ["insert"] * n + ["update"] * n,
            "_combined_unchanged": [None] * n + [["big"]] * n,
        },
        part_rows=2 * n,
    )
    batches = _output(tmp_path, parts)
    assert sum(b.num_rows for b in batches) == n
    assert max(b.num_rows for b in batches) == OUTPUT_BATCH_ROWS


def test_a_part_is_weighed_once_however_many_windows_its_fills_take(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 3,000 updates leaving a 5 kB text alone: 30 MB of fills (as text), met in
    # windows of 8 MB; weighing a part reads all of it (a compressed part: decodes it).
    n = 3000
    big = [f"{i:05d}" + "x" * 5_000 for i in range(n)]
    parts = _stream(
        tmp_path,
        {
            "id": list(range(n)) * 2,
            "big": big + [None] * n,
            "n": [0] * n + list(range(n)),
            "_combined_op": ["insert"] * n + ["update"] * n,
            "_combined_unchanged": [None] * n + [["big"]] * n,
        },
        part_rows=n,
    )
    weighed: list[Path] = []
    met: list[Path] = []
    weigh, deliver = _output_module._joined_rows, _output_module.part_rows

    def weighing(part: StagedParts, batch_rows: int) -> int:
        weighed.extend(part.paths)
        return weigh(part, batch_rows)

    def delivering(con: Any, ranges: Sequence[Any], *args: Any, **kwargs: Any) -> Any:
        met.extend(path for path, _ in ranges)
        return deliver(con, ranges, *args, **kwargs)

    monkeypatch.setattr(_output_module, "_joined_rows", weighing)
    monkeypatch.setattr(_deliver_module, "part_rows", delivering)
    batches = _output(tmp_path, parts)
    rows = pa.Table.from_batches(batches).sort_by("id").to_pylist()
    assert [(r["id"], r["big"], r["n"]) for r in rows] == [(i, big[i], i) for i in range(n)]
    assert len(met) > len(set(met))  # (the premise: a part met in several windows)
    assert sorted(weighed) == sorted(set(met))


def test_an_event_streams_wide_rows_come_in_small_batches_in_log_order(tmp_path: Path) -> None:
    # An append stream delivers every change, each part's in ordinal order:
    # cut into many batches, the order holds across them.
    n = 3000
    big = [f"{i:05d}" + "x" * 5_000 for i in range(n)]
    ids = [(i * 7919) % n for i in range(n)]  # (ids out of their order: the log's order shows)
    parts = _stream(
        tmp_path,
        {
            "id": ids * 2,
            "big": ["v"] * n + [big[i] for i in ids],
            "n": ids + [None] * n,
            "_combined_op": ["insert"] * n + ["update"] * n,
            "_combined_unchanged": [None] * n + [["n"]] * n,
        },
        part_rows=n,
    )
    batches = _output(tmp_path, parts, "append")
    rows = pa.Table.from_batches(batches).to_pylist()
    wide = [b.num_rows for b in batches if b.column("big")[0].as_py() != "v"]
    assert max(wide) == 1024 and sum(wide) == n  # (the inserts' part: narrow, one batch)
    assert [(r["id"], r["big"], r["n"]) for r in rows] == [(i, "v", i) for i in ids] + [
        (i, big[i], i) for i in ids
    ]
