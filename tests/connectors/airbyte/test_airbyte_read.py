"""Discovery and reads of a real, well-behaved Airbyte source (a Python script)."""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from tests.connectors.airbyte.fixtures import TOKEN, probes

from combined.connectors._subprocess._state import program_state
from combined.connectors.abc import CursorSpec, ReadRequest
from combined.connectors.airbyte import AirbyteSource
from combined.errors import ConfigError, NotFoundError
from combined.protocol import Message, RecordBatchMessage, StateMessage

TRUST = "the source bookmarks users by updated_at"


def read_all(source: AirbyteSource, request: ReadRequest) -> list[Message]:
    extraction = source.read(request)
    try:
        return list(extraction)
    finally:
        extraction.finish("success")


def users(strategy: str = "cursor", **kw: Any) -> ReadRequest:
    cursor = CursorSpec("updated_at", trust=TRUST) if strategy == "cursor" else None
    return ReadRequest(
        dataset="users",
        relation="users",
        key=("id",),
        strategy=strategy,  # type: ignore[arg-type]
        cursor=cursor,
        **kw,
    )


def rows(messages: list[Message]) -> list[dict[str, Any]]:
    return [r for m in messages if isinstance(m, RecordBatchMessage) for r in m.batch.to_pylist()]


def test_discover_reports_streams_keys_cursors_and_types(good_config: dict[str, Any]) -> None:
    discovery = AirbyteSource(good_config).discover()
    assert discovery.connector == "airbyte"
    users_d = discovery.dataset("users")
    events_d = discovery.dataset("events")
    assert users_d is not None and events_d is not None
    assert users_d.primary_key == ("id",) and events_d.primary_key == ("id",)
    assert users_d.strategies == ("snapshot", "cursor")
    assert events_d.strategies == ("snapshot",)
    (candidate,) = users_d.cursor_candidates
    assert candidate.column == "updated_at" and "deletes are not seen" in candidate.evidence
    assert "deletes not seen" in users_d.kind
    types = {f.name: f.arrow_type for f in users_d.fields}
    assert types["balance"] == "decimal128(38, 2)"
    assert types["updated_at"] == "timestamp[us, tz=UTC]"
    assert types["seen"] == "timestamp[us]"
    assert types["visits"] == "int64"
    assert types["tags"] == "string"
    assert {f.name: f.arrow_type for f in events_d.fields}["id"] == "int64"


def test_check_passes_with_the_right_token(good_config: dict[str, Any]) -> None:
    AirbyteSource(good_config).check()
    (probe,) = probes(Path(good_config["config"]["probe_file"]))
    assert probe["argv"][0] == "check" and probe["mode"] == 0o600 and probe["dir_mode"] == 0o700
    assert not Path(probe["argv"][2]).exists()  # the private config file is gone


def test_snapshot_reads_the_whole_stream_with_exact_types(good_config: dict[str, Any]) -> None:
    source = AirbyteSource(good_config)
    messages = read_all(source, users("snapshot"))
    got = rows(messages)
    assert [r["id"] for r in got] == [1, 2, 3]
    assert got[0]["balance"] == Decimal("12345678901234567890.12")
    assert got[0]["visits"] == 3 and got[0]["tags"] == '["math"]'
    assert str(got[0]["seen"]) == "2024-05-01 10:00:00"
    final = messages[-1]
    assert isinstance(final, StateMessage) and final.final and final.state == {}
    probe = probes(Path(good_config["config"]["probe_file"]))[-1]
    assert probe["argv"][0] == "read" and "--state" not in probe["argv"]
    (configured,) = probe["catalog"]["streams"]
    assert configured["stream"]["name"] == "users"
    assert (configured["sync_mode"], configured["destination_sync_mode"]) == (
        "full_refresh",
        "overwrite",
    )


def test_cursor_read_keeps_state_after_its_records_and_resumes(
    good_config: dict[str, Any],
) -> None:
    good_config["config"]["state_every"] = 1
    source = AirbyteSource(good_config)
    messages = read_all(source, users(batch_rows=2))
    kinds = [
        "batch" if isinstance(m, RecordBatchMessage) else ("final" if m.final else "state")
        for m in messages
    ]
    # a state never precedes the records it covers: each follows the batch holding them
    # (the batch of users 1-2 fills at user 2, before the state after user 2 is read)
    assert kinds == ["batch", "state", "state", "batch", "state", "final"]
    positions = [m.position for m in messages if isinstance(m, StateMessage)]
    assert positions[:3] == ["2024-05-01T10:00:00Z", "2024-05-02T09:00:00Z", "2024-05-03T09:00:00Z"]
    final = messages[-1]
    assert isinstance(final, StateMessage)
    assert final.position == "2024-05-03T09:00:00Z"
    assert program_state(final.state, "airbyte") == {
        "type": "STREAM",
        "stream": {
            "stream_descriptor": {"name": "users"},
            "stream_state": {"updated_at": "2024-05-03T09:00:00Z"},
        },
    }
    assert final.state["trust"] == TRUST
    probe = probes(Path(good_config["config"]["probe_file"]))[-1]
    (configured,) = probe["catalog"]["streams"]
    assert configured["sync_mode"] == "incremental"
    assert configured["cursor_field"] == ["updated_at"]
    assert configured["destination_sync_mode"] == "append_dedup"

    again = read_all(source, users(state=dict(final.state)))
    probe = probes(Path(good_config["config"]["probe_file"]))[-1]
    assert probe["state"] == [program_state(final.state, "airbyte")]
    assert [r["id"] for r in rows(again)] == [3]  # at or after the bookmark only


