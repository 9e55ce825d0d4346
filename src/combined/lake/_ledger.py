"""The governance ledger: publications, their Runs and admissions, kept in the lake.

``<lake>/_combined/publications`` is an append-only Delta table, one row per
publication: its id, number, instant, Runs and members, and each Run with the
admission it executed under (the redacted configuration body and digest). A
publication is written here *before* the catalog transaction that makes it
visible commits, so the lake always holds every publication the catalog
does; ``combined repair`` on an empty catalog restores them (with their Runs
and admissions) from it. A publication whose catalog transaction then failed
leaves a row whose number the next publication takes again: the later row
of a number wins. Beside it: every ended Run (``runs``), every quarantine entry
(``quarantine``), every raw-layer retention decision (``expired``) and every
dataset reset (``resets``), each as it last was.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import Any

import pyarrow as pa

from combined.lake._layout import LakeLayout
from combined.lake._probe import store_failure
from combined.lake._table import LakeTable

_SCHEMA = pa.schema([("seq", pa.int64()), ("id", pa.string()), ("body", pa.string())])
#: The ledger's tables, each under ``<lake>/_combined/``.
LEDGER_TABLES = ("publications", "runs", "quarantine", "expired", "resets")


class Ledger:
    """The lake's record of publications and quarantine entries (see the module)."""

    def __init__(self, layout: LakeLayout) -> None:
        self.layout = layout

    def table(self, name: str) -> LakeTable:
        """The ledger table ``name`` (one of :data:`LEDGER_TABLES`)."""
        store = self.layout.store
        return LakeTable(store.join("_combined", name), "", store, small=True)

    def _append(self, name: str, key: str, record: Mapping[str, Any]) -> None:
        """Append one record (a Delta commit of its own) to the ledger table ``name``."""
        body = json.dumps({**record, "written_ns": time.time_ns()}, default=str, sort_keys=True)
        seq = int(record.get("seq") or 0)
        batch = pa.record_batch(
            [pa.array([seq]), pa.array([key]), pa.array([body])], schema=_SCHEMA
        )
        from deltalake.exceptions import DeltaError

        table = self.table(name)
        try:
            create = not table.exists()
            table.append_batches(_SCHEMA, iter([batch]), create=create, metadata={"ledger": name})
        except (OSError, DeltaError) as exc:
            # Written before the catalog records the same thing: nothing of it was recorded.
            raise store_failure(
                f"the lake's ledger ({table.path}) could not be written",
                exc,
                "`combined repair` (or the next capture) ends any Run this left unfinished",
            ) from None

    def _latest(self, name: str, key: str) -> dict[Any, dict[str, Any]]:
        """Each key's newest record in the ledger table ``name``."""
        table = self.table(name)
        newest: dict[Any, dict[str, Any]] = {}
        for path in table.files():
            for record in map(json.loads, table.store.read_table(path).column("body").to_pylist()):
                k = record[key]
                if k not in newest or record["written_ns"] > newest[k]["written_ns"]:
                    newest[k] = record
        return newest

    def publication(self, record: Mapping[str, Any]) -> None:
        """Keep one publication's record."""
        self._append("publications", str(record["id"]), record)

    def quarantine(self, row: Mapping[str, Any]) -> None:
        """Keep a quarantine entry as it now is (the newest record of an entry wins)."""
        self._append("quarantine", str(row["id"]), row)

    def run(self, record: Mapping[str, Any] | None) -> None:
        """Keep an ended Run with its admission (the newest record of a Run wins)."""
        if record is not None:
            self._append("runs", str(record["run"]["id"]), {**record, "id": record["run"]["id"]})

    def expiry(self, source: str, dataset: str, files: list[str], **decision: Any) -> None:
        """Keep a decision to remove Delivery files from the raw layer (``retention.raw``):
        a lake commit whose files it names is then complete without them.

        ``files`` are named within the dataset's raw layer, as commits name them:
        a lake moved or restored elsewhere still finds them.
        """
        key = f"{source}.{dataset}"
        self._append("expired", key, {"key": key, "files": files, **decision})

    def expired(self, source: str, dataset: str) -> set[str]:
        """The files of ``source.dataset``'s raw layer that a retention removed."""
        key = f"{source}.{dataset}"
        table = self.table("expired")
        if not table.exists():
            return set()
        out: set[str] = set()
        for path in table.files():
            for record in map(json.loads, table.store.read_table(path).column("body").to_pylist()):
                if record.get("key") == key:
                    # (a record's first form named paths: their file names are the same)
                    paths = record.get("paths") or []
                    out.update(record.get("files") or [p.rsplit("/", 1)[-1] for p in paths])
        return out

    def reset(self, record: Mapping[str, Any]) -> None:
        """Keep a dataset's reset (``combined reset``): the table versions it forgot."""
        self._append("resets", str(record["id"]), record)

    def resets(self) -> list[dict[str, Any]]:
        """Every reset the lake holds."""
        return list(self._latest("resets", "id").values())

    def runs(self) -> list[dict[str, Any]]:
        """Every ended Run the lake holds, with its admission, as it last was."""
        return list(self._latest("runs", "id").values())

    def records(self) -> list[dict[str, Any]]:
        """Every publication the lake holds, by number (the later row of a number wins)."""
        by_seq = self._latest("publications", "seq")
        return [by_seq[s] for s in sorted(by_seq)]

    def quarantine_entries(self) -> list[dict[str, Any]]:
        """Every quarantine entry the lake holds, as it last was."""
        return list(self._latest("quarantine", "id").values())
