"""How the singer connector fails: each misbehaving tap gives one classified, clear error."""

from __future__ import annotations

import base64
import json
import os
import pickle
import tempfile
import threading
import time
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from tests.connectors.singer.fixtures import TOKEN

from combined._credentials import masking
from combined.connectors._subprocess._process import STDERR_TAIL_BYTES
from combined.connectors._subprocess._schema import BadValue, plan_field
from combined.connectors.abc import ReadRequest
from combined.connectors.singer import SingerSource
from combined.errors import (
    CombinedError,
    ConfigError,
    SchemaMismatch,
    SourceError,
    SourceUnavailable,
)
from combined.protocol import RecordBatchMessage

BadConfig = Callable[..., dict[str, Any]]


def items(**kw: Any) -> ReadRequest:
    return ReadRequest(dataset="items", relation="items", key=("id",), strategy="snapshot", **kw)


def fail_read(config: dict[str, Any], error: type[CombinedError]) -> CombinedError:
    extraction = SingerSource(config).read(items())
    try:
        with pytest.raises(error) as info:
            list(extraction)
    finally:
        extraction.finish("abort")
    return info.value


def gone(pid: int, within: float = 5.0) -> bool:
    """Whether process ``pid`` has ended and been reaped, waiting up to ``within`` s."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if not os.path.exists(f"/proc/{pid}"):
            return True
        time.sleep(0.05)
    return False


def test_missing_executable_is_a_config_error_with_an_install_hint() -> None:
    source = SingerSource({"command": "tap-does-not-exist-anywhere"})
    with pytest.raises(ConfigError, match="'tap-does-not-exist-anywhere' is not on PATH") as info:
        source.check()
    assert "pipx install tap-does-not-exist-anywhere" in (info.value.hint or "")


def test_a_tap_that_cannot_be_executed_is_a_source_error(tmp_path: Path) -> None:
    tap = tmp_path / "tap-no-interpreter"
    tap.write_text("no #! line: the kernel cannot run this\n")
    tap.chmod(0o700)
    with pytest.raises(SourceError, match="could not be started: Exec format error") as info:
        SingerSource({"command": str(tap)}).discover()
    assert "executable Singer tap" in (info.value.hint or "")
    assert list(Path(tempfile.gettempdir()).glob(f"combined-singer-{os.getpid()}-*")) == []


@pytest.mark.parametrize(
    "config",
    [{}, {"command": ""}, {"command": [1]}, {"command": "x", "config": []}],
)
def test_bad_configuration_is_refused(config: dict[str, Any]) -> None:
    with pytest.raises(ConfigError):
        SingerSource(config)


def test_unknown_keys_are_refused_naming_the_closest() -> None:
    with pytest.raises(ConfigError, match="idle_timout") as info:
        SingerSource({"command": "x", "idle_timout": 5})
    assert "'idle_timeout'" in (info.value.hint or "")


def test_check_runs_discovery(bad_config: BadConfig) -> None:
    SingerSource(bad_config("ok")).check()
    with pytest.raises(SourceError, match="exited with status 2") as info:
        SingerSource(bad_config("discover_fail")).check()
    assert "connection refused" in info.value.message  # the tap's log tail
    with pytest.raises(SourceError, match="no valid JSON catalog"):
        SingerSource(bad_config("discover_garbage")).discover()


def test_non_zero_exit_fails_with_the_log_tail(bad_config: BadConfig) -> None:
    exc = fail_read(bad_config("exit"), SourceError)
    assert type(exc) is SourceError
    assert "exited with status 3" in exc.message
    assert "fatal: the provider said 500" in exc.message
    assert "checkpoint did not move" in (exc.hint or "")
    assert pickle.loads(pickle.dumps(exc)).message == exc.message


def test_malformed_line_names_its_number(bad_config: BadConfig) -> None:
    exc = fail_read(bad_config("malformed"), SourceError)
    assert "line 3 of the tap's output is not JSON" in exc.message
    assert "one Singer message (a JSON object) per line" in exc.message
    assert exc.context["line"] == 3


def test_record_before_schema(bad_config: BadConfig) -> None:
    exc = fail_read(bad_config("record_first"), SourceError)
    assert "line 1: a RECORD of stream 'items' came before its SCHEMA" in exc.message


def test_value_that_does_not_fit_names_stream_field_and_line(bad_config: BadConfig) -> None:
    exc = fail_read(bad_config("type_mismatch"), SchemaMismatch)
    assert exc.message.startswith("line 4: field 'id' of stream 'items' holds text of 3 characters")
    assert "not an integer" in exc.message
    assert exc.context == {"stream": "items", "field": "id", "line": 4}


def test_undeclared_property_is_refused(bad_config: BadConfig) -> None:
    exc = fail_read(bad_config("extra_field"), SchemaMismatch)
    assert "line 3" in exc.message and "'colour'" in exc.message


def test_batch_messages_are_refused_clearly(bad_config: BadConfig) -> None:
    exc = fail_read(bad_config("batch"), SourceError)
    assert "BATCH message" in exc.message and "batch_config" in (exc.hint or "")


def test_huge_stderr_neither_blocks_nor_grows_the_error(bad_config: BadConfig) -> None:
    # 20 MiB of log before the first message: a pipe nobody reads would block the tap.
    messages = list(SingerSource(bad_config("huge_stderr")).read(items()))
    got = [
        r["id"] for m in messages if isinstance(m, RecordBatchMessage) for r in m.batch.to_pylist()
    ]
    assert got == [1, 2, 3, 4, 5]


def test_huge_stderr_keeps_only_a_bounded_tail(bad_config: BadConfig, tmp_path: Path) -> None:
    from combined.connectors._subprocess._process import ChildProcess

    script = tmp_path / "noisy.py"
    script.write_text(
        "import sys\n"
        "for _ in range(20 * 1024):\n    sys.stderr.write('y' * 1023 + '\\n')\n"
        "sys.stderr.write('the end\\n')\n"
    )
    import sys

    proc = ChildProcess([sys.executable, str(script)], scrub=str, max_line_bytes=1024)
    assert proc.next_line(30) is None
    assert proc.wait_exit(30) == 0
    tail = proc.stderr_tail()
    assert tail.endswith("the end") and len(tail) <= STDERR_TAIL_BYTES + 3


def test_a_silent_tap_times_out_and_its_process_group_is_ended(
    bad_config: BadConfig, tmp_path: Path
) -> None:
    config = bad_config("hang", idle_timeout=1)
    source = SingerSource(config)
    extraction = source.read(items())
    started = time.monotonic()
    with pytest.raises(SourceUnavailable, match="wrote nothing for 1 s after line 1") as info:
        list(extraction)
    assert time.monotonic() - started < 15
    assert info.value.transient  # retried as another Attempt
    extraction.finish("abort")
    tap, child = (int(p) for p in (tmp_path / "pids").read_text().split())
    assert gone(tap) and gone(child)  # the tap and the helper it started


def test_finish_from_another_thread_stops_a_running_read(
    bad_config: BadConfig, tmp_path: Path
) -> None:
    extraction = SingerSource(bad_config("hang", idle_timeout=300)).read(items())
    errors: list[BaseException] = []

    def consume() -> None:
        try:
            list(extraction)
        except BaseException as exc:
            errors.append(exc)

    reader = threading.Thread(target=consume)
    reader.start()
    pids = tmp_path / "pids"
    deadline = time.monotonic() + 30
    while not pids.exists() or not pids.read_text().strip():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    receipt = extraction.finish("abort")
    reader.join(timeout=30)
    assert not reader.is_alive()
    assert receipt.cleanup_succeeded
    assert errors and isinstance(errors[0], SourceError)
    tap, child = (int(p) for p in pids.read_text().split())
    assert gone(tap) and gone(child)
    with pytest.raises(ChildProcessError):
        os.waitpid(tap, os.WNOHANG)  # reaped: no zombie


def test_abandoning_a_read_part_way_stops_the_tap(good_config: dict[str, Any]) -> None:
    source = SingerSource(good_config)
    request = ReadRequest(
        dataset="users", relation="users", key=("id",), strategy="snapshot", batch_rows=1
    )
    extraction = source.read(request)
    it = iter(extraction)
    first = next(it)
    assert isinstance(first, RecordBatchMessage)
    pid = extraction.pid  # type: ignore[attr-defined]
    extraction.finish("abort")
    assert pid is not None and gone(pid)
    with pytest.raises(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)
    with pytest.raises(CombinedError):
        list(extraction)  # finished: no second pass


def test_no_secret_in_errors_or_log_tails(bad_config: BadConfig) -> None:
    exc = fail_read(bad_config("leak"), SourceError)
    shown = " ".join([exc.message, exc.hint or "", exc.describe(), repr(exc), str(exc.context)])
    assert "exited with status 1" in shown and "Authorization: " in shown
    assert TOKEN not in shown
    # a token the tap obtained itself, in a request's header line; the api_token in base64
    assert "at-5150-derived-access" not in shown
    basic = base64.b64encode(f"tap-user:{TOKEN}".encode()).decode()
    assert not any(basic[n : n + 12] in shown for n in range(12, len(basic) - 16))
    assert TOKEN not in repr(pickle.loads(pickle.dumps(exc)).__reduce__())
    # discovery errors too
    config = bad_config("discover_fail")
    config["config"]["password"] = TOKEN
    with pytest.raises(SourceError) as info:
        SingerSource(config).discover()
    assert TOKEN not in info.value.describe()


def test_unsupported_strategy_and_bounds_are_refused(bad_config: BadConfig) -> None:
    source = SingerSource(bad_config("ok"))
    with pytest.raises(ConfigError, match="strategy 'cdc'"):
        source.read(ReadRequest(dataset="items", relation="items", key=("id",), strategy="cdc"))
    with pytest.raises(ConfigError, match="does not read partitions"):
        source.read(items(bounds={"lower": 1}))


# -- the type mapping, value by value ------------------------------------------------------


@pytest.mark.parametrize(
    ("schema", "arrow", "nullable"),
    [
        ({"type": "integer"}, pa.int64(), False),
        ({"type": ["null", "integer"]}, pa.int64(), True),
        ({"type": ["integer", "number"]}, pa.float64(), False),
        ({"type": "number", "multipleOf": 0.001}, pa.decimal128(38, 3), False),
        ({"type": "number", "multipleOf": Decimal("1E-38")}, pa.decimal128(38, 38), False),
        ({"type": "string", "format": "date-time"}, pa.timestamp("us", tz="UTC"), False),
        ({"anyOf": [{"type": "null"}, {"type": "string", "format": "date"}]}, pa.date32(), True),
        ({"type": ["string", "integer"]}, pa.string(), False),
        ({"type": "object"}, pa.string(), False),
        ({}, pa.string(), True),
        ({"type": "string", "format": "uuid"}, pa.string(), False),
    ],
)
def test_json_schema_to_arrow(schema: dict[str, Any], arrow: pa.DataType, nullable: bool) -> None:
    plan = plan_field("f", schema)
    assert plan.arrow == arrow and plan.nullable is nullable


@pytest.mark.parametrize(
    ("schema", "values", "bad"),
    [
        ({"type": "integer"}, [1, True], 1),
        ({"type": "integer"}, [1, Decimal("1.5")], 1),
        ({"type": "integer"}, [2**63], 0),
        ({"type": "number"}, [1.5, "2"], 1),
        ({"type": "number", "multipleOf": 0.01}, [Decimal("1.23"), Decimal("1.234")], 1),
        ({"type": "boolean"}, [True, 1], 1),
        ({"type": "string"}, ["a", 5], 1),
        ({"type": "string", "format": "date-time"}, ["2024-01-01T00:00:00Z", "yesterday"], 1),
        ({"type": "string", "format": "date-time"}, ["2024-01-01T00:00:00"], 0),
        ({"type": "string", "format": "date"}, ["2024-02-30"], 0),
    ],
)
def test_values_that_do_not_fit_are_named_never_nulled(
    schema: dict[str, Any], values: list[Any], bad: int
) -> None:
    with pytest.raises(BadValue) as info:
        plan_field("f", schema).column(values)
    assert info.value.index == bad


def test_exact_numbers_stay_exact() -> None:
    plan = plan_field("f", {"type": "number", "multipleOf": 0.01})
    column = plan.column([Decimal("12345678901234567890.12"), 3, None])
    assert column.to_pylist() == [Decimal("12345678901234567890.12"), Decimal("3.00"), None]


def test_read_ahead_is_bounded_in_bytes_not_only_in_lines(tmp_path: Path) -> None:
    """A tap of large records waits for Combined once 16 MiB of lines are read ahead.

    Bounded by lines alone, 256 records of 50 MB would be held at once (12.5 GB).
    """
    import sys

    from combined.connectors._subprocess._process import ChildProcess

    progress = tmp_path / "progress"
    script = tmp_path / "big.py"
    script.write_text(
        "import sys\n"
        "for i in range(48):\n"
        "    sys.stdout.write('x' * (1024 * 1024 - 1) + '\\n'); sys.stdout.flush()\n"
        f"    open({str(progress)!r}, 'w').write(str(i + 1))\n"
    )
    proc = ChildProcess([sys.executable, str(script)], scrub=str, max_line_bytes=2**21)
    try:
        seen, still = "", 0
        while still < 10:  # wait until the tap stops making progress: blocked on the pipe
            time.sleep(0.2)
            now = progress.read_text() if progress.exists() else ""
            still = still + 1 if now == seen else 0
            seen = now
        assert int(seen) <= 16 + 4  # the read-ahead, the pipe and the line being read
        lines = 0
        while (line := proc.next_line(30)) is not None:
            assert len(line) == 1024 * 1024
            lines += 1
        assert lines == 48
        assert proc.wait_exit(30) == 0
    finally:
        proc.stop()


def _tail_of(tmp_path: Path, *lines: str) -> str:
    """The log tail of a program writing ``lines`` (Python expressions) to stderr, then failing."""
    import sys

    from combined.connectors._subprocess._process import ChildProcess

    script = tmp_path / "long.py"
    writes = "".join(f"sys.stderr.write({line} + '\\n')\n" for line in lines)
    script.write_text(f"import sys\n{writes}sys.exit(1)\n")
    proc = ChildProcess([sys.executable, str(script)], scrub=masking([TOKEN]), max_line_bytes=1024)
    assert proc.next_line(30) is None
    assert proc.wait_exit(30) == 1
    return proc.stderr_tail()


def test_a_long_last_log_line_is_shown_and_masked_before_it_is_cut(tmp_path: Path) -> None:
    """A log line longer than the tail (a one-line JSON log, a Java trace) still says why."""
    reason = f"'x' * 9000 + {TOKEN!r} + ' fatal: the real reason'"
    tail = _tail_of(tmp_path, reason)
    assert tail.endswith("*** fatal: the real reason") and TOKEN not in tail
    # the tail's cut falls inside the token of the last line: masked first, never half shown
    tail = _tail_of(tmp_path, reason, f"'z' * 100 + {TOKEN!r} + 'q' * (8192 - 12)")
    assert tail.startswith("...z") and "z***qqq" in tail and len(tail) <= STDERR_TAIL_BYTES + 3
    pieces = [TOKEN[:n] for n in range(6, len(TOKEN))] + [TOKEN[-n:] for n in range(6, len(TOKEN))]
    assert not any(piece in tail for piece in pieces)


def test_a_token_a_failing_tap_wrote_back_and_printed_is_masked_in_its_error(
    tmp_path: Path,
) -> None:
    """The tap writes a rotated token back into its --config file, prints it, and fails."""
    import json
    import sys

    from tests.connectors.singer.fixtures import TAPS

    first = "rt-first-0123456789abcdef"
    provider = tmp_path / "provider.json"
    provider.write_text(json.dumps({"valid": first, "fail_after_rotation": True}))
    schema = {"type": "object", "properties": {"id": {"type": "integer"}}}
    catalog = tmp_path / "catalog.json"
    catalog.write_text(json.dumps({"streams": [{"tap_stream_id": "items", "schema": schema}]}))
    source = SingerSource(
        {
            "command": [sys.executable, str(TAPS / "rotating_tap.py")],
            "config": {"provider": str(provider), "refresh_token": first},
            "catalog": str(catalog),
        }
    )
    request = ReadRequest(dataset="items", relation="items", key=("id",), strategy="snapshot")
    with pytest.raises(SourceError, match="exited with status 1") as info:
        list(source.read(request))
    rotated = json.loads(provider.read_text())["valid"]
    assert "rotated to ***, then the provider went away" in info.value.message
    assert rotated not in str(info.value)
    assert source.live.current["refresh_token"] == rotated  # the next read uses it


def test_a_tap_killed_within_a_line_is_reported_killed_not_its_line_blamed(
    tmp_path: Path,
) -> None:
    """Killed mid-write (out of memory): the cut line is not "not JSON", the kill is the cause."""
    import sys

    script = tmp_path / "killed.py"
    script.write_text(
        "import json, os, signal, sys\n"
        "if '--discover' in sys.argv: sys.exit(1)\n"
        "schema = {'type': 'object', 'properties': {'id': {'type': 'integer'}}}\n"
        "print(json.dumps({'type': 'SCHEMA', 'stream': 's', 'schema': schema}))\n"
        'sys.stdout.write(\'{"type": "RECORD", "stream": "s", "record": {"id": 2\')\n'
        "sys.stdout.flush()\n"
        "sys.stderr.write('about to be killed\\n'); sys.stderr.flush()\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    schema = {"type": "object", "properties": {"id": {"type": "integer"}}}
    catalog = tmp_path / "catalog.json"
    catalog.write_text(json.dumps({"streams": [{"tap_stream_id": "s", "schema": schema}]}))
    source = SingerSource(
        {"command": [sys.executable, str(script)], "config": {}, "catalog": str(catalog)}
    )
    request = ReadRequest(dataset="s", relation="s", key=("id",), strategy="snapshot")
    with pytest.raises(SourceError) as info:
        list(source.read(request))
    assert "was killed by signal 9" in info.value.message
    assert "about to be killed" in info.value.message
    assert "not JSON" not in info.value.message


def test_a_discovery_killed_by_a_signal_says_so(tmp_path: Path) -> None:
    import sys

    script = tmp_path / "killed_discovery.py"
    script.write_text("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n")
    with pytest.raises(SourceError, match="the tap's discovery was killed by signal 9"):
        SingerSource({"command": [sys.executable, str(script)], "config": {}}).discover()
