"""CDC reads for the engine: the stitched first snapshot, then the stream.

Stand-up order (docs/architecture.md, section 5): the publication exists, the slot is
created with its exported snapshot and confirmed to retain WAL, its
consistent LSN is recorded, and only then is the relation read, inside that
exported snapshot. The snapshot's final state carries the consistent LSN, so
the stream that follows starts exactly where the snapshot ends: the key
resolves rows the snapshot already holds, with no gap and no double.

Each dataset has its own slot and publication, both named by
:func:`slot_name`: one slot per dataset keeps a dataset's checkpoint
independent of every other dataset's, at the cost of the server decoding the
WAL once per slot. The name is the readable ``<prefix>_<schema>_<table>``
(lower-cased, other characters as ``_``, cut to fit) followed by ``_`` and 10
hex digits of a SHA-256 over the exact prefix, schema and table, so
``sales_eu.orders`` and ``sales.eu_orders``, ``Orders`` and ``orders``, or two
long names that share their first 63 characters get different slots. Slots
named by the earlier scheme (the readable part alone) are not recognised:
there were no released users, so none is migrated.

A first capture (no checkpoint in the lake) drops a slot of its name that
nothing streams from, as the leftover of an interrupted stand-up, only when
its publication carries this project's mark or the lake records that this
project made that very slot (``_slot_owner.record_made``); it refuses one that a process
holds, one that another database of the server made (slot names are the
server's), and one whose publication another project marked or no project
did (:mod:`~combined.connectors.postgres._slot_owner`). The slot prefix
(``slot_prefix``, default ``combined``) is what separates two Combined
projects: two projects capturing the same table of one server need
different prefixes, and the second is refused its first capture until it
has one. Two sources of one project are refused such a pair when the
project is checked.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from typing import Any

from combined.connectors._shared import cdc_values
from combined.connectors.abc import BaseExtraction, ReadRequest, StreamOwner
from combined.connectors.postgres._catalog import parse_relation
from combined.connectors.postgres._cdc import CdcExtraction, lsn_from_state
from combined.connectors.postgres._connect import Session, Settings
from combined.connectors.postgres._extract import PartitionRead, PostgresExtraction, ReadOptions
from combined.connectors.postgres._identity import require_key_identity
from combined.connectors.postgres._publication import (
    ensure_publication,
    require_published,
    verify_tree,
)
from combined.connectors.postgres._replication import (
    RECOVER_HINT,
    SlotHandle,
    _control,
    create_slot,
    drop_slot,
    require_own_slot,
    require_slot,
)
from combined.connectors.postgres._rewrite import Marks, read_marks, recorded_marks
from combined.connectors.postgres._shapes import recorded_types
from combined.connectors.postgres._slot_owner import Claim, record_made
from combined.connectors.postgres._tree import Tree, read_tree
from combined.errors import ConfigError, NeedsSnapshot, SourceError, StreamGap
from combined.protocol import Message, RecordBatchMessage, StateMessage, TerminalOutcome


def qualified(relation: str) -> str:
    """``schema.table`` for a relation named with or without its schema."""
    return relation if "." in relation else f"public.{relation}"


#: Hex digits of the digest that makes slot names distinct; 40 bits.
_DIGEST_CHARS = 10
#: PostgreSQL's limit on a slot name (NAMEDATALEN - 1).
_NAME_BYTES = 63


def slot_name(prefix: str, relation: str) -> str:
    """The slot (and publication) name of one dataset: ``[a-z0-9_]``, at most 63 bytes.

    A readable part, then a digest of the exact ``prefix``, schema and table
    (a bare ``table`` is ``public.table``), so that distinct relations never
    share a name however they are spelled or however long they are.
    """
    schema, table = parse_relation(relation)
    exact = json.dumps([prefix, schema, table], ensure_ascii=False).encode()
    digest = hashlib.sha256(exact).hexdigest()[:_DIGEST_CHARS]
    return f"{_readable(f'{prefix}_{schema}_{table}')}_{digest}"


def slot_name_start(prefix: str) -> str:
    """How every :func:`slot_name` of ``prefix`` starts (a slot of the prefix, listed)."""
    return _readable(f"{prefix}_")


def _readable(text: str) -> str:
    """A slot name's readable part: ``[a-z0-9_]``, cut to leave room for the digest."""
    return re.sub(r"[^a-z0-9_]", "_", text.lower())[: _NAME_BYTES - _DIGEST_CHARS - 1]


