"""Requeue: a Run whose worker died is retried by itself, bounded, never over its commits.

Recovery (:mod:`combined.runtime._recover`) ends a Run whose process died
``failed``. When that process was a worker (the Run waited in the queue and a
worker took it: its ``run.taken`` event), no command is there to say so or to
run it again: a scheduled dataset waited for its next tick, a Run queued by
hand or through the API was lost until someone noticed. So, in the
transaction that ends it, the Run is retried: a Run with trigger
``recovery``, ``retry_of`` the dead Run, under the dead Run's own admission,
waiting in the queue for any worker. Left out of the retry are:

- a dataset the dead Run committed to before it died: recovery projected
  that commit (its Deliveries, version and MAR, once); reading it again
  would capture it twice, and the next capture publishes it;
- a dataset a newer Run captures (queued or running: the retry joins it,
  ``run.joined``, as a scheduled tick does) or captured (succeeded since);
- a dataset no longer in the project file.

A Run whose worker died ``budget`` times over its chain of automatic
retries (it and the Runs before it, through ``retry_of``, while each was a
``recovery`` retry or a retry a source deferred with ``RetryLater``) is not
retried again: it stays failed, its error and ``run.interrupted`` say why,
and ``alert.run_retries_exhausted`` says so, once (no retry follows to fire
it again). Only deaths count: a source asking again and again to wait
(``Retry-After`` past its ceiling: a rate limit, a quota) is paced by that
source, costs it one request a retry, and may last as long as it asks; but a
chain alternating between a dying worker and ``RetryLater`` is cut off at
its ``budget``-th death, where counting the deaths since the last deferral
(in a row) never ended it. A retry by hand (``combined run retry``) starts
a new chain. A Run a command executed itself (``combined capture``) is not
retried: that command's own exit told its caller.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from combined.catalog import Catalog, Run
from combined.catalog import _schema as t
from combined.catalog import data as cat
from combined.catalog import runs as runs_repo


@dataclass(frozen=True, slots=True)
class Requeued:
    """What ending a dead worker's Run did about it: its retry, the Runs it joined, or why none."""

    #: How many times a worker died executing it and the automatic retries before it.
    deaths: int
    budget: int
    #: How many of those retries a source deferred (``RetryLater``) rather than a death.
    deferred: int = 0
    retry: Run | None = None
    #: The queued or running Runs that capture some of its datasets already, with those datasets.
    joined: tuple[tuple[str, tuple[str, ...]], ...] = ()
    #: Why (some of) its datasets are not retried.
    left: tuple[str, ...] = ()
    #: Not retried because workers died ``budget`` times executing it and its retries.
    exhausted: bool = False

    def told(self) -> str:
        """What became of it, as the end of its error says."""
        said = list(self.left)
        if self.retry is not None:
            said.append(
                f"run {self.retry.id} retries {', '.join(self.retry.datasets)} "
                f"(automatic retry {self.deaths} of {self.budget - 1})"
            )
        said += [
            f"run {run_id}, already queued or running, captures {', '.join(datasets)}"
            for run_id, datasets in self.joined
        ]
        return "; ".join(said)

    def body(self) -> dict[str, Any]:
        """The fields ``run.interrupted`` records about it."""
        return {
            "retry": self.retry.id if self.retry else None,
            "joined": [run_id for run_id, _ in self.joined],
            "deaths": self.deaths,
            "budget": self.budget,
            **({"deferred": self.deferred} if self.deferred else {}),
            **({"not_retried": "; ".join(self.left)} if self.left else {}),
        }


