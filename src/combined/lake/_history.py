"""History mode: every version of every row of a dataset, in a second Delta table.

``<lake>/_history/<source>/<dataset>/`` holds, per version of a row, the
row as its Delivery delivered it (payload and provenance columns) and:

- ``_combined_valid_from``: the acceptance time of the lake commit that made
  the version current (its ``ingested_at``, stamped on the row as
  ``_combined_ingested_at``);
- ``_combined_valid_to``: the acceptance time of the commit that replaced or
  deleted it, null while it is current;
- ``_combined_is_current``: whether it is the projection's row now.

It is derived from the projection's own commits, in their order: each
history commit mirrors one lake commit of the dataset, from the Deliveries
that commit lists in the raw layer (and a full refresh's change list), and
carries ``Transaction(app_id="combined-history:<source>/<dataset>",
version=<its last Delivery sequence>)``. A commit whose sequence the history
holds already is skipped, so a retried or repeated projection adds no
version twice; one the history lacks (a crash between the two commits, or
history enabled on a dataset with commits) is applied from the raw layer
before anything is published. Where the raw layer no longer holds a pending
commit's Deliveries (``retention.raw``), the history (re)starts from the
projection at the oldest readable version after them (``history.restarted``).
Readers pin the history version that mirrors a publication's lake version
(:func:`history_version`).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator, Mapping
from datetime import datetime
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from combined.errors import LakeError
from combined.lake._files import read_batches, write_data_files
from combined.lake._history_write import IS_CURRENT, VALID_FROM, VALID_TO, history_actions
from combined.lake._layout import LakeLayout
from combined.lake._maintain import reading_version
from combined.lake._table import METADATA_KEY, LakeTable, _files_of, post_commit
from combined.lake._table_schema import _retyped, _union
from combined.lake._types import to_lake, unviewed
from combined.protocol._digest import DigestSet

#: How ``combined sql`` names a dataset's history: ``<source>.<dataset>__history``.
SUFFIX = "__history"
_ID, _OP = "_combined_id", "_combined_op"
_TIME = pa.timestamp("us", tz="UTC")
#: Operations that end an identity's current version without a new one.
_ENDS = ("delete", "truncate")
_log = logging.getLogger("combined.history")


def history_table(layout: LakeLayout, source: str, dataset: str) -> LakeTable:
    """The dataset's history table (app id ``combined-history:<source>/<dataset>``)."""
    return LakeTable(
        layout.history(source, dataset), f"combined-history:{source}/{dataset}", layout.store
    )


def maintain_history(
    layout: LakeLayout,
    source: str,
    dataset: str,
    told: Callable[[dict[str, Any]], None] | None = None,
    before_log: Callable[[], None] | None = None,
) -> list[int]:
    """Mirror every lake commit of the dataset the history lacks, oldest first.

    Returns the lake versions applied (none when the history is up to date).
    Where the raw layer no longer holds a pending commit's Deliveries
    (``retention.raw`` expired them while the history was off or behind),
    the history (re)starts from the projection after them; ``told`` receives
    that decision (the ``history.restarted`` event's body), which is logged too.
    ``before_log`` is called once a mirrored commit's data files are written,
    before its log entry (a crash test's hook).
    """
    history = history_table(layout, source, dataset)
    done = history.committed_sequence()
    pending = [
        meta
        for meta in reversed(layout.dataset_table(source, dataset).commits())
        if int(meta.get("last_sequence") or 0) > done and meta.get("deliveries")
    ]
    gone = [n for n, m in enumerate(pending) if not _in_raw_layer(layout, source, dataset, m)]
    if gone:
        start, files = _readable(layout, source, dataset, pending, gone[-1])
        restart = history.exists()
        _seed(layout, history, source, dataset, pending[start], files, restart=restart)
        at = int(pending[start]["lake_version"])
        decision = {
            "history_restarted_at": at,
            "restart": restart,
            "reason": f"the history {'re' if restart else ''}starts at lake version {at}, "
            f"from the projection: the Deliveries of lake version "
            f"{pending[gone[-1]]['lake_version']} and before are no longer in the raw layer "
            "(removed by retention.raw), so the versions they replaced are not known",
        }
        _log.warning("%s.%s: %s", source, dataset, decision["reason"])
        if told is not None:
            told(decision)
        pending = pending[start + 1 :]
    for meta in pending:
        _apply(layout, history, source, dataset, meta, before_log)
    return [int(m["lake_version"]) for m in pending]


