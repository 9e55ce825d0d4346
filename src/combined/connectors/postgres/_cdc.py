"""PostgreSQL change capture: row changes to Arrow batches, and the extraction.

:class:`ChangeBatcher` (in ``_batch``) turns the decoded row changes of one
relation into bounded Arrow record batches; ``_assemble`` orders them with
their checkpoints. :class:`CdcExtraction` streams a pgoutput slot and yields,
in commit order, record batches and, after the records of each committed
transaction, one ``StateMessage`` per dataset it touched.

The contract with the engine:

* ``StateMessage.state`` is ``{"lsn": "<commit end LSN>", "dataset": name}``:
  every change of that dataset committed before the LSN has been yielded.
  The state is the dataset's checkpoint (store it in the lake commit) and is
  handed back to :meth:`CdcExtraction.acknowledge` once that commit is
  durable. ``position`` is the commit LSN, ``emitted_at`` the commit time.
* Records after the last state message belong to a transaction whose commit
  was not read yet (large transactions are yielded as they stream): they
  must not be committed before a state message covers them.
* The slot is confirmed up to the lowest LSN acknowledged across the
  datasets: a dataset's commit never confirms another dataset's changes.
  Quiet datasets move by heartbeat (follow mode) and final (bounded runs)
  state messages, whose ``position`` is the LSN and ``emitted_at`` null.
* A TRUNCATE is a one-row batch whose ``_combined_op`` is ``truncate`` and
  whose other columns are null: every row of the dataset committed before
  it is removed (incremental), or the event is kept (append). Rows before it
  are in earlier batches, rows after it in later ones.
* ``_combined_unchanged`` lists, per update row, the columns whose TOAST
  value was not sent: the batch holds null there, and the lake keeps its
  current value. An update that changed the key is the old key's delete,
  then the new key's insert at the next row (its update when the update
  left values unchanged: the delete names the same columns, whose values
  then come from the old key). Rows in a batch are in log order; one key may appear more
  than once, the last occurrence wins.
* A column that a relation message shows and the lake does not hold
  (``lake_columns``) was added since: every row's value is read from the
  source (:mod:`._fill`) and yielded as updates of the new columns alone (the
  others in ``_combined_unchanged``) before the changes that follow; every
  run, one stopped early too, then reads on at least to the WAL position of
  that read, then to that of a count of the filled columns' nulls
  (``filled_nulls``, which reconciliation compares with the lake's).
  Columns whose values were rewritten in place are filled the same way
  (their type changed, a label of their enum renamed, their table written
  anew: :mod:`._rewrite`). An event stream's (``events``) added columns are
  not filled: the rows that hold a value are counted (``unfilled_columns``).
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Collection, Generator, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from combined.connectors.abc import BaseExtraction
from combined.connectors.postgres._assemble import _Assembler
from combined.connectors.postgres._batch import (
    CHANGE_COLUMNS,
    OP_TRUNCATE,
    UNCHANGED_COLUMN,
    ChangeBatcher,
)
from combined.connectors.postgres._connect import Settings
from combined.connectors.postgres._fill import (
    ColumnFill,
    FillCount,
    count_nulls,
    not_null_columns,
    relations_now,
)
from combined.connectors.postgres._pgoutput import (
    Begin,
    Commit,
    LogicalMessage,
    PgoutputDecoder,
    Relation,
    arrow_type,
    lsn_to_text,
    text_to_lsn,
)
from combined.connectors.postgres._publication import partition_ancestors, verify_tree
from combined.connectors.postgres._replication import (
    END_PREFIX,
    RECOVER_HINT,
    ReplicationStream,
    SlotLost,
    advance_slot,
    current_wal_lsn,
    emit_end_marker,
    emit_heartbeat,
    require_slot,
    resolve_user_types,
)
from combined.connectors.postgres._rewrite import Marks
from combined.connectors.postgres._tree import Tree
from combined.errors import ConfigError, ProtocolViolation, SourceError, StreamGap
from combined.protocol import (
    OP_COLUMN,
    ExtractionAuthority,
    Message,
    RecordBatchMessage,
    TerminalOutcome,
)

#: The tags of row change messages (insert, update, delete).
_ROW_TAGS = frozenset((b"I", b"U", b"D"))
#: At most this many row changes already received are fed at once.
_ROWS_AT_ONCE = 4096
#: ... and row changes are gathered, across reads, up to this many bytes.
_GATHERED_BYTES = 4 * 2**20
#: Seconds an idle read waits for the stream's next message before a drain.
_BUSY_WAIT = 0.01

__all__ = [
    "CHANGE_COLUMNS",
    "OP_TRUNCATE",
    "UNCHANGED_COLUMN",
    "CdcExtraction",
    "ChangeBatcher",
    "_Assembler",
    "arrow_type",
    "lsn_from_state",
]


def lsn_from_state(state: Mapping[str, Any] | None) -> int | None:
    """The LSN of a committed CDC checkpoint state (``None`` before the first)."""
    if not state:
        return None
    lsn = state.get("lsn")
    if not isinstance(lsn, str):
        raise ProtocolViolation("a cdc checkpoint state has no lsn", hint='expected {"lsn": "X/Y"}')
    return text_to_lsn(lsn)


# --------------------------------------------------------------------------
# The extraction
# --------------------------------------------------------------------------


@dataclass
class _Pace:
    """The stream loop's clocks (monotonic seconds) and the run's end (LSNs)."""

    started: float
    #: Where the run ends (None: until stopped); it may move on to a later anchor.
    end_lsn: int | None
    last_flush: float = field(init=False)
    last_beat: float = field(init=False)
    last_ping: float = field(init=False)
    idle_since: float = field(init=False)
    stopped: bool = False
    #: The position the run's final states are at, set when the loop ends.
    final: int = 0
    #: The LSN of the latest end marker of this run the stream delivered.
    marked: int = 0
    #: Where the catalog's columns are compared and filled (:meth:`_Assembler.fill_late`).
    late: int | None = None

    def __post_init__(self) -> None:
        self.last_flush = self.last_beat = self.last_ping = self.idle_since = self.started


class CdcExtraction(BaseExtraction):
    """Stream a pgoutput slot into record batches and per-dataset checkpoints.

    ``settings`` are the source's: every connection the extraction opens
    (control and replication) uses its timeout and application name.
    ``datasets`` maps each dataset to its table (``schema.table``).
    ``start_lsn`` is the committed checkpoint (``lsn_from_state``), one for
    all datasets or one per dataset (the slot's consistent LSN after a fresh
    setup): transactions committed before a dataset's start are skipped, so
    a replay after a crash lands each change once. ``end_lsn`` bounds the
    run: an LSN, ``"current"`` (an end marker written when streaming starts,
    :func:`~._replication.emit_end_marker`, whose arrival ends the run; the
    server's WAL position then when it cannot be written) or ``None`` to
    follow. A run also ends when ``stop()`` returns true or
    ``timeout`` seconds passed; it never ends inside a transaction, and its
    last messages are a ``final`` state for every dataset. ``keys`` (per
    dataset) are checked against the replica identity, which is all a delete
    carries.

    ``trees`` (per dataset) are the tables as :func:`~._publication.verify_tree`
    found them in step with the checkpoint when the read started. A
    partitioned table's changes are read from its partitions; before its
    final state, the run checks again that no partition was attached,
    detached or dropped meanwhile (and that no table gained inheritance
    children), and fails otherwise: those move rows without a change in the
    stream.

    While following, a dataset without changes gets a heartbeat state every
    ``heartbeat_interval`` seconds, so that its acknowledgement lets the slot
    move. Rows are flushed when a batch is full, when the stream is idle and
    at least every ``flush_interval`` seconds after a commit.

    The server drops a replication connection that stays silent for
    ``wal_sender_timeout`` (one minute by default): pull the next message
    within that time. A dropped or failed stream raises ``SourceUnavailable``
    (retried as an attempt, replaying from the acknowledged position); a
    missing or invalidated slot raises ``SlotLost``.

    ``dropped`` (per dataset) tells the tables dropped since their
    checkpoint: their changes up to the drop are read as any others (the
    stream decodes them as the catalog was then), a table created again
    under the name is not read, and the refusal is left in
    :attr:`stream_gaps` for the engine to keep once those changes are
    committed (``runtime._gap``).
    """

    def __init__(
        self,
        settings: Settings,
        *,
        slot: str,
        publication: str,
        datasets: Mapping[str, str],
        start_lsn: int | str | Mapping[str, int | str],
        end_lsn: int | str | None = None,
        keys: Mapping[str, tuple[str, ...]] | None = None,
        oids: Mapping[str, int] | None = None,
        trees: Mapping[str, Tree] | None = None,
        batch_rows: int = 65_536,
        batch_bytes: int = 16 << 20,
        stop: Callable[[], bool] | None = None,
        timeout: float | None = None,
        flush_interval: float = 1.0,
        heartbeat_interval: float = 30.0,
        status_interval: float = 10.0,
        authority: ExtractionAuthority | None = None,
        lake_columns: Mapping[str, Sequence[str]] | None = None,
        events: Iterable[str] = (),
        columns: Mapping[str, Collection[str]] | None = None,
        types: Mapping[str, Mapping[str, tuple[int, int]]] | None = None,
        marks: Mapping[str, Marks] | None = None,
        dropped: Mapping[str, StreamGap] | None = None,
    ) -> None:
        super().__init__(authority)
        if not datasets:
            raise ConfigError("a cdc extraction needs at least one dataset", hint="declare one")
        if status_interval < 1:
            raise ConfigError("status_interval must be at least 1 second", hint="pass 1 or more")
        self._settings = settings
        self.slot, self.publication = slot, publication
        self.datasets = dict(datasets)
        self._starts = {
            d: _lsn(start_lsn if not isinstance(start_lsn, Mapping) else _pick(start_lsn, d))
            for d in datasets
        }
        self._end = end_lsn
        self._keys = keys
        self._oids = oids
        self._trees = dict(trees or {})
        self._lake_columns = lake_columns
        self._columns = columns
        self._types = dict(types or {})
        self._marks = dict(marks or {})
        #: Per dataset whose table was dropped: what ends its capture once committed.
        self.stream_gaps: dict[str, StreamGap] = dict(dropped or {})
        #: Each dataset's table as the catalog held it when the run started, its
        #: enum labels and files then, and the WAL position after that read
        #: (:meth:`_Assembler.fill_late`).
        self._now: dict[str, Relation] = {}
        self._now_marks: dict[str, Marks] = {}
        self._now_lsn = 0
        self._fill = ColumnFill(settings)
        #: Per dataset, the columns the source declares NOT NULL when the run ended.
        self.not_null_columns: dict[str, tuple[str, ...]] = {}
        #: Per filled dataset, the source's nulls in each filled column where
        #: the lake's commit holds the same transactions (reconciliation compares).
        self.filled_nulls: dict[str, dict[str, int]] = {}
        self._counts: dict[str, FillCount] = {}
        #: Per event-stream dataset, the columns that arrived unfilled and how
        #: many of the source's rows hold a value in each (none: left out).
        self.unfilled_columns: dict[str, dict[str, int]] = {}
        self._events = frozenset(events)
        self._limits = (batch_rows, batch_bytes)
        self._stop, self._timeout = stop, timeout
        self._flush_interval, self._heartbeat_interval = flush_interval, heartbeat_interval
        self._status_interval = status_interval
        self._lock = threading.RLock()
        self._stream: ReplicationStream | None = None
        self._acked = dict(self._starts)
        self._confirmed = 0
        #: This run's end marker content (None: the run ends at WAL positions alone).
        self._token: str | None = None
        self._assembler: _Assembler | None = None

    @property
    def confirmed_lsn(self) -> int:
        """The highest LSN known confirmed on the slot (its position once streaming starts)."""
        return self._confirmed

    def _messages(self) -> Iterator[Message]:
        self.authority.acquire()
        asm, stream, pace = self._open()
        decoder = PgoutputDecoder()
        rows = _Gathered()
        while True:
            now = time.monotonic()
            if rows.held and not asm.in_transaction:  # (a row outside a transaction fails)
                yield from self._emit(rows.feed(asm))
            if not asm.in_transaction and self._at_end(asm, stream, pace, now):
                break
            if pace.late is not None:
                yield from self._emit(
                    asm.fill_late(self._now, self._now_lsn, pace.late, self._now_marks)
                )
                pace.late, self._now = None, {}
                continue  # to the end's checks: read on to the fill's position, count
            with self._lock:
                got = stream.read(0.0)
            if got is None:
                got = yield from self._idle(asm, stream, pace, now)
                if got is None:
                    continue
            pace.idle_since = time.monotonic()
            data = got[0]
            if data[:1] in _ROW_TAGS and not decoder.in_stream:
                # Nearly every message: kept as bytes, parsed a batch at a time;
                # the row changes already received are taken along in one call,
                # and fed once many are gathered (see _Gathered).
                with self._lock:
                    more = stream.read_rows(_ROWS_AT_ONCE)
                if rows.add(data, more):
                    yield from self._emit(rows.feed(asm))
                continue
            if rows.held:  # every other message follows the rows before it
                fed = rows.feed(asm)
                if fed:  # (rarely: no generator started for nothing)
                    yield from self._emit(fed)
            msg = decoder.decode(data)
            if isinstance(msg, Begin) and self._begins_after_end(asm, msg, pace):
                break
            if isinstance(msg, LogicalMessage) and self._is_marker(msg):
                pace.marked = max(pace.marked, msg.lsn)
                continue
            # Nearly every message is a row change that yields nothing: no
            # generator is started for it (two a message cost ~10% of a drain).
            ready = asm.feed(msg)
            if ready:
                yield from self._emit(ready)
            if asm.fill_waits:
                yield from self._emit(asm.fill_pending())
            if (
                isinstance(msg, Commit)
                and pace.idle_since - pace.last_flush >= self._flush_interval
            ):
                yield from self._emit(self._flush(asm, pace))
        yield from self._finish(asm, pace.final)

    def _open(self) -> tuple[_Assembler, ReplicationStream, _Pace]:
        """Check the slot, resolve the run's end and start streaming from the lowest start."""
        status = require_slot(self._settings, self.slot)
        self._require_behind(status.confirmed_flush_lsn or 0)
        # PostgreSQL before 17 lets a lower flush move the slot back: never send one.
        self._confirmed = max(self._confirmed, status.confirmed_flush_lsn or 0)
        end = self._end
        if end in ("current", None):  # read before the run's end is set
            self._now = self._catalog_now()
        if end == "current":
            self._token = uuid.uuid4().hex
            end = emit_end_marker(self._settings, self._token)
            if end is None:  # an older server, or one that refuses the message
                self._token = None
                end = current_wal_lsn(self._settings)
        asm = self._assembler = self._new_assembler()
        stream = self._stream = ReplicationStream(
            self._settings,
            self.slot,
            self.publication,
            min(self._starts.values()),
            status_interval=self._status_interval,
            extra_options=() if self._token is None else (("messages", "true"),),
        )
        return asm, stream, _Pace(time.monotonic(), None if end is None else _lsn(end))

    def _require_behind(self, confirmed: int) -> None:
        """Raise :class:`SlotLost` when the slot was confirmed past a dataset's start.

        The slot is confirmed only up to what the lake committed, so it
        never stands past the lake's checkpoint; one that does was read
        by another (a slot made again under its name, the lake restored
        from an older backup, another tool consuming it), and the server
        streams from the slot's position: the changes between are gone,
        and capturing on lost them silently.
        """
        for dataset, start in self._starts.items():
            if confirmed > start:
                raise SlotLost(
                    f"replication slot {self.slot!r} was confirmed up to "
                    f"{lsn_to_text(confirmed)}, past the checkpoint of "
                    f"{dataset!r} in the lake "
                    f"({lsn_to_text(start)}): the changes between were consumed by another "
                    "reader (the slot made again, the lake restored from an older backup, "
                    "or another tool reading the slot) and the server no longer sends them",
                    hint=RECOVER_HINT,
                    slot=self.slot,
                )

    def _is_marker(self, msg: LogicalMessage) -> bool:
        """Whether ``msg`` is one of this run's end markers (not another run's or tool's)."""
        return (
            self._token is not None
            and not msg.transactional
            and msg.prefix == END_PREFIX
            and msg.content == self._token.encode()
        )

    def _later_end(self, later: int) -> int:
        """The run's end moved on to ``later``: a new marker past it, when the run uses them."""
        if self._token is None:
            return later
        marker = emit_end_marker(self._settings, self._token)
        if marker is None:  # refused now: the WAL position alone ends the run
            self._token = None
            return later
        return max(marker, later)

    def _at_end(self, asm: _Assembler, stream: ReplicationStream, pace: _Pace, now: float) -> bool:
        """Between transactions: whether the run ends here (else its end may move on)."""
        # Between transactions, every commit before the server's reported
        # position (a commit end, a keepalive or an end marker) has been read.
        final = max(asm.position, stream.wal_end, pace.marked)
        if not pace.stopped and self._stopping(now - pace.started):
            pace.stopped, pace.end_lsn = True, final  # the run ends here, or at an anchor past it
        if pace.end_lsn is not None and final >= pace.end_lsn:
            if self._now:  # once, before the fills are anchored and counted
                if final >= self._now_lsn:
                    pace.late = final
                    return False
                self._now = {}  # an ALTER read then may follow: the next run compares
            later = self._read_on(asm, pace.end_lsn)
            if later is None:
                pace.final = final
                return True
            pace.end_lsn = self._later_end(later)
        return False

    def _begins_after_end(self, asm: _Assembler, msg: Begin, pace: _Pace) -> bool:
        """Whether the transaction ``msg`` begins committed after the run's end."""
        if pace.end_lsn is None or msg.final_lsn < pace.end_lsn:
            return False
        later = self._read_on(asm, pace.end_lsn)
        if later is None or msg.final_lsn >= later:
            pace.final = pace.end_lsn  # this transaction committed after the run's end
            return True
        pace.end_lsn = self._later_end(later)
        return False

    def _flush(self, asm: _Assembler, pace: _Pace) -> list[Message]:
        """After a commit, at the flush interval: what is committed, and (following, at
        the heartbeat interval) a state for the quiet datasets, as :meth:`_idle` beats:
        a stream that never pauses still lets their acknowledgements move the slot."""
        pace.last_flush = pace.idle_since
        if pace.end_lsn is None and pace.idle_since - pace.last_beat >= self._heartbeat_interval:
            pace.last_beat = pace.idle_since
            return asm.states(asm.position)  # (a commit's end: no unread commit precedes it)
        return asm.drain()

    def _idle(
        self, asm: _Assembler, stream: ReplicationStream, pace: _Pace, now: float
    ) -> Generator[Message, None, tuple[bytes, int] | None]:
        """Nothing to read: hand over what is committed, beat, ping; then wait a little.

        A walsender decoding small transactions sends each a little after the
        last: the reader catches up with it again and again. A short wait
        comes first, so that a drain (a batch built, a state handed over) is
        made when the stream pauses, not between two of its transactions.
        """
        with self._lock:
            got = stream.read(_BUSY_WAIT)
        if got is not None:
            return got
        yield from self._emit(asm.drain())
        pace.last_flush = now
        if pace.end_lsn is None and not asm.in_transaction:
            if now - pace.last_beat >= self._heartbeat_interval:
                yield from self._emit(asm.states(max(asm.position, stream.wal_end)))
                pace.last_beat = now
        if now - pace.last_ping >= 0.5:
            with self._lock:
                stream.request_reply()  # a keepalive brings the server's position
            pace.last_ping = now
        if pace.end_lsn is not None and self._token is None and now - pace.idle_since >= 2.0:
            self._nudge()  # an end marker needs none: the stream delivers it
            pace.idle_since = now
        with self._lock:
            return stream.read(0.2)

    def _catalog_now(self) -> dict[str, Relation]:
        """The captured tables as the catalog holds them (:func:`relations_now`), where
        the lake's columns are known; their enum labels and files in ``_now_marks``,
        the WAL position after the read in ``_now_lsn``.

        A checkpoint that recorded no types, or no labels and files (written
        before they were), takes these at the run's end
        (:meth:`_Assembler.fill_late`): an ``ALTER`` between it and this read
        goes unseen, once.
        """
        chosen = {
            d: rel
            for d, rel in self.datasets.items()
            if d not in self._events
            and d in (self._lake_columns or {})
            and d not in self.stream_gaps  # (no catalog holds a dropped table)
        }
        if not chosen:
            return {}
        found, self._now_lsn = relations_now(self._settings, list(chosen.values()))
        self._now_marks = {d: marks for d, (_, marks) in zip(chosen, found, strict=True)}
        return {d: relation for d, (relation, _) in zip(chosen, found, strict=True)}

    def _new_assembler(self) -> _Assembler:
        return _Assembler(
            self.datasets,
            self._starts,
            keys=self._keys,
            oids=self._oids,
            batch_rows=self._limits[0],
            batch_bytes=self._limits[1],
            resolve_types=self._resolve_types,
            trees=self._trees,
            ancestors=self._ancestors,
            known=self._lake_columns,
            columns=self._columns,
            fill=self._fill,
            events=self._events,
            types=self._types,
            marks=self._marks,
            gone=tuple(self.stream_gaps),
        )

    def _finish(self, asm: _Assembler, final: int) -> Iterator[Message]:
        """The checks of a run's end, then its final states (at ``final``)."""
        self._check_trees(asm)
        self._note_halts(asm)
        self.not_null_columns = {
            t.dataset: not_null_columns(self._settings, t.relation)
            for t in asm.targets()
            if t.dataset not in self.stream_gaps
        }
        self._settle_counts(asm)
        yield from self._emit(asm.states(final, final=True))
        self.authority.complete()

    def _note_halts(self, asm: _Assembler) -> None:
        """The gap of each dropped table whose read stopped at columns it cannot fill
        (:meth:`_Assembler._halt`), telling which of its changes were committed and which not."""
        for t in asm.targets():
            if t.halted is None:
                continue
            columns, at = t.halted
            gap = self.stream_gaps[t.dataset]
            self.stream_gaps[t.dataset] = StreamGap(
                f"captured table {t.relation!r} was dropped (slot {self.slot}), and its columns "
                f"{columns} were added or rewritten before that: its changes committed before "
                f"{lsn_to_text(at)}, the transaction where the stream first showed them, were "
                f"committed to the lake (its checkpoint held at {lsn_to_text(t.emitted)}); "
                "those of that transaction and after, up to the drop, were not: the values of "
                "those columns in the rows the stream did not change went with the table, and "
                "cannot be filled",
                hint=f"{RECOVER_HINT} (the new snapshot reads the table as it is now, if it was "
                "created again; the changes not committed went with the table)",
                **gap.context,
            )

    def _read_on(self, asm: _Assembler, end: int) -> int | None:
        """A later end when the stream must be read on past ``end``, else None.

        Filled values hold once the stream reaches the WAL position of their
        read (:attr:`ColumnFill.lsn`): no run, even one stopped early, ends
        before it. Then each filled dataset's nulls are counted in a snapshot
        of the source (:func:`count_nulls`) and the stream read on to that
        count's position, so that the lake's commit and the count describe
        the same transactions (:meth:`_settle_counts` checks that they do).
        """
        if self._fill.lsn > end:
            return self._fill.lsn
        later = end
        for t in asm.targets():
            if t.filled and t.dataset not in self._counts:
                count = count_nulls(self._settings, t.relation, t.filled)
                self._counts[t.dataset] = count
                t.watch = []
                later = max(later, count.lsn)
        return later if later > end else None

    def _settle_counts(self, asm: _Assembler) -> None:
        """Keep each filled dataset's source counts where the lake's commit matches them;
        count what an event stream's added columns hold in the source.

        A transaction that changed the dataset after the count began and that
        the count's snapshot does not see is in the lake but not in the
        count: that dataset's counts are dropped (its check is skipped).
        """
        self.filled_nulls = {}
        for t in asm.targets():
            count = self._counts.get(t.dataset)
            if count is not None and all(count.sees(x) for x in t.watch or ()):
                self.filled_nulls[t.dataset] = dict(count.nulls)
            if t.unfilled and t.dataset not in self.stream_gaps:  # (a dropped table: none)
                # an event stream's: how many rows hold a value no event carries
                now = count_nulls(self._settings, t.relation, t.unfilled)
                self.unfilled_columns[t.dataset] = {
                    c: now.rows - n for c, n in now.nulls.items() if now.rows - n
                }

    def _check_trees(self, asm: _Assembler) -> None:
        """Fail unless each table's partitions are still those its stream covered.

        The final state records the partitions as they are now: a partition
        created meanwhile by ``CREATE TABLE ... PARTITION OF`` is known from
        then on.
        """
        for t in asm.targets():
            if t.tree is None:
                continue
            now = verify_tree(
                self._settings,
                t.relation,
                t.tree.record(),
                when="while the capture streamed",
                streamed=t.leaves,
            )
            if now is not None:
                t.tree = now

    def _ancestors(self, oid: int) -> tuple[int, ...]:
        """The partitioned tables above relation ``oid``."""
        return partition_ancestors(self._settings, oid)

    def _nudge(self) -> None:
        """Write a WAL record past a bounded run's end when the server is idle.

        The walsender reports a position only as far as WAL exists; when the
        run's end is the last record, one more record lets a keepalive pass it.
        """
        try:
            emit_heartbeat(self._settings)
        except SourceError:
            pass  # best effort: a later keepalive or the run's timeout still ends the wait

    def _stopping(self, elapsed: float) -> bool:
        if self._timeout is not None and elapsed >= self._timeout:
            return True
        return self._stop is not None and self._stop()

    def _emit(self, messages: Iterable[Message]) -> Iterator[Message]:
        for m in messages:
            if isinstance(m, RecordBatchMessage):
                op = m.batch.column(OP_COLUMN)
                if not (m.batch.num_rows == 1 and op[0].as_py() == OP_TRUNCATE):
                    self.authority.count(m.batch.num_rows, m.batch.nbytes)
            yield m

    def acknowledge(self, state: Mapping[str, Any]) -> None:
        """Confirm to the server what the lake now holds durably.

        ``state`` is one of this extraction's state messages, after the lake
        commit holding it. The slot is confirmed up to the lowest position
        acknowledged across datasets, never beyond it and never backwards.
        """
        lsn = lsn_from_state(state)
        dataset = state.get("dataset")
        if dataset is None and len(self.datasets) == 1:
            dataset = next(iter(self.datasets))
        if lsn is None or dataset not in self._acked:
            raise ProtocolViolation(
                f"not a checkpoint state of this extraction: {dict(state)!r}",
                hint="acknowledge the state of a StateMessage this extraction yielded",
            )
        with self._lock:
            asm = self._assembler
            if asm is not None and lsn > asm.emitted(str(dataset)):
                raise ProtocolViolation(
                    f"acknowledged lsn {lsn_to_text(lsn)} is ahead of the stream for {dataset!r}",
                    hint="acknowledge only states this extraction yielded",
                )
            self._acked[str(dataset)] = max(self._acked[str(dataset)], lsn)
            target = min(self._acked.values())
            if target <= self._confirmed:
                return
            stream = self._stream
            if stream is not None and not stream.closed:
                try:
                    stream.confirm(target)
                    self._confirmed = target
                    return
                except SourceError:
                    stream.close()  # a broken stream: confirm on the idle slot instead
            advance_slot(self._settings, self.slot, target)
            self._confirmed = target

    def _resolve_types(self, oids: Iterable[int]) -> Mapping[int, tuple[int, int]]:
        """Read enums as text and domains as their base type."""
        return resolve_user_types(self._settings, oids)

    def _release(self, outcome: TerminalOutcome) -> tuple[str, ...]:
        with self._lock:
            stream, self._stream = self._stream, None
            if stream is not None:
                stream.close()
        return ()


class _Gathered:
    """Row changes received and not yet fed to the assembler, in order.

    A walsender sends each change as it decodes it: a reader that caught up
    with it reads a few changes a time (often one: the next one's bytes are
    still on their way), and every feed costs the same numpy rounds however
    few rows it takes (~35 us; 8,000-28,000 feeds for 500,000 changes on 2
    shared cores, 0.3-1.0 CPU-s). The rows of an open transaction are
    gathered across reads instead, and fed once ``_ROWS_AT_ONCE`` rows or
    ``_GATHERED_BYTES`` bytes are held, or before any other message (a
    commit among them) is handled. Nothing waits for them: rows an idle
    stream holds are those of a transaction still open, which no state
    covers until its commit arrives.
    """

    def __init__(self) -> None:
        self.rows: list[bytes] = []
        self.bytes = 0

    @property
    def held(self) -> bool:
        """Whether rows wait to be fed."""
        return bool(self.rows)

    def add(self, first: bytes, more: list[bytes]) -> bool:
        """Hold ``first`` and ``more``; whether enough are held to feed them."""
        rows = self.rows
        rows.append(first)
        rows += more
        self.bytes += len(first) + sum(map(len, more))
        return len(rows) >= _ROWS_AT_ONCE or self.bytes >= _GATHERED_BYTES

    def feed(self, asm: _Assembler) -> list[Message]:
        """Feed the held rows to ``asm`` in one call; what it hands over."""
        rows, self.rows, self.bytes = self.rows, [], 0
        return asm.feed_rows(rows)


def _lsn(value: int | str) -> int:
    return value if isinstance(value, int) else text_to_lsn(value)


def _pick(starts: Mapping[str, int | str], dataset: str) -> int | str:
    try:
        return starts[dataset]
    except KeyError:
        raise ConfigError(
            f"no start position for dataset {dataset!r}",
            hint="pass the committed checkpoint, or the slot's consistent lsn after setup",
        ) from None
