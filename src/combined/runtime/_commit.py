"""Commit: a prepared transition's Deliveries, verified, made one idempotent Delta commit.

The commit carries the checkpoint and the metadata the projection is built
from; the checkpoint barrier (:mod:`combined.runtime._barrier`) decided at
staging which checkpoint it may carry. A retried commit finds its sequences
committed and changes nothing. Once committed, the Deliveries move from the
Run's staging into the raw layer (:func:`promote`), which keeps them; what
the table will not hold byte for byte is put there before the commit writes
a row (:func:`_keep_raw`).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from combined.delivery import StagedDelivery
from combined.errors import DeliveryAltered, LakeError, ProtocolViolation
from combined.lake import LakeLayout, link_or_copy, linked_name
from combined.lake._files import read_batches
from combined.lake._positions import LakePositions
from combined.lake._probe import store_failure
from combined.runtime._faults import arm_commit_watchdog, fault
from combined.runtime._plan import Prepared, Staged, table_of


def verified(prepared: Sequence[Prepared]) -> Sequence[Prepared]:
    """``prepared``, once every staged Delivery of the Run is still what was recorded.

    Each Delivery's bytes are checked against its recorded size and sha256,
    and its rows against its record count, before the Run's first commit: an
    altered one (bytes changed, rows added) raises DeliveryAltered naming it,
    and the Run commits nothing.
    """
    deliveries = [d for p in prepared for d in p.deliveries]
    # Two at a time: sha256 releases the GIL, and this check is all the
    # process does between its Deliveries and its commit (~0.1 s a 100 MB).
    with ThreadPoolExecutor(max_workers=2, thread_name_prefix="verify") as pool:
        problems = list(pool.map(_alteration, deliveries))
    for d, problem in zip(deliveries, problems, strict=True):
        if problem is not None:
            raise DeliveryAltered(
                f"{d.source}.{d.dataset}: Delivery {d.id} (sequence {d.sequence}, "
                f"{d.path.name}) {problem} since it was staged; this run committed nothing",
                hint="find what changed the run's staging directory, then capture again: "
                "the next capture stages the rows anew",
            )
    return prepared


def _alteration(d: StagedDelivery) -> str | None:
    """How a staged Delivery differs from its record, or None."""
    from combined.delivery._staging import file_hash

    try:
        if d.path.stat().st_size != d.byte_count or file_hash(d.path) != d.content_hash:
            return "no longer holds the bytes it was recorded with (size and sha256)"
        rows = pq.read_metadata(d.path).num_rows
    except FileNotFoundError:
        return "is gone from the run's staging"
    except (OSError, pa.ArrowInvalid):
        return "is no longer a readable Parquet file"
    if rows != d.record_count:
        return f"holds {rows} records, not the {d.record_count} recorded"
    return None


def commit(prepared: Prepared, layout: LakeLayout) -> tuple[int | None, datetime | None]:
    """One lake commit for the dataset's transition; returns (lake version, acceptance time)."""
    plan = prepared.staged.plan
    table = table_of(layout, plan)
    if not prepared.deliveries:
        return table.pinned().version(), None  # (the version the Run's steps read)
    ingested_at = datetime.fromisoformat(prepared.metadata["ingested_at"])
    paths = [d.path for d in prepared.deliveries]
    schema = pq.read_schema(str(paths[0]))

    def reader() -> pa.RecordBatchReader:
        return pa.RecordBatchReader.from_batches(schema, _read(paths))

    result = table.commit(
        first_sequence=prepared.deliveries[0].sequence,
        last_sequence=prepared.deliveries[-1].sequence,
        mode=prepared.mode,  # type: ignore[arg-type]
        data=reader,
        # Delivery files are final: an append commits them as the table's files.
        files=[(d.path, d.stats, d.content_hash) for d in prepared.deliveries if d.stats]
        if all(d.stats is not None for d in prepared.deliveries)
        else None,
        metadata=prepared.metadata,
        needs_merge=prepared.needs_merge,
        before_rows=functools.partial(_keep_raw, layout, prepared),
        before_write=arm_commit_watchdog,
        before_log=lambda: fault("before_log"),
    )
    if result.skipped and result.run_id != prepared.metadata["run_id"]:
        # Another run committed these sequences first (it held the dataset when
        # this one lost its lease): the lake holds its Deliveries, not ours.
        # Projecting, billing or acknowledging ours would describe rows the
        # lake never received and move the checkpoint past what it holds.
        first, last = prepared.deliveries[0].sequence, prepared.deliveries[-1].sequence
        by = f"run {result.run_id}" if result.run_id else "another writer"
        raise ProtocolViolation(
            f"{plan.source}.{plan.name}: delivery sequences {first}..{last} were committed "
            f"by {by} (lake version {result.lake_version}), not by this run; this run's "
            "Deliveries were discarded and nothing of it was published or acknowledged",
            hint="capture again: the next run starts from what the lake holds",
        )
    # The acceptance time is the one stamped on the rows and in the commit metadata.
    return result.lake_version, ingested_at if not result.skipped else result.committed_at


