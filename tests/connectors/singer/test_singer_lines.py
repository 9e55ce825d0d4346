"""Exact lines from a scripted tap: number exactness, STATE placement, a stream never read."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from tests.connectors.singer.conftest import SCRIPT_PROPERTIES
from tests.connectors.singer.test_singer_errors import gone

from combined.connectors.abc import CursorSpec, ReadRequest
from combined.connectors.singer import SingerSource
from combined.errors import SchemaMismatch, SourceError, SourceUnavailable
from combined.protocol import Message, RecordBatchMessage, StateMessage

Scripted = Callable[..., dict[str, Any]]

SCHEMA = {
    "type": "SCHEMA",
    "stream": "s",
    "schema": {
        "type": "object",
        "properties": {"id": {"type": "integer"}, "u": {"type": ["null", "integer"]}},
    },
    "key_properties": ["id"],
}


def out(message: dict[str, Any] | str) -> dict[str, str]:
    """A step writing ``message`` (a dict as JSON, a str as it is) as one line."""
    return {"out": message if isinstance(message, str) else json.dumps(message)}


def record(i: int) -> dict[str, str]:
    return out({"type": "RECORD", "stream": "s", "record": {"id": i, "u": i}})


def state(i: int) -> dict[str, str]:
    return out({"type": "STATE", "value": {"bookmarks": {"s": {"replication_key_value": i}}}})


def read(
    config: dict[str, Any], strategy: str = "snapshot", batch_rows: int = 1000
) -> list[Message]:
    request = ReadRequest(
        dataset="s",
        relation="s",
        key=("id",),
        strategy=strategy,  # type: ignore[arg-type]
        cursor=CursorSpec("u", 0, "the tap's bookmark") if strategy == "cursor" else None,
        batch_rows=batch_rows,
    )
    extraction = SingerSource(config).read(request)
    try:
        return list(extraction)
    finally:
        extraction.finish("success")


def rows(messages: list[Message]) -> list[dict[str, Any]]:
    return [r for m in messages if isinstance(m, RecordBatchMessage) for r in m.batch.to_pylist()]


def test_integers_written_with_a_fraction_or_exponent_stay_exact(scripted: Scripted) -> None:
    line = '{"type":"RECORD","stream":"s","record":{"id":9007199254740993.0,"u":1e3}}'
    got = rows(read(scripted([out(SCHEMA), out(line)])))
    # never through a float: 2**53 + 1 is not a float
    assert got == [{"id": 9007199254740993, "u": 1000}]


def test_an_integer_a_double_would_round_in_a_number_field_is_refused(
    scripted: Scripted,
) -> None:
    """A `number` property is a double: 12345678901234567890123 landed as 1.2345678901234568e+22."""
    schema = json.loads(json.dumps(SCHEMA))
    schema["schema"]["properties"]["n"] = {"type": ["null", "number"]}
    exact = '{"type":"RECORD","stream":"s","record":{"id":1,"n":9007199254740992}}'
    fraction = '{"type":"RECORD","stream":"s","record":{"id":2,"n":0.1}}'
    got = rows(read(scripted([out(schema), out(exact), out(fraction)])))
    assert [r["n"] for r in got] == [9007199254740992.0, 0.1]  # 2**53: a double holds it
    big = '{"type":"RECORD","stream":"s","record":{"id":3,"n":12345678901234567890123}}'
    with pytest.raises(SchemaMismatch, match="'n' .* not an integer a double holds exactly") as e:
        read(scripted([out(schema), out(exact), out(big)]))
    assert 'types: {"s.n": decimal(N)}' in (e.value.hint or "")
    # 2**53 + 1, as an integer and with a fraction: a double holds neither (it is 2**53 there)
    for n in ("9007199254740993", "9007199254740993.0", "-9007199254740993"):
        odd = f'{{"type":"RECORD","stream":"s","record":{{"id":4,"n":{n}}}}}'
        with pytest.raises(SchemaMismatch, match="line 4: field 'n' .* not an integer a double"):
            read(scripted([out(schema), out(exact), out(fraction), out(odd)]))
    properties = {**SCRIPT_PROPERTIES, "n": {"type": ["null", "number"]}}
    steps = [out(schema), out(exact), out(big)]
    typed = scripted(steps, properties, types={"s.n": "decimal(0)"})
    assert [r["n"] for r in rows(read(typed))] == [9007199254740992, 12345678901234567890123]


def _shape(messages: list[Message]) -> list[str]:
    return [
        f"rows {[r['id'] for r in m.batch.to_pylist()]}"
        if isinstance(m, RecordBatchMessage)
        else f"state {m.position}{' final' if m.final else ''}"
        for m in messages
        if isinstance(m, RecordBatchMessage | StateMessage)
    ]


def test_a_state_after_every_record_does_not_cut_the_batches(scripted: Scripted) -> None:
    steps = [out(SCHEMA)]
    for i in range(1, 6):
        steps += [record(i), state(i)]
    # one batch, not five of one row (each batch is a Parquet row group downstream),
    # and the newest state after the records it covers
    assert _shape(read(scripted(steps), "cursor")) == [
        "rows [1, 2, 3, 4, 5]",
        "state 5",
        "state 5 final",
    ]
    # batches bounded by batch_rows: each state comes after every record before it
    assert _shape(read(scripted(steps), "cursor", batch_rows=2)) == [
        "rows [1, 2]",
        "state 1",
        "state 2",
        "rows [3, 4]",
        "state 3",
        "state 4",
        "rows [5]",
        "state 5",
        "state 5 final",
    ]


def test_a_state_before_any_record_and_records_after_the_last_state(scripted: Scripted) -> None:
    steps = [state(0), out(SCHEMA), record(1), state(1), record(2)]
    # record 2 comes after the last STATE: the checkpoint stays at the state before it
    assert _shape(read(scripted(steps), "cursor")) == [
        "state 0",
        "rows [1, 2]",
        "state 1",
        "state 1 final",
    ]


@pytest.mark.parametrize(
    "steps",
    [
        [],
        [
            out({**SCHEMA, "stream": "other"}),
            out({"type": "RECORD", "stream": "other", "record": {}}),
        ],
    ],
    ids=["silent", "another stream only"],
)
def test_a_snapshot_of_a_stream_the_tap_never_wrote_is_refused(
    scripted: Scripted, steps: list[dict[str, str]]
) -> None:
    # An empty snapshot deletes every row of the dataset: a tap that did not read
    # the stream (it ignored the selection, or names it otherwise) must not do that.
    with pytest.raises(SourceError, match="wrote no SCHEMA for stream 's'"):
        read(scripted(steps))


def test_an_empty_stream_is_an_empty_snapshot(scripted: Scripted) -> None:
    messages = read(scripted([out(SCHEMA)]))
    assert rows(messages) == [] and _shape(messages) == ["state None final"]


ABANDON = """
import sys
import time
from combined.connectors.abc import ReadRequest
from combined.connectors.singer import SingerSource
source = SingerSource({config!r})
request = ReadRequest(dataset="s", relation="s", key=("id",), strategy="snapshot", batch_rows=1)
extraction = source.read(request)
messages = iter(extraction)
next(messages)
print(extraction.pid, flush=True)
sys.exit(0)  # never finished: the interpreter exits with the read part way
"""


def test_interpreter_exit_mid_read_stops_the_tap_and_removes_its_files(
    scripted: Scripted, tmp_path: Path
) -> None:
    config = scripted([out(SCHEMA), record(1), record(2), {"sleep": 60}])
    private = tmp_path / "tmp"
    private.mkdir()
    done = subprocess.run(
        [sys.executable, "-c", ABANDON.format(config=config)],
        env={**os.environ, "TMPDIR": str(private)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    # no crash in the interpreter's finalisation, no configuration (secrets) left behind
    assert done.returncode == 0, done.stderr
    assert list(private.iterdir()) == []
    assert gone(int(done.stdout))  # the tap (sleeping 60 s) was stopped


def test_discover_timeout_bounds_the_whole_discovery(scripted: Scripted) -> None:
    # a line every 0.3 s never trips a per-line timeout: the 1 s limit is for all of it
    trickle = [{"out": " "}, {"sleep": 0.3}] * 10
    source = SingerSource(scripted([], discover_steps=trickle, discover_timeout=1))
    started = time.monotonic()
    with pytest.raises(SourceUnavailable, match="did not finish within 1 s"):
        source.discover()
    assert time.monotonic() - started < 2.5


def test_a_line_that_is_not_utf8_says_so_and_how_to_fix_it(scripted: Scripted) -> None:
    """A Python tap under a Latin-1 locale writes its text in Latin-1, not UTF-8."""
    latin1 = '{"type": "RECORD", "stream": "s", "record": {"id": 1, "u": "caf\xe9"}}\n'
    with pytest.raises(SourceError) as info:
        read(scripted([out(SCHEMA), {"raw": latin1}]))
    assert "line 2 of the tap's output is not UTF-8 text (byte 0xe9 at offset" in info.value.message
    assert "PYTHONIOENCODING" in (info.value.hint or "")
    assert "caf" not in info.value.message  # the line is never quoted: it may hold a secret


def test_a_state_keeps_its_exact_numbers_and_no_secret(scripted: Scripted, tmp_path: Path) -> None:
    """The state went through a float (0.99999999999999999 came back as 1.0, a bookmark
    past rows never read), and a token the tap wrote into it was kept in clear in the
    checkpoint (the catalog, the lake's commit metadata)."""
    secret = "tk-0af3c9d1e5b7"
    value = (
        '{"bookmarks":{"s":{"replication_key_value":0.99999999999999999,'
        f'"big":123456789012345678901234567890.5,"n":7}}}},"tok":"Bearer {secret}",'
        '"next":"https://api.example.com/v1/items?page_token=CAESBggBEAEY&limit=100"}'
    )
    config = scripted([out(SCHEMA), record(1), out(f'{{"type":"STATE","value":{value}}}')])
    config["config"]["api_token"] = secret
    final = read(config, strategy="cursor")[-1]
    assert isinstance(final, StateMessage) and final.final
    kept = json.dumps(final.state)
    assert secret not in kept and secret not in (final.position or "")
    text = final.state["singer_json"]
    assert '"replication_key_value":0.99999999999999999' in text
    assert '"big":123456789012345678901234567890.5' in text and '"n":7' in text
    assert '"tok":"Bearer ***"' in text
    # only the configured secrets: a value that looks like a credential goes back as it is
    assert '"next":"https://api.example.com/v1/items?page_token=CAESBggBEAEY&limit=100"' in text
    assert final.position == "0.99999999999999999"
    # ... and goes back to the tap as it was kept, digit for digit
    given = tmp_path / "given.json"
    config = scripted([{"state_file": str(given)}, out(SCHEMA)])
    config["config"]["api_token"] = secret
    request = ReadRequest(
        dataset="s",
        relation="s",
        key=("id",),
        strategy="cursor",
        cursor=CursorSpec("u", 0, "the tap's bookmark"),
        state=dict(final.state),
    )
    extraction = SingerSource(config).read(request)
    try:
        assert isinstance(list(extraction)[-1], StateMessage)
    finally:
        extraction.finish("success")
    assert given.read_text() == text


@pytest.mark.parametrize(
    ("declared", "value", "kept"),
    [
        ({"type": ["null", "string"]}, 10, "10"),  # a number in a text field
        ({"type": ["null", "integer"]}, '"abc"', "abc"),  # text in an integer field
        ({"type": ["null", "integer"]}, "true", "true"),  # a boolean in an integer field
        ({"type": ["null", "number"], "multipleOf": 0.01}, "1.005", "1.005"),  # more decimals
        ({"type": ["null", "string"], "format": "date"}, "20240101", "20240101"),
    ],
)
def test_the_type_a_refused_value_names_reads_that_value(
    scripted: Scripted, declared: dict[str, Any], value: Any, kept: str
) -> None:
    """Following the hint works: `string` for a number in a text field failed the same way."""
    properties = {**SCRIPT_PROPERTIES, "n": declared}
    schema = {**SCHEMA, "schema": {"type": "object", "properties": properties}}
    line = f'{{"type":"RECORD","stream":"s","record":{{"id":1,"n":{value}}}}}'
    steps = [out(schema), out(line)]
    with pytest.raises(SchemaMismatch, match="line 2: field 'n'") as e:
        read(scripted(steps, properties))
    named = re.search(r'types: \{"s\.n": ([a-z_]+(?:\(N\))?)\}', e.value.hint or "")
    assert named is not None, e.value.hint
    declared_type = named.group(1).replace("(N)", "(3)")
    got = rows(read(scripted(steps, properties, types={"s.n": declared_type})))
    assert [str(r["n"]) for r in got] == [kept]
