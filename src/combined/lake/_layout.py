"""Where things live in the lake."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from combined._owner_only import private_dir
from combined.errors import LakeNotWritable, StagingLimitExceeded

if TYPE_CHECKING:
    from combined.lake._table import LakeTable


@dataclass(frozen=True, slots=True)
class LakeLayout:
    """Paths of the projection tables, the raw layer, quarantine, usage and staging.

    ``root`` is a local directory (an absolute path). Object stores are the
    same layout under a URL; the commit protocol relies on their conditional put.
    """

    root: Path

    def table(self, source: str, dataset: str) -> Path:
        """The Delta table of a dataset's current projection."""
        return self.root / source / dataset

    def dataset_table(self, source: str, dataset: str) -> LakeTable:
        """The dataset's Delta table with its commit protocol (app id ``combined:<s>/<d>``)."""
        from combined.lake._table import LakeTable

        return LakeTable(self.table(source, dataset), f"combined:{source}/{dataset}")

    def deliveries(self, source: str, dataset: str) -> Path:
        """The raw layer: committed Deliveries of a dataset."""
        return self.root / "_deliveries" / source / dataset

    def quarantine(self, source: str, dataset: str) -> Path:
        """Quarantined records of a dataset."""
        return self.root / "_quarantine" / source / dataset

    def usage(self, source: str, dataset: str) -> Path:
        """The Delta table of a dataset's billed identities (MAR)."""
        return self.root / "_usage" / source / dataset

    def staging(self, run_id: str) -> Path:
        """The run-scoped staging directory."""
        return self.root / "_staging" / run_id

    def ensure_writable(self) -> None:
        """Fail early, with a clear error, when the lake cannot be written."""
        try:
            # Owner-only, so every table, Delivery and staged file beneath is too.
            private_dir(self.root)
            for area in ("_staging", "_quarantine", "_deliveries", "_usage"):
                private_dir(self.root / area)
            probe = self.root / f".write-probe-{os.getpid()}"
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as exc:
            raise LakeNotWritable(
                f"the lake at {self.root} is not writable: {exc.strerror}",
                hint="set `lake:` in combined.yaml to a directory you can write, "
                "or fix its permissions",
            ) from exc


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
