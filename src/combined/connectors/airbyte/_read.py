"""One run of an Airbyte source for one stream: its messages as bounded Arrow batches and states."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from combined.connectors._subprocess._live import CONFIG_FILE
from combined.connectors._subprocess._private import PrivateDir
from combined.connectors._subprocess._process import ChildProcess
from combined.connectors._subprocess._rows import Rows, described
from combined.connectors._subprocess._run import Gathered, ProgramExtraction
from combined.connectors._subprocess._schema import FieldPlan
from combined.connectors._subprocess._state import kept_state, masked, program_state
from combined.connectors.airbyte._catalog import Stream
from combined.connectors.airbyte._messages import control, descriptor, log, trace_error
from combined.protocol import Message, StateMessage

_FIX = "the connector must declare every property it writes in the stream's json_schema"
# Messages a read may carry that say nothing about its records.
_IGNORED = ("SPEC", "CATALOG", "CONNECTION_STATUS")


def position(stream_state: Any, cursor: str | None) -> str | None:
    """The cursor's value in a per-stream state, as text, when the connector keeps it plainly."""
    if cursor is None or not isinstance(stream_state, Mapping):
        return None
    value = stream_state.get(cursor)
    if value is None or isinstance(value, Mapping | list):
        return None
    return str(value)


class AirbyteExtraction(ProgramExtraction):
    """A snapshot (``full_refresh``) or cursor (``incremental``) read of one stream."""

    STATE_KEY = "airbyte"

    def __init__(
        self,
        *,
        stream: Stream,
        plans: Sequence[FieldPlan],
        catalog: Mapping[str, Any],
        cursor: str | None,
        **common: Any,
    ) -> None:
        super().__init__(label=stream.qualified, **common)
        self._stream = stream
        self._plans = tuple(plans)
        self._catalog = catalog
        self._cursor = cursor

    def _arguments(self, files: PrivateDir) -> list[str]:
        args = ["read", "--config", files.write(CONFIG_FILE, self._program_config.current)]
        args += ["--catalog", files.write("catalog.json", self._catalog)]
        request = self._request
        state = program_state(request.state, "airbyte") if request.strategy == "cursor" else None
        if state:
            args += ["--state", files.write("state.json", [state])]
        return args

    def _read(self, proc: ChildProcess) -> Iterator[Message]:
        request, stream = self._request, self._stream
        cursor = request.strategy == "cursor"
        rows = Rows(stream.qualified, self._plans, self._selected(), frozenset(), fix=_FIX)
        out = Gathered(rows)
        # An empty snapshot deletes every row: it needs the connector's word that it
        # read the stream (a record, a state or a status of it).
        read_it = False
        number = 0
        while (raw := self._next(proc, number)) is not None:
            number += 1
            msg = self._decode(proc, raw, number)
            if msg is None:
                continue
            kind = msg["type"]
            if kind == "RECORD":
                rows.add(self._record(proc, msg, number), number, len(raw))
                read_it = True
                if self._full(rows):
                    yield from self._flush(out)
            elif kind == "STATE":
                state = self._stream_state(proc, msg, number)
                if state is None:
                    continue
                read_it = True
                if cursor:
                    yield from self._on_state(out, state)
            elif kind == "TRACE":
                read_it = self._trace(proc, msg, number) or read_it
            elif kind == "LOG":
                log(proc, msg)
            elif kind == "CONTROL":
                control(proc, msg, self._program_config)
            elif kind not in _IGNORED:
                raise self._fail(
                    proc,
                    f"line {number}: unknown Airbyte message type {described(kind)}: expected "
                    "RECORD, STATE, LOG, TRACE",
                    "run a connector that speaks the Airbyte protocol",
                    line=number,
                )
        yield from self._flush(out)
        self._exit(proc)
        if not read_it and not cursor:
            raise self._fail(
                proc,
                f"the connector wrote no record, state or status of stream {stream.qualified!r}: "
                "it may not have read the stream, and an empty snapshot would delete every "
                f"row of dataset {request.dataset!r}",
                "check that the connector reads the streams of its configured catalog "
                "(run its `read` yourself); nothing was committed",
            )
        self.authority.complete()
        yield self._final_state(out.latest, self._previous_position)

    def _previous_position(self, previous: Mapping[str, Any]) -> str | None:
        """The position of the previous checkpoint's stream state."""
        stream_state = (
            (program_state(previous, "airbyte") or {}).get("stream", {}).get("stream_state")
        )
        return position(stream_state, self._cursor)

    def _record(self, proc: ChildProcess, msg: Mapping[str, Any], number: int) -> Any:
        record = msg.get("record")
        if not isinstance(record, Mapping) or not isinstance(record.get("data"), Mapping):
            raise self._fail(
                proc,
                f"line {number}: a RECORD without a `record.data` object",
                "the connector must write each record's data as a JSON object",
                line=number,
            )
        if not self._stream.matches(record):
            other = record.get("stream")
            if record.get("namespace"):
                other = f"{record.get('namespace')}.{other}"
            raise self._fail(
                proc,
                f"line {number}: a RECORD of stream {other!r}, which the configured "
                f"catalog does not select (it selects {self._stream.qualified!r} alone)",
                "the connector must read only the streams of its configured catalog; "
                "nothing was committed",
                line=number,
            )
        return record["data"]

    def _stream_state(
        self, proc: ChildProcess, msg: Mapping[str, Any], number: int
    ) -> StateMessage | None:
        """This stream's per-stream state as a checkpoint; None for another stream's."""
        state = msg.get("state")
        if not isinstance(state, Mapping):
            raise self._fail(
                proc,
                f"line {number}: a STATE without a `state` object",
                "the connector must write its state as an AirbyteStateMessage",
                line=number,
            )
        kind = state.get("type") or ("LEGACY" if "data" in state else None)
        if kind in ("GLOBAL", "LEGACY"):
            if self._request.strategy != "cursor":
                return None  # a snapshot keeps no state
            raise self._fail(
                proc,
                f"line {number}: the connector keeps {kind} state, shared by all its "
                "streams; Combined reads one stream a run and keeps each dataset's state "
                "apart, so only per-stream (STREAM) state can resume a cursor read",
                f"use `strategy: snapshot` for dataset {self._request.dataset!r}, or a "
                "connector version with per-stream state; nothing was committed",
                line=number,
                state_type=kind,
            )
        stream = state.get("stream")
        if kind != "STREAM" or not isinstance(stream, Mapping):
            raise self._fail(
                proc,
                f"line {number}: a STATE of unknown type {described(kind)}: expected STREAM, "
                "GLOBAL or LEGACY",
                "run a connector that speaks the Airbyte protocol",
                line=number,
            )
        if not self._stream.matches(descriptor(stream)):
            return None  # another stream's state: nothing of this dataset
        stream_state = masked(stream.get("stream_state"), self._mask_state)
        kept = {
            "type": "STREAM",
            "stream": {
                "stream_descriptor": dict(descriptor(stream) or {}),
                "stream_state": stream_state,
            },
        }
        return StateMessage(
            self._request.dataset,
            {
                **kept_state("airbyte", kept, self._mask_state),
                "stream": self._stream.qualified,
                "trust": self._trust(),
            },
            position=position(stream_state, self._cursor),
        )

    def _trust(self) -> str:
        spec = self._request.cursor
        return spec.trust if spec is not None else "connector state"

    def _trace(self, proc: ChildProcess, msg: Mapping[str, Any], number: int) -> bool:
        """Raise a TRACE ERROR; whether a STREAM_STATUS says this stream was read."""
        error = trace_error(
            proc,
            msg,
            self._scrub,
            f"reading stream {self._stream.qualified!r}",
            stream=self._stream.qualified,
            line=number,
        )
        if error is not None:
            raise error
        trace = msg.get("trace")
        status = trace.get("stream_status") if isinstance(trace, Mapping) else None
        if not isinstance(status, Mapping) or not self._stream.matches(descriptor(status)):
            return False
        if status.get("status") == "INCOMPLETE":
            raise self._fail(
                proc,
                f"line {number}: the connector reports stream {self._stream.qualified!r} "
                "INCOMPLETE",
                "read the connector's log above; nothing was committed",
                line=number,
            )
        return status.get("status") == "COMPLETE"
