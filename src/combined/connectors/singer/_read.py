"""One run of a tap for one stream: its output lines as bounded Arrow batches and states."""

from __future__ import annotations

import atexit
import contextlib
import json
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from decimal import Decimal
from typing import Any

import pyarrow as pa

from combined.connectors._shared import SessionRead
from combined.connectors.abc import ReadRequest
from combined.connectors.singer._catalog import Stream
from combined.connectors.singer._process import LineTooLong, Stopped, TapProcess, Timeout
from combined.connectors.singer._schema import (
    BadSchema,
    BadValue,
    FieldPlan,
    json_default,
    plan_stream,
)
from combined.connectors.singer._settings import PrivateDir, Settings
from combined.errors import (
    ProtocolViolation,
    SchemaMismatch,
    SourceError,
    SourceUnavailable,
    UnsupportedType,
)
from combined.protocol import (
    ExtractionAuthority,
    Message,
    RecordBatchMessage,
    StateMessage,
    TerminalOutcome,
)

# Every number is parsed from its text as a Decimal: an integer written with a
# fraction or an exponent (9007199254740993.0) stays exact, a double column
# rounds once (float(Decimal) is correctly rounded, as float parsing is).
_DECODER = json.JSONDecoder(parse_float=Decimal)
_SHOWN = 80


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= _SHOWN else text[: _SHOWN - 3] + "..."


class _Rows:
    """Records of one schema gathered column by column, with the line of each row."""

    def __init__(
        self,
        stream: str,
        plans: Sequence[FieldPlan],
        selected: Sequence[str] | None,
        unsupported: frozenset[str],
    ) -> None:
        self.stream = stream
        self.plans = tuple(plans)
        keep = None if selected is None else set(selected)
        self.kept = tuple(
            p for p in self.plans if (keep is None or p.name in keep) and p.name not in unsupported
        )
        self.known = frozenset(p.name for p in self.plans)
        self.strict = tuple(p.name for p in self.kept if not p.nullable)
        self.columns: dict[str, list[Any]] = {p.name: [] for p in self.kept}
        self.lines: list[int] = []
        self.nbytes = 0
        self.schema = pa.schema([pa.field(p.name, p.arrow) for p in self.kept])

    def add(self, record: Mapping[str, Any], line: int, nbytes: int) -> None:
        extra = [k for k in record if k not in self.known]
        if extra:
            raise SchemaMismatch(
                f"line {line}: a record of stream {self.stream!r} holds field {extra[0]!r}, "
                "which its SCHEMA does not declare",
                hint="the tap must declare every property it writes; fix the tap or its "
                "catalog; nothing was committed for this dataset",
                stream=self.stream,
                field=extra[0],
                line=line,
            )
        for name in self.strict:
            if name in record and record[name] is None:
                raise SchemaMismatch(
                    f"line {line}: field {name!r} of stream {self.stream!r} is null, "
                    "but its schema does not allow null",
                    hint="the tap's schema must list \"null\" among the field's types; "
                    "nothing was committed for this dataset",
                    stream=self.stream,
                    field=name,
                    line=line,
                )
        for name, values in self.columns.items():
            values.append(record.get(name))
        self.lines.append(line)
        self.nbytes += nbytes

    def __len__(self) -> int:
        return len(self.lines)

    def take(self) -> pa.RecordBatch:
        """The gathered rows as one batch, and start afresh."""
        arrays = []
        for plan in self.kept:
            values = self.columns[plan.name]
            try:
                arrays.append(plan.column(values))
            except BadValue as bad:
                line = self.lines[bad.index]
                raise SchemaMismatch(
                    f"line {line}: field {plan.name!r} of stream {self.stream!r} holds "
                    f"{_shown(values[bad.index])}, which is not {bad.expected} "
                    f"(declared {plan.source_type})",
                    hint="fix the value in the source or the tap's schema for the field; "
                    "nothing was committed for this dataset",
                    stream=self.stream,
                    field=plan.name,
                    line=line,
                ) from None
        batch = pa.RecordBatch.from_arrays(arrays, schema=self.schema)
        self.columns = {p.name: [] for p in self.kept}
        self.lines = []
        self.nbytes = 0
        return batch


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