def keep_position(layout: LakeLayout, staged: Staged) -> None:
    """Keep the checkpoint of a read that changed no row beside its table (``lake._positions``).

    Before the source is acknowledged, as a commit would be; no lake version, no Delivery.
    """
    assert staged.state is not None and staged.after is not None
    plan = staged.plan
    LakePositions(layout).keep(plan.source, plan.name, staged.after, staged.state, staged.position)


def _keep_raw(layout: LakeLayout, prepared: Prepared, linked: bool) -> None:
    """Put into the raw layer, before the commit writes a row, what the table cannot give back.

    Deliveries the commit links into the table are table files byte for
    byte, and the raw layer is completed from those if the Run's staging is
    lost after the commit (:func:`complete_raw_layer`). The Deliveries of a
    commit that writes rows of its own (a merge, a retyped table), and the
    change list of any commit, are nowhere else: they are put now, so a
    machine lost with its staging between the lake commit and
    :func:`promote` loses nothing. Every such file is named uniquely (a
    Delivery by its id, a change list by a random part): if the commit
    never lands they are orphans (``retention.orphans``), and another Run
    never puts a file under a name this one's commit holds.
    """
    plan = prepared.staged.plan
    paths = [] if linked else [d.path for d in prepared.deliveries]
    changes = prepared.metadata.get("changes_file")
    if changes:
        paths.append(prepared.deliveries[0].path.with_name(str(changes)))
    if not paths:
        return
    store = layout.store
    try:
        store.makedirs(layout.deliveries(plan.source, plan.name))
        for path in paths:
            _keep(store, path, raw_location(layout, plan.source, plan.name, path.name))
    except OSError as exc:
        raise store_failure(
            f"{plan.source}.{plan.name}: its Deliveries could not be put into the raw layer "
            f"({layout.deliveries(plan.source, plan.name)}) before the lake commit",
            exc,
            "nothing was committed; the next capture stages the rows again",
        ) from exc


def _keep(store: Any, path: Path, target: str) -> None:
    """``path`` at ``target``: whole or absent (an object, or :func:`_link_whole`)."""
    if store.remote:
        store.put(path, target)
        return
    _link_whole(path, target, "partial")


def _link_whole(source: Path, target: str, suffix: str) -> None:
    """A local file at ``target``, whole or absent: linked (or copied) to a hidden
    ``.NAME.SUFFIX`` beside it, then renamed (orphan detection knows both suffixes)."""
    partial = Path(target).with_name(f".{Path(target).name}.{suffix}")
    partial.unlink(missing_ok=True)  # an interrupted one's
    link_or_copy(source, partial)
    os.replace(partial, target)


def _read(paths: list[Path]) -> Iterator[pa.RecordBatch]:
    for path in paths:
        pf = pq.ParquetFile(str(path))
        try:
            yield from read_batches(pf, 65_536)
        finally:
            pf.close()


def raw_location(layout: LakeLayout, source: str, dataset: str, file: str) -> str:
    """Where a committed Delivery (or transition file) lives in the raw layer."""
    return layout.store.child(layout.deliveries(source, dataset), file)


