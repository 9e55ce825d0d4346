"""Unusual file shapes read directly: real files, real DuckDB, no engine.

Each test here once lost or changed a value without an error.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from combined.connectors.abc import ReadRequest
from combined.connectors.files import FilesSource
from combined.protocol import RecordBatchMessage

#: Past DuckDB's default sample of 20,480 rows.
_PAST_SAMPLE = 30_000


def _rows(root: Path, relation: str) -> pa.Table:
    source = FilesSource({"path": str(root)})
    request = ReadRequest(dataset="d", relation=relation, key=("id",), strategy="snapshot")
    extraction = source.read(request)
    try:
        batches = [m.batch for m in extraction if isinstance(m, RecordBatchMessage)]
    finally:
        extraction.finish("abort")
    return pa.Table.from_batches(batches)


def test_a_json_key_first_seen_past_the_sample_is_read(tmp_path: Path) -> None:
    lines = [json.dumps({"id": i, "v": i}) for i in range(_PAST_SAMPLE)]
    lines.append(json.dumps({"id": _PAST_SAMPLE, "v": 0, "late": "kept"}))
    (tmp_path / "events").mkdir()
    (tmp_path / "events" / "a.jsonl").write_text("\n".join(lines) + "\n")
    table = _rows(tmp_path, "events/*.jsonl")
    assert "late" in table.column_names
    assert table.column("late").drop_null().to_pylist() == ["kept"]


def test_a_csv_value_past_the_sample_is_not_cast_to_the_sampled_type(tmp_path: Path) -> None:
    body = "".join(f"{i},{10_000 + i}\n" for i in range(_PAST_SAMPLE))
    (tmp_path / "zips").mkdir()
    (tmp_path / "zips" / "a.csv").write_text("id,zip\n" + body + f"{_PAST_SAMPLE},01234\n")
    table = _rows(tmp_path, "zips/*.csv")
    last = table.filter(pc.equal(table.column("id"), _PAST_SAMPLE)).to_pylist()
    assert [str(r["zip"]) for r in last] == ["01234"]
