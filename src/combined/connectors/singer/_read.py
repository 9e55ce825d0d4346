"""One run of a tap for one stream: its output lines as bounded Arrow batches and states."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from combined.connectors._subprocess._live import CONFIG_FILE
from combined.connectors._subprocess._private import PrivateDir
from combined.connectors._subprocess._process import ChildProcess
from combined.connectors._subprocess._rows import Rows, described
from combined.connectors._subprocess._run import Gathered, ProgramExtraction
from combined.connectors._subprocess._schema import (
    BadSchema,
    FieldPlan,
    plan_stream,
)
from combined.connectors._subprocess._state import kept_state, masked, program_state
from combined.connectors.singer._catalog import Stream
from combined.errors import SourceError, UnsupportedType
from combined.protocol import Message, StateMessage

_FIX = "the tap must declare every property it writes; fix the tap or its catalog"
#: The messages that name their stream (another stream's are skipped).
_STREAM_KINDS = ("SCHEMA", "RECORD", "ACTIVATE_VERSION", "BATCH")


def bookmark(state: Any, stream: Stream) -> str | None:
    """The stream's bookmark value in a Singer STATE, as text, if the tap keeps a usual one."""
    if not isinstance(state, Mapping):
        return None
    marks = state.get("bookmarks")
    mark = marks.get(stream.tap_stream_id) if isinstance(marks, Mapping) else None
    if not isinstance(mark, Mapping):
        return None
    for name in ("replication_key_value", stream.replication_key):
        if name and mark.get(name) is not None:
            return str(mark[name])
    return None


class SingerExtraction(ProgramExtraction):
    """A snapshot or cursor read of one stream: the tap runs once, when iterated.

    :meth:`finish` (any outcome, from any thread) stops the tap and its
    process group, reaps it and removes its private files; iterating twice,
    or after :meth:`finish`, is a :class:`~combined.errors.ProtocolViolation`.
    """

    STATE_KEY = "singer"

    def __init__(self, *, stream: Stream, catalog: Mapping[str, Any], **common: Any) -> None:
        super().__init__(label=stream.tap_stream_id, **common)
        self._stream = stream
        self._catalog = catalog

    def _arguments(self, files: PrivateDir) -> list[str]:
        args = ["--config", files.write(CONFIG_FILE, self._program_config.current)]
        args += ["--catalog", files.write("catalog.json", self._catalog)]
        state = self._tap_state()
        if state is not None:
            args += ["--state", files.write("state.json", state)]
        return args

    def _tap_state(self) -> Any:
        request = self._request
        if request.strategy != "cursor" or not request.state:
            return None
        return program_state(request.state, "singer")

    # -- the protocol -------------------------------------------------------------------

    def _read(self, proc: ChildProcess) -> Iterator[Message]:
        request, stream = self._request, self._stream
        names = stream.names()
        cursor = request.strategy == "cursor"
        out = Gathered()
        number = 0
        while (raw := self._next(proc, number)) is not None:
            number += 1
            msg = self._decode(proc, raw, number)
            if msg is None:
                continue
            kind = msg["type"]
            if kind == "STATE":
                if cursor:
                    value = masked(msg.get("value"), self._mask_state)
                    state = StateMessage(
                        request.dataset, self._state(value), position=bookmark(value, stream)
                    )
                    yield from self._on_state(out, state)
                continue
            if kind in _STREAM_KINDS and msg.get("stream") not in names:
                continue  # another stream's message: the tap may ignore the selection
            if kind == "RECORD":
                rows = self._add_record(proc, out.rows, msg, number, len(raw))
                if self._full(rows):
                    yield from self._flush(out)
            elif kind == "SCHEMA":
                plans = self._schema(msg.get("schema"), number)
                if out.rows is None or plans != out.rows.plans:
                    yield from self._flush(out)
                    # A changed schema gives batches of the new shape: the engine's
                    # drift policy judges the difference.
                    out.rows = Rows(
                        stream.tap_stream_id,
                        plans,
                        self._selected(),
                        stream.unsupported(),
                        fix=_FIX,
                    )
            elif kind != "ACTIVATE_VERSION":
                # (A full-table version switch is ignored: a snapshot capture replaces
                # the whole stream already, and a cursor capture merges by key either way.)
                raise self._unexpected(proc, kind, number)
        yield from self._flush(out)
        self._exit(proc)
        if out.rows is None and not cursor:
            raise self._no_schema(proc)
        self.authority.complete()
        yield self._final_state(
            out.latest, lambda previous: bookmark(program_state(previous, "singer"), stream)
        )

    def _add_record(
        self, proc: ChildProcess, rows: Rows | None, msg: Mapping[str, Any], number: int, size: int
    ) -> Rows:
        """Add a RECORD's record to ``rows``; refuse one before its SCHEMA or not an object."""
        if rows is None:
            raise self._fail(
                proc,
                f"line {number}: a RECORD of stream {self._stream.tap_stream_id!r} came "
                "before its SCHEMA",
                "the tap must write a stream's SCHEMA before its records",
                line=number,
            )
        record = msg.get("record")
        if not isinstance(record, dict):
            raise self._fail(
                proc,
                f"line {number}: a RECORD without a `record` object",
                "the tap must write each record as a JSON object",
                line=number,
            )
        rows.add(record, number, size)
        return rows

    def _unexpected(self, proc: ChildProcess, kind: Any, number: int) -> SourceError:
        """The error for a BATCH message (records in files) or an unknown message type."""
        if kind == "BATCH":
            return self._fail(
                proc,
                f"line {number}: the tap wrote a BATCH message (records in files), "
                "which the singer connector does not read",
                "configure the tap without `batch_config` so that it writes RECORD messages",
                line=number,
            )
        return self._fail(
            proc,
            f"line {number}: unknown Singer message type {described(kind)}: expected "
            "SCHEMA, RECORD, STATE, ACTIVATE_VERSION",
            "run a tap that speaks the Singer specification",
            line=number,
        )

    def _no_schema(self, proc: ChildProcess) -> SourceError:
        """A snapshot's tap wrote no SCHEMA: it did not read the stream."""
        # An empty snapshot deletes every row of the dataset. A tap writes a
        # stream's SCHEMA even when it holds no record, so no SCHEMA means the
        # tap did not read the stream (it ignored the catalog's selection).
        return self._fail(
            proc,
            f"the tap wrote no SCHEMA for stream {self._stream.tap_stream_id!r}: it did not "
            "read the stream, and an empty snapshot would delete every row of "
            f"dataset {self._request.dataset!r}",
            "check that the tap honours the catalog's `selected` metadata for the "
            "stream (run it with --catalog yourself); nothing was committed",
        )

    def _schema(self, schema: Any, number: int) -> tuple[FieldPlan, ...]:
        try:
            plans = self._settings.typing.apply(self._stream.names(), plan_stream(schema))
        except BadSchema as exc:
            raise UnsupportedType(
                f"line {number}: the SCHEMA of stream {self._stream.tap_stream_id!r}: {exc}",
                hint="fix the tap's schema for that property",
                stream=self._stream.tap_stream_id,
                line=number,
            ) from None
        return plans

    def _state(self, value: Any) -> dict[str, Any]:
        spec = self._request.cursor
        return {
            **kept_state("singer", value, self._mask_state),
            "stream": self._stream.tap_stream_id,
            "trust": spec.trust if spec is not None else "tap bookmark",
        }