def promote(
    layout: LakeLayout,
    staging_root: Path,
    source: str,
    dataset: str,
    files: list[str],
    hashes: Mapping[str, str] | None = None,
) -> None:
    """Move committed files from the run's staging into the raw layer (idempotent).

    Into an object store a file is copied server-side from the table file
    holding the same bytes (``hashes``: a file's sha256, the name of its
    linked table file), else uploaded; each object whole or absent.
    """
    store = layout.store
    store.makedirs(layout.deliveries(source, dataset))
    for name in files:
        src = staging_root / source / dataset / "deliveries" / name
        dst = raw_location(layout, source, dataset, name)
        if not src.exists() or store.exists(dst):
            continue
        digest = (hashes or {}).get(name)
        if store.remote and digest and _copy_linked(layout, source, dataset, digest, src):
            src.unlink()
        else:
            store.move_in(src, dst)


def _copy_linked(layout: LakeLayout, source: str, dataset: str, digest: str, src: Path) -> bool:
    """Copy the table file holding ``src``'s bytes into the raw layer, server-side.

    That file is named after the bytes' sha256 ``digest`` (:func:`linked_name`)
    and must have ``src``'s size; False when no such file is there (the
    commit rewrote the rows, or the table was compacted and vacuumed since).
    """
    store = layout.store
    table_file = store.child(layout.table(source, dataset), linked_name(digest))
    try:
        if not store.exists(table_file) or store.size(table_file) != src.stat().st_size:
            return False
        store.copy(table_file, raw_location(layout, source, dataset, src.name))
    except OSError:
        return False
    return True


def _restore_from_table(
    layout: LakeLayout, source: str, dataset: str, d: Mapping[str, Any], lake_version: int
) -> bool:
    """Put a committed Delivery missing from staging back into the raw layer from the table.

    A Delivery committed by linking is a table data file byte for byte: when
    its staging copy is gone (recovery erased the staging of a Run that had
    stalled inside its commit), the table file with its size and sha256 is
    linked into the raw layer under the Delivery's name (found by name when
    it is named after its bytes, else by reading the table's files). False
    when no table file holds its bytes (a rewrite commit re-encoded its rows).
    """
    store = layout.store
    dst = raw_location(layout, source, dataset, d["file"])
    named = store.child(layout.table(source, dataset), linked_name(d["content_hash"]))
    files = layout.dataset_table(source, dataset).files(lake_version)
    for file in sorted(files, key=lambda f: f != named):
        try:
            if store.size(file) != int(d["bytes"]) or store.sha256(file) != d["content_hash"]:
                continue
        except OSError:
            continue
        if store.remote:
            store.copy(file, dst)  # server-side; an object is whole or absent
            return True
        _link_whole(Path(file), dst, "restoring")
        return True
    return False


def complete_raw_layer(
    layout: LakeLayout, source: str, dataset: str, meta: Mapping[str, Any]
) -> tuple[set[str], set[str]]:
    """Check every committed file of ``meta`` is in the raw layer, restoring what can be.

    Returns the Deliveries without rows that are gone (a quiet stream's, which
    only carried a position): no table file holds them, and no row or MAR
    depends on them; and the files a ``retention.raw`` removed, as the lake's
    ledger records (their commit was billed before). Any other missing file
    raises LakeError.
    """
    here = functools.partial(raw_location, layout, source, dataset)
    absent = [d for d in meta.get("deliveries") or [] if not layout.store.exists(here(d["file"]))]
    changes = meta.get("changes_file")
    names = [changes] if changes and not layout.store.exists(here(changes)) else []
    expired: set[str] = set()
    if absent or names:
        # Removed by a decision (not restored from the table, which would undo it).
        from combined.lake._ledger import Ledger

        gone = Ledger(layout).expired(source, dataset)
        expired = {n for n in [*(d["file"] for d in absent), *names] if n in gone}
        names = [n for n in names if n not in expired]
    version = int(meta["lake_version"])
    missing = [
        d
        for d in absent
        if d["file"] not in expired and not _restore_from_table(layout, source, dataset, d, version)
    ]
    empty = {d["file"] for d in missing if int(d["records"]) == 0}
    names += [d["file"] for d in missing if d["file"] not in empty]
    if names:
        raise LakeError(
            f"{source}.{dataset}: lake version {meta['lake_version']} (run {meta['run_id']}) "
            f"committed {', '.join(names)}, which neither its run's staging nor the raw layer "
            f"holds ({layout.deliveries(source, dataset)}); the lake holds the rows, but the "
            "raw layer and MAR cannot be completed from it",
            hint="restore the files into the raw layer from a backup, then run `combined repair`",
        )
    return empty, expired
