"""PostgreSQL change capture: row changes to Arrow batches, and the extraction.

:class:`ChangeBatcher` turns the decoded row changes of one relation into
bounded Arrow record batches. :class:`CdcExtraction` streams a pgoutput slot
and yields, in commit order, record batches and, after the records of each
committed transaction, one ``StateMessage`` per dataset it touched.

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
  then the new key's update at the next row: when the update left values
  unchanged, the delete names the same columns, whose values then come from
  the old key. Rows in a batch are in log order; one key may appear more
  than once, the last occurrence wins.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pyarrow as pa

from combined.connectors.abc import BaseExtraction
from combined.connectors.postgres._connect import Settings
from combined.connectors.postgres._pgoutput import (
    Begin,
    Commit,
    Delete,
    Insert,
    PgoutputDecoder,
    PgoutputMessage,
    Relation,
    RelationCache,
    RowChange,
    StreamAbort,
    StreamCommit,
    StreamStart,
    StreamStop,
    Truncate,
    TupleData,
    Type,
    Update,
    arrow_type,
    lsn_to_text,
    text_to_arrow,
    text_to_lsn,
)
from combined.connectors.postgres._replication import (
    ReplicationStream,
    advance_slot,
    current_wal_lsn,
    emit_heartbeat,
    require_slot,
    resolve_user_types,
)
from combined.errors import (
    ConfigError,
    ProtocolViolation,
    SchemaMismatch,
    SourceError,
)
from combined.protocol import (
    EMITTED_AT_COLUMN,
    OP_COLUMN,
    POSITION_COLUMN,
    ExtractionAuthority,
    Message,
    RecordBatchMessage,
    StateMessage,
    TerminalOutcome,
)

__all__ = [
    "CHANGE_COLUMNS",
    "OP_TRUNCATE",
    "UNCHANGED_COLUMN",
    "CdcExtraction",
    "ChangeBatcher",
    "arrow_type",
    "lsn_from_state",
]


#: The op of the one-row marker batch that states a TRUNCATE of the relation.
OP_TRUNCATE = "truncate"
#: Per row, the columns whose TOAST value an update left unchanged (and that
#: the batch therefore holds as null): the lake keeps its value for them.
UNCHANGED_COLUMN = "_combined_unchanged"
#: The control columns every change batch carries after the relation's columns.
CHANGE_COLUMNS = (OP_COLUMN, EMITTED_AT_COLUMN, POSITION_COLUMN, UNCHANGED_COLUMN)

_UNIX_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_EMITTED_TYPE = pa.timestamp("us", tz="UTC")


class ChangeBatcher:
    """Collect the row changes of one relation into bounded Arrow record batches.

    Values are kept per column in their wire form and converted one column
    at a time when the batch is built (``pyarrow.compute`` casts of the text
    form), so memory is bounded by ``batch_rows`` and ``batch_bytes``, never
    by the size of a transaction. Rows keep log order; the caller flushes when
    :attr:`full` is true and at the boundaries it needs (commit, truncate,
    relation change).

    The batch holds the relation's columns, then ``_combined_op``
    (``insert``/``update``/``delete``), ``_combined_emitted_at`` (commit
    time), ``_combined_source_position`` (commit LSN as text) and
    ``_combined_unchanged``. An update that leaves a TOAST value unchanged
    carries null in that column and names it in ``_combined_unchanged``: the
    value was not sent and must not overwrite the lake's. When the old row is
    sent whole (``REPLICA IDENTITY FULL``) the value is taken from it instead.
    A delete carries the replica identity columns; the others are null. An
    update that changes the key is a delete of the old key followed by an
    update of the new one. ``key`` names the dataset's key columns: with it,
    an update whose old row was sent (a changed replica identity, or every
    update under ``REPLICA IDENTITY FULL``) is such a pair exactly when a key
    value differs; without it, only a changed replica identity is.

    ``type_overrides`` maps a user-defined type OID to the built-in OID to
    read it as (an enum as ``text``, a domain as its base type).
    """

    def __init__(
        self,
        relation: Relation,
        *,
        batch_rows: int = 65_536,
        batch_bytes: int = 64 << 20,
        type_overrides: Mapping[int, tuple[int, int]] | None = None,
        key: tuple[str, ...] | None = None,
    ) -> None:
        if batch_rows < 1 or batch_bytes < 1:
            raise ProtocolViolation("batch limits must be positive", hint="pass batch_rows >= 1")
        self.relation = relation
        self.batch_rows = batch_rows
        self.batch_bytes = batch_bytes
        overrides = type_overrides or {}
        types = []
        for c in relation.columns:
            oid, mod = overrides.get(c.type_oid, (c.type_oid, c.type_modifier))
            types.append(arrow_type(oid, mod if mod >= 0 else c.type_modifier, column=c.name))
        self._types = tuple(types)
        self._names = tuple(c.name for c in relation.columns)
        #: Positions of the dataset's key columns (None: the key is not known here).
        self._key_at = (
            tuple(self._names.index(k) for k in key)
            if key and all(k in self._names for k in key)
            else None
        )
        fields = [pa.field(n, t) for n, t in zip(self._names, self._types, strict=True)]
        fields += [
            pa.field(OP_COLUMN, pa.string(), nullable=False),
            pa.field(EMITTED_AT_COLUMN, _EMITTED_TYPE),
            pa.field(POSITION_COLUMN, pa.string()),
            pa.field(UNCHANGED_COLUMN, pa.list_(pa.string())),
        ]
        self.schema = pa.schema(fields)
        self._reset()
        self._time_key: datetime | None = None
        self._time_us = 0
        self._lsn_key = -1
        self._lsn_text = ""

    def _reset(self) -> None:
        self._columns: list[list[bytes | None]] = [[] for _ in self._names]
        self._ops: list[str] = []
        self._emitted: list[int] = []
        self._positions: list[str] = []
        self._unchanged: list[list[str] | None] = []
        self._bytes = 0

    @property
    def rows(self) -> int:
        """Rows collected since the last flush."""
        return len(self._ops)

    @property
    def nbytes(self) -> int:
        """Wire bytes of the values collected since the last flush."""
        return self._bytes

    @property
    def full(self) -> bool:
        """Whether a row or byte limit is reached and the batch should be flushed."""
        return len(self._ops) >= self.batch_rows or self._bytes >= self.batch_bytes

    def add(self, change: RowChange, *, commit_lsn: int, commit_time: datetime) -> None:
        """Append one decoded row change of this relation."""
        if change.relation_oid != self.relation.oid:
            raise ProtocolViolation(
                f"change for relation oid {change.relation_oid} given to the batcher of "
                f"{self.relation.qualified_name}",
                hint="route changes by relation oid",
            )
        if isinstance(change, Insert):
            self._row(change.new.values, "insert", None, commit_lsn, commit_time)
        elif isinstance(change, Delete):
            self._row(change.old.values, "delete", None, commit_lsn, commit_time)
        else:
            self._update(change, commit_lsn, commit_time)

    def _update(self, change: Update, commit_lsn: int, commit_time: datetime) -> None:
        new, old = change.new, change.old
        values = new.values
        unchanged: list[str] | None = None
        if "u" in new.kinds:
            filled = list(values)
            for i, kind in enumerate(new.kinds):
                if kind != "u":
                    continue
                if change.old_kind == "O" and old is not None and old.kinds[i] in "tb":
                    filled[i] = old.values[i]  # the whole old row was sent: the value is known
                else:
                    unchanged = unchanged or []
                    unchanged.append(self._names[i])
            values = tuple(filled)
        if old is not None and self._key_changed(change.old_kind, old, new):
            # The old key's row is gone. When the update left values unchanged,
            # the delete names them: they move with the row, from its old key.
            self._row(old.values, "delete", unchanged, commit_lsn, commit_time)
        self._row(values, "update", unchanged, commit_lsn, commit_time)

    def _key_changed(self, old_kind: str | None, old: TupleData, new: TupleData) -> bool:
        """Whether an update whose old row was sent moves the row to another key.

        Under ``REPLICA IDENTITY FULL`` every update sends the whole old row
        (``O``), whether the key changed or not: only the key's values tell.
        """
        if self._key_at is None:
            return old_kind == "K"
        return any(
            new.kinds[i] != "u" and old.kinds[i] != "u" and old.values[i] != new.values[i]
            for i in self._key_at
        )

    def _row(
        self,
        values: tuple[bytes | None, ...],
        op: str,
        unchanged: list[str] | None,
        commit_lsn: int,
        commit_time: datetime,
    ) -> None:
        if len(values) != len(self._columns):
            raise SchemaMismatch(
                f"a row of {self.relation.qualified_name} has {len(values)} columns, "
                f"its relation message {len(self._columns)}",
                hint="restart the capture; the stream and its relation cache disagree",
            )
        nbytes = 0
        for column, value in zip(self._columns, values, strict=True):
            column.append(value)
            if value is not None:
                nbytes += len(value)
        self._bytes += nbytes
        self._ops.append(op)
        self._unchanged.append(unchanged)
        if commit_time is not self._time_key:
            self._time_key = commit_time
            self._time_us = (commit_time - _UNIX_EPOCH) // timedelta(microseconds=1)
        self._emitted.append(self._time_us)
        if commit_lsn != self._lsn_key:
            self._lsn_key, self._lsn_text = commit_lsn, lsn_to_text(commit_lsn)
        self._positions.append(self._lsn_text)

    def flush(self) -> pa.RecordBatch | None:
        """Build the collected rows into one record batch (``None`` when empty)."""
        if not self._ops:
            return None
        arrays = [
            text_to_arrow(values, type_, name)
            for values, type_, name in zip(self._columns, self._types, self._names, strict=True)
        ]
        arrays += [
            pa.array(self._ops, pa.string()),
            pa.array(self._emitted, pa.int64()).cast(_EMITTED_TYPE),
            pa.array(self._positions, pa.string()),
            pa.array(self._unchanged, pa.list_(pa.string())),
        ]
        self._reset()
        return pa.RecordBatch.from_arrays(arrays, schema=self.schema)

    def truncate_batch(self, *, commit_lsn: int, commit_time: datetime) -> pa.RecordBatch:
        """The one-row marker batch of a TRUNCATE: op ``truncate``, every column null.

        Flush the rows collected before it first: the marker's place in the
        order of batches is the place of the truncate in the log.
        """
        n = len(self._names)
        arrays = [pa.nulls(1, t) for t in self._types]
        micros = (commit_time - _UNIX_EPOCH) // timedelta(microseconds=1)
        arrays += [
            pa.array([OP_TRUNCATE], pa.string()),
            pa.array([micros], pa.int64()).cast(_EMITTED_TYPE),
            pa.array([lsn_to_text(commit_lsn)], pa.string()),
            pa.nulls(1, pa.list_(pa.string())),
        ]
        assert len(arrays) == n + len(CHANGE_COLUMNS)
        return pa.RecordBatch.from_arrays(arrays, schema=self.schema)


# --------------------------------------------------------------------------
# Decoded messages -> record batches and state messages, in commit order
# --------------------------------------------------------------------------


def lsn_from_state(state: Mapping[str, Any] | None) -> int | None:
    """The LSN of a committed CDC checkpoint state (``None`` before the first)."""
    if not state:
        return None
    lsn = state.get("lsn")
    if not isinstance(lsn, str):
        raise ProtocolViolation("a cdc checkpoint state has no lsn", hint='expected {"lsn": "X/Y"}')
    return text_to_lsn(lsn)


def _qualified(relation: str) -> str:
    schema, dot, name = relation.partition(".")
    return f"{schema}.{name}" if dot else f"public.{schema}"


@dataclass(eq=False)
class _Target:
    """One captured dataset and what the stream has done for it."""

    dataset: str
    relation: str
    start: int  # transactions committed before this LSN are already in the lake
    key: tuple[str, ...] | None = None
    oid: int | None = None
    batcher: ChangeBatcher | None = None
    committed_rows: int = 0  # leading rows of the batcher whose commit was read
    pending: Commit | None = None  # the last commit whose state was not emitted yet
    emitted: int = 0  # LSN of the last state emitted
    skip: bool = False  # the current transaction is already in the lake
    touched: bool = False  # the current transaction changed this dataset


def _state_value(lsn: str, t: _Target) -> dict[str, Any]:
    """A dataset's checkpoint: the LSN, and its table's oid when known (``relid``)."""
    value: dict[str, Any] = {"lsn": lsn, "dataset": t.dataset}
    if t.oid is not None:
        value["relid"] = t.oid
    return value


class _Assembler:
    """Turns decoded pgoutput messages into protocol messages (no I/O).

    Rows accumulate per dataset across transactions; :meth:`drain` flushes
    them with the state of the last commit. A full batcher is cut at the last
    commit boundary it holds: committed rows, their state, then the rows of
    the transaction in progress.
    """

    def __init__(
        self,
        datasets: Mapping[str, str],
        starts: Mapping[str, int],
        *,
        keys: Mapping[str, tuple[str, ...]] | None = None,
        oids: Mapping[str, int] | None = None,
        batch_rows: int = 65_536,
        batch_bytes: int = 64 << 20,
        resolve_types: Callable[[Iterable[int]], Mapping[int, tuple[int, int]]] | None = None,
    ) -> None:
        # ``oids``: each table's oid when its checkpoint was committed; a
        # relation message under another oid is the table dropped and created
        # again since, whose rows the lake's copy no longer describes.
        self._targets = {
            _qualified(rel): _Target(
                d, _qualified(rel), starts[d], (keys or {}).get(d), (oids or {}).get(d)
            )
            for d, rel in datasets.items()
        }
        for t in self._targets.values():
            t.emitted = t.start
        self._by_oid: dict[int, _Target] = {}
        self._cache = RelationCache()
        self._batch_rows, self._batch_bytes = batch_rows, batch_bytes
        self._resolve_types = resolve_types
        self._txn: Begin | None = None
        #: End LSN of the last commit read (the lowest start before any).
        self.position = min(starts.values())

    @property
    def in_transaction(self) -> bool:
        """Whether a ``Begin`` was read without its ``Commit``."""
        return self._txn is not None

    def emitted(self, dataset: str) -> int:
        """The LSN of the last state emitted for ``dataset``."""
        return next(t.emitted for t in self._targets.values() if t.dataset == dataset)

    def feed(self, msg: PgoutputMessage) -> list[Message]:
        """Apply one decoded message; return what is ready to be yielded."""
        if isinstance(msg, Insert | Update | Delete):  # nearly every message: tested first
            return self._change(msg)
        if isinstance(msg, Begin):
            self._txn = msg
            for t in self._targets.values():
                t.skip = msg.final_lsn < t.start
            return []
        if isinstance(msg, Commit):
            return self._commit(msg)
        if isinstance(msg, Relation):
            return self._relation(msg)
        if isinstance(msg, Truncate):
            return self._truncate(msg)
        if isinstance(msg, Type):
            self._cache.add_type(msg)
        elif isinstance(msg, StreamStart | StreamStop | StreamCommit | StreamAbort):
            raise SourceError(
                "the slot streams transactions in progress",
                hint="start replication with proto_version 1 (no streaming option)",
            )
        return []  # Origin and logical messages carry nothing to capture

    def _txn_or_fail(self) -> Begin:
        if self._txn is None:
            raise SourceError("a change outside a transaction", hint="restart the capture")
        return self._txn

    def _change(self, msg: RowChange) -> list[Message]:
        t = self._by_oid.get(msg.relation_oid)
        if t is None or t.skip:
            return []
        txn = self._txn_or_fail()
        assert t.batcher is not None
        t.batcher.add(msg, commit_lsn=txn.final_lsn, commit_time=txn.commit_time)
        t.touched = True
        return self._cut(t) if t.batcher.full else []

    def _commit(self, msg: Commit) -> list[Message]:
        for t in self._targets.values():
            if t.touched:
                t.pending = msg
                t.committed_rows = t.batcher.rows if t.batcher else 0
                t.touched = False
        self._txn = None
        self.position = max(self.position, msg.end_lsn)
        return []

    def _relation(self, msg: Relation) -> list[Message]:
        changed = self._cache.update(msg)
        bound = self._by_oid.get(msg.oid)
        t = self._targets.get(msg.qualified_name)
        if bound is not None and bound is not t:
            raise SchemaMismatch(
                f"captured table {bound.relation!r} was renamed to {msg.qualified_name!r}",
                hint="declare the dataset under its new name and rerun cdc setup",
                dataset=bound.dataset,
            )
        if t is None:
            return []
        if t.oid is not None and t.oid != msg.oid:
            # The table was dropped and created again: its old rows were never
            # deleted, and the new one's may have been published only later.
            raise SourceError(
                f"captured table {t.relation!r} was dropped and created again",
                hint="run `combined cdc teardown` then `combined cdc setup` for the source: "
                "a new slot and a new snapshot close the gap",
                dataset=t.dataset,
            )
        out: list[Message] = []
        if t.batcher is None or changed:
            self._check_key(t, msg)
            if t.batcher is not None:
                out += self._cut(t)  # rows of the old shape end the batch
            t.batcher = ChangeBatcher(
                msg,
                batch_rows=self._batch_rows,
                batch_bytes=self._batch_bytes,
                type_overrides=self._overrides(msg),
                key=t.key,
            )
        t.oid = msg.oid
        self._by_oid[msg.oid] = t
        return out

    def _check_key(self, t: _Target, msg: Relation) -> None:
        if not t.key or msg.replica_identity == "f":
            return
        missing = [k for k in t.key if k not in msg.key]
        if missing:
            raise SchemaMismatch(
                f"dataset {t.dataset!r} is keyed on {', '.join(missing)}, "
                "which deletes do not carry",
                hint="make the key the replica identity, "
                f"or ALTER TABLE {t.relation} REPLICA IDENTITY FULL",
                dataset=t.dataset,
            )

    def _overrides(self, msg: Relation) -> Mapping[int, tuple[int, int]]:
        unknown = {c.type_oid for c in msg.columns if c.type_oid >= 16384}
        if not unknown or self._resolve_types is None:
            return {}
        return self._resolve_types(sorted(unknown))

    def _truncate(self, msg: Truncate) -> list[Message]:
        txn = self._txn_or_fail()
        out: list[Message] = []
        for oid in msg.relation_oids:
            t = self._by_oid.get(oid)
            if t is None or t.skip or t.batcher is None:
                continue
            out += self._cut(t)
            marker = t.batcher.truncate_batch(commit_lsn=txn.final_lsn, commit_time=txn.commit_time)
            out.append(RecordBatchMessage(t.dataset, marker))
            t.touched = True
        return out

    def _cut(self, t: _Target) -> list[Message]:
        """Yield ``t``'s rows: committed ones, their state, then the open transaction's."""
        batch = t.batcher.flush() if t.batcher is not None else None
        m, out = t.committed_rows, list[Message]()
        if batch is not None and m > 0:
            out.append(RecordBatchMessage(t.dataset, batch.slice(0, m)))
        if t.pending is not None:
            out.append(self._state(t, t.pending))
        if batch is not None and batch.num_rows > m:
            out.append(RecordBatchMessage(t.dataset, batch.slice(m)))
        t.committed_rows = 0
        return out

    def _state(self, t: _Target, commit: Commit) -> StateMessage:
        t.pending = None
        t.emitted = commit.end_lsn
        return StateMessage(
            t.dataset,
            _state_value(lsn_to_text(commit.end_lsn), t),
            position=lsn_to_text(commit.commit_lsn),
            emitted_at=commit.commit_time.isoformat(),
        )

    def drain(self) -> list[Message]:
        """Everything committed so far, each dataset's rows followed by its state."""
        out: list[Message] = []
        for t in self._targets.values():
            if t.committed_rows or t.pending is not None:
                out += self._cut(t)
        return out

    def states(self, lsn: int, *, final: bool = False) -> list[Message]:
        """Drain, then a state at ``lsn`` for every dataset not already there.

        ``lsn`` must be a position no unread commit precedes (a commit end, a
        keepalive's position between transactions, or a bounded run's end).
        """
        if self.in_transaction:
            raise ProtocolViolation("a heartbeat state inside a transaction", hint="a bug")
        out = self.drain()
        for t in self._targets.values():
            at = max(lsn, t.emitted)
            if at > t.emitted or final:
                t.emitted = at
                text = lsn_to_text(at)
                out.append(StateMessage(t.dataset, _state_value(text, t), text, None, final))
        return out