class TapRun:
    """A running tap and its private files: closing stops the one and removes the other.

    A run still open when the interpreter exits (a read abandoned part way) is
    closed by an ``atexit`` hook, while the reader threads still run: left to
    the interpreter's finalisation, the tap and its secret configuration file
    would outlive it (and closing a pipe under a frozen reader thread aborts it).
    """

    def __init__(self, proc: TapProcess, files: PrivateDir) -> None:
        self.proc = proc
        self.files = files
        _OPEN_RUNS.add(self)

    def close(self) -> BaseException | None:
        """Stop the tap's process group, reap it, remove the files; return the first failure."""
        _OPEN_RUNS.discard(self)
        failure: BaseException | None = None
        try:
            self.proc.stop()
        except Exception as exc:  # cleanup reports, never raises
            failure = exc
        finally:
            self.files.remove()
        return failure


_OPEN_RUNS: weakref.WeakSet[TapRun] = weakref.WeakSet()


@atexit.register
def _close_open_runs() -> None:
    for run in list(_OPEN_RUNS):
        run.close()


def _close_quietly(run: TapRun | None, primary: BaseException | None) -> BaseException | None:
    if run is None:
        return None
    failure = run.close()
    if failure is not None and primary is not None:
        with contextlib.suppress(Exception):
            primary.add_note(f"stopping the tap also failed: {type(failure).__name__}")
    return failure


