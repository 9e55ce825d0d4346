"""Runs of a connector program: one-shot calls (discovery) and reads of one stream.

A read is a :class:`ProgramExtraction`: the program runs once, when the
extraction is iterated, and :meth:`~ProgramExtraction.finish` (any outcome,
from any thread) stops it and its process group, reaps it and removes its
private files. Each protocol (Singer, Airbyte) implements the arguments of
its read and the meaning of its lines; everything else is here.
"""

from __future__ import annotations

import abc
import atexit
import contextlib
import json
import sys
import time
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from combined.connectors._shared import SessionRead
from combined.connectors._subprocess._live import LiveConfig
from combined.connectors._subprocess._private import PrivateDir
from combined.connectors._subprocess._process import ChildProcess, LineTooLong, Stopped, Timeout
from combined.connectors._subprocess._rows import Rows, decode_line
from combined.connectors._subprocess._settings import Flavour, ProgramSettings
from combined.connectors._subprocess._state import kept_state
from combined.connectors.abc import ReadRequest, refuse_bounds
from combined.errors import (
    CombinedError,
    ConfigError,
    ProtocolViolation,
    SourceError,
    SourceUnavailable,
)
from combined.protocol import (
    ExtractionAuthority,
    Message,
    RecordBatchMessage,
    StateMessage,
)

#: In an argv item, the private directory of the run (to mount it into a container).
FILES_PLACEHOLDER = "{files}"


class ProgramRun:
    """A running program and its private files: closing stops the one and removes the other.

    A run still open when the interpreter exits (a read abandoned part way) is
    closed by an ``atexit`` hook, while the reader threads still run: left to
    the interpreter's finalisation, the program and its secret configuration
    file would outlive it (and closing a pipe under a frozen reader thread
    aborts it).
    """

    def __init__(self, proc: ChildProcess, files: PrivateDir, live: LiveConfig) -> None:
        self.proc = proc
        self.files = files
        self.live = live
        _OPEN_RUNS.add(self)

    def close(self) -> BaseException | None:
        """Stop the program's process group, reap it, keep the configuration it wrote back,
        remove the files; return the first failure."""
        _OPEN_RUNS.discard(self)
        failure: BaseException | None = None
        try:
            self.proc.stop()
        except Exception as exc:  # cleanup reports, never raises
            failure = exc
        finally:
            failure = _take_back(self.live, self.files) or failure
        return failure


def _take_back(live: LiveConfig, files: PrivateDir) -> BaseException | None:
    """Keep what the ended program wrote back into its configuration, then remove its files."""
    try:
        live.take_back(files)
    except Exception as exc:  # a rotated token that cannot be kept: the run says so
        return exc
    finally:
        files.remove()
    return None


_OPEN_RUNS: weakref.WeakSet[ProgramRun] = weakref.WeakSet()


@atexit.register
def _close_open_runs() -> None:
    for run in list(_OPEN_RUNS):
        run.close()


def _close_quietly(run: ProgramRun | None, primary: BaseException | None) -> BaseException | None:
    if run is None:
        return None
    failure = run.close()
    if failure is not None and primary is not None:
        with contextlib.suppress(Exception):
            primary.add_note(f"stopping the program also failed: {type(failure).__name__}")
    return failure


def check_request(flavour: Flavour, request: ReadRequest) -> None:
    """Refuse what no program-run read does: cdc, partitions, a batch of no rows."""
    if request.strategy not in ("snapshot", "cursor"):
        raise ConfigError(
            f"the {flavour.connector} connector cannot read with strategy {request.strategy!r}",
            hint="use the snapshot or cursor strategy",
            dataset=request.dataset,
        )
    refuse_bounds(
        flavour.connector, request, f"drop the bounds: a {flavour.noun} reads its stream whole"
    )
    if request.batch_rows < 1:
        raise ConfigError("batch_rows must be positive", hint="e.g. 65536")