def test_cursor_read_without_state_keeps_the_previous_checkpoint(
    scripted: Any,
) -> None:
    """(A checkpoint from before the state was kept as text, which held in clear a token
    the connector wrote into it, is carried on as text, the token masked; a review
    found it carried on as it was.)"""
    record = {"type": "RECORD", "record": {"stream": "s", "data": {"id": 1, "u": 5}}}
    kept = {
        "type": "STREAM",
        "stream": {"stream_descriptor": {"name": "s"}, "stream_state": {"u": 4, "t": TOKEN}},
    }
    previous = {"airbyte": kept, "stream": "s", "trust": "t"}
    source = AirbyteSource(scripted([{"msg": record}]))
    request = ReadRequest(
        "s", "s", ("id",), "cursor", state=previous, cursor=CursorSpec("u", trust="t")
    )
    messages = read_all(source, request)
    final = messages[-1]
    assert isinstance(final, StateMessage) and final.position == "4"
    assert "airbyte" not in final.state and TOKEN not in json.dumps(final.state)
    carried = program_state(final.state, "airbyte")
    assert carried["stream"]["stream_state"] == {"u": 4, "t": "***"}
    assert final.state["stream"] == "s" and final.state["trust"] == "t"


def test_columns_are_selected_and_batches_bounded(good_config: dict[str, Any]) -> None:
    source = AirbyteSource(good_config)
    messages = read_all(source, users("snapshot", columns=("name",), batch_rows=2))
    batches = [m.batch for m in messages if isinstance(m, RecordBatchMessage)]
    assert [b.num_rows for b in batches] == [2, 1]
    assert batches[0].schema.names == ["id", "name"]
    assert batches[0].schema.field("id").type == pa.int64()


def test_unknown_stream_names_the_known_ones(good_config: dict[str, Any]) -> None:
    source = AirbyteSource(good_config)
    with pytest.raises(NotFoundError, match="no stream 'orders'") as info:
        source.read(ReadRequest("orders", "orders", ("id",), "snapshot"))
    assert "users, events" in (info.value.hint or "")


@pytest.mark.parametrize(
    ("request_", "match"),
    [
        (
            ReadRequest("events", "events", ("id",), "cursor", cursor=CursorSpec("id")),
            "does not support incremental",
        ),
        (ReadRequest("users", "users", ("id",), "cursor"), "without a cursor"),
        (
            ReadRequest("users", "users", ("id",), "cursor", cursor=CursorSpec("id")),
            "source-defined cursor",
        ),
        (
            ReadRequest("users", "users", ("id",), "cursor", cursor=CursorSpec("updated_at", 5)),
            "declares a lookback",
        ),
        (
            ReadRequest(
                "users",
                "users",
                ("id",),
                "cursor",
                cursor=CursorSpec("updated_at", nulls="exclude"),
            ),
            "cursor.nulls: exclude",
        ),
        (ReadRequest("users", "users", ("id",), "cdc"), "strategy 'cdc'"),
    ],
)
def test_reads_it_cannot_do_are_refused(
    good_config: dict[str, Any], request_: ReadRequest, match: str
) -> None:
    with pytest.raises(ConfigError, match=match):
        AirbyteSource(good_config).read(request_)


def test_a_stream_state_keeps_its_exact_numbers_and_no_secret(scripted: Any) -> None:
    """The state went through a float (a cursor of 0.99999999999999999 came back as
    1.0), and the configured token written into it was kept in clear in the checkpoint."""
    record = {"type": "RECORD", "record": {"stream": "s", "data": {"id": 1, "u": 5}}}
    state = (
        '{"type":"STATE","state":{"type":"STREAM","stream":{"stream_descriptor":{"name":"s"},'
        '"stream_state":{"u":0.99999999999999999,"big":123456789012345678901234567890.5,'
        f'"auth":"{TOKEN}"}}}}}}}}'
    )
    source = AirbyteSource(scripted([{"msg": record}, {"out": state}]))
    request = ReadRequest("s", "s", ("id",), "cursor", cursor=CursorSpec("u", trust="t"))
    final = read_all(source, request)[-1]
    assert isinstance(final, StateMessage) and final.final
    assert TOKEN not in json.dumps(final.state)
    text = final.state["airbyte_json"]
    assert '"u":0.99999999999999999,"big":123456789012345678901234567890.5' in text
    assert '"auth":"***"' in text
    assert final.position == "0.99999999999999999"
    kept = program_state(final.state, "airbyte")
    assert kept["stream"]["stream_state"]["u"] == Decimal("0.99999999999999999")
