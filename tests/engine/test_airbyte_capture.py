"""The engine over a real Airbyte source (a Python script run as a subprocess) into a real lake."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from tests.connectors.airbyte.fixtures import EVENTS, TOKEN, USERS, good_command, probes, write_data

from combined.connectors import known_connectors
from combined.connectors._subprocess._state import program_state
from combined.engine import Engine

pytestmark = pytest.mark.skipif(
    "airbyte" not in known_connectors(),
    reason="the installed metadata predates the airbyte entry point: `pip install -e .` again",
)

PROJECT = """\
version: 1
lake: ./lake
sources:
  faker:
    connector: airbyte
    config:
      command: {command}
      config:
        data_file: {data}
        probe_file: {probe}
        api_token: {{secret: "env:COMBINED_TEST_AIRBYTE_TOKEN"}}
        state_every: 2
    datasets:
      users:
        stream: users
        key: [id]
        strategy: cursor
        cursor: {{column: updated_at, trust: "the source's per-stream state"}}
      events:
        key: [id]
"""


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("COMBINED_TEST_AIRBYTE_TOKEN", TOKEN)
    write_data(tmp_path / "data.json", USERS, EVENTS)
    (tmp_path / "combined.yaml").write_text(
        PROJECT.format(
            command=json.dumps(good_command()),
            data=json.dumps(str(tmp_path / "data.json")),
            probe=json.dumps(str(tmp_path / "probe.jsonl")),
        )
    )
    return tmp_path


def _ids(engine: Engine, table: str) -> list[int]:
    result = engine.sql(f"SELECT id FROM {table} ORDER BY id")
    return [int(r["id"]) for r in result.to_pylist()]


def _reads(project: Path) -> list[dict[str, Any]]:
    return [p for p in probes(project / "probe.jsonl") if p["argv"][0] == "read"]


def test_capture_then_recapture_reads_only_new_records(project: Path) -> None:
    engine = Engine.open(project / "combined.yaml")
    try:
        (run,) = engine.capture(["faker.users", "faker.events"])
        assert run.state == "succeeded", run.error
        assert _ids(engine, "faker.users") == [1, 2, 3]
        assert _ids(engine, "faker.events") == [1, 2, 3]
        ada = engine.sql("SELECT * FROM faker.users WHERE id = 1").to_pylist()[0]
        assert str(ada["balance"]) == "12345678901234567890.12"
        assert ada["_combined_producer"].startswith("airbyte@1")
        assert ada["_combined_source_position"] == "2024-05-03T09:00:00Z"
        checkpoint = engine.committed_checkpoint("faker", "users")
        assert checkpoint is not None
        assert program_state(checkpoint, "airbyte")["stream"]["stream_state"] == {
            "updated_at": "2024-05-03T09:00:00Z"
        }
        assert engine.committed_checkpoint("faker", "events") == {}

        users = [dict(u) for u in USERS]
        users[2]["name"] = "grace h."
        users[2]["updated_at"] = "2024-05-04T09:00:00Z"
        users.append({"id": 4, "name": "edsger", "updated_at": "2024-05-05T09:00:00Z"})
        write_data(project / "data.json", users, EVENTS[:2])
        (run,) = engine.capture(["faker.users", "faker.events"])
        assert run.state == "succeeded", run.error
        last = [p for p in _reads(project) if "--state" in p["argv"]][-1]
        assert last["state"] == [program_state(checkpoint, "airbyte")]
        assert run.stats is not None
        assert run.stats["users"]["captured"] == 2  # only what changed since the state
        assert (run.stats["users"]["inserts"], run.stats["users"]["updates"]) == (1, 1)
        assert run.stats["events"]["deletes"] == 1  # a snapshot sees the missing event
        assert _ids(engine, "faker.users") == [1, 2, 3, 4]
        assert _ids(engine, "faker.events") == [1, 2]
    finally:
        engine.close()


def test_a_failed_connector_commits_nothing_and_keeps_the_state(project: Path) -> None:
    engine = Engine.open(project / "combined.yaml")
    try:
        (run,) = engine.capture(["faker.users"])
        assert run.state == "succeeded", run.error
        before = engine.committed_checkpoint("faker", "users")
        history = engine.history("faker.users")
        lake_log = sorted((project / "lake" / "faker" / "users" / "_delta_log").iterdir())

        users = [*USERS, *({"id": i, "updated_at": f"2024-06-0{i}T00:00:00Z"} for i in (4, 5, 6))]
        # the source sends the record at its state, two new ones and a STATE, then dies
        write_data(project / "data.json", users, EVENTS, fail_after=5)
        (run,) = engine.capture(["faker.users"])
        assert run.state == "failed"
        assert run.error is not None and "exited with status 1" in run.error
        assert "the provider went away mid-stream" in run.error
        assert TOKEN not in run.error
        assert engine.committed_checkpoint("faker", "users") == before
        assert engine.history("faker.users") == history
        assert sorted((project / "lake" / "faker" / "users" / "_delta_log").iterdir()) == lake_log
        assert _ids(engine, "faker.users") == [1, 2, 3]

        write_data(project / "data.json", users, EVENTS)
        (run,) = engine.capture(["faker.users"])
        assert run.state == "succeeded", run.error
        assert _ids(engine, "faker.users") == [1, 2, 3, 4, 5, 6]
        assert _reads(project)[-1]["state"] == [program_state(before, "airbyte")]
    finally:
        engine.close()


def test_a_run_names_every_dataset_it_holds_for_duplicate_keys(project: Path) -> None:
    """The first dataset's duplicate keys ended the Run's reads: its error named that one
    alone, and the next capture of the other, told to go on alone, met its own."""
    text = (project / "combined.yaml").read_text()
    cursor = text[text.index("        strategy: cursor\n") : text.index("      events:")]
    (project / "combined.yaml").write_text(text.replace(cursor, ""))  # users: a snapshot
    users = [*USERS, {**USERS[0], "name": "again"}]
    write_data(project / "data.json", users, [*EVENTS, EVENTS[1], EVENTS[2]])
    engine = Engine.open(project / "combined.yaml")
    try:
        (run,) = engine.capture(["faker.users", "faker.events"])
        assert run.state == "needs_review", run.error
        error = run.error or ""
        assert "2 datasets of the Run hold duplicate keys" in error
        assert "the capture of faker.users holds 1 duplicate key(s) of (id)" in error
        assert "the capture of faker.events holds 2 duplicate key(s) of (id)" in error
        entries = engine.quarantine()
        assert {(e["source"], e["dataset"]) for e in entries} == {
            ("faker", "users"),
            ("faker", "events"),
        }
        for entry in entries:
            assert f"quarantine entry {entry['id']}" in error
            assert f"`combined quarantine show {entry['id']}`" in error
        # A later dataset failing otherwise is told too.
        write_data(project / "data.json", users, [{"id": 1, "kind": 5}])
        (run,) = engine.capture(["faker.users", "faker.events"])
        assert run.state == "needs_review", run.error
        error = run.error or ""
        assert "the capture of faker.users holds 1 duplicate key(s) of (id)" in error
        assert "the Run's reads then stopped: faker.events: line" in error and "'kind'" in error
    finally:
        engine.close()