def requeue(
    catalog: Catalog,
    conn: Connection,
    run: Run,
    *,
    declared: Collection[tuple[str, str]],
    committed: Collection[str],
    budget: int,
    ttl: timedelta,
) -> Requeued | None:
    """Retry the dead ``run`` in ``conn`` (before it is ended there); None if no worker took it.

    ``declared``: the project's (source, dataset); ``committed``: the datasets
    it committed to before it died.
    """
    from combined.runtime._scheduler import admit_or_join

    if not _taken(conn, run):
        return None
    deaths, deferred = _chain(conn, run)
    gone = {d for d in run.datasets if (run.source, d) not in declared}
    done = _done_since(conn, run) | gone
    rest = [d for d in run.datasets if d not in committed and d not in done]
    left = _left_out(run, committed, done, gone)
    if not rest or deaths >= budget:
        if rest:
            left.append(_spent(run, deaths, deferred))
        return Requeued(deaths, budget, deferred, left=tuple(left), exhausted=bool(rest))
    parts = admit_or_join(
        catalog,
        conn,
        source=run.source,
        datasets=rest,
        trigger="recovery",
        admission=runs_repo.get_admission(conn, run.admission_id),
        ttl=ttl,
        retry_of=run.id,
    )
    return Requeued(
        deaths,
        budget,
        deferred,
        retry=next((p.run for p in parts if not p.joined), None),
        joined=tuple((p.run.id, p.datasets) for p in parts if p.joined),
        left=tuple(left),
    )


def _spent(run: Run, deaths: int, deferred: int) -> str:
    """Why ``run`` is not retried once its retries are spent, and what to do."""
    waits = f" (its source also asked {deferred} times to wait: RetryLater)" if deferred else ""
    return (
        f"not retried: its worker died {deaths} times over this run and the automatic "
        f"retries before it{waits}, as many as automatic retries allow; find what ends it "
        f"(memory, the machine), then `combined run retry {run.id}`"
    )


def _left_out(
    run: Run, committed: Collection[str], done: Collection[str], gone: Collection[str]
) -> list[str]:
    """Why some datasets of ``run`` are not retried."""
    said = []
    mine = [d for d in run.datasets if d in committed]
    if mine:
        said.append(
            f"not retried: {', '.join(mine)} (committed before it died: a retry would capture "
            "it twice)"
        )
    newer = [d for d in run.datasets if d in done and d not in committed and d not in gone]
    if newer:
        said.append(f"not retried: {', '.join(newer)} (a newer run captured it since)")
    removed = [d for d in run.datasets if d in gone and d not in committed]
    if removed:
        said.append(f"not retried: {', '.join(removed)} (no longer in the project file)")
    return said


def _taken(conn: Connection, run: Run) -> bool:
    """Whether a worker took ``run`` from the queue (a ``run.taken`` event since it was queued)."""
    return bool(
        cat.activity(
            conn, limit=1, kind="run.taken", run_id=run.id, since=run.created_at, exact=True
        )
    )


def _chain(conn: Connection, run: Run) -> tuple[int, int]:
    """How many times a worker died executing ``run`` and the automatic retries before it,
    and how many of those retries a source deferred (``RetryLater``); in one query.

    The chain is followed back through ``retry_of`` while a Run retried itself: a
    ``recovery`` retry (the Run before it died) or a deferred one (trigger ``retry``
    with a ``not_before``: the Run before it ended ``RetryLater``). A retry by hand
    (``combined run retry``, no ``not_before``) starts a new chain.
    """
    runs, before = t.runs, t.runs.alias("before")
    columns = (runs.c.id, runs.c.trigger, runs.c.retry_of, runs.c.not_before)
    chain = sa.select(*columns).where(runs.c.id == run.id).cte("chain", recursive=True)
    automatic = sa.or_(
        chain.c.trigger == "recovery",
        sa.and_(chain.c.trigger == "retry", chain.c.not_before.is_not(None)),
    )
    chain = chain.union_all(
        sa.select(*(before.c[c.name] for c in columns)).where(
            before.c.id == chain.c.retry_of, automatic
        )
    )
    rows = conn.execute(sa.select(chain.c.trigger, chain.c.not_before)).all()
    deaths = 1 + sum(r.trigger == "recovery" for r in rows)
    deferred = sum(r.trigger == "retry" and r.not_before is not None for r in rows)
    return deaths, deferred


def _done_since(conn: Connection, run: Run) -> set[str]:
    """The datasets of ``run`` a Run queued after it captured (it succeeded)."""
    rows = conn.execute(
        sa.select(t.runs.c.datasets).where(
            t.runs.c.source == run.source,
            t.runs.c.created_at > run.created_at,
            t.runs.c.state == "succeeded",
        )
    ).all()
    return {d for row in rows for d in row.datasets if d in run.datasets}


__all__ = ["Requeued", "requeue"]