def refuse_lookback(flavour: Flavour, request: ReadRequest) -> None:
    """Refuse a cursor lookback or NULL policy: the program chooses what it reads.

    It keeps its own bookmark and cannot re-read a window, and it decides
    itself whether records with a null cursor are emitted: ``cursor.nulls``
    other than its default would be a promise nothing keeps.
    """
    lookback = request.cursor.lookback if request.cursor is not None else None
    if lookback not in (None, 0) and getattr(lookback, "total_seconds", lambda: 1)() != 0:
        raise ConfigError(
            f"dataset {request.dataset!r} declares a lookback, but a {flavour.noun} keeps its "
            "own bookmark and cannot re-read a window",
            hint=f"remove cursor.lookback (use the {flavour.noun}'s own setting, if it has one)",
            dataset=request.dataset,
        )
    nulls = request.cursor.nulls if request.cursor is not None else "fail"
    if nulls != "fail":
        raise ConfigError(
            f"dataset {request.dataset!r} declares cursor.nulls: {nulls}, but a "
            f"{flavour.noun} itself chooses whether records with a null cursor are emitted",
            hint="remove cursor.nulls",
            dataset=request.dataset,
        )


def start(
    settings: ProgramSettings,
    argv: Sequence[str],
    scrub: Callable[[str], str],
    files: PrivateDir,
) -> ChildProcess:
    """Start ``argv`` (``{files}`` in it naming ``files``); failing to is a ``SourceError``."""
    flavour = settings.flavour
    argv = [a.replace(FILES_PLACEHOLDER, str(files.path)) for a in argv]
    try:
        return ChildProcess(
            argv, scrub=scrub, max_line_bytes=settings.max_line_bytes, env=settings.environment()
        )
    except OSError as exc:
        raise SourceError(
            f"the {flavour.noun} {argv[0]!r} could not be started: {exc.strerror or exc}",
            hint=f"check that `command:` names an executable {flavour.protocol} {flavour.noun}",
        ) from None


def with_log(proc: ChildProcess, message: str, noun: str) -> str:
    """``message`` followed by the program's last log lines, if it wrote any."""
    tail = proc.stderr_tail()
    return f"{message}; the {noun}'s last log lines:\n{tail}" if tail else message


def call(
    settings: ProgramSettings,
    scrub: Callable[[str], str],
    arguments: Callable[[PrivateDir], list[str]],
    on_line: Callable[[ChildProcess, int, bytes], None],
    *,
    too_slow: Callable[[], CombinedError],
    too_long: Callable[[ChildProcess, LineTooLong], CombinedError],
    live: LiveConfig,
) -> tuple[ChildProcess, int]:
    """Run the program once to its end (discovery, check), within ``discover_timeout``.

    ``arguments`` writes the run's private files and returns the arguments
    after the program's argv; ``on_line`` sees each line of its output. Returns
    the stopped process (its log tail still readable) and its exit status.
    The timeout bounds the whole call, not each line of it. A configuration
    the program wrote back is kept (``live``), however the call ends.
    """
    argv = settings.executable()
    files = PrivateDir(f"combined-{settings.flavour.connector}-")
    proc: ChildProcess | None = None
    timeout = settings.discover_timeout
    try:
        proc = start(settings, [*argv, *arguments(files)], scrub, files)
        deadline = time.monotonic() + timeout
        number = 0
        try:
            while (line := proc.next_line(max(0.0, deadline - time.monotonic()))) is not None:
                number += 1
                on_line(proc, number, line)
        except Timeout:
            raise too_slow() from None
        except LineTooLong as exc:
            raise too_long(proc, exc) from None
        code = proc.wait_exit(max(0.0, deadline - time.monotonic()))
        if code is None:
            raise too_slow()
        return proc, code
    finally:
        if proc is not None:
            proc.stop()
        failure = _take_back(live, files)
        if failure is not None and sys.exc_info()[1] is None:
            raise failure


@dataclass
class Gathered:
    """A program's output so far: the batch being filled and the states read.

    A state never ends a batch (a program may write one per record): it is
    handed over after the batch holding the records before it, or at once
    when they all are handed over already.
    """

    rows: Rows | None = None
    #: The last state read, and the one still waiting for its batch.
    latest: StateMessage | None = None
    pending: StateMessage | None = None