def _readable(
    layout: LakeLayout, source: str, dataset: str, pending: list[dict[str, Any]], first: int
) -> tuple[int, list[str]]:
    """The oldest pending commit from ``first`` on whose rows are still in the lake.

    An old version's files may have been vacuumed by ``combined maintain``
    (unless a kept publication reads it): the newest version always reads.
    Returns its index and the files holding its rows (past maintenance commits).
    """
    table = layout.dataset_table(source, dataset)
    for n in range(first, len(pending)):
        files = table.files(reading_version(table, int(pending[n]["lake_version"])))
        if all(layout.store.exists(f) for f in files):
            return n, files
    raise LakeError(
        f"{source}.{dataset}: the history cannot start: no version of the table from lake "
        f"version {pending[first]['lake_version']} on has all its files",
        hint="run `combined repair`, then capture again",
    )


def history_version(layout: LakeLayout, source: str, dataset: str, lake_version: int) -> int | None:
    """The history table version mirroring the dataset's ``lake_version``.

    None without a history table, or when the history does not hold every
    commit up to that version (history was turned off since, or a commit's
    mirror is still to be applied): readers are then not shown a history
    that disagrees with the projection.
    """
    history = history_table(layout, source, dataset)
    mirrored = [m for m in history.commits() if int(m.get("table_version", -1)) <= lake_version]
    if not mirrored:
        return None
    newest = mirrored[0]
    behind = any(
        int(m["lake_version"]) <= lake_version
        and m.get("deliveries")
        and int(m.get("last_sequence") or 0) > int(newest.get("last_sequence") or 0)
        for m in layout.dataset_table(source, dataset).commits()
    )
    return None if behind else int(newest["lake_version"])


# -- one mirrored commit -------------------------------------------------------------------


def _apply(
    layout: LakeLayout,
    history: LakeTable,
    source: str,
    dataset: str,
    meta: Mapping[str, Any],
    before_log: Callable[[], None] | None = None,
) -> None:
    """Apply one lake commit's transition to the history, in one history commit.

    Copy-on-write (:func:`history_actions`): the files holding a version the
    commit closes are rewritten with it closed, its new versions added.
    """
    from deltalake.exceptions import CommitFailedError

    sequence = int(meta["last_sequence"])
    files = _raw_files(layout, source, dataset, meta)
    at = pa.scalar(datetime.fromisoformat(meta["ingested_at"]), _TIME)
    changes = _change_list(layout, source, dataset, meta)
    properties = _properties(history, meta)
    dt = history.delta()
    if dt is not None and int(dt.transaction_version(history.app_id) or 0) >= sequence:
        return  # mirrored since the caller looked (another process): the write builds on dt
    incoming = _schema(layout, files, dt)
    rows = _rows(layout, files, incoming, at, changes)
    try:
        if dt is None:
            actions = write_data_files(history.path, incoming, rows, history.store)
        else:
            if _retyped(dt, incoming):
                dt = _retype(history, dt, incoming)
            dt = _widened(history, dt, incoming)
            ends = _ends(layout, files, changes)
            actions = history_actions(history.path, dt, incoming, ends, at, rows, history.store)
        # (one commit: the first creates the table; each carries the transaction)
        history._add(dt, incoming, actions, properties, before_log)
    except CommitFailedError as exc:
        if history.committed_sequence() >= sequence:
            return  # a concurrent projection of the same commit won: it holds these versions
        raise LakeError(f"the history commit of {source}.{dataset} conflicted: {exc}") from exc


def _widened(history: LakeTable, dt: Any, schema: pa.Schema) -> Any:
    """The history with ``schema``'s new columns added (null in every version it holds).

    A commit of its own, before the version's (delta-rs' low-level commit
    changes no schema but by overwriting): it carries no transaction and
    changes no version; after a crash, the next try finds the columns there.
    """
    from deltalake import Schema

    current = pa.schema(dt.schema().to_arrow())
    new = [pa.field(f.name, f.type, True) for f in schema if f.name not in current.names]
    if not new:
        return dt
    dt.alter.add_columns(
        list(Schema.from_arrow(pa.schema(new)).fields), post_commithook_properties=post_commit()
    )
    return history.delta()


