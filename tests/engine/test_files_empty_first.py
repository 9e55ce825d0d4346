"""A first capture of a file set that holds no row yet (real DuckDB, real Delta lake)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from combined.catalog import data as cat
from combined.engine import Engine

DECLARED = {"id": "BIGINT", "status": "VARCHAR"}


def _engine(root: Path, columns: dict[str, str] | None = None) -> Engine:
    (root / "data" / "orders").mkdir(parents=True)
    file_set: dict[str, Any] = {"glob": "orders/*.csv", "allow_empty": True}
    if columns:
        file_set["columns"] = columns
    config = {"path": "./data", "files": {"orders": file_set}}
    source = {"connector": "files", "config": config, "datasets": {"orders": {"key": ["id"]}}}
    project = {"version": 1, "lake": "./lake", "sources": {"exports": source}}
    path = root / "combined.yaml"
    path.write_text(json.dumps(project))  # JSON is YAML
    return Engine.open(path)


def _write(root: Path, text: str) -> None:
    (root / "data" / "orders" / "a.csv").write_text(text)


def test_no_file_yet_takes_the_declared_columns_and_rows_land_later(tmp_path: Path) -> None:
    engine = _engine(tmp_path, DECLARED)
    try:
        (run,) = engine.capture()
        assert run.state == "succeeded", run.error
        _write(tmp_path, "id,status\n1,placed\n")
        (run,) = engine.capture()
        assert run.state == "succeeded", run.error
        rows = engine.sql("SELECT id, status FROM exports.orders").to_pylist()
        assert rows == [{"id": 1, "status": "placed"}]
        with engine.catalog.begin() as conn:
            assert cat.activity(conn, kind="drift") == []
    finally:
        engine.close()


def test_a_header_alone_with_declared_columns_is_an_empty_first_capture(tmp_path: Path) -> None:
    engine = _engine(tmp_path, DECLARED)
    try:
        _write(tmp_path, "id,status\n")
        (run,) = engine.capture()
        assert run.state == "succeeded", run.error
        assert engine.sql("SELECT count(*) AS n FROM exports.orders").to_pylist() == [{"n": 0}]
    finally:
        engine.close()


def test_a_header_alone_without_types_says_to_declare_them(tmp_path: Path) -> None:
    engine = _engine(tmp_path)
    try:
        _write(tmp_path, "id,status\n")
        (run,) = engine.capture()
        assert run.state == "failed"
        assert run.error is not None and "read no row" in run.error
        assert "`columns:`" in run.error and "'id'" in run.error
    finally:
        engine.close()


def test_files_of_a_header_alone_are_refused_unless_allowed_empty(tmp_path: Path) -> None:
    """A file rewritten as its header alone (an export that failed upstream, a writer
    caught after its header) was an empty snapshot: every row was deleted, while a file
    of no byte was refused as an empty snapshot."""
    engine = _engine(tmp_path, DECLARED)
    path = tmp_path / "combined.yaml"
    path.write_text(path.read_text().replace('"allow_empty": true, ', ""))
    engine.close()
    engine = Engine.open(path)
    try:
        _write(tmp_path, "id,status\n1,placed\n2,paid\n")
        (run,) = engine.capture()
        assert run.state == "succeeded", run.error
        _write(tmp_path, "id,status\n")
        (run,) = engine.capture()
        assert run.state == "failed"
        assert run.error is not None and "hold no row (a header alone" in run.error
        assert "allow_empty: true" in run.error
        assert engine.sql("SELECT count(*) AS n FROM exports.orders").to_pylist() == [{"n": 2}]
    finally:
        engine.close()


def test_a_json_file_of_an_empty_array_holds_no_row(tmp_path: Path) -> None:
    """It was refused as "non-record JSON"; it is a file of no record: refused as an empty
    snapshot, or, with allow_empty, one."""
    engine = _engine(tmp_path, DECLARED)
    try:
        path = tmp_path / "combined.yaml"
        path.write_text(path.read_text().replace("orders/*.csv", "orders/*.json"))
        engine.close()
        engine = Engine.open(path)
        (tmp_path / "data" / "orders" / "a.json").write_text('[{"id": 1, "status": "x"}]')
        (run,) = engine.capture()
        assert run.state == "succeeded", run.error
        (tmp_path / "data" / "orders" / "a.json").write_text("[\n]\n")
        (run,) = engine.capture()
        assert run.state == "succeeded", run.error  # allow_empty: an empty snapshot
        assert engine.sql("SELECT count(*) AS n FROM exports.orders").to_pylist() == [{"n": 0}]
    finally:
        engine.close()
