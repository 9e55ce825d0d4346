"""The singer connector against real taps: discovery, snapshot and cursor reads."""

from __future__ import annotations

import os
import stat
from datetime import UTC, date, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from tests.connectors.singer.fixtures import probes

from combined.connectors._subprocess._state import program_state
from combined.connectors.abc import CursorSpec, ReadRequest
from combined.connectors.singer import SingerSource
from combined.errors import ConfigError, NotFoundError
from combined.protocol import Message, RecordBatchMessage, StateMessage

TRUST = "the tap's bookmark"


def request(
    dataset: str = "users",
    strategy: str = "snapshot",
    state: dict[str, Any] | None = None,
    **kw: Any,
) -> ReadRequest:
    cursor = CursorSpec("updated_at", 0, TRUST) if strategy == "cursor" else None
    return ReadRequest(
        dataset=dataset,
        relation=kw.pop("relation", dataset),
        key=("id",),
        strategy=strategy,  # type: ignore[arg-type]
        state=state,
        cursor=kw.pop("cursor", cursor),
        **kw,
    )


def read_all(source: SingerSource, req: ReadRequest) -> list[Message]:
    extraction = source.read(req)
    try:
        return list(extraction)
    finally:
        extraction.finish("success")


def rows(messages: list[Message]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for m in messages:
        if isinstance(m, RecordBatchMessage):
            out.extend(m.batch.to_pylist())
    return out


def test_discovery_reports_streams_types_keys_and_cursor(good_config: dict[str, Any]) -> None:
    found = SingerSource(good_config).discover()
    assert found.connector == "singer"
    users = found.dataset("users")
    events = found.dataset("events")
    assert users is not None and events is not None
    types = {f.name: f.arrow_type for f in users.fields}
    assert types == {
        "id": "int64",
        "name": "string",
        "updated_at": "timestamp[us, tz=UTC]",
        "balance": "decimal128(38, 2)",
        "score": "double",
        "active": "bool",
        "born": "date32[day]",
        "tags": "string",
        "profile": "string",
    }
    nullable = {f.name: f.nullable for f in users.fields}
    assert nullable["id"] is False and nullable["name"] is True and nullable["born"] is True
    assert users.primary_key == ("id",)
    assert users.strategies == ("snapshot", "cursor")
    (candidate,) = users.cursor_candidates
    assert candidate.column == "updated_at" and "deletes are not seen" in candidate.evidence
    assert "deletes not seen" in users.kind
    # events: full table only, and its unsupported field is not offered
    assert events.strategies == ("snapshot",)
    assert [f.name for f in events.fields] == ["id", "kind"]


def test_snapshot_reads_every_record_exactly(good_config: dict[str, Any]) -> None:
    source = SingerSource(good_config)
    messages = read_all(source, request(batch_rows=100))
    got = {r["id"]: r for r in rows(messages)}
    assert sorted(got) == [1, 2, 3, 4, 5]
    ada = got[1]
    # a decimal is read from the line's text, never through a float
    assert ada["balance"] == Decimal("12345678901234567890.12")
    assert ada["score"] == 0.1
    assert ada["updated_at"] == datetime(2024, 5, 1, 10, 0, tzinfo=UTC)
    assert ada["born"] == date(1815, 12, 10)
    assert ada["tags"] == '["math","engines"]'
    assert ada["profile"] == '{"lang":"en","n":1.5}'
    assert ada["active"] is True
    assert got[2]["updated_at"] == datetime(2024, 5, 1, 10, 30, 0, 250000, tzinfo=UTC)
    assert got[2]["balance"] == Decimal("0.01") and got[2]["score"] == 3.0
    assert got[4]["balance"] == Decimal("7.00")
    assert got[3]["balance"] is None and got[3]["tags"] is None  # missing property: null
    # a snapshot passes no state, asks for FULL_TABLE and ends with an empty checkpoint
    assert isinstance(messages[-1], StateMessage)
    assert messages[-1].final and messages[-1].state == {}
    run = probes(good_config)[-1]
    assert "--state" not in run["argv"]
    (entry,) = run["catalog"]["streams"]
    root = next(m["metadata"] for m in entry["metadata"] if m["breadcrumb"] == [])
    assert entry["tap_stream_id"] == "users"
    assert root["selected"] is True and root["replication-method"] == "FULL_TABLE"


def test_other_streams_messages_are_ignored(good_config: dict[str, Any]) -> None:
    events = rows(read_all(SingerSource(good_config), request("events")))
    assert events == [{"id": i, "kind": f"k{i}"} for i in (1, 2, 3)]  # `legacy` unsupported


def test_cursor_read_resumes_from_the_committed_state(good_config: dict[str, Any]) -> None:
    source = SingerSource(good_config)
    first = read_all(source, request(strategy="cursor"))
    assert len(rows(first)) == 5
    final = first[-1]
    assert isinstance(final, StateMessage) and final.final
    assert program_state(final.state, "singer") == {
        "bookmarks": {
            "users": {
                "replication_key": "updated_at",
                "replication_key_value": "2024-05-04T09:00:00Z",
            }
        }
    }
    assert final.state["trust"] == TRUST
    assert final.position == "2024-05-04T09:00:00Z"
    second = read_all(source, request(strategy="cursor", state=dict(final.state)))
    # the tap re-sends the record at its bookmark, as Singer SDK taps do
    assert [r["id"] for r in rows(second)] == [5]
    run = probes(good_config)[-1]
    assert "--state" in run["argv"] and run["state"] == program_state(final.state, "singer")
    (entry,) = run["catalog"]["streams"]
    root = next(m["metadata"] for m in entry["metadata"] if m["breadcrumb"] == [])
    assert root["replication-method"] == "INCREMENTAL"
    assert root["replication-key"] == "updated_at"


def test_cursor_read_without_new_state_keeps_the_previous_one(
    good_config: dict[str, Any], tmp_path: Path
) -> None:
    from tests.connectors.singer.fixtures import write_data

    write_data(Path(good_config["config"]["data_file"]), [], [])
    previous = {"singer": {"bookmarks": {"users": {"replication_key_value": "x"}}}, "trust": TRUST}
    messages = read_all(SingerSource(good_config), request(strategy="cursor", state=previous))
    assert rows(messages) == []
    assert isinstance(messages[-1], StateMessage)
    assert program_state(messages[-1].state, "singer") == {
        "bookmarks": {"users": {"replication_key": "updated_at", "replication_key_value": "x"}}
    }


def test_batches_are_bounded_and_states_follow_their_records(
    good_config: dict[str, Any],
) -> None:
    good_config["config"]["state_every"] = 2
    messages = read_all(SingerSource(good_config), request(strategy="cursor", batch_rows=2))
    seen = 0
    marks = []
    for m in messages:
        if isinstance(m, RecordBatchMessage):
            assert 1 <= m.batch.num_rows <= 2
            seen += m.batch.num_rows
        else:
            marks.append((seen, m.position))
    # each STATE comes after exactly the records it covers
    assert marks[:2] == [(2, "2024-05-01T12:30:00.250000+02:00"), (4, "2024-05-03T09:00:00Z")]
    assert marks[-1] == (5, "2024-05-04T09:00:00Z")


def test_source_batch_rows_caps_the_request(good_config: dict[str, Any]) -> None:
    good_config["batch_rows"] = 1
    messages = read_all(SingerSource(good_config), request(batch_rows=1000))
    sizes = [m.batch.num_rows for m in messages if isinstance(m, RecordBatchMessage)]
    assert sizes == [1, 1, 1, 1, 1]


def test_columns_select_fields_and_keep_the_key(good_config: dict[str, Any]) -> None:
    messages = read_all(SingerSource(good_config), request(columns=("name",)))
    batch = next(m.batch for m in messages if isinstance(m, RecordBatchMessage))
    assert batch.schema.names == ["id", "name"]
    entry = probes(good_config)[-1]["catalog"]["streams"][0]
    chosen = {
        m["breadcrumb"][1]: m["metadata"].get("selected")
        for m in entry["metadata"]
        if m["breadcrumb"]
    }
    assert chosen["name"] is True and chosen["balance"] is False


def test_tap_config_is_a_private_file_removed_afterwards(good_config: dict[str, Any]) -> None:
    source = SingerSource(good_config)
    source.discover()
    read_all(source, request())
    runs = probes(good_config)
    assert len(runs) == 2
    for run in runs:
        assert run["mode"] == 0o600 and run["dir_mode"] == 0o700
        assert not os.path.exists(run["config"])
        assert not os.path.exists(os.path.dirname(run["config"]))
        # the secret is in the file only, never on the command line
        assert all(good_config["config"]["api_token"] not in a for a in run["argv"])


def test_the_tap_process_is_reaped_after_a_read(good_config: dict[str, Any]) -> None:
    extraction = SingerSource(good_config).read(request())
    list(extraction)
    pid = extraction.pid  # type: ignore[attr-defined]
    assert pid is not None
    with pytest.raises(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)  # already reaped: no zombie left
    extraction.finish("success")


def test_schema_change_mid_stream_gives_batches_of_the_new_shape(bad_config: Any) -> None:
    messages = read_all(SingerSource(bad_config("schema_change")), request("items"))
    batches = [m.batch for m in messages if isinstance(m, RecordBatchMessage)]
    assert [b.schema.names for b in batches] == [["id", "label"], ["id", "label", "size"]]
    assert batches[1].column("size").type == pa.int64()


def test_unknown_stream_names_the_streams(good_config: dict[str, Any]) -> None:
    with pytest.raises(NotFoundError, match="no stream 'orders'") as info:
        SingerSource(good_config).read(request("orders"))
    assert "users, events" in (info.value.hint or "")


def test_stream_alias_finds_by_stream_name(good_config: dict[str, Any]) -> None:
    got = rows(read_all(SingerSource(good_config), request("people", relation="users")))
    assert len(got) == 5


@pytest.mark.parametrize(
    ("dataset", "cursor", "match"),
    [
        ("events", CursorSpec("id", 0, TRUST), "has no replication_key"),
        ("users", CursorSpec("id", 0, TRUST), "bookmarks stream 'users' by 'updated_at'"),
        ("users", CursorSpec("updated_at", 5, TRUST), "declares a lookback"),
        ("users", CursorSpec("updated_at", 0, TRUST, "include"), "cursor.nulls: include"),
    ],
)
def test_cursor_declarations_the_tap_cannot_honour_are_refused(
    good_config: dict[str, Any], dataset: str, cursor: CursorSpec, match: str
) -> None:
    with pytest.raises(ConfigError, match=match):
        SingerSource(good_config).read(request(dataset, strategy="cursor", cursor=cursor))


def test_catalog_file_replaces_discovery(good_config: dict[str, Any], tmp_path: Path) -> None:
    import json
    import sys

    sys.path.insert(0, str(Path(__file__).parent / "taps"))
    try:
        import good_tap  # type: ignore[import-not-found]
    finally:
        sys.path.pop(0)
    path = tmp_path / "catalog.json"
    path.write_text(json.dumps(good_tap.catalog()))
    good_config["catalog"] = str(path)
    source = SingerSource(good_config)
    assert [d.name for d in source.discover().datasets] == ["users", "events"]
    assert probes(good_config) == []  # the tap was not run for discovery
    assert len(rows(read_all(source, request()))) == 5


def test_config_file_mode_is_private_even_with_a_loose_umask(
    good_config: dict[str, Any],
) -> None:
    old = os.umask(0)
    try:
        read_all(SingerSource(good_config), request())
    finally:
        os.umask(old)
    assert stat.S_IMODE(probes(good_config)[-1]["mode"]) == 0o600