class ProgramExtraction(SessionRead[ProgramRun]):
    """A read of one stream: the program runs once, when iterated.

    :meth:`finish` (any outcome, from any thread) stops the program and its
    process group, reaps it and removes its private files; iterating twice,
    or after :meth:`finish`, is a :class:`~combined.errors.ProtocolViolation`.
    Subclasses give the run's arguments (:meth:`_arguments`) and read its
    lines (:meth:`_read`).
    """

    def __init__(
        self,
        *,
        settings: ProgramSettings,
        argv: Sequence[str],
        label: str,
        request: ReadRequest,
        batch_rows: int,
        scrub: Callable[[str], str],
        live: LiveConfig,
    ) -> None:
        super().__init__(ExtractionAuthority(), _close_quietly)
        self._program_config = live
        self._settings = settings
        self._flavour = settings.flavour
        self._argv = list(argv)
        self._label = label
        self._request = request
        self._batch_rows = batch_rows
        self._scrub = scrub
        #: Masks the configured secrets alone, in a state given back to the program.
        self._mask_state = settings.state_masker()
        self.pid: int | None = None
        """The program's process id once it started."""

    #: The checkpoint's key of the program's own state (``<key>_json``), if it keeps one.
    STATE_KEY: str | None = None

    @abc.abstractmethod
    def _arguments(self, files: PrivateDir) -> list[str]:
        """Write the run's private files; return the arguments after the program's argv."""

    @abc.abstractmethod
    def _read(self, proc: ChildProcess) -> Iterator[Message]:
        """Read the running program's lines as batches and states."""

    # -- life cycle ---------------------------------------------------------------------

    def _begin(self) -> ChildProcess:
        if self._finished:
            raise ProtocolViolation("the extraction is finished", hint="start a new read")
        files = PrivateDir(f"combined-{self._flavour.connector}-")
        try:
            proc = start(self._settings, [*self._argv, *self._arguments(files)], self._scrub, files)
        except BaseException:
            files.remove()
            raise
        self._session = ProgramRun(proc, files, self._program_config)
        self.pid = proc.pid
        return proc

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

    # -- lines --------------------------------------------------------------------------

    def _fail(self, proc: ChildProcess, message: str, hint: str, **context: Any) -> SourceError:
        return SourceError(
            with_log(proc, message, self._flavour.noun), hint=hint, stream=self._label, **context
        )

    def _next(self, proc: ChildProcess, number: int) -> bytes | None:
        timeout = self._settings.idle_timeout
        noun = self._flavour.noun
        try:
            return proc.next_line(timeout)
        except Timeout:
            raise SourceUnavailable(
                f"the {noun} wrote nothing for {timeout:g} s after line {number} "
                f"of stream {self._label!r}; it was stopped",
                hint=f"raise `idle_timeout` if the {noun} is slow to answer, or check the "
                "provider it reads",
                stream=self._label,
            ) from None
        except LineTooLong as exc:
            raise self._fail(
                proc,
                f"line {exc.line} of the {noun}'s output is longer than {exc.limit} bytes",
                "raise `max_line_bytes` if one record really is that large",
                line=exc.line,
            ) from None
        except Stopped:
            raise SourceError(
                f"the read was stopped before the {noun} finished",
                hint="capture again",
                stream=self._label,
            ) from None
        except OSError as exc:
            raise self._fail(
                proc, f"reading the {noun}'s output failed: {exc}", "capture again"
            ) from None

    def _decode(self, proc: ChildProcess, raw: bytes, number: int) -> dict[str, Any] | None:
        """Line ``number`` as a message (a JSON object with a ``type``); None if blank."""
        noun, protocol = self._flavour.noun, self._flavour.protocol
        if raw.isspace() or not raw:
            return None
        try:
            msg = decode_line(raw)
        except (UnicodeDecodeError, ValueError) as exc:
            raise self._unreadable(proc, raw, number, exc) from None
        if not isinstance(msg, dict) or msg.get("type") is None:
            raise self._fail(
                proc,
                f"line {number} of the {noun}'s output is not a {protocol} message: "
                "expected a JSON object with a `type`",
                f"the {noun} must write only {protocol} messages to standard output",
                line=number,
            )
        return msg

    def _unreadable(
        self, proc: ChildProcess, raw: bytes, number: int, exc: ValueError
    ) -> SourceError:
        """The error of a line that is not UTF-8 JSON (never quoting it: it may hold a secret)."""
        noun, protocol = self._flavour.noun, self._flavour.protocol
        cut = not raw.endswith(b"\n")
        if cut:
            # The output ended within the line: a program killed (out of memory) or
            # failing says so, rather than its last line being blamed.
            self._exit(proc)
        if isinstance(exc, UnicodeDecodeError):
            return self._fail(
                proc,
                f"line {number} of the {noun}'s output is not UTF-8 text (byte "
                f"0x{exc.object[exc.start]:02x} at offset {exc.start}): {protocol} messages "
                "are UTF-8 JSON",
                f"make the {noun} write UTF-8: for a Python {noun}, set "
                "env: {PYTHONIOENCODING: utf-8} in the source (its locale's encoding is "
                "used otherwise); for another, its own output-encoding setting",
                line=number,
            )
        why = f"{exc.msg} at column {exc.colno}" if isinstance(exc, json.JSONDecodeError) else exc
        return self._fail(
            proc,
            f"line {number} of the {noun}'s output is not JSON ({why}"
            + ("; the output ends within it" if cut else "")
            + f"): expected one {protocol} message (a JSON object) per line",
            f"the {noun} must write only {protocol} messages to standard output and its "
            "logs to standard error",
            line=number,
        )

    def _exit(self, proc: ChildProcess) -> None:
        noun = self._flavour.noun
        code = proc.wait_exit(self._settings.idle_timeout)
        if code is not None and self._session is not None:
            # Before any error quotes its log: a new token it printed is masked then.
            self._session.live.take_back(self._session.files)
        if code is None:
            proc.stop()
            raise SourceUnavailable(
                f"the {noun} closed its output but did not exit within "
                f"{self._settings.idle_timeout:g} s; it was stopped",
                hint=f"raise `idle_timeout`, or check the {noun}",
                stream=self._label,
            )
        if code != 0:
            how = f"was killed by signal {-code}" if code < 0 else f"exited with status {code}"
            raise self._fail(
                proc,
                f"the {noun} {how} while reading stream {self._label!r}",
                f"read the {noun}'s log above; nothing of this read was committed and the "
                "dataset's checkpoint did not move",
                exit_code=code,
            )

    # -- batches ------------------------------------------------------------------------

    def _selected(self) -> Sequence[str] | None:
        request = self._request
        if request.columns is None:
            return None
        return [*request.columns, *request.key]

    def _full(self, rows: Rows) -> bool:
        """Whether ``rows`` holds a batch's worth (rows or bytes)."""
        return len(rows) >= self._batch_rows or rows.nbytes >= self._settings.batch_bytes

    def _handover(self, rows: Rows, pending: Message | None) -> Iterator[Message]:
        """The gathered rows as a batch, then ``pending``: a state read before the last row."""
        yield self._batch(rows)
        if pending is not None:
            yield pending

    def _flush(self, out: Gathered) -> Iterator[Message]:
        """Hand over the gathered rows, if any, and the state waiting for them."""
        if out.rows is not None and len(out.rows):
            yield from self._handover(out.rows, out.pending)
            out.pending = None

    def _on_state(self, out: Gathered, state: StateMessage) -> Iterator[Message]:
        """Keep ``state`` as the latest; hand it over now unless rows wait before it."""
        out.pending = out.latest = state
        if out.rows is None or not len(out.rows):
            yield state
            out.pending = None

    def _final_state(
        self, latest: StateMessage | None, position: Callable[[Mapping[str, Any]], str | None]
    ) -> StateMessage:
        """The read's last state: none for a snapshot, else the latest one seen.

        A cursor read that saw no state keeps the previous checkpoint (its
        ``position`` computed from it).
        """
        request = self._request
        if request.strategy != "cursor":
            return StateMessage(request.dataset, {}, final=True)
        if latest is not None:
            return StateMessage(request.dataset, latest.state, position=latest.position, final=True)
        previous = dict(request.state or {})
        key = self.STATE_KEY
        if key is not None and key in previous and f"{key}_json" not in previous:
            # A checkpoint from before the state was kept as text: kept so from now on,
            # exact and masked (it may hold a secret the program wrote, in clear).
            previous.update(kept_state(key, previous.pop(key), self._mask_state))
        return StateMessage(request.dataset, previous, position=position(previous), final=True)

    def _batch(self, rows: Rows) -> RecordBatchMessage:
        batch = rows.take()
        self.authority.count(batch.num_rows, batch.nbytes)
        return RecordBatchMessage(self._request.dataset, batch)
