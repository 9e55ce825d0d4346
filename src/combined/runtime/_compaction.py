"""Compaction a capture triggers itself once its table holds too many small files.

Small: under ``lake._maintain.SMALL_FILE_BYTES`` (1 MiB), what many small
captures leave; a large snapshot's Deliveries are not, and never trigger it.

It runs after the Run is published, under the dataset's lease, so readers
already see the capture and no other Run of the dataset commits meanwhile:
the capture is slower by the compaction's own cost and nothing else (a
table below its threshold costs one read of the table's log). A compaction
that fails leaves the table as it was: it is told in the Activity feed and
the Run stays as it ended.
"""

from __future__ import annotations

from combined.catalog import Catalog
from combined.catalog import data as cat
from combined.config._retention import DEFAULT_COMPACT_FILES
from combined.lake import LakeLayout
from combined.lake._maintain import compact, small_file_count


def compact_if_due(
    catalog: Catalog,
    layout: LakeLayout,
    source: str,
    dataset: str,
    run_id: str,
    threshold: int | None,
) -> None:
    """Compact the dataset's table when it holds more small data files than ``threshold``."""
    limit = threshold or DEFAULT_COMPACT_FILES
    table = layout.dataset_table(source, dataset)
    try:
        files = small_file_count(table.pinned())
        if files <= limit:
            return
        done = compact(
            table, f"{files} small data files, more than retention.compact_files {limit}"
        )
    except Exception as exc:  # noqa: BLE001 - the Run's own result stands
        _tell(catalog, "maintenance.compaction_failed", source, dataset, run_id, error=repr(exc))
        return
    if done is not None:
        _tell(
            catalog,
            "maintenance.compacted",
            source,
            dataset,
            run_id,
            trigger="capture",
            threshold=limit,
            **vars(done),
        )


def _tell(
    catalog: Catalog, kind: str, source: str, dataset: str, run_id: str, **body: object
) -> None:
    """One Activity event about the Run's dataset (its text redacted by ``emit``)."""
    with catalog.begin() as conn:
        cat.emit(conn, kind, source=source, dataset=dataset, run_id=run_id, **body)