def cdc_read(
    settings: Settings,
    request: ReadRequest,
    prefix: str,
    owner: Callable[[], StreamOwner | None] = lambda: None,
) -> BaseExtraction:
    """A stitched snapshot when no LSN was committed yet, else the stream from it.

    ``owner``: the project the stitched snapshot makes its slot and publication for.
    """
    if not request.key:
        raise ConfigError(
            f"cdc dataset {request.dataset} needs a key",
            hint="declare `key:` with the table's replica identity columns",
        )
    name = slot_name(prefix, request.relation)
    lsn = lsn_from_state(request.state)
    if lsn is None:
        return StitchedSnapshot(settings, request, slot=name, owner=owner)
    gone = _dropped(settings, request, name)
    if gone is None:
        tree = _resumable_tree(settings, request, name)
        oid = tree.oid if tree is not None else None
    else:  # its changes up to the drop are read under the oid it had
        tree, oid = None, int((request.state or {})["relid"])
    types = recorded_types(request.state)
    marks = recorded_marks(request.state)
    stop = None
    max_changes = request.options.get("max_changes")
    ext: CdcExtraction
    if max_changes:

        def stop() -> bool:
            return ext.receipt.rows >= int(max_changes)

    ext = CdcExtraction(
        settings,
        slot=name,
        publication=name,
        datasets={request.dataset: qualified(request.relation)},
        start_lsn=lsn,
        end_lsn=request.options.get("end_lsn", "current"),
        keys={request.dataset: tuple(request.key)},
        oids={request.dataset: oid} if oid is not None else None,
        trees={request.dataset: tree} if tree is not None else None,
        batch_rows=request.batch_rows,
        stop=stop,
        timeout=request.options.get("timeout"),
        lake_columns=(
            {request.dataset: list(request.options["lake_columns"])}
            if request.options.get("lake_columns")
            else None
        ),
        events=(request.dataset,) if request.options.get("event_stream") else (),
        columns=({request.dataset: (*request.columns, *request.key)} if request.columns else None),
        types={request.dataset: types} if types is not None else None,
        marks={request.dataset: marks} if marks is not None else None,
        dropped={request.dataset: gone} if gone is not None else None,
    )
    return ext


def _dropped(settings: Settings, request: ReadRequest, name: str) -> StreamGap | None:
    """What ends the capture, once it committed the changes before the drop, when the
    captured table was dropped since its checkpoint (the oid it recorded is gone).

    The stream still carries every change committed before the ``DROP TABLE``
    (decoded as the catalog was then): refused before reading, a capture left
    them in the slot, and the teardown its hint named dropped them with the
    slot. None when the table is there (or a partitioned one, whose dropped
    partitions :func:`verify_tree` refuses), or when the publication is gone
    too (nothing streams: :func:`require_published` refuses it).
    """
    state = request.state or {}
    relid = state.get("relid")
    if relid is None or state.get("partitions"):
        return None
    require_slot(settings, name)  # (lost with its WAL: nothing to read)
    with _control(settings, "look up the captured table") as conn:
        row = conn.execute(
            "SELECT NOT EXISTS (SELECT 1 FROM pg_class WHERE oid = %s::oid), "
            "EXISTS (SELECT 1 FROM pg_publication WHERE pubname = %s)",
            (int(relid), name),
        ).fetchone()
    if row is None or not row[0] or not row[1]:
        return None
    table = qualified(request.relation)
    return StreamGap(
        f"captured table {table!r} was dropped (slot {name}): its changes up to the drop "
        "were committed to the lake, and the stream carries nothing of it after that (a "
        "table created again under its name is another table, whose rows it never streams)",
        hint=f"{RECOVER_HINT} (the new snapshot reads the table as it is now, if it was "
        "created again; the lake keeps its rows until then)",
        dataset=request.dataset,
        publication=name,
    )


