"""Compaction a capture triggers itself once a table holds too many small files.

Small: under ``lake._maintain.SMALL_FILE_BYTES`` (1 MiB), what many small
captures leave; a large snapshot's Deliveries are not, and never trigger it.
Every table a capture appends to is counted: the dataset's own, its MAR table
(``_usage/``: one billing commit a capture), its history (``history: true``)
and the lake's ledger (``_combined/``: a Run and a publication record each).
Left alone, each of them grew a file a capture, and each capture read them
all again (MAR's billing read the month's every usage file: a capture of a
small table took 0.14 s at first and ~0.3 s after 600 captures).

A capture's compaction reads and writes files of at most
``CAPTURE_TARGET_BYTES`` (2 MiB): its cost is bounded by the small files it
merges, never the table's size. ``combined maintain`` compacts to the
table's full target.

It runs after the Run is published, under the dataset's lease, so readers
already see the capture and no other Run of the dataset commits meanwhile:
the capture is slower by the compaction's own cost and nothing else (a
table below its threshold costs one read of its log). A compaction that
fails leaves the table as it was: it is told in the Activity feed and the
Run stays as it ended. The ledger is the lake's, not a dataset's: another
Run may append to it meanwhile (appends never conflict with a compaction),
and two Runs compacting it at once leave it to the one that commits first.
"""

from __future__ import annotations

from combined.catalog import Catalog
from combined.catalog import data as cat
from combined.config._retention import DEFAULT_COMPACT_FILES
from combined.lake import LakeLayout
from combined.lake._history import history_table
from combined.lake._ledger import LEDGER_TABLES, Ledger
from combined.lake._maintain import CAPTURE_TARGET_BYTES, compact, small_file_count
from combined.lake._table import LakeTable


def compact_if_due(
    catalog: Catalog,
    layout: LakeLayout,
    source: str,
    dataset: str,
    run_id: str,
    threshold: int | None,
    *,
    history: bool = False,
) -> None:
    """Compact each of the dataset's tables holding more small files than ``threshold``.

    The dataset's table is counted at every capture (the Run loaded it
    anyway); its MAR table and history, at most a file a commit, at one
    table version in a quarter of the threshold: an object store is not
    asked for their logs at each capture.
    """
    limit = threshold or DEFAULT_COMPACT_FILES
    data = layout.dataset_table(source, dataset).pinned()
    _compact(catalog, data, limit, "data", source=source, dataset=dataset, run_id=run_id)
    if (data.version() or 0) % max(1, limit // 4):
        return
    others = [("usage", layout.usage_table(source, dataset))]
    if history:
        others.append(("history", history_table(layout, source, dataset)))
    for kind, table in others:
        _compact(catalog, table, limit, kind, source=source, dataset=dataset, run_id=run_id)


#: The ledger is counted at one publication (by its number) in this many.
LEDGER_EVERY = DEFAULT_COMPACT_FILES // 4


def compact_ledger_at(
    catalog: Catalog, layout: LakeLayout, run_id: str, publication_id: str | None
) -> None:
    """:func:`compact_ledger_if_due` at one publication in :data:`LEDGER_EVERY` (by its number)."""
    if publication_id is None:
        return
    with catalog.begin() as conn:
        published = cat.get_publication(conn, publication_id=publication_id)
    if published is not None and int(published.seq) % LEDGER_EVERY == 0:
        compact_ledger_if_due(catalog, layout, run_id)


def compact_ledger_if_due(catalog: Catalog, layout: LakeLayout, run_id: str) -> None:
    """Compact each table of the lake's ledger holding more small files than the default."""
    ledger = Ledger(layout)
    for name in LEDGER_TABLES:
        _compact(
            catalog, ledger.table(name), DEFAULT_COMPACT_FILES, f"ledger {name}", run_id=run_id
        )


def _compact(
    catalog: Catalog,
    table: LakeTable,
    limit: int,
    kind: str,
    *,
    run_id: str,
    source: str | None = None,
    dataset: str | None = None,
) -> None:
    """Compact ``table`` if it holds more than ``limit`` small files; tell what was done."""
    try:
        files = small_file_count(table)
        if files <= limit:
            return
        reason = f"{files} small data files, more than retention.compact_files {limit}"
        done = compact(table, reason, target=CAPTURE_TARGET_BYTES)
    except Exception as exc:  # noqa: BLE001 - the Run's own result stands
        _tell(
            catalog,
            "maintenance.compaction_failed",
            source,
            dataset,
            run_id,
            table=kind,
            error=repr(exc),
        )
        return
    if done is not None:
        _tell(
            catalog,
            "maintenance.compacted",
            source,
            dataset,
            run_id,
            trigger="capture",
            table=kind,
            threshold=limit,
            **vars(done),
        )


def _tell(
    catalog: Catalog,
    kind: str,
    source: str | None,
    dataset: str | None,
    run_id: str,
    **body: object,
) -> None:
    """One Activity event about a table the Run appended to (its text redacted by ``emit``)."""
    with catalog.begin() as conn:
        cat.emit(conn, kind, source=source, dataset=dataset, run_id=run_id, **body)
