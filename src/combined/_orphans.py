"""Orphaned files of one dataset: reported by ``combined maintain``, removed only by decision.

A file is an orphan when, under the dataset's lease (no Run of it writes):

- it is in the dataset's table, raw layer (``_deliveries/``), MAR
  (``_usage/``) or history (``_history/``) directory (never quarantine,
  never staging);
- no version of the Delta log it belongs to names it (added, or removed by
  a later commit: vacuum's to decide), nor, for the raw layer, any commit of
  the dataset's table nor any Delivery the catalog records (in any state);
- no Run of the dataset is still unended: a Run whose process died may be
  one recovery has still to close, and a stalled one may yet commit its
  files (``combined repair`` closes a dead one; its files are judged after);
- it is older than the grace (its modification time): a writer that holds
  no lease here (a process of another catalog sharing the lake, one stalled
  past its lease) may be about to commit a file it has just written.

Without ``retention.orphans`` (``forever``) they are reported (count,
bytes, the oldest, the setting that would remove them) and told once as
``maintenance.orphans_found``; nothing is removed. With it, the decision is
recorded first (``maintenance.orphans_removed``: the files, a bounded
list, and the policy), then the files are deleted; a crash in between leaves
files the next ``maintain`` finds and removes again.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from combined.catalog import Catalog
from combined.catalog import data as cat
from combined.catalog import runs as runs_repo
from combined.config._retention import FOREVER, MIN_ORPHAN_GRACE, Retention
from combined.config._values import format_duration
from combined.lake import LakeLayout
from combined.lake._orphans import (
    LakeFile,
    LogIncomplete,
    listed,
    log_versions,
    moved_on,
    referenced,
    unnamed,
)

#: The files an Activity event names (the count says how many more).
NAMED = 100


@dataclass
class Finding:
    """A dataset's orphans, each with the Delta table whose log was read to judge it."""

    files: list[tuple[LakeFile, str, int]] = field(default_factory=list)
    #: Why a directory (or the whole dataset) was not judged.
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class _Judged:
    """Whose files are judged, as of when, under which retention."""

    catalog: Catalog
    layout: LakeLayout
    source: str
    dataset: str
    retention: Retention
    #: Files modified before this are old enough to be judged.
    before: datetime


def orphans(
    catalog: Catalog,
    layout: LakeLayout,
    source: str,
    dataset: str,
    retention: Retention,
    now: datetime,
) -> dict[str, Any]:
    """Find the dataset's orphans; remove them when ``retention.orphans`` says so. A report."""
    grace = MIN_ORPHAN_GRACE if retention.orphans == FOREVER else retention.orphans
    assert isinstance(grace, timedelta)
    unended = unended_run(catalog, source, dataset)
    if unended is not None:
        return {"found": 0, "bytes": 0, "oldest": None, "removed": 0, "not_judged": [unended]}
    judged = _Judged(catalog, layout, source, dataset, retention, now - grace)
    finding = find(judged)
    files = sorted((f for f, _, _ in finding.files), key=lambda f: f.modified)
    report: dict[str, Any] = {
        "found": len(files),
        "bytes": sum(f.size for f in files),
        "oldest": files[0].modified.isoformat() if files else None,
        "removed": 0,
    }
    if finding.notes:
        report["not_judged"] = finding.notes
    if not files:
        return report
    if retention.orphans == FOREVER:
        report["setting"] = _setting(files, now)
        _tell_found(judged, files, report["setting"])
        return report
    report["removed"] = _remove(judged, finding)
    return report


def unended_run(catalog: Catalog, source: str, dataset: str) -> str | None:
    """Why the dataset is not judged while a Run of it has not ended, or None."""
    with catalog.begin() as conn:
        runs = runs_repo.list_runs(
            conn, limit=10_000, states=["extracting", "committing"], source=source
        )
    run = next((r for r in runs if dataset in r.datasets), None)
    if run is None:
        return None
    return (
        f"run {run.id} has not ended ({run.state}): files it wrote may still be committed; "
        "`combined repair` closes it if its process died"
    )


def find(judged: _Judged) -> Finding:
    """The dataset's files modified before ``judged.before`` that nothing names."""
    layout, source, dataset = judged.layout, judged.source, judged.dataset
    store, finding = layout.store, Finding()
    table = layout.table(source, dataset)
    usage, history = layout.usage(source, dataset), layout.history(source, dataset)
    # (folder, the table whose log names its files, whether it is the raw layer)
    areas = [
        (table, table, False),
        (usage, usage, False),
        (history, history, False),
        (layout.deliveries(source, dataset), table, True),  # named by the table's commits
    ]
    logs: dict[str, tuple[set[str], set[str], int] | None] = {}
    for folder, log_of, raw in areas:
        old = [f for f in listed(store, folder) if f.modified < judged.before]
        if not old:
            continue
        if log_of not in logs:
            logs[log_of] = _read_log(layout, log_of, folder, finding)
        read = logs[log_of]
        if read is None:
            continue
        paths, raw_names, head = read
        left = unnamed(old, raw_names if raw else paths)
        if raw and left:  # (and no Delivery the catalog records: read only when needed)
            left = unnamed(left, _recorded(judged.catalog, source, dataset))
        finding.files += [(f, log_of, head) for f in left]
    return finding


