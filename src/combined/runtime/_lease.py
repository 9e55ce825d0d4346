"""Lease: a Run takes its datasets' leases, renewed from a thread while it executes (the heartbeat).

Only the Run that holds a dataset's lease commits to it; a recovery that
projects a dataset's lake commits holds it under a ``repair:`` name.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from datetime import timedelta

from combined.catalog import Catalog
from combined.errors import ProtocolViolation
from combined.runtime._beat import Beating
from combined.runtime._deadline import env_seconds

#: The lease holder prefix of a recovery projecting a dataset's lake commits.
REPAIR = "repair:"


def acquire(catalog: Catalog, source: str, dataset: str, run_id: str, ttl: timedelta) -> bool:
    """Take the dataset's lease; waits (up to a minute) while a repair projects it."""
    deadline = time.monotonic() + 60
    while not catalog.acquire_lease(source, dataset, run_id, ttl):
        holder = catalog.lease_holder(source, dataset) or ""
        if not holder.startswith(REPAIR) or time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


class LeaseKeeper(Beating):
    """Renews a Run's dataset leases from a thread until stopped (the heartbeat).

    A lease that expires lets another Run take the dataset and lets recovery
    treat this one as dead; renewing it every ``ttl / 5`` keeps a long Run's
    datasets its own. :meth:`require` renews at once and raises when the
    lease went to another Run meanwhile (a process stalled past the TTL):
    the Run must then neither commit nor acknowledge.
    """

    def __init__(
        self, catalog: Catalog, run_id: str, datasets: Sequence[tuple[str, str]], ttl_s: float
    ) -> None:
        super().__init__(f"lease-{run_id[:8]}", ttl_s / 5)
        self.catalog = catalog
        self.run_id = run_id
        self.datasets = list(datasets)
        self.ttl = timedelta(seconds=ttl_s)
        self._lost: set[tuple[str, str]] = set()

    def _renew(self, datasets: Sequence[tuple[str, str]]) -> list[tuple[str, str]]:
        """Renew the leases of ``datasets`` in one catalog transaction; those lost."""
        asked = [d for d in datasets if d not in self._lost]
        lost = [d for d in datasets if d in self._lost]
        if asked:
            gone = self.catalog.renew_leases(asked, self.run_id, self.ttl)
            self._lost.update(gone)  # never re-taken: another Run may hold them now
            lost += gone
        return lost

    def beat(self) -> bool:
        """Renew every lease of the Run (a failed renewal is tried again next beat)."""
        try:
            self._renew(self.datasets)
        except Exception:  # noqa: BLE001 - a failed beat is retried; require() decides
            pass
        return False

    def require(self, source: str, dataset: str, tries: int = 3) -> None:
        """Renew the dataset's lease now; raise ProtocolViolation when it was lost."""
        self.require_all([(source, dataset)], tries)

    def require_all(self, datasets: Sequence[tuple[str, str]], tries: int = 3) -> None:
        """Renew the leases of ``datasets`` now; raise ProtocolViolation when one was lost.

        In one catalog transaction (a Run about to publish 200 datasets
        renewed them in 200). A catalog that fails to answer is asked
        ``tries`` times (a busy SQLite file, a PostgreSQL restart) before its
        error ends the Run.
        """
        from combined.runtime._retry import retrying

        lost = retrying(tries)(self._renew, datasets)
        if lost:
            source, dataset = lost[0]
            holder = self.catalog.lease_holder(source, dataset)
            raise ProtocolViolation(
                f"run {self.run_id} lost its lease on {source}.{dataset}"
                + (f" to run {holder}" if holder else "")
                + " (it stalled past the lease's time to live); nothing more of it "
                "is committed or acknowledged",
                hint="capture again once no other run holds the dataset",
            )


__all__ = ["REPAIR", "LeaseKeeper", "acquire"]


def lease_ttl() -> float:
    """Seconds a dataset lease outlives its last renewal (``COMBINED_LEASE_TTL_S``, 300)."""
    return env_seconds("COMBINED_LEASE_TTL_S", 300.0)
