"""Declared types over a Singer tap's or Airbyte source's schemas (real programs, real lake).

A stream that declares a zoned date-time and sends values without an offset
(as airbyte-source-faker's `purchases` does) failed the whole Run, holding
back the good streams, and no option could say how to read it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from combined.engine import Engine
from combined.errors import ConfigError

PROGRAMS = Path(__file__).parent.parent / "connectors"
ZONED = {"type": "string", "format": "date-time", "airbyte_type": "timestamp_with_timezone"}
USERS = {"id": {"type": "integer"}, "name": {"type": ["null", "string"]}}
PURCHASES = {"id": {"type": "integer"}, "created_at": ZONED}
RECORDS = {
    "users": [{"id": 1, "name": "ada"}],
    "purchases": [
        {"id": 1, "created_at": "2024-05-01T12:00:00"},
        {"id": 2, "created_at": "2024-05-01T12:00:00+02:00"},
    ],
}


#: An Airbyte source of the streams above: discover prints their catalog; read
#: writes the records of the streams its configured catalog selects.
AIRBYTE_SOURCE = """
import json, sys
with open(sys.argv[1]) as f:
    streams, records = json.load(f)
args = sys.argv[2:]
if args[0] == "discover":
    print(json.dumps({"type": "CATALOG", "catalog": {"streams": streams}}))
elif args[0] == "read":
    with open(args[args.index("--catalog") + 1]) as f:
        chosen = [c["stream"]["name"] for c in json.load(f)["streams"]]
    for name in chosen:
        for r in records[name]:
            record = {"stream": name, "data": r, "emitted_at": 1}
            print(json.dumps({"type": "RECORD", "record": record}))
