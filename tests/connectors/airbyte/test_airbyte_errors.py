"""How the airbyte connector fails: each misbehaving source gives one classified, clear error."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from tests.connectors.airbyte.fixtures import TOKEN

from combined.connectors._subprocess._process import STDERR_TAIL_BYTES
from combined.connectors.abc import CursorSpec, ReadRequest
from combined.connectors.airbyte import AirbyteSource
from combined.errors import (
    CombinedError,
    ConfigError,
    SchemaMismatch,
    SourceError,
    SourceUnavailable,
)

Scripted = Callable[..., dict[str, Any]]


def record(data: dict[str, Any], stream: str = "s") -> dict[str, Any]:
    return {"msg": {"type": "RECORD", "record": {"stream": stream, "data": data}}}


def trace_error(failure_type: str, message: str) -> dict[str, Any]:
    error = {"message": message, "internal_message": "boom", "failure_type": failure_type}
    return {"msg": {"type": "TRACE", "trace": {"type": "ERROR", "error": error}}}


def snapshot() -> ReadRequest:
    return ReadRequest(dataset="s", relation="s", key=("id",), strategy="snapshot")


def fail_read(
    config: dict[str, Any], error: type[CombinedError], request: ReadRequest | None = None
) -> CombinedError:
    extraction = AirbyteSource(config).read(request or snapshot())
    try:
        with pytest.raises(error) as info:
            list(extraction)
    finally:
        extraction.finish("abort")
    return info.value


def gone(pid: int, within: float = 5.0) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if not os.path.exists(f"/proc/{pid}"):
            return True
        time.sleep(0.05)
    return False


def test_missing_executable_is_a_config_error_with_an_install_hint() -> None:
    source = AirbyteSource({"command": "source-does-not-exist"})
    with pytest.raises(ConfigError, match="'source-does-not-exist' is not on PATH") as info:
        source.check()
    assert "pipx install airbyte-source-does-not-exist" in (info.value.hint or "")


def test_unknown_keys_are_refused_naming_the_closest() -> None:
    with pytest.raises(ConfigError, match="idle_timout") as info:
        AirbyteSource({"command": "x", "idle_timout": 5})
    assert "'idle_timeout'" in (info.value.hint or "")


def test_check_failed_status_is_an_error_without_the_secret(good_config: dict[str, Any]) -> None:
    data = Path(good_config["config"]["data_file"])
    data.write_text(data.read_text().replace(TOKEN, "another-token-value"))
    with pytest.raises(SourceError, match="CONNECTION_STATUS FAILED") as info:
        AirbyteSource(good_config).check()
    assert TOKEN not in str(info.value) and "bad token ***" in str(info.value)
    assert "config:" in (info.value.hint or "")


@pytest.mark.parametrize(
    ("failure_type", "error"),
    [
        ("config_error", ConfigError),
        ("system_error", SourceError),
        ("transient_error", SourceUnavailable),
    ],
)
def test_trace_errors_are_classified_in_check_and_read(
    scripted: Scripted, failure_type: str, error: type[CombinedError]
) -> None:
    steps = [trace_error(failure_type, f"it broke, token {TOKEN}"), {"exit": 1}]
    config = scripted(steps, check=steps)
    with pytest.raises(error, match="it broke") as info:
        AirbyteSource(config).check()
    assert type(info.value) is error and TOKEN not in str(info.value)
    exc = fail_read(config, error)
    assert type(exc) is error
    assert "the connector failed reading stream 's': it broke, token *** (boom)" in exc.message
    assert exc.context["failure_type"] == failure_type


def test_check_exit_without_status_and_discover_without_catalog(scripted: Scripted) -> None:
    config = scripted(check=[{"err": "cannot start"}, {"exit": 4}])
    with pytest.raises(SourceError, match="check exited with status 4") as info:
        AirbyteSource(config).check()
    assert "cannot start" in str(info.value)
    with pytest.raises(SourceError, match="wrote no CONNECTION_STATUS"):
        AirbyteSource(scripted()).check()
    config = scripted(
        discover=[{"msg": {"type": "LOG", "log": {"message": "no luck"}}}, {"exit": 0}]
    )
    with pytest.raises(SourceError, match="wrote no CATALOG") as info:
        AirbyteSource(config).discover()
    assert "INFO no luck" in str(info.value)


def test_non_zero_exit_fails_the_read_with_the_log_tail(scripted: Scripted) -> None:
    log = {"msg": {"type": "LOG", "log": {"level": "ERROR", "message": "the provider said 500"}}}
    exc = fail_read(
        scripted([record({"id": 1}), log, {"err": "stack trace"}, {"exit": 3}]), SourceError
    )
    assert "the connector exited with status 3 while reading stream 's'" in exc.message
    assert "ERROR the provider said 500" in exc.message and "stack trace" in exc.message


def test_malformed_line_names_its_number(scripted: Scripted) -> None:
    exc = fail_read(scripted([record({"id": 1}), {"out": '{"type": "RECORD", "rec'}]), SourceError)
    assert "line 2 of the connector's output is not JSON" in exc.message


def test_a_record_of_a_stream_not_selected_is_refused(scripted: Scripted) -> None:
    exc = fail_read(scripted([record({"id": 1}), record({"id": 2}, "other")]), SourceError)
    assert "line 2: a RECORD of stream 'other', which the configured catalog does not select" in (
        exc.message
    )


def test_type_mismatch_names_line_field_and_value(scripted: Scripted) -> None:
    exc = fail_read(scripted([record({"id": 1}), record({"id": "abc"})]), SchemaMismatch)
    assert (
        "line 2: field 'id' of stream 's' holds text of 3 characters, which is not an integer"
        in exc.message
    )
    exc = fail_read(scripted([record({"id": 1, "colour": "red"})]), SchemaMismatch)
    assert "holds field 'colour'" in exc.message


def test_unknown_message_type_is_refused(scripted: Scripted) -> None:
    exc = fail_read(scripted([{"msg": {"type": "BANANA"}}]), SourceError)
    assert "unknown Airbyte message type text of 6 characters" in exc.message


def test_a_log_flood_keeps_a_bounded_tail(scripted: Scripted) -> None:
    flood = [
        {"err": "x" * 1023, "times": 20 * 1024},
        *({"msg": {"type": "LOG", "log": {"message": "y" * 200}}} for _ in range(2000)),
        {"msg": {"type": "LOG", "log": {"message": "the last log line"}}},
        {"exit": 1},
    ]
    exc = fail_read(scripted(flood), SourceError)
    assert "the last log line" in exc.message
    assert len(exc.message) < STDERR_TAIL_BYTES + 500


def _halves(secret: str) -> list[str]:
    """Every piece of ``secret`` of 6 characters or more that starts or ends it."""
    return [secret[:n] for n in range(6, len(secret))] + [
        secret[-n:] for n in range(6, len(secret))
    ]


def test_a_secret_where_a_long_message_is_cut_is_never_half_shown(scripted: Scripted) -> None:
    """LOG and TRACE messages are shortened to 2000 characters: masked first, then cut."""
    said = "x" * 1985 + TOKEN + " and more"  # the cut falls inside the token
    log = {"msg": {"type": "LOG", "log": {"level": "INFO", "message": said}}}
    exc = fail_read(scripted([log, {"exit": 1}]), SourceError)
    assert not any(piece in exc.message for piece in _halves(TOKEN)), exc.message
    exc = fail_read(scripted([trace_error("system_error", said)]), SourceError)
    assert not any(piece in exc.message for piece in _halves(TOKEN)), exc.message


def test_a_hanging_connector_is_stopped_with_its_children(
    scripted: Scripted, tmp_path: Path
) -> None:
    pids = tmp_path / "pids"
    config = scripted([record({"id": 1}), {"spawn_and_hang": str(pids)}], idle_timeout=1)
    exc = fail_read(config, SourceUnavailable)
    assert "wrote nothing for 1 s after line 1" in exc.message
    leader, child = (int(p) for p in pids.read_text().split())
    assert gone(leader) and gone(child)


def test_global_state_is_refused_for_a_cursor_read(scripted: Scripted) -> None:
    state = {"type": "STATE", "state": {"type": "GLOBAL", "global": {"shared_state": {}}}}
    request = ReadRequest("s", "s", ("id",), "cursor", cursor=CursorSpec("u", trust="t"))
    exc = fail_read(scripted([record({"id": 1}), {"msg": state}]), SourceError, request)
    assert "keeps GLOBAL state" in exc.message and "strategy: snapshot" in (exc.hint or "")
    legacy = {"type": "STATE", "state": {"data": {"s": {"u": 1}}}}
    exc = fail_read(scripted([{"msg": legacy}]), SourceError, request)
    assert "keeps LEGACY state" in exc.message


def test_an_empty_snapshot_needs_word_that_the_stream_was_read(scripted: Scripted) -> None:
    exc = fail_read(scripted([]), SourceError)
    assert "an empty snapshot would delete every row" in exc.message
    status = {"stream_descriptor": {"name": "s"}, "status": "COMPLETE"}
    trace: dict[str, Any] = {
        "msg": {"type": "TRACE", "trace": {"type": "STREAM_STATUS", "stream_status": status}}
    }
    extraction = AirbyteSource(scripted([trace])).read(snapshot())
    try:
        assert [m.final for m in extraction] == [True]  # type: ignore[union-attr]
    finally:
        extraction.finish("success")
    incomplete = {**status, "status": "INCOMPLETE"}
    body = {"type": "STREAM_STATUS", "stream_status": incomplete}
    exc = fail_read(
        scripted([record({"id": 1}), {"msg": {"type": "TRACE", "trace": body}}]), SourceError
    )
    assert "reports stream 's' INCOMPLETE" in exc.message