def _in_raw_layer(layout: LakeLayout, source: str, dataset: str, meta: Mapping[str, Any]) -> bool:
    """Whether the raw layer holds every Delivery with rows of the commit ``meta``."""
    folder = layout.deliveries(source, dataset)
    return all(
        layout.store.exists(layout.store.child(folder, d["file"]))
        for d in meta.get("deliveries") or []
        if int(d["records"])
    )


def _seed(
    layout: LakeLayout,
    history: LakeTable,
    source: str,
    dataset: str,
    meta: Mapping[str, Any],
    files: list[str],
    *,
    restart: bool,
) -> None:
    """Start the history from the projection at the commit ``meta`` (its ``files``).

    Each row is the version current at that commit, since its own acceptance
    (``_combined_ingested_at``, the commit that wrote it); the versions it
    replaced are not known any more. A ``restart`` replaces the history's
    rows (its earlier versions stay readable at their Delta versions).
    """
    schema = layout.dataset_table(source, dataset).schema(int(meta["lake_version"]))
    assert schema is not None
    target = schema.append(pa.field(VALID_FROM, _TIME))
    target = target.append(pa.field(VALID_TO, _TIME)).append(pa.field(IS_CURRENT, pa.bool_()))

    def rows() -> Iterator[pa.RecordBatch]:
        for path in files:
            with pq.ParquetFile(layout.store.open_input(path)) as pf:
                for batch in read_batches(pf, 65_536):
                    since = batch.column("_combined_ingested_at").cast(_TIME)
                    opened = _version(batch, target, pa.scalar(None, _TIME))
                    yield opened.set_column(target.get_field_index(VALID_FROM), VALID_FROM, since)

    actions = write_data_files(history.path, target, rows(), history.store)
    properties = _properties(history, meta, seeded=True, restarted=restart)
    if restart:
        _overwrite(history.delta(), target, actions, properties)
    else:
        history._add(None, target, actions, properties)


def _properties(history: LakeTable, meta: Mapping[str, Any], **extra: Any) -> Any:
    """A history commit's properties: the lake commit it mirrors, keyed by its sequence."""
    from deltalake import CommitProperties, Transaction

    sequence = int(meta["last_sequence"])
    mirrored = {
        "run_id": meta.get("run_id"),
        "table_version": int(meta["lake_version"]),
        "first_sequence": int(meta.get("first_sequence") or 0),
        "last_sequence": sequence,
        "ingested_at": meta["ingested_at"],
        **extra,
    }
    return CommitProperties(
        custom_metadata={METADATA_KEY: json.dumps(mirrored)},
        app_transactions=[Transaction(app_id=history.app_id, version=sequence)],
    )


def _raw_files(layout: LakeLayout, source: str, dataset: str, meta: Mapping[str, Any]) -> list[str]:
    """The raw-layer files of the commit's Deliveries (an empty one may be gone)."""
    out = []
    for d in meta.get("deliveries") or []:
        path = layout.store.child(layout.deliveries(source, dataset), d["file"])
        if layout.store.exists(path):
            out.append(path)
        elif int(d["records"]):
            raise LakeError(
                f"{source}.{dataset}: the history cannot mirror lake version "
                f"{meta['lake_version']}: its Delivery {d['file']} is not in the raw layer",
                hint="restore the file into the raw layer from a backup, then run "
                "`combined repair`",
            )
    return out


def _change_list(
    layout: LakeLayout, source: str, dataset: str, meta: Mapping[str, Any]
) -> pa.Table | None:
    """A full refresh's change list (id, op): its Deliveries hold unchanged rows too."""
    name = meta.get("changes_file")
    if not name:
        return None
    return layout.store.read_table(layout.store.child(layout.deliveries(source, dataset), name))