class SingerExtraction(SessionRead[TapRun]):
    """A snapshot or cursor read of one stream: the tap runs once, when iterated.

    :meth:`finish` (any outcome, from any thread) stops the tap and its
    process group, reaps it and removes its private files; iterating twice,
    or after :meth:`finish`, is a :class:`~combined.errors.ProtocolViolation`.
    """

    def __init__(
        self,
        *,
        settings: Settings,
        argv: Sequence[str],
        stream: Stream,
        catalog: Mapping[str, Any],
        request: ReadRequest,
        batch_rows: int,
        scrub: Callable[[str], str],
    ) -> None:
        super().__init__(ExtractionAuthority(), _close_quietly)
        self._settings = settings
        self._argv = list(argv)
        self._stream = stream
        self._catalog = catalog
        self._request = request
        self._batch_rows = batch_rows
        self._scrub = scrub
        self.pid: int | None = None
        """The tap's process id once it started."""

    # -- life cycle ---------------------------------------------------------------------

    def _begin(self) -> TapProcess:
        if self._finished:
            raise ProtocolViolation("the extraction is finished", hint="start a new read")
        files = PrivateDir()
        try:
            argv = [*self._argv, "--config", files.write("config.json", self._settings.tap_config)]
            argv += ["--catalog", files.write("catalog.json", self._catalog)]
            state = self._tap_state()
            if state is not None:
                argv += ["--state", files.write("state.json", state)]
            proc = TapProcess(argv, scrub=self._scrub, max_line_bytes=self._settings.max_line_bytes)
        except OSError as exc:
            files.remove()
            raise SourceError(
                f"the tap {self._argv[0]!r} could not be started: {exc.strerror or exc}",
                hint="check that `command:` names an executable Singer tap",
            ) from None
        self._session = TapRun(proc, files)
        self.pid = proc.pid
        return proc

    def _tap_state(self) -> Any:
        request = self._request
        if request.strategy != "cursor" or not request.state:
            return None
        return request.state.get("singer")

    def _release(self, outcome: TerminalOutcome) -> tuple[str, ...]:
        with self._lock:
            self._finished = True
            run, self._session = self._session, None
        if run is not None:
            failure = run.close()
            if failure is not None:
                raise failure
        if self._cleanup_failure is not None:
            raise self._cleanup_failure
        return ()  # a read keeps no file evidence

    def _messages(self) -> Iterator[Message]:
        self._claim()
        with self._lock:
            proc = self._begin()
        self.authority.acquire()
        try:
            yield from self._read(proc)
        except GeneratorExit:
            self._abandon(None)
            raise
        except BaseException as exc:
            self._abandon(exc)
            raise
        self._abandon(None)

    # -- the protocol -------------------------------------------------------------------

    def _fail(self, proc: TapProcess, message: str, hint: str, **context: Any) -> SourceError:
        tail = proc.stderr_tail()
        if tail:
            message = f"{message}; the tap's last log lines:\n{tail}"
        return SourceError(message, hint=hint, stream=self._stream.tap_stream_id, **context)

    def _read(self, proc: TapProcess) -> Iterator[Message]:
        request, stream = self._request, self._stream
        names = stream.names()
        cursor = request.strategy == "cursor"
        rows: _Rows | None = None
        last_state: Any = None
        seen_state = False
        pending: StateMessage | None = None
        number = 0
        while True:
            raw = self._next(proc, number)
            if raw is None:
                break
            number += 1
            if not raw.strip():
                continue
            try:
                msg = _DECODER.decode(raw.decode("utf-8").strip())
            except (UnicodeDecodeError, ValueError) as exc:
                why = (
                    f"{exc.msg} at column {exc.colno}"
                    if isinstance(exc, json.JSONDecodeError)
                    else str(exc)
                )
                raise self._fail(
                    proc,
                    f"line {number} of the tap's output is not JSON ({why}): expected one "
                    "Singer message (a JSON object) per line",
                    "the tap must write only Singer messages to standard output and its "
                    "logs to standard error",
                    line=number,
                ) from None
            kind = msg.get("type") if isinstance(msg, dict) else None
            if kind is None:
                raise self._fail(
                    proc,
                    f"line {number} of the tap's output is not a Singer message: "
                    "expected a JSON object with a `type`",
                    "the tap must write only Singer messages to standard output",
                    line=number,
                )
            assert isinstance(msg, dict)
            if kind == "STATE":
                if cursor:
                    last_state, seen_state = msg.get("value"), True
                    pending = StateMessage(
                        request.dataset,
                        self._state(last_state),
                        position=bookmark(last_state, stream),
                    )
                    # A STATE never ends a batch (a tap may write one per record): it is
                    # handed over after the batch holding the records before it, or now
                    # when they all are handed over already.
                    if rows is None or not len(rows):
                        yield pending
                        pending = None
                continue
            if msg.get("stream") not in names:
                if kind in ("SCHEMA", "RECORD", "ACTIVATE_VERSION", "BATCH"):
                    continue  # another stream's message: the tap may ignore the selection
            if kind == "RECORD":
                if rows is None:
                    raise self._fail(
                        proc,
                        f"line {number}: a RECORD of stream {stream.tap_stream_id!r} came "
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
                rows.add(record, number, len(raw))
                if len(rows) >= self._batch_rows or rows.nbytes >= self._settings.batch_bytes:
                    yield from self._handover(rows, pending)
                    pending = None
            elif kind == "SCHEMA":
                plans = self._schema(msg.get("schema"), number)
                if rows is None or plans != rows.plans:
                    if rows is not None and len(rows):
                        yield from self._handover(rows, pending)
                        pending = None
                    # A changed schema gives batches of the new shape: the engine's
                    # drift policy judges the difference.
                    rows = _Rows(
                        stream.tap_stream_id, plans, self._selected(), stream.unsupported()
                    )
            elif kind == "ACTIVATE_VERSION":
                # A full-table version switch: a snapshot capture replaces the whole
                # stream already, and a cursor capture merges by key either way.
                continue
            elif kind == "BATCH":
                raise self._fail(
                    proc,
                    f"line {number}: the tap wrote a BATCH message (records in files), "
                    "which the singer connector does not read",
                    "configure the tap without `batch_config` so that it writes RECORD messages",
                    line=number,
                )
            else:
                raise self._fail(
                    proc,
                    f"line {number}: unknown Singer message type {_shown(kind)}: expected "
                    "SCHEMA, RECORD, STATE, ACTIVATE_VERSION",
                    "run a tap that speaks the Singer specification",
                    line=number,
                )
        if rows is not None and len(rows):
            yield from self._handover(rows, pending)
        self._exit(proc)
        if rows is None and not cursor:
            # An empty snapshot deletes every row of the dataset. A tap writes a
            # stream's SCHEMA even when it holds no record, so no SCHEMA means the
            # tap did not read the stream (it ignored the catalog's selection).
            raise self._fail(
                proc,
                f"the tap wrote no SCHEMA for stream {stream.tap_stream_id!r}: it did not "
                "read the stream, and an empty snapshot would delete every row of "
                f"dataset {request.dataset!r}",
                "check that the tap honours the catalog's `selected` metadata for the "
                "stream (run it with --catalog yourself); nothing was committed",
            )
        self.authority.complete()
        if not cursor:
            yield StateMessage(request.dataset, {}, final=True)
        elif seen_state:
            yield StateMessage(
                request.dataset,
                self._state(last_state),
                position=bookmark(last_state, stream),
                final=True,
            )
        else:
            previous = dict(request.state or {})
            yield StateMessage(
                request.dataset,
                previous,
                position=bookmark(previous.get("singer"), stream),
                final=True,
            )

    def _next(self, proc: TapProcess, number: int) -> bytes | None:
        timeout = self._settings.idle_timeout
        try:
            return proc.next_line(timeout)
        except Timeout:
            raise SourceUnavailable(
                f"the tap wrote nothing for {timeout:g} s after line {number} "
                f"of stream {self._stream.tap_stream_id!r}; it was stopped",
                hint="raise `idle_timeout` if the tap is slow to answer, or check the "
                "provider it reads",
                stream=self._stream.tap_stream_id,
            ) from None
        except LineTooLong as exc:
            raise self._fail(
                proc,
                f"line {exc.line} of the tap's output is longer than {exc.limit} bytes",
                "raise `max_line_bytes` if one record really is that large",
                line=exc.line,
            ) from None
        except Stopped:
            raise SourceError(
                "the read was stopped before the tap finished",
                hint="capture again",
                stream=self._stream.tap_stream_id,
            ) from None
        except OSError as exc:
            raise self._fail(
                proc, f"reading the tap's output failed: {exc}", "capture again"
            ) from None

    def _exit(self, proc: TapProcess) -> None:
        code = proc.wait_exit(self._settings.idle_timeout)
        if code is None:
            proc.stop()
            raise SourceUnavailable(
                f"the tap closed its output but did not exit within "
                f"{self._settings.idle_timeout:g} s; it was stopped",
                hint="raise `idle_timeout`, or check the tap",
                stream=self._stream.tap_stream_id,
            )
        if code != 0:
            how = f"was killed by signal {-code}" if code < 0 else f"exited with status {code}"
            raise self._fail(
                proc,
                f"the tap {how} while reading stream {self._stream.tap_stream_id!r}",
                "read the tap's log above; nothing of this read was committed and the "
                "dataset's checkpoint did not move",
                exit_code=code,
            )

    def _schema(self, schema: Any, number: int) -> tuple[FieldPlan, ...]:
        try:
            plans = plan_stream(schema)
        except BadSchema as exc:
            raise UnsupportedType(
                f"line {number}: the SCHEMA of stream {self._stream.tap_stream_id!r}: {exc}",
                hint="fix the tap's schema for that property",
                stream=self._stream.tap_stream_id,
                line=number,
            ) from None
        return plans

    def _selected(self) -> Sequence[str] | None:
        request = self._request
        if request.columns is None:
            return None
        return [*request.columns, *request.key]

    def _handover(self, rows: _Rows, pending: StateMessage | None) -> Iterator[Message]:
        """The gathered rows as a batch, then ``pending``: a STATE read before the last row."""
        yield self._batch(rows)
        if pending is not None:
            yield pending

    def _batch(self, rows: _Rows) -> RecordBatchMessage:
        batch = rows.take()
        self.authority.count(batch.num_rows, batch.nbytes)
        return RecordBatchMessage(self._request.dataset, batch)

    def _state(self, value: Any) -> dict[str, Any]:
        spec = self._request.cursor
        return {
            # Numbers parsed exact (Decimal) go back to plain JSON numbers.
            "singer": json.loads(json.dumps(value, default=json_default)),
            "stream": self._stream.tap_stream_id,
            "trust": spec.trust if spec is not None else "tap bookmark",
        }