def _resumable_tree(settings: Settings, request: ReadRequest, name: str) -> Tree | None:
    """The captured table's tree, once resuming from slot ``name`` is proved gap-free."""
    # Never resume silently with a gap: the slot must exist and hold its WAL,
    # and its publication must still stream the table.
    require_slot(settings, name)
    require_published(settings, name, qualified(request.relation))
    relid = (request.state or {}).get("relid")
    # Partitions attached, detached or dropped since the checkpoint moved rows
    # that no change in the stream carries.
    tree = verify_tree(
        settings,
        qualified(request.relation),
        (request.state or {}).get("partitions"),
        when="since the last capture",
    )
    oid = tree.oid if tree is not None else None
    if relid is not None and oid != int(relid):
        raise NeedsSnapshot(
            f"captured table {qualified(request.relation)!r} was dropped and created again "
            f"since the last capture (slot {name}): the lake holds the old table's rows, and "
            "the new one's changes before it was published again were never streamed",
            hint=RECOVER_HINT,
            dataset=request.dataset,
        )
    return tree


class StitchedSnapshot(BaseExtraction):
    """The first read of a CDC dataset: slot first, then the snapshot it exported."""

    ROWS_ONLY = True  # (the stream follows in the next capture)

    def __init__(
        self,
        settings: Settings,
        request: ReadRequest,
        *,
        slot: str,
        owner: Callable[[], StreamOwner | None],
    ) -> None:
        super().__init__()
        self._settings = settings
        self._request = request
        self.slot = self.publication = slot
        self._owner = owner
        self._handle: SlotHandle | None = None
        self._inner: PostgresExtraction | None = None

    def _messages(self) -> Iterator[Message]:
        s, req = self._settings, self._request
        # Refused before anything is created: a refusal after the publication
        # left an empty one behind on the server.
        _require_key_identity(s, req)
        require_own_slot(s, self.slot)  # another database's: never dropped below
        owner = self._owner()
        # Another project's slot (its publication's mark), or one not provably
        # ours (by that mark, or by our lake's record of making it), is refused
        # here, and the publication marked ours.
        judged = ensure_publication(
            s,
            self.publication,
            [qualified(req.relation)],
            add_missing=True,
            claim=Claim(owner),
        ).slot
        # No committed checkpoint refers to a slot of this name (we are here
        # because none exists), and the slot judged is provably ours: if nothing
        # streams from it, it is the leftover of our interrupted stand-up; one
        # that a process holds is not to be taken. The short wait lets the
        # walsender of an interrupted attempt exit. Only the slot judged is
        # dropped: not one made again (or streamed from) since, nor one made
        # where there was none (creating ours then fails).
        if judged is not None:
            drop_slot(
                s,
                self.slot,
                wait_seconds=3.0,
                in_use_hint=f"dataset {req.dataset} has no committed checkpoint, so no capture "
                "of it streams from this slot: stop the process that does",
                judged=judged,
            )
        self._handle = handle = create_slot(s, self.slot)
        self._record(owner, handle)
        snapshot_id = handle.snapshot_name
        if snapshot_id is None:
            raise SourceError(
                f"replication slot {self.slot!r} exported no snapshot",
                hint="the server must support exported snapshots (PostgreSQL 10 or newer)",
            )
        snapshot_text, tree, columns, types, marks = _probe_snapshot(
            s, snapshot_id, qualified(req.relation)
        )
        snap_req = replace(
            req, strategy="snapshot", state=None, cursor=None, columns=_streamed(req, columns)
        )
        self._inner = inner = PostgresExtraction(
            s,
            snap_req,
            ReadOptions.of(snap_req),
            PartitionRead(
                snapshot_id=snapshot_id,
                snapshot_text=snapshot_text,
                column=req.key[0],
                index=0,
                lower=None,
                upper=None,
                include_nulls=True,
            ),
        )
        self._authority = inner.authority  # one receipt: the snapshot read's
        for msg in cdc_values(iter(inner)):
            if isinstance(msg, RecordBatchMessage):
                yield msg
        inner.finish("success")
        handle.release_snapshot()
        lsn = handle.consistent_point_text
        # The types the snapshot read: the stream's first relation message showing
        # another one had the column rewritten since (an ALTER COLUMN ... TYPE); so
        # do its enum labels and files, which the next run compares (._rewrite).
        state: dict[str, Any] = {"lsn": lsn, "stitched": True, "types": types}
        if marks is not None:
            state.update(marks.record())
        if tree is not None:
            state["relid"] = tree.oid
            if tree.partitioned:
                state["partitions"] = tree.record()
        yield StateMessage(req.dataset, state, position=lsn, final=True)

    def _record(self, owner: StreamOwner | None, handle: SlotHandle) -> None:
        """Keep in the lake that this project made the slot (``_slot_owner.record_made``),
        before the snapshot is read: killed after this, the retry knows the slot its own.
        A slot whose record could not be kept is dropped again (it would be refused)."""
        try:
            record_made(owner, self.slot, handle.database, handle.consistent_point_text)
        except BaseException:
            handle.release_snapshot()
            drop_slot(self._settings, self.slot, wait_seconds=3.0)
            raise

    def _release(self, outcome: TerminalOutcome) -> tuple[str, ...]:
        if self._inner is not None:
            self._inner.finish("success" if outcome == "success" else "abort")
        if self._handle is not None:
            self._handle.release_snapshot()
        return ()