def _read_log(
    layout: LakeLayout, table: str, folder: str, finding: Finding
) -> tuple[set[str], set[str], int] | None:
    """The paths and raw-layer files a table's whole log names, and its head.

    None, told in ``finding``'s notes, when it names nothing that can be relied
    on: no log at all (a first commit killed before it: the files are judged
    once the table has one), or one that does not start at version 0.
    """
    store, where = layout.store, _relative(layout, folder)
    try:
        versions = log_versions(store, table)
        if not versions:
            of = "" if folder == table else f" ({_relative(layout, table)})"
            finding.notes.append(f"{where}: its table{of} has no Delta log yet")
            return None
        paths, raw_names = referenced(store, table, versions)
    except LogIncomplete as exc:
        finding.notes.append(f"{where}: {exc}; what it once named cannot be told")
        return None
    return paths, raw_names, versions[-1]


def _recorded(catalog: Catalog, source: str, dataset: str) -> set[str]:
    """The raw-layer file names of every Delivery the catalog records of the dataset."""
    with catalog.begin() as conn:
        rows = cat.deliveries(conn, source=source, dataset=dataset)
    return {str(d.path).replace("\\", "/").rsplit("/", 1)[-1] for d in rows if d.path}


def _setting(files: list[LakeFile], now: datetime) -> str:
    """The ``retention.orphans`` that would remove every file found: the youngest one's age."""
    youngest = max(f.modified for f in files)
    days = max(1, (now - youngest) // timedelta(days=1))
    return f"retention.orphans: {days}d"


def _relative(layout: LakeLayout, location: str) -> str:
    """A location relative to the lake's root, for reports and events."""
    root = str(layout.store.root).rstrip("/")
    return location[len(root) + 1 :].replace("\\", "/") if location.startswith(root) else location


def _event(judged: _Judged, kind: str, files: list[LakeFile], **body: Any) -> None:
    """Tell ``kind`` of the dataset's ``files``: how many, their bytes, the oldest, the first."""
    with judged.catalog.begin() as conn:
        cat.emit(
            conn,
            kind,
            source=judged.source,
            dataset=judged.dataset,
            count=len(files),
            bytes=sum(f.size for f in files),
            oldest=min(f.modified for f in files).isoformat(),
            files=[_relative(judged.layout, f.location) for f in files[:NAMED]],
            more=max(0, len(files) - NAMED),
            modified_before=judged.before.isoformat(),
            policy=judged.retention.describe("orphans"),
            **body,
        )


def _tell_found(judged: _Judged, files: list[LakeFile], setting: str) -> None:
    """``maintenance.orphans_found``, once: again only when the count or bytes changed."""
    with judged.catalog.begin() as conn:
        last = cat.activity(
            conn,
            limit=1,
            kind="maintenance.orphans_found",
            source=judged.source,
            dataset=judged.dataset,
            exact=True,
        )
    told = (last[0].body or {}) if last else {}
    if (told.get("count"), told.get("bytes")) == (len(files), sum(f.size for f in files)):
        return
    _event(
        judged,
        "maintenance.orphans_found",
        files,
        would_remove_with=setting,
        reason="no commit names them (a writer stopped before its commit); kept, as "
        "retention.orphans is forever",
    )


def _remove(judged: _Judged, finding: Finding) -> int:
    """Record the decision, then delete the orphans; how many went.

    A table whose log moved on since it was read (a writer outside this
    lease committed meanwhile) keeps its files until the next maintenance.
    """
    store = judged.layout.store
    moved = {t for _, t, head in finding.files if moved_on(store, t, head)}
    files = sorted((f for f, t, _ in finding.files if t not in moved), key=lambda f: f.modified)
    if not files:
        return 0
    grace = judged.retention.orphans
    assert isinstance(grace, timedelta)
    _event(
        judged,
        "maintenance.orphans_removed",
        files,
        reason=f"no commit names them and they are older than {format_duration(grace)}, "
        f"under {judged.retention.describe('orphans')}",
    )
    for f in files:
        store.delete(f.location)
    return len(files)