# --------------------------------------------------------------------------
# The extraction
# --------------------------------------------------------------------------


class CdcExtraction(BaseExtraction):
    """Stream a pgoutput slot into record batches and per-dataset checkpoints.

    ``settings`` are the source's: every connection the extraction opens
    (control and replication) uses its timeout and application name.
    ``datasets`` maps each dataset to its table (``schema.table``).
    ``start_lsn`` is the committed checkpoint (``lsn_from_state``), one for
    all datasets or one per dataset (the slot's consistent LSN after a fresh
    setup): transactions committed before a dataset's start are skipped, so
    a replay after a crash lands each change once. ``end_lsn`` bounds the
    run: an LSN, ``"current"`` (the server's position when streaming starts)
    or ``None`` to follow. A run also ends when ``stop()`` returns true or
    ``timeout`` seconds passed; it never ends inside a transaction, and its
    last messages are a ``final`` state for every dataset. ``keys`` (per
    dataset) are checked against the replica identity, which is all a delete
    carries.

    While following, a dataset without changes gets a heartbeat state every
    ``heartbeat_interval`` seconds, so that its acknowledgement lets the slot
    move. Rows are flushed when a batch is full, when the stream is idle and
    at least every ``flush_interval`` seconds after a commit.

    The server drops a replication connection that stays silent for
    ``wal_sender_timeout`` (one minute by default): pull the next message
    within that time. A dropped or failed stream raises ``SourceUnavailable``
    (retried as an attempt, replaying from the acknowledged position); a
    missing or invalidated slot raises ``SlotLost``.
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
        batch_rows: int = 65_536,
        batch_bytes: int = 64 << 20,
        stop: Callable[[], bool] | None = None,
        timeout: float | None = None,
        flush_interval: float = 1.0,
        heartbeat_interval: float = 30.0,
        status_interval: float = 10.0,
        authority: ExtractionAuthority | None = None,
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
        self._limits = (batch_rows, batch_bytes)
        self._stop, self._timeout = stop, timeout
        self._flush_interval, self._heartbeat_interval = flush_interval, heartbeat_interval
        self._status_interval = status_interval
        self._lock = threading.RLock()
        self._stream: ReplicationStream | None = None
        self._acked = dict(self._starts)
        self._confirmed = 0
        self._assembler: _Assembler | None = None

    @property
    def confirmed_lsn(self) -> int:
        """The highest LSN known confirmed on the slot (its position once streaming starts)."""
        return self._confirmed

    def _messages(self) -> Iterator[Message]:
        self.authority.acquire()
        status = require_slot(self._settings, self.slot)
        # PostgreSQL before 17 lets a lower flush move the slot back: never send one.
        self._confirmed = max(self._confirmed, status.confirmed_flush_lsn or 0)
        end = self._end
        if end == "current":
            end = current_wal_lsn(self._settings)
        end_lsn = None if end is None else _lsn(end)
        asm = self._assembler = _Assembler(
            self.datasets,
            self._starts,
            keys=self._keys,
            oids=self._oids,
            batch_rows=self._limits[0],
            batch_bytes=self._limits[1],
            resolve_types=self._resolve_types,
        )
        stream = self._stream = ReplicationStream(
            self._settings,
            self.slot,
            self.publication,
            min(self._starts.values()),
            status_interval=self._status_interval,
        )
        decoder = PgoutputDecoder()
        started = time.monotonic()
        last_flush = last_beat = last_ping = idle_since = started
        while True:
            now = time.monotonic()
            if not asm.in_transaction:
                # Between transactions, every commit before the server's reported
                # position (a commit end or a keepalive) has been read.
                final = max(asm.position, stream.wal_end)
                if end_lsn is not None and final >= end_lsn:
                    break
                if self._stopping(now - started):
                    break
            with self._lock:
                got = stream.read(0.0)
            if got is None:
                yield from self._emit(asm.drain())  # idle: hand over what is committed
                last_flush = now
                if end_lsn is None and not asm.in_transaction:
                    if now - last_beat >= self._heartbeat_interval:
                        yield from self._emit(asm.states(max(asm.position, stream.wal_end)))
                        last_beat = now
                if now - last_ping >= 0.5:
                    with self._lock:
                        stream.request_reply()  # a keepalive brings the server's position
                    last_ping = now
                if end_lsn is not None and now - idle_since >= 2.0:
                    self._nudge()
                    idle_since = now
                with self._lock:
                    got = stream.read(0.2)
                if got is None:
                    continue
            idle_since = time.monotonic()
            msg = decoder.decode(got[0])
            if end_lsn is not None and isinstance(msg, Begin) and msg.final_lsn >= end_lsn:
                final = end_lsn  # this transaction committed after the run's end
                break
            yield from self._emit(asm.feed(msg))
            if isinstance(msg, Commit) and idle_since - last_flush >= self._flush_interval:
                yield from self._emit(asm.drain())
                last_flush = idle_since
        yield from self._emit(asm.states(final, final=True))
        self.authority.complete()

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

    def _emit(self, messages: list[Message]) -> Iterator[Message]:
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