def _require_key_identity(settings: Settings, request: ReadRequest) -> None:
    """Refuse, before the publication and the slot, a key the stream's deletes will not carry.

    A delete (and a key change) sends the replica identity's columns only: a
    key column outside them could never be matched. The stream checks this
    too (its relation message), but only at the first change after the
    snapshot.
    """
    session = Session(settings)
    try:
        require_key_identity(lambda q: session.rows(q, "reading the replica identity"), request)
    finally:
        session.close()


def _streamed(request: ReadRequest, columns: Sequence[tuple[str, bool]]) -> tuple[str, ...] | None:
    """The columns the snapshot reads: those the change stream carries.

    pgoutput leaves out generated columns (PostgreSQL 18 sends them only
    from a publication with ``publish_generated_columns``, which Combined
    does not set): read in the snapshot, they would vanish from every row a
    change rewrites and fail the next capture as a dropped column.
    """
    generated = [name for name, gen in columns if gen]
    chosen = request.columns or tuple(name for name, _ in columns)
    named = [c for c in chosen if c in generated]
    if named and request.columns:
        raise ConfigError(
            f"column {named[0]!r} of {request.relation!r} is generated, and PostgreSQL's "
            "logical replication does not stream generated columns",
            hint=f"leave {named[0]!r} out of the dataset's `columns:` (the lake can compute it "
            "from the others), or capture the relation with the snapshot or cursor strategy",
            dataset=request.dataset,
        )
    if not generated:
        return request.columns
    return tuple(c for c in chosen if c not in generated)


def _probe_snapshot(
    settings: Settings, snapshot_id: str, relation: str
) -> tuple[str, Tree | None, list[tuple[str, bool]], dict[str, list[int]], Marks | None]:
    """``pg_current_snapshot()``, ``relation``'s partitions, its columns (name,
    generated), the streamed columns' (type oid, type modifier) and its enum
    labels and files (:mod:`._rewrite`).

    The exported snapshot sees them as the snapshot read does: the
    partitions recorded with the first checkpoint are those it read.
    """
    from psycopg import sql

    session = Session(settings)
    try:
        session.run("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY", "probing the snapshot")
        session.run(
            sql.SQL("SET TRANSACTION SNAPSHOT {}").format(sql.Literal(snapshot_id)),
            "importing the slot's snapshot",
        )
        text: Any = session.rows(
            "SELECT CAST(pg_current_snapshot() AS text)", "reading the snapshot"
        )[0][0]

        def rows(query: sql.Composed) -> list[tuple[Any, ...]]:
            return session.rows(query, "reading the table's partitions")

        tree = read_tree(rows, *parse_relation(relation))
        columns = session.rows(
            sql.SQL(
                "SELECT a.attname::text, a.attgenerated <> '', a.atttypid::bigint,"
                " a.atttypmod::int FROM pg_attribute a"
                " JOIN pg_class c ON c.oid = a.attrelid"
                " JOIN pg_namespace n ON n.oid = c.relnamespace"
                " WHERE n.nspname = {} AND c.relname = {} AND a.attnum > 0"
                " AND NOT a.attisdropped ORDER BY a.attnum"
            ).format(*map(sql.Literal, parse_relation(relation))),
            "reading the table's columns",
        )
        marks = None
        if tree is not None:
            what = "reading the table's enum labels and files"
            marks = read_marks(lambda q: session.rows(q, what), tree.oid)
        session.run("ROLLBACK", "closing the probe")
        types = {str(n): [int(t), int(m)] for n, g, t, m in columns if not g}
        return str(text), tree, [(str(n), bool(g)) for n, g, *_ in columns], types, marks
    finally:
        session.close()
