"""Where things live in the lake."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from combined._owner_only import private_dir
from combined.errors import LakeNotWritable, StagingLimitExceeded
from combined.lake._probe import check_store
from combined.lake._store import LakeStore

if TYPE_CHECKING:
    from combined.lake._table import LakeTable


@dataclass(frozen=True)
class LakeLayout:
    """Locations of the projection tables, the raw layer, quarantine, usage and staging.

    ``root`` is a local directory (an absolute path) or an object-store URL
    (see :class:`LakeStore`); locations are strings under it. Run staging is
    always local: under the lake for a local lake, else under ``staging_root``
    (the project's ``.combined/staging``).
    """

    root: str | Path
    staging_root: Path | None = None
    store: LakeStore = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "store", LakeStore.at(self.root))

    def table(self, source: str, dataset: str) -> str:
        """The Delta table of a dataset's current projection."""
        return self.store.join(source, dataset)

    def dataset_table(self, source: str, dataset: str) -> LakeTable:
        """The dataset's Delta table with its commit protocol (app id ``combined:<s>/<d>``)."""
        from combined.lake._table import LakeTable

        return LakeTable(self.table(source, dataset), f"combined:{source}/{dataset}", self.store)

    def reading_table(self, source: str, dataset: str) -> LakeTable:
        """:meth:`dataset_table` for a read alone (``status``, ``sql``, ``publications``,
        ``--as-of``), never a commit: its log's requests bounded as the ledger's
        (:data:`~combined.lake._store.SMALL_REQUESTS`), so a store that never answers
        is told in about 20 s, not after delta-rs' 180 s of retries. A commit keeps
        those: they ride out a burst of 503 SlowDown."""
        from combined.lake._table import LakeTable

        app_id = f"combined:{source}/{dataset}"
        return LakeTable(self.table(source, dataset), app_id, self.store, small=True)

    def deliveries(self, source: str, dataset: str) -> str:
        """The raw layer: committed Deliveries of a dataset."""
        return self.store.join("_deliveries", source, dataset)

    def quarantine(self, source: str, dataset: str) -> str:
        """Quarantined records of a dataset."""
        return self.store.join("_quarantine", source, dataset)

    def usage(self, source: str, dataset: str) -> str:
        """The Delta table of a dataset's billed identities (MAR)."""
        return self.store.join("_usage", source, dataset)

    def usage_table(self, source: str, dataset: str) -> LakeTable:
        """The dataset's MAR table (app id ``combined-usage:<s>/<d>``)."""
        from combined.lake._table import LakeTable

        return LakeTable(
            self.usage(source, dataset), f"combined-usage:{source}/{dataset}", self.store
        )

    def history(self, source: str, dataset: str) -> str:
        """The Delta table of every version of a dataset's rows (``history: true``)."""
        return self.store.join("_history", source, dataset)

    def staging_area(self) -> Path:
        """The local directory holding every Run's staging."""
        if not self.store.remote:
            return Path(self.store.root) / "_staging"
        if self.staging_root is None:
            raise LakeNotWritable(
                f"the lake at {self.store.root} is in an object store and no local "
                "staging directory was given"
            )
        return self.staging_root

    def staging(self, run_id: str) -> Path:
        """The run-scoped staging directory (always on this machine)."""
        return self.staging_area() / run_id

    def ensure_writable(self) -> None:
        """Fail early, with a clear error, when the lake cannot be written."""
        if self.store.remote:
            check_store(self.store)
            return
        root = Path(self.store.root)
        try:
            # Owner-only, so every table, Delivery and staged file beneath is too.
            private_dir(root)
            for area in ("_staging", "_quarantine", "_deliveries", "_usage", "_history"):
                private_dir(root / area)
            probe = root / f".write-probe-{os.getpid()}"
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as exc:
            raise _not_writable(root, str(exc.strerror)) from exc

    def check_writable(self) -> None:
        """:meth:`ensure_writable`'s question, creating nothing in a local lake
        (``combined check``): a lake not made yet is writable where its nearest existing
        directory is. An object store is asked as a capture asks it (a probe object
        written and deleted)."""
        if self.store.remote:
            check_store(self.store)
            return
        root = Path(self.store.root)
        nearest = root
        while not nearest.exists() and nearest != nearest.parent:
            nearest = nearest.parent
        if not nearest.is_dir():
            raise _not_writable(root, f"{nearest} is not a directory")
        if not os.access(nearest, os.W_OK | os.X_OK):
            raise _not_writable(root, f"{nearest} cannot be written")


def _not_writable(root: Path, why: str) -> LakeNotWritable:
    """The error of a local lake at ``root`` that cannot be written, for ``why``."""
    return LakeNotWritable(
        f"the lake at {root} is not writable: {why}",
        hint="set `lake:` in combined.yaml to a directory you can write, or fix its permissions",
    )


def confined(base: Path, relative: str, max_length: int) -> Path:
    """``base / relative``, refusing paths that escape ``base`` or are too long."""
    target = (base / relative).resolve()
    base_resolved = base.resolve()
    if base_resolved != target and base_resolved not in target.parents:
        raise StagingLimitExceeded(
            f"the staging path {relative!r} escapes the run's staging directory",
            hint="dataset and file names must not contain '..' or absolute paths",
        )
    if len(str(target)) > max_length:
        raise StagingLimitExceeded(
            f"the staging path {target} is longer than {max_length} characters",
            hint="raise staging.max_path_length in combined.yaml or use a shorter lake path",
        )
    return target