"""


def _airbyte(tmp_path: Path) -> dict[str, Any]:
    streams = [
        {
            "name": name,
            "json_schema": {"type": "object", "properties": props},
            "supported_sync_modes": ["full_refresh"],
            "source_defined_primary_key": [["id"]],
        }
        for name, props in (("users", USERS), ("purchases", PURCHASES))
    ]
    program = tmp_path / "source.py"
    program.write_text(AIRBYTE_SOURCE)
    data = tmp_path / "data.json"
    data.write_text(json.dumps([streams, RECORDS]))
    return {"command": [sys.executable, str(program), str(data)], "config": {}}


def _singer(tmp_path: Path) -> dict[str, Any]:
    schemas = {"users": USERS, "purchases": PURCHASES}
    entries = [
        {
            "tap_stream_id": s,
            "schema": {"type": "object", "properties": p},
            "key_properties": ["id"],
        }
        for s, p in schemas.items()
    ]
    steps = []
    for s, rows in RECORDS.items():
        schema = {"type": "object", "properties": schemas[s]}
        message = {"type": "SCHEMA", "stream": s, "schema": schema, "key_properties": ["id"]}
        steps.append({"out": json.dumps(message)})
        steps += [{"out": json.dumps({"type": "RECORD", "stream": s, "record": r})} for r in rows]
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"catalog": {"streams": entries}, "steps": steps}))
    program = PROGRAMS / "singer" / "taps" / "script_tap.py"
    return {"command": [sys.executable, str(program)], "config": {"script": str(script)}}


def _engine(tmp_path: Path, connector: str, **options: Any) -> Engine:
    config = (_airbyte if connector == "airbyte" else _singer)(tmp_path)
    project = {
        "version": 1,
        "lake": "./lake",
        "sources": {
            "app": {
                "connector": connector,
                "config": {**config, **options},
                "datasets": {"users": {"key": ["id"]}, "purchases": {"key": ["id"]}},
            }
        },
    }
    (tmp_path / "combined.yaml").write_text(json.dumps(project))
    return Engine.open(tmp_path / "combined.yaml")


CONNECTORS = pytest.mark.parametrize("connector", ["singer", "airbyte"])


@CONNECTORS
def test_a_naive_value_in_a_zoned_field_names_the_options(tmp_path: Path, connector: str) -> None:
    engine = _engine(tmp_path, connector)
    try:
        (run,) = engine.capture()
        assert run.state != "succeeded"
        assert "naive_timestamps: utc" in (run.error or "")
        assert 'types: {"purchases.created_at": string}' in (run.error or "")
    finally:
        engine.close()


@CONNECTORS
def test_naive_timestamps_utc_reads_them_as_utc(tmp_path: Path, connector: str) -> None:
    engine = _engine(tmp_path, connector, naive_timestamps="utc")
    try:
        (run,) = engine.capture()
        assert run.state == "succeeded", run.error
        rows = engine.sql(
            "SELECT id, CAST(created_at AS VARCHAR) AS at FROM app.purchases ORDER BY id"
        ).to_pylist()
        assert [r["at"][:19] for r in rows] == ["2024-05-01 12:00:00", "2024-05-01 10:00:00"]
        assert engine.sql("SELECT count(*) AS n FROM app.users").to_pylist() == [{"n": 1}]
    finally:
        engine.close()


@CONNECTORS
def test_a_declared_type_overrides_the_schema(tmp_path: Path, connector: str) -> None:
    engine = _engine(tmp_path, connector, types={"purchases.created_at": "string"})
    try:
        (run,) = engine.capture()
        assert run.state == "succeeded", run.error
        rows = engine.sql("SELECT id, created_at FROM app.purchases ORDER BY id").to_pylist()
        assert [r["created_at"] for r in rows] == [
            "2024-05-01T12:00:00",
            "2024-05-01T12:00:00+02:00",
        ]
    finally:
        engine.close()


@CONNECTORS
def test_naive_timestamps_keep_stores_a_timestamp_without_zone(
    tmp_path: Path, connector: str
) -> None:
    engine = _engine(tmp_path, connector, naive_timestamps="keep")
    try:
        (run,) = engine.capture()
        # The value with an offset does not fit a timestamp without zone: said, by name.
        assert run.state != "succeeded"
        assert "created_at" in (run.error or "") and "without offset" in (run.error or "")
    finally:
        engine.close()
    engine = _engine(
        tmp_path, connector, types={"purchases.created_at": "timestamp_without_timezone"}
    )
    try:
        (run,) = engine.capture()
        assert run.state != "succeeded"  # the same type declared for the one field
    finally:
        engine.close()


@CONNECTORS
def test_a_declared_type_of_an_unknown_field_is_refused(tmp_path: Path, connector: str) -> None:
    engine = _engine(tmp_path, connector, types={"purchases.nope": "string"})
    try:
        (run,) = engine.capture()
        assert run.state != "succeeded"
        assert "has no field 'nope'" in (run.error or "")
    finally:
        engine.close()


@CONNECTORS
def test_json_keys_sorted_writes_each_object_with_its_keys_sorted(
    tmp_path: Path, connector: str
) -> None:
    RECORDS["users"][0]["prefs"] = {"z": 1, "a": {"y": [{"b": 2, "a": 1}], "x": None}}
    USERS["prefs"] = {"type": ["null", "object"]}
    try:
        engine = _engine(tmp_path, connector, json_keys="sorted", naive_timestamps="utc")
        try:
            (run,) = engine.capture()
            assert run.state == "succeeded", run.error
            (row,) = engine.sql("SELECT prefs FROM app.users").to_pylist()
            assert row["prefs"] == '{"a":{"x":null,"y":[{"a":1,"b":2}]},"z":1}'
        finally:
            engine.close()
    finally:
        del RECORDS["users"][0]["prefs"], USERS["prefs"]


@CONNECTORS
def test_json_keys_must_be_as_sent_or_sorted(tmp_path: Path, connector: str) -> None:
    engine = _engine(tmp_path, connector, json_keys="alphabetical")
    try:
        with pytest.raises(ConfigError, match="json_keys must be one of as_sent, sorted"):
            engine.capture()
    finally:
        engine.close()
