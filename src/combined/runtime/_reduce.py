"""Reduce: one dataset's staged capture against the lake's current state, to its transition.

The reduction (``combined.capture._reduce``, out of core) yields the
transition: inserts, updates and deletes by stable identity. A capture with
duplicated keys is held in quarantine instead. :func:`prepare` then has the
transition written as Deliveries (:mod:`combined.runtime._deliver`) and
names the dataset version it makes, ready to commit.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from datetime import UTC, datetime
from decimal import Decimal
from functools import partial
from typing import Any

import pyarrow as pa

from combined.capture._lake_fills import EventLake
from combined.capture._reduce import Reducer, Transition
from combined.catalog import Catalog, VersionTotals, version_id
from combined.catalog import data as cat
from combined.delivery import StagingArea
from combined.errors import CaptureError, CombinedError, DuplicateKeys, LakeError, NotFoundError
from combined.lake import LakeLayout, LakeTable
from combined.lake._probe import read_failure
from combined.protocol import _provenance as prov
from combined.protocol._digest import Digest, digest_of
from combined.runtime._deliver import Writing, Written, commit_metadata, deliver
from combined.runtime._memory import release_memory
from combined.runtime._plan import DatasetPlan, Prepared, Staged, table_of
from combined.runtime._quarantine import quarantine_duplicates
from combined.runtime._reporter import Reporter


def prepare(
    staged: Staged,
    *,
    run_id: str,
    admission_id: str,
    producer: str,
    area: StagingArea,
    layout: LakeLayout,
    memory_limit: int,
    catalog: Catalog,
    reporter: Reporter,
) -> Prepared:
    """Reduce the staged capture to its transition and write it as Deliveries.

    A reduction that runs out of its memory fails saying what gets through.
    """
    plan = staged.plan
    table = table_of(layout, plan).pinned()
    schema = table.schema()
    reporter.phase(plan.name, "reducing")
    w = Writing(
        area=area,
        run_id=run_id,
        producer=producer,
        accepted_at=datetime.now(UTC),
        row=_dataset_row(catalog, plan),
        baseline=not table.exists(),
        digest=_digest(plan, schema, staged.schema),
    )
    with _memory_said(plan, memory_limit, layout.store.root if layout.store.remote else None):
        reducer = _reducer(staged, table, schema, layout, memory_limit, w)
        # At most two tasks beside this thread: a first baseline's duplicate
        # check (its ids' prefixes) and its digests.
        side = ThreadPoolExecutor(max_workers=2, thread_name_prefix="transition")
        try:
            # A first baseline's Deliveries are encoded while its ids are checked.
            ahead = reducer.all_new and reducer.prefixes_ahead(side)
            if not ahead and reducer.duplicates(limit=1):
                _hold_duplicates(reducer, staged, run_id=run_id, layout=layout, catalog=catalog)
            # A first baseline's counts are known from its staged parts; its
            # digests follow on a second connection while its Deliveries are
            # encoded (neither needs the other).
            transition = reducer.counts_all_new() if reducer.all_new else reducer.reduce()
            if staged.by_value is not None:
                staged.compared = "values" if reducer.compared_by_value else "digests"
            if reducer.soft is not None and (staged.full or staged.bounded) and not reducer.has_op:
                _count_live(staged, reducer)
            written = deliver(reducer, staged, transition, table, w, side, reporter)
            if ahead and reducer.duplicates(limit=1):
                # (its Deliveries, never committed, are erased with the Attempt's staging)
                _hold_duplicates(reducer, staged, run_id=run_id, layout=layout, catalog=catalog)
            if reducer.all_new:
                transition = (
                    written.pending.result() if written.pending is not None else reducer.reduce()
                )
            content = reducer.full_content_xor() if plan.sync_mode == "full_refresh" else None
        finally:
            side.shutdown(wait=True)  # before its connection closes, whatever failed
            reducer.close()
            # Give the batches' buffers back before the commit allocates its own.
            release_memory()
    return _prepared(staged, transition, written, content, admission_id, catalog, w)


@contextmanager
def _memory_said(plan: DatasetPlan, memory_limit: int, lake: str | None = None) -> Iterator[None]:
    """A reduction that runs out of its memory fails saying what gets through; one whose
    read of an object-store lake (``lake``, its URL) the store failed, as that store's
    failure (a lake error: a traceback was the Run's error, and it was not retried)."""
    import duckdb  # (the reduction's)

    try:
        yield
    except duckdb.OutOfMemoryException as exc:
        raise _out_of_memory(plan, memory_limit, exc) from exc
    except (duckdb.Error, OSError) as exc:
        if lake is None or lake not in str(exc):
            raise
        raise read_failure(
            f"{plan.source}.{plan.name}: the reduction could not read the lake's table; "
            "nothing was committed",
            OSError(_store_words(exc)),
        ) from exc


def _store_words(exc: BaseException) -> str:
    """The store's own line of an error DuckDB raised around it (a Python traceback of
    the filesystem it called, then its SQL): the ``OSError`` line, else the first."""
    lines = str(exc).splitlines()
    said = [line.removeprefix("OSError: ") for line in lines if line.startswith("OSError: ")]
    return said[0] if said else (lines[0] if lines else type(exc).__name__)


def _out_of_memory(plan: DatasetPlan, memory_limit: int, exc: Exception) -> CaptureError:
    """What to do when the reduction ran out of its memory (DuckDB's error, its first line)."""
    said = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    hint = "raise reduction_memory in combined.yaml (for example to 1GiB) and capture again"
    if plan.strategy == "cdc":
        hint += (
            f", or drain the stream in smaller captures (combined cdc follow {plan.source} "
            "--max-changes 50000)"
        )
    return CaptureError(
        f"{plan.source}.{plan.name}: the reduction ran out of its memory "
        f"(reduction_memory: {memory_limit // 2**20} MiB): {said}",
        hint=hint + "; nothing was committed",
    )


def _reducer(
    staged: Staged,
    table: LakeTable,
    schema: pa.Schema | None,
    layout: LakeLayout,
    memory_limit: int,
    w: Writing,
) -> Reducer:
    """The reduction of the staged capture against the table's current files.

    An event stream's (``append``) table is not its current rows: the
    capture is never compared with it, and only the values its changes left
    unchanged are read from it (``events``: each id's newest event).
    ``schema``: the table's, which may hold columns the capture lacks
    (dropped at the source: ``capture._dropped``).
    """
    plan = staged.plan
    spill = w.area.path(f"{plan.source}/{plan.name}/spill/.keep").parent
    append = plan.sync_mode == "append"
    return Reducer(
        capture_files=staged.parts,
        capture_schema=staged.schema,
        current_files=[] if append else table.files(),
        lake_schema=None if append else schema,
        gone=_gone(staged),
        key=plan.key,
        strategy=plan.strategy,
        sync_mode=plan.sync_mode,
        memory_limit=memory_limit,
        spill_dir=spill,
        baseline=w.baseline,
        full=staged.full,
        current_filter=staged.current_filter,
        lake=layout.store,
        digest=w.digest,
        deletes=plan.deletes,
        dataset=f"{plan.source}.{plan.name}",
        same=staged.same_as_committed,
        # (staged unhashed, to be compared with the lake's rows by value: capture._values)
        values=staged.by_value,
        events=partial(_event_lake, table) if append else None,
    )


def _gone(staged: Staged) -> list[str]:
    """The columns the source dropped while the capture read changes that held them (an
    evolved drop its rows still hold: null in every change read after the drop).

    Only where the source's columns at the read's end are known and lack
    them: one added again under its name is a new column, whose nulls are
    values (``capture._dropped``).
    """
    if staged.fields is None:
        return []
    drops = [e for e in staged.drift if e["class"] == "drop" and e["outcome"] == "evolve"]
    held, now = staged.schema.names, staged.fields
    return [e["field"] for e in drops if e["field"] in held and e["field"] not in now]


def _event_lake(table: LakeTable) -> EventLake:
    """An event stream's table: its files, and the sequence of each Delivery its
    commits record, by id (a Delivery's rows name it: ``_combined_delivery_id``)."""
    sequences = {
        str(d["id"]): int(d["sequence"])
        for meta in table.commits()
        for d in meta.get("deliveries") or []
        if d.get("id") is not None and d.get("sequence") is not None
    }
    return EventLake(table.files(), sequences)


def _hold_duplicates(
    reducer: Reducer, staged: Staged, *, run_id: str, layout: LakeLayout, catalog: Catalog
) -> None:
    """Hold the rows of duplicated keys in quarantine; raise DuplicateKeys naming the entry."""
    plan = staged.plan
    qid, held = quarantine_duplicates(
        reducer, staged, run_id=run_id, layout=layout, catalog=catalog
    )
    try:
        reducer.check_duplicates(f"{plan.source}.{plan.name}")
    except DuplicateKeys as exc:
        where = (
            f"its rows are held in quarantine entry {qid}"
            if held
            else f"the same rows already await review in quarantine entry {qid}, "
            "so this capture was not held again"
        )
        cause = _duplicates_cause(reducer, staged)
        raise DuplicateKeys(
            f"{exc.message}; {where}",
            hint=f"{cause} (`combined quarantine show {qid}` lists the rows)",
            **exc.context,
            quarantine=qid,
            cause=cause,
        ) from None


def every_held(held: Sequence[DuplicateKeys], then: CombinedError | None = None) -> DuplicateKeys:
    """One error naming every dataset of a Run held for duplicate keys (each in its
    quarantine entry: :func:`_hold_duplicates`), and ``then``, the failure that stopped
    the Run's reads before its last dataset."""
    if len(held) == 1 and then is None:
        return held[0]
    told = " ".join(f"({n}) {exc.message}." for n, exc in enumerate(held, 1))
    causes = "; ".join(dict.fromkeys(str(exc.context.get("cause", exc.hint)) for exc in held))
    shows = ", ".join(f"`combined quarantine show {exc.context.get('quarantine')}`" for exc in held)
    hint = f"{causes} ({shows} list the rows)"
    if then is not None:
        hint += f"; the Run's reads then stopped: {then.message}"
    return DuplicateKeys(
        f"{len(held)} datasets of the Run hold duplicate keys: {told}"
        if len(held) > 1
        else held[0].message,
        hint=hint,
        duplicates=sum(int(exc.context.get("duplicates") or 0) for exc in held),
    )


def _duplicates_cause(reducer: Reducer, staged: Staged) -> str:
    """What to do about the duplicated keys: the read's own word where it turned distinct
    values of a key column into NULL (MariaDB's zero dates), else the source's key."""
    told = getattr(staged.extraction, "null_key_hint", None)
    nulled = reducer.null_key_columns() if told is not None else []
    hint = told(nulled) if told is not None and nulled else None
    return hint or (
        "fix the key in the source or declare a key that is unique; a table with no "
        "key at all (repeated rows): `key: []` with strategy: snapshot identifies each "
        "row by its content and keeps the repeats"
    )


def _count_live(staged: Staged, reducer: Reducer) -> None:
    """A whole (or bounded) capture's source counts less its flagged rows: the live rows.

    Reconciliation compares the source's rows (and control totals, read in
    the same snapshot) with the lake's, which holds no row a soft-delete flag marks.
    """
    control = staged.control
    column = control.get("sum_column") if control else None
    rows, total = reducer.flagged(column)
    if not rows:
        return
    staged.rows -= rows
    if control is not None:
        live = {**control, "rows": int(control["rows"]) - rows}
        if column and control.get("sum") is not None and total is not None:
            live["sum"] = str(Decimal(str(control["sum"])) - Decimal(str(total)))
        staged.control = live


def _digest(plan: DatasetPlan, lake: pa.Schema | None, staged: pa.Schema) -> Digest:
    """The digest format of the dataset's table (v1 hex or v2 binary), as staging used it.

    A table keeps the format it was created with; staging read it from the
    same table when the capture began. A table created or replaced in
    between with the other format is refused, never written in two formats.
    """
    digest = digest_of(lake)
    if prov.ID in staged.names and digest_of(staged) != digest:
        raise LakeError(
            f"{plan.source}.{plan.name}: the lake table's identity encoding changed during "
            "the capture (another writer created or replaced it); nothing was committed",
            hint="capture again",
        )
    return digest


def _dataset_row(catalog: Catalog, plan: DatasetPlan) -> Any | None:
    """The dataset's catalog row (None before its first capture registers it).

    Read once per prepare: the dataset's lease keeps every other writer of it
    away until the commit, so neither its schema nor its version moves meanwhile.
    """
    with catalog.begin() as conn:
        try:
            return cat.get_dataset(conn, plan.source, plan.name)
        except NotFoundError:
            return None


def _prepared(
    staged: Staged,
    transition: Transition,
    written: Written,
    content: tuple[int, int] | None,
    admission_id: str,
    catalog: Catalog,
    w: Writing,
) -> Prepared:
    """The transition, its Deliveries and its commit's metadata, ready to commit."""
    plan = staged.plan
    version = _next_version(catalog, w.row, plan, transition, bool(written.deliveries), content)
    metadata = commit_metadata(
        staged,
        transition,
        written,
        version,
        run_id=w.run_id,
        admission_id=admission_id,
        accepted_at=w.accepted_at,
    )
    mode = {"incremental": "merge", "append": "append", "full_refresh": "overwrite"}[plan.sync_mode]
    # (an event stream's updates and deletes are events appended like its inserts: its
    # Deliveries are linked as they are, their rows in the stream's order)
    needs_merge = (
        not w.baseline
        and plan.sync_mode != "append"
        and (transition.updates > 0 or transition.deletes > 0)
    )
    return Prepared(
        staged=staged,
        transition=transition,
        deliveries=written.deliveries,
        changes_path=written.changes_path,
        metadata=metadata,
        mode=mode,
        needs_merge=needs_merge,
    )


def _next_version(
    catalog: Catalog,
    row: Any | None,
    plan: DatasetPlan,
    transition: Transition,
    delivered: bool,
    content: tuple[int, int] | None,
) -> dict[str, Any]:
    """The dataset version the transition makes: its parent's totals moved by the transition.

    ``content`` is a replacement's whole content digest (its rows are the
    version's); a transition that changes nothing keeps the parent version.
    """
    parent_id = row.current_version if row is not None else None
    with catalog.begin() as conn:
        parent = cat.get_version(conn, parent_id) if parent_id else None
    parent_count = int(parent.row_count) if parent is not None else 0
    parent_lo, parent_hi = _split(parent.content_digest if parent is not None else None)
    if content is not None:
        lo, hi = content
        row_count = transition.captured
    else:
        lo = parent_lo ^ transition.content_xor[0]
        hi = parent_hi ^ transition.content_xor[1]
        row_count = parent_count + transition.inserts - transition.deletes
        if plan.sync_mode == "append":
            row_count = parent_count + transition.appended  # every event is kept
    totals = VersionTotals(row_count=row_count, content_digest=f"{hi:016x}{lo:016x}")
    # An event stream's truncate changes no identity, yet the lake keeps it as an event.
    kept = plan.sync_mode == "append" and transition.appended > 0
    changed = delivered and (transition.changes > 0 or content is not None or kept)
    if content is not None and transition.changes == 0 and parent is not None:
        changed = False
    vid = (
        version_id(f"{plan.source}.{plan.name}", parent_id, transition.digest, totals)
        if changed
        else parent_id
    )
    return {
        "id": vid,
        "parent": parent_id,
        "row_count": totals.row_count,
        "content_digest": totals.content_digest,
    }


def _split(digest: str | None) -> tuple[int, int]:
    if not digest:
        return 0, 0
    return int(digest[16:], 16), int(digest[:16], 16)
