"""Decoded pgoutput messages into record batches and checkpoints, in commit order.

:class:`_Assembler` does no I/O of its own (types and added columns are read
through callbacks): :class:`~combined.connectors.postgres._cdc.CdcExtraction`
reads the stream and feeds it, and hands over what it returns.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Generator, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from struct import Struct
from typing import Any, cast

import numpy as np

from combined.connectors.postgres._batch import NOT_WIRE, ChangeBatcher, wire_ops
from combined.connectors.postgres._catalog import parse_relation, relation_name
from combined.connectors.postgres._fill import FillDeferred
from combined.connectors.postgres._pgoutput import (
    Begin,
    Commit,
    Delete,
    Insert,
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
    decode_message,
    lsn_to_text,
)
from combined.connectors.postgres._rewrite import Marks, to_read_again
from combined.connectors.postgres._shapes import (
    as_table_row,
    check_key_types,
    same_columns,
    types_of,
)
from combined.connectors.postgres._tree import Tree, precedes
from combined.errors import NeedsSnapshot, ProtocolViolation, SchemaMismatch, SourceError
from combined.protocol import Message, RecordBatchMessage, StateMessage

__all__ = ["_Assembler"]

_OID = Struct("!I")
#: :meth:`_Assembler.feed_rows` of at most this many rows feeds them one by one:
#: its numpy rounds cost ~35 us a call however few rows they take, one row ~3 us.
_FEW_ROWS = 8


def _qualified(relation: str) -> str:
    return relation_name(*parse_relation(relation))


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
    tree: Tree | None = None  # the table and its partitions when the read started
    #: Columns the lake (or an earlier relation message) holds: one that
    #: arrives beyond them was added since (None: unknown, nothing is filled).
    known: set[str] | None = None
    #: Partitions the stream sent changes of, each with the positions of the
    #: table's columns in its rows (None: the table's own order).
    leaves: dict[int, tuple[int, ...] | None] = field(default_factory=dict)
    #: Columns filled from the source in this read (:meth:`_Assembler.fill_pending`).
    filled: list[str] = field(default_factory=list)
    #: Whether added columns are left unfilled (an event stream): noted in ``unfilled``.
    events: bool = False
    unfilled: list[str] = field(default_factory=list)
    #: Transactions that changed the dataset, by xid, since a watch began (None: no watch).
    watch: list[int] | None = None
    #: The columns the dataset holds (its ``columns:`` and key; None: every column).
    columns: frozenset[str] | None = None
    #: Each column's (type oid, type modifier) as the last relation message, or the
    #: checkpoint, showed it (None: not recorded; no type change is seen).
    types: dict[str, tuple[int, int]] | None = None
    #: The commit LSN of the transaction whose relation message last set ``types``.
    types_at: int = 0
    #: The enum labels and files the checkpoint recorded, or the run's end took
    #: (:mod:`._rewrite`; None: not recorded, nothing rewritten is seen).
    marks: Marks | None = None
    #: The table was dropped since its checkpoint: a relation under its name and
    #: another oid is a table created since, whose changes are not this one's.
    gone: bool = False
    #: Whether rows of the open transaction were handed over (a full batch cut in it).
    spilled: bool = False
    #: The dropped table's columns to fill its relation message showed, and the commit
    #: LSN of that message's transaction: the dataset's changes from there on are left
    #: out (:meth:`_Assembler._halt`), its state held before them.
    halted: tuple[list[str], int] | None = None


def _state_value(lsn: str, t: _Target) -> dict[str, Any]:
    """A dataset's checkpoint: the LSN, its table's oid when known (``relid``), and,
    for a partitioned table, its partitions (``partitions``, :meth:`Tree.record`)."""
    value: dict[str, Any] = {"lsn": lsn, "dataset": t.dataset}
    if t.oid is not None:
        value["relid"] = t.oid
    if t.tree is not None and t.tree.partitioned:
        value["partitions"] = t.tree.record()
    if t.types is not None:
        value["types"] = {name: list(pair) for name, pair in t.types.items()}
    if t.marks is not None:
        value.update(t.marks.record())
    return value


class _Assembler:
    """Turns decoded pgoutput messages into protocol messages (no I/O).

    Rows accumulate per dataset across transactions; :meth:`drain` flushes
    them with the state of the last commit. A full batcher is cut at the last
    commit boundary it holds: committed rows, their state, then the rows of
    the transaction in progress.

    A partitioned table's changes come under its partitions' oids and in
    their column order (``publish_via_partition_root`` off): ``trees`` gives
    each dataset's table and partitions when the read started, and
    ``ancestors`` names the partitioned tables above a relation the stream
    shows that is not among them (a partition created since). Their rows
    are put in the table's column order, under the table's oid, into the
    dataset's one batcher.
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
        trees: Mapping[str, Tree] | None = None,
        ancestors: Callable[[int], tuple[int, ...]] | None = None,
        known: Mapping[str, Sequence[str]] | None = None,
        fill: Callable[
            [str, Sequence[str], Mapping[str, tuple[int, int]]],
            Iterator[tuple[bytes | None, ...]],
        ]
        | None = None,
        events: Collection[str] = (),
        columns: Mapping[str, Collection[str]] | None = None,
        types: Mapping[str, Mapping[str, tuple[int, int]]] | None = None,
        marks: Mapping[str, Marks] | None = None,
        gone: Collection[str] = (),
    ) -> None:
        # ``gone``: the datasets whose table was dropped since their checkpoint.
        # ``columns``: each dataset's selected columns (``columns:`` and its
        # key), when it selects; the stream's other columns are left out.
        # ``types``: each column's type as its checkpoint recorded it; a
        # relation message showing another one has the column filled.
        # ``marks``: the enum labels and files its checkpoint recorded
        # (:meth:`fill_late` compares the catalog's with them).
        # ``known``: the columns each dataset's lake table holds; ``fill``
        # reads the given columns of every row of a table (:mod:`._fill`),
        # except for ``events`` (append datasets), whose added columns are
        # only noted (``_Target.unfilled``).
        # ``oids``: each table's oid when its checkpoint was committed; a
        # relation message under another oid is the table dropped and created
        # again since, whose rows the lake's copy no longer describes.
        self._targets = {
            _qualified(rel): _Target(
                d,
                _qualified(rel),
                starts[d],
                (keys or {}).get(d),
                (oids or {}).get(d),
                tree=(trees or {}).get(d),
                known=set(known[d]) if known and d in known else None,
                events=d in events,
                columns=frozenset(columns[d]) if columns and d in columns else None,
                types=dict(types[d]) if types and d in types else None,
                marks=(marks or {}).get(d),
                gone=d in gone,
            )
            for d, rel in datasets.items()
        }
        self._fill = fill
        self._pending_fill: tuple[_Target, Relation, list[str], Begin] | None = None
        self._partitioned: dict[int, _Target] = {}
        for t in self._targets.values():
            t.emitted = t.start
            if t.tree is not None and t.tree.partitioned:
                t.oid = t.oid if t.oid is not None else t.tree.oid
                self._partitioned[t.tree.oid] = t
        self._ancestors = ancestors
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

    def targets(self) -> list[_Target]:
        """The captured datasets."""
        return list(self._targets.values())

    def feed(self, msg: PgoutputMessage) -> list[Message]:
        """Apply one decoded message; return what is ready to be yielded."""
        if isinstance(msg, Insert | Update | Delete):  # nearly every message: tested first
            return self._change(msg)
        if isinstance(msg, Begin):
            self._txn = msg
            for t in self._targets.values():
                t.skip = t.halted is not None or msg.final_lsn < t.start
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

    def feed_wire(self, data: bytes) -> list[Message]:
        """:meth:`feed` of a row change (``I``, ``U``, ``D``) as the wire sent it.

        Outside a streamed block only. The row reaches its batcher as bytes,
        parsed with the batch's other rows (:mod:`._tuples`); a partition's
        row in another column order than its table's is decoded here.
        """
        if len(data) < 6:
            raise SourceError(
                f"truncated pgoutput message {data[:1].decode(errors='replace')!r}",
                hint="the replication stream was cut or corrupted; restart the capture",
            )
        (oid,) = _OID.unpack_from(data, 1)
        t = self._by_oid.get(oid)
        if t is None or t.skip:
            return []
        if t.leaves and t.leaves.get(oid) is not None:
            return self._change(cast(RowChange, decode_message(data)))
        txn = self._txn_or_fail()
        assert t.batcher is not None
        t.touched = True
        if t.batcher.add_wire(data, commit_lsn=txn.final_lsn, commit_time=txn.commit_time):
            return self._cut(t)
        return []

    def feed_rows(self, rows: Sequence[bytes]) -> list[Message]:
        """:meth:`feed_wire` of consecutive row changes, in order, in one call.

        Nearly every message of a stream is a row change of the open
        transaction: their relation oids and ops are read for all of them at
        once (numpy), and each run of one relation's rows goes to its batcher
        in one call (:meth:`ChangeBatcher.add_wires`), not one call a row.
        """
        n = len(rows)
        if n <= _FEW_ROWS:  # a few rows (single-row transactions): numpy's rounds cost more
            return [m for data in rows for m in self.feed_wire(data)]
        sizes = np.fromiter(map(len, rows), np.int64, n)
        if (sizes < 6).any():
            return [m for data in rows for m in self.feed_wire(data)]
        at = np.cumsum(sizes) - sizes
        raw = np.frombuffer(b"".join(rows), np.uint8)
        oids = (
            (raw[at + 1].astype(np.int64) << 24)
            | (raw[at + 2].astype(np.int64) << 16)
            | (raw[at + 3].astype(np.int64) << 8)
            | raw[at + 4]
        )
        ops = wire_ops(raw, at)
        bounds = [0, *(np.flatnonzero(oids[1:] != oids[:-1]) + 1).tolist(), n]
        out: list[Message] = []
        for i, j in zip(bounds, bounds[1:], strict=False):
            t = self._by_oid.get(int(oids[i]))
            if t is None or t.skip:
                continue
            if (t.leaves and t.leaves.get(int(oids[i])) is not None) or (
                ops[i:j] == NOT_WIRE
            ).any():
                for data in rows[i:j]:
                    out += self.feed_wire(data)
                continue
            out += self._add_run(t, rows[i:j], sizes[i:j], ops[i:j])
        return out

    def _add_run(
        self, t: _Target, rows: Sequence[bytes], sizes: np.ndarray, ops: np.ndarray
    ) -> list[Message]:
        """Rows of one relation kept as their bytes into ``t``'s batcher, cut when full."""
        txn = self._txn_or_fail()
        assert t.batcher is not None
        out: list[Message] = []
        t.touched = True
        while len(rows):
            k = t.batcher.add_wires(
                rows, sizes, ops, commit_lsn=txn.final_lsn, commit_time=txn.commit_time
            )
            if t.batcher.full:
                out += self._cut(t)
            rows, sizes, ops = rows[k:], sizes[k:], ops[k:]
        return out

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
        if t.leaves and msg.relation_oid in t.leaves:
            as_table_row(msg, t.batcher.relation.oid, t.leaves[msg.relation_oid])
        t.batcher.add(msg, commit_lsn=txn.final_lsn, commit_time=txn.commit_time)
        t.touched = True
        return self._cut(t) if t.batcher.full else []

    def _commit(self, msg: Commit) -> list[Message]:
        for t in self._targets.values():
            if t.touched:
                if t.watch is not None and self._txn is not None:
                    t.watch.append(self._txn.xid)
                t.pending = msg
                t.committed_rows = t.batcher.rows if t.batcher else 0
                t.touched = t.spilled = False
        self._txn = None
        self.position = max(self.position, msg.end_lsn)
        return []

    def _relation(self, msg: Relation) -> list[Message]:
        changed = self._cache.update(msg)
        bound = self._by_oid.get(msg.oid)
        t = self._targets.get(msg.qualified_name)
        if t is None or t.tree is None or t.tree.partitioned:
            partitioned = self._partition_of(msg, bound)
            if partitioned is not None:
                return self._partition(partitioned, msg)
        if bound is not None and bound is not t:
            raise SchemaMismatch(
                f"captured table {bound.relation!r} was renamed to {msg.qualified_name!r}",
                hint="declare the dataset under its new name and rerun cdc setup",
                dataset=bound.dataset,
            )
        if t is None or t.halted is not None:
            return []
        if t.oid is not None and t.oid != msg.oid:
            if t.gone:
                return []  # created again after its drop (and published): not the one read
            # The table was dropped and created again: its old rows were never
            # deleted, and the new one's may have been published only later.
            raise NeedsSnapshot(
                f"captured table {t.relation!r} was dropped and created again",
                hint="run `combined cdc teardown` then `combined cdc setup` for the source: "
                "a new slot and a new snapshot close the gap",
                dataset=t.dataset,
            )
        if t.gone and not t.events and not t.skip:
            halted = self._halt(t, msg)
            if halted is not None:
                return halted
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
                columns=t.columns,
            )
        t.oid = msg.oid
        self._by_oid[msg.oid] = t
        self._note_added(t, msg)
        return out

    def _note_added(self, t: _Target, msg: Relation) -> None:
        """Ask for a fill (:meth:`fill_pending`) when ``msg`` shows columns the lake
        lacks, or columns whose values were rewritten (:meth:`_to_fill`)."""
        # (a transaction already in the lake shows types older than its checkpoint's)
        fill = [] if t.skip else self._to_fill(t, msg)
        if not t.skip:
            t.types = types_of(msg)
            t.types_at = self._txn.final_lsn if self._txn is not None else 0
        if t.known is None:
            return
        added = [n for n in fill if n not in t.known]
        t.known.update(c.name for c in msg.columns if t.columns is None or c.name in t.columns)
        if not fill or self._txn is None or t.skip:
            return
        if t.events:  # events keep the values they were sent with
            t.unfilled += added
        elif self._fill is not None and not t.gone:  # (a dropped table's: :meth:`_halt`)
            self._pending_fill = (t, msg, fill, self._txn)

    def _halt(self, t: _Target, msg: Relation) -> list[Message] | None:
        """Stop the dataset of a dropped table at ``msg`` when it shows columns to fill
        (:meth:`_to_fill`: added or rewritten since the lake's commit): their values in the
        rows the stream did not change went with the table. None: none to fill.

        The changes of the transactions committed before this one are handed over with
        their state, held at the end of the last of them (:attr:`_Target.halted`); this
        transaction's and every later one's are left out, the slot never confirmed past
        them. Before, none was committed, and the new snapshot the hint named lost the
        changes made before the column appeared. When rows of this transaction were
        handed over already (a full batch cut in it), nothing is committed, as before.
        """
        txn = self._txn
        fill = self._to_fill(t, msg) if txn is not None else []
        if not fill or txn is None:
            return None
        if t.spilled:
            raise NeedsSnapshot(
                f"captured table {t.relation!r} was dropped, and its columns {fill} were "
                "added or rewritten before that, within a transaction larger than a batch: "
                "their values in the rows the stream did not change are gone with it, so its "
                "changes since the last capture are not committed",
                hint="run `combined cdc teardown` then `combined cdc setup` for the source",
                dataset=t.dataset,
            )
        batch = t.batcher.flush() if t.batcher is not None else None
        out: list[Message] = []
        if batch is not None and t.committed_rows:
            out.append(RecordBatchMessage(t.dataset, batch.slice(0, t.committed_rows)))
        if t.pending is not None:
            out.append(self._state(t, t.pending))
        t.committed_rows, t.touched, t.skip, t.halted = 0, False, True, (fill, txn.final_lsn)
        if self.position > t.emitted:  # (every transaction before this one is read)
            out.append(self._state_at(t, self.position, final=False))
        return out

    def _to_fill(self, t: _Target, msg: Relation) -> list[str]:
        """The columns of ``msg`` to fill: those the lake lacks, and those whose type
        changed since the last relation message or checkpoint (an ``ALTER COLUMN
        ... TYPE`` rewrote their values in place: :mod:`._fill`).

        A key column's integer or text type widened keeps its rows'
        identities; any other new key type is refused (:func:`._shapes.check_key_types`).
        """
        if t.known is None:
            return []
        key, was, shown = set(t.key or msg.key), t.types, types_of(msg)
        if was is not None:
            check_key_types(t.relation, t.dataset, key, was, shown)
        return [
            n
            for n, pair in shown.items()
            if (t.columns is None or n in t.columns)
            and (
                n not in t.known or (was is not None and n not in key and was.get(n, pair) != pair)
            )
        ]

    @property
    def fill_waits(self) -> bool:
        """Whether a relation message left rows to fill (see :meth:`fill_pending`)."""
        return self._pending_fill is not None

    def fill_pending(self) -> Generator[Message, None, bool]:
        """The rows of columns added since the lake's schema, as updates of those alone.

        The stream carries a column added with a default only on the rows
        changed after the ALTER; every other row gets its value from the
        source (:mod:`._fill`), placed before the changes that follow the
        relation message. Full batches are handed over as the read goes.
        Returns whether the columns were read (not deferred to a later type).
        """
        pending, self._pending_fill = self._pending_fill, None
        if pending is None or self._fill is None:
            return False
        t, msg, added, txn = pending
        assert t.batcher is not None
        names = [c.name for c in msg.columns]
        key = list(t.key or msg.key)
        at = [names.index(n) for n in key + added]
        shown = {n: pair for n, pair in types_of(msg).items() if n in added}
        try:
            for row in self._fill(t.relation, key + added, shown):
                kinds = ["u"] * len(names)
                values: list[bytes | None] = [None] * len(names)
                for i, value in zip(at, row, strict=True):
                    kinds[i], values[i] = ("n" if value is None else "t"), value
                change = Update(msg.oid, TupleData("".join(kinds), tuple(values)))
                t.batcher.add(change, commit_lsn=txn.final_lsn, commit_time=txn.commit_time)
                t.touched = True
                if t.batcher.full:
                    yield from self._cut(t)
        except FillDeferred:
            return False  # a later type: its relation message, or the catalog's, fills then
        t.filled += added
        return True

    def fill_late(
        self,
        now: Mapping[str, Relation],
        read_at: int,
        at: int,
        marks: Mapping[str, Marks] | None = None,
    ) -> Iterator[Message]:
        """Fill what the catalog showed changed when no relation message did.

        ``now`` holds each dataset's table as the catalog showed it when the
        run started (:func:`._fill.relations_now`), before WAL position
        ``read_at``, and ``marks`` its enum labels and files then
        (:mod:`._rewrite`); ``at`` is a position between transactions that
        every commit read so far precedes. A table with columns to fill
        (:meth:`_to_fill`, :meth:`_again`) gets a transaction of its own at
        ``at``: its relation, then the fill. A relation message of a
        transaction that commits past ``read_at`` is newer than the
        catalog's read: the stream has already shown the columns it holds
        (an enum's labels and the files, it never shows). A checkpoint that
        recorded no types, or no marks, takes the catalog's, filling nothing
        by them. The marks are taken once what they ask for was read.
        """
        for t in self._targets.values():
            msg = now.get(t.dataset)
            if msg is None or t.events:
                continue
            seen = (marks or {}).get(t.dataset)
            if t.types is None:
                t.types, t.marks = types_of(msg), t.marks or seen
                continue
            fresh = t.types_at < read_at
            shape = msg if fresh or t.batcher is None else t.batcher.relation
            again = self._again(t, seen, shape)
            if (fresh and self._to_fill(t, msg)) or again:
                begin = Begin(at, datetime.now(UTC), 0)
                self.feed(begin)
                if fresh:
                    yield from self._relation(msg)
                read = yield from self._fill_also(t, again, begin)
                yield from self._commit(Commit(0, at, at, begin.commit_time))
                if not read:
                    continue  # a later type is read by its own fill; the next run compares
            t.marks = seen if seen is not None else t.marks

    def _again(self, t: _Target, seen: Marks | None, shape: Relation) -> list[str]:
        """The columns of ``shape`` whose values were rewritten since ``t``'s marks
        (:func:`._rewrite.to_read_again`); none when either is unknown."""
        if seen is None or t.marks is None:
            return []
        return to_read_again(
            t.marks,
            seen,
            [c.name for c in shape.columns if t.columns is None or c.name in t.columns],
            set(t.key or shape.key),
            relation=t.relation,
            dataset=t.dataset,
        )

    def _fill_also(
        self, t: _Target, again: Sequence[str], txn: Begin
    ) -> Generator[Message, None, bool]:
        """:meth:`fill_pending` of the columns a relation message asked for and ``again``;
        whether they were read."""
        assert t.batcher is not None
        _, shape, asked, _ = self._pending_fill or (t, t.batcher.relation, [], txn)
        self._pending_fill = (t, shape, [*asked, *(c for c in again if c not in asked)], txn)
        return (yield from self.fill_pending())

    def _partition_of(self, msg: Relation, bound: _Target | None) -> _Target | None:
        """The partitioned dataset ``msg`` is a partition of, if any."""
        if bound is not None:
            return bound if msg.oid in bound.leaves else None
        if not self._partitioned or msg.oid in self._partitioned:
            return None
        for t in self._partitioned.values():
            if t.tree is not None and msg.oid in t.tree.leaves:
                return t
        if self._ancestors is None:
            return None
        # A partition created since the read started, or no partition of ours.
        return next(
            (self._partitioned[o] for o in self._ancestors(msg.oid) if o in self._partitioned),
            None,
        )

    def _partition(self, t: _Target, msg: Relation) -> list[Message]:
        """Route partition ``msg`` to ``t``: its columns in the table's order, one batcher."""
        assert t.tree is not None and t.oid is not None
        self._check_key(t, msg)
        names = [c.name for c in msg.columns]
        # The table's order; a column the read did not know yet (added since) at the end.
        order = [n for n in t.tree.columns if n in names] + [
            n for n in names if n not in t.tree.columns
        ]
        at = {n: i for i, n in enumerate(names)}
        positions = tuple(at[n] for n in order)
        schema, table = parse_relation(t.relation)
        shaped = Relation(
            t.oid, schema, table, msg.replica_identity, tuple(msg.columns[i] for i in positions)
        )
        out: list[Message] = []
        if t.batcher is None or not same_columns(t.batcher.relation, shaped):
            if t.batcher is not None:
                out += self._cut(t)  # rows of the old shape end the batch
            t.batcher = ChangeBatcher(
                shaped,
                batch_rows=self._batch_rows,
                batch_bytes=self._batch_bytes,
                type_overrides=self._overrides(shaped),
                key=t.key,
                columns=t.columns,
            )
        t.leaves[msg.oid] = None if positions == tuple(range(len(names))) else positions
        self._by_oid[msg.oid] = t
        # A column added to the table reaches every partition: the first to show it fills all.
        self._note_added(t, shaped)
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
                f"or ALTER TABLE {msg.qualified_name} REPLICA IDENTITY FULL",
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
        hit: dict[str, _Target] = {}
        for oid in msg.relation_oids:
            t = self._by_oid.get(oid)
            if t is not None and not t.skip and t.batcher is not None:
                hit.setdefault(t.dataset, t)
        for t in hit.values():
            assert t.batcher is not None
            if t.leaves and t.oid not in msg.relation_oids:
                self._check_whole(t, set(msg.relation_oids), txn)
            out += self._cut(t)
            marker = t.batcher.truncate_batch(commit_lsn=txn.final_lsn, commit_time=txn.commit_time)
            out.append(RecordBatchMessage(t.dataset, marker))
            t.touched = True
        return out

    def _check_whole(self, t: _Target, truncated: set[int], txn: Begin) -> None:
        """Raise unless a truncate of ``t``'s partitions emptied the whole table.

        ``TRUNCATE`` of a partitioned table names every partition; one that
        leaves a partition out truncated some partitions only, whose rows
        the lake cannot tell apart. Partitions linked after the truncating
        transaction began (by xid) may be missing from it.
        """
        assert t.tree is not None
        required = {
            link.child for link in t.tree.links if link.kind != "p" and precedes(link.xmin, txn.xid)
        }
        missing = (required | set(t.leaves)) - truncated
        if missing:
            raise NeedsSnapshot(
                f"a partition of captured table {t.relation!r} was truncated on its own: "
                "the lake cannot tell its rows from the other partitions'",
                hint="run `combined cdc teardown` then `combined cdc setup` for the source: "
                "a new snapshot takes the table as it is now; truncate the partitioned "
                "table itself, or delete the partition's rows, to keep streaming",
                dataset=t.dataset,
            )

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
            t.spilled = True
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
            at = t.emitted if t.halted is not None else max(lsn, t.emitted)
            if at > t.emitted or final:
                out.append(self._state_at(t, at, final=final))
        return out

    def _state_at(self, t: _Target, lsn: int, *, final: bool) -> StateMessage:
        """``t``'s state at ``lsn``, a position between transactions with no rows to it."""
        t.emitted = lsn
        text = lsn_to_text(lsn)
        return StateMessage(t.dataset, _state_value(text, t), text, None, final)