def _schema(layout: LakeLayout, files: list[str], dt: Any) -> pa.Schema:
    """The history's columns: the table's, then the Deliveries' new ones."""
    delivered = pa.schema([])
    for f in files:
        delivered = _union(delivered, layout.store.parquet_schema(f))
    if dt is not None:
        return _union(pa.schema(dt.schema().to_arrow()), delivered)
    return (
        delivered.append(pa.field(VALID_FROM, _TIME))
        .append(pa.field(VALID_TO, _TIME))
        .append(pa.field(IS_CURRENT, pa.bool_()))
    )


def _rows(
    layout: LakeLayout,
    files: list[str],
    schema: pa.Schema,
    at: pa.Scalar,
    changes: pa.Table | None,
) -> Iterator[pa.RecordBatch]:
    """The commit's new versions: each delivered row, the commit's time, a null ``valid_to``
    and ``is_current`` true (deletes and, in a full refresh, unchanged rows left out)."""
    put: DigestSet | None = None
    if changes is not None:  # a full refresh: only the rows its change list names changed
        ops = changes.column("op").cast(pa.string())
        puts = pc.filter(changes.column(_ID), pc.is_in(ops, pa.array(["insert", "update"])))
        put = DigestSet(puts)  # (built once: a set a batch cost ~0.4 CPU-s at 2M puts)
    for path in files:
        with pq.ParquetFile(layout.store.open_input(path)) as pf:
            for batch in read_batches(pf, 65_536):
                if put is None:
                    op = batch.column(_OP).cast(pa.string())
                    keep = pc.invert(pc.is_in(op, pa.array(list(_ENDS))))
                else:
                    keep = put(batch.column(_ID))
                kept = batch.filter(keep)
                if kept.num_rows:
                    yield _version(kept, schema, at)


def _ends(layout: LakeLayout, files: list[str], changes: pa.Table | None) -> pa.Array | None:
    """The identities whose current version the commit closes.

    Every identity its Deliveries hold (an insert's has none to close), or
    those a full refresh's change list updates or deletes. (None null: the
    ids are looked up sorted, :class:`DigestSet`, only where none is.)
    """
    if changes is not None:
        ops = changes.column("op").cast(pa.string())
        ends = pc.filter(changes.column(_ID), pc.is_in(ops, pa.array(["update", "delete"])))
        return pc.drop_null(ends.combine_chunks())
    ids: list[pa.Array] = []
    for path in files:
        with pq.ParquetFile(layout.store.open_input(path)) as pf:
            for batch in pf.iter_batches(batch_size=65_536, columns=[_ID]):
                ids.append(pc.drop_null(batch.column(0)))
    return pa.concat_arrays(ids) if ids else None


def _version(batch: pa.RecordBatch, schema: pa.Schema, at: pa.Scalar) -> pa.RecordBatch:
    n = batch.num_rows
    marks = {
        VALID_FROM: pa.repeat(at, n),
        VALID_TO: pa.nulls(n, _TIME),
        IS_CURRENT: pa.repeat(pa.scalar(True), n),
    }
    arrays = [*batch.columns, *marks.values()]
    names = [*batch.schema.names, *marks]
    return to_lake(pa.RecordBatch.from_arrays(arrays, names=names), schema)


def _retype(history: LakeTable, dt: Any, schema: pa.Schema) -> Any:
    """Rewrite the history in the widened column types (the projection's were too).

    Delta widens no column in place. This commit changes no version (it
    carries no transaction): repeated after a crash, it rewrites the same rows.
    Streamed file by file into new files, then one overwrite in the new schema.
    """
    target = _union(pa.schema(dt.schema().to_arrow()), schema)

    def rows() -> Iterator[pa.RecordBatch]:
        for path in _files_of(dt):
            with pq.ParquetFile(history.store.open_input(path)) as pf:
                for batch in read_batches(pf, 65_536, threads=False):
                    yield to_lake(unviewed(batch), target)

    actions = write_data_files(history.path, target, rows(), history.store)
    _overwrite(dt, target, actions)
    return history.delta()


def _overwrite(dt: Any, schema: pa.Schema, actions: list[Any], properties: Any = None) -> None:
    """One commit replacing every file of the history by ``actions``', in ``schema``."""
    from deltalake import Schema

    dt.create_write_transaction(
        actions,
        mode="overwrite",
        schema=Schema.from_arrow(schema),
        commit_properties=properties,
        post_commithook_properties=post_commit(),
    )
