"""Managing change data capture: setup, status, teardown and the follow loop.

These drive a source's :class:`~combined.connectors.abc.ChangeSource`
methods for every dataset declared with ``strategy: cdc``; the change stream
itself is captured by ordinary Runs.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from combined.catalog import Run
from combined.connectors.abc import ChangeSource
from combined.errors import ConfigError
from combined.runtime._gap import GAP

if TYPE_CHECKING:
    from combined.engine import Engine


def cdc_datasets(engine: Engine, source: str) -> list[tuple[str, str]]:
    """(dataset, relation) of every ``cdc`` dataset of ``source``."""
    src = engine.project.source(source)
    out = [(name, d.relation) for name, d in src.datasets.items() if d.strategy == "cdc"]
    if not out:
        raise ConfigError(
            f"source {source} declares no dataset with strategy cdc",
            hint="set `strategy: cdc` on the datasets to capture from the change stream",
        )
    return out


def _change_source(engine: Engine, source: str) -> Any:
    conn = engine.open_source(source)
    if not type(conn).SUPPORTS_CDC or not isinstance(conn, ChangeSource):
        conn.close()
        raise ConfigError(
            f"the {type(conn).name} connector of source {source} cannot capture changes",
            hint="use strategy snapshot or cursor for this source",
        )
    return conn


def setup(engine: Engine, source: str) -> tuple[list[str], Run]:
    """Create the publications, then run the stitched first capture (slot, snapshot, LSN)."""
    datasets = cdc_datasets(engine, source)
    conn = _change_source(engine, source)
    try:
        notes = [
            conn.cdc_setup(relation, committed=engine.committed_checkpoint(source, name))
            for name, relation in datasets
        ]
    finally:
        conn.close()
    (run,) = engine.capture([f"{source}.{name}" for name, _ in datasets])
    return notes, run


def status(engine: Engine, source: str) -> list[dict[str, Any]]:
    """Each cdc dataset's stream status next to the lake's committed position."""
    datasets = cdc_datasets(engine, source)
    conn = _change_source(engine, source)
    try:
        out = []
        for name, relation in datasets:
            committed = engine.committed_checkpoint(source, name)
            held = (committed or {}).get(GAP)  # refused until a new snapshot (runtime._gap)
            out.append(
                {
                    "dataset": f"{source}.{name}",
                    **conn.cdc_status(relation, committed=committed),
                    "held": held,
                }
            )
        return out
    finally:
        conn.close()


def undeclared(engine: Engine, source: str) -> list[dict[str, Any]]:
    """The source's streams no declared dataset owns (a PostgreSQL slot a dataset removed
    from the project left, holding the server's WAL back); none where a source has none."""
    datasets = cdc_datasets(engine, source)
    conn = _change_source(engine, source)
    try:
        listed = getattr(conn, "cdc_undeclared", None)
        return [] if listed is None else list(listed([relation for _, relation in datasets]))
    finally:
        conn.close()


def teardown(engine: Engine, source: str) -> list[str]:
    """Drop slots and publications and void the checkpoints (the next capture re-snapshots)."""
    datasets = cdc_datasets(engine, source)
    conn = _change_source(engine, source)
    notes = []
    try:
        for name, relation in datasets:
            committed = engine.committed_checkpoint(source, name)
            notes.append(f"{source}.{name}: {conn.cdc_teardown(relation, committed=committed)}")
            version = engine.reset_checkpoint(source, name, "cdc teardown")
            if version is not None:
                notes.append(
                    f"{source}.{name}: checkpoint voided at lake version {version}; "
                    "the next capture takes a new snapshot and reconciles it with the lake"
                )
    finally:
        conn.close()
    return notes


#: The longest pause of :func:`follow` after captures that failed in a row.
MAX_FOLLOW_PAUSE_S = 300.0


def follow(
    engine: Engine,
    source: str,
    *,
    every: float,
    max_changes: int | None = None,
    iterations: int | None = None,
    stop: Callable[[], bool] | None = None,
    waiting: Callable[[float, int], object] | None = None,
    failed: int = 0,
) -> Iterator[Run]:
    """Capture and publish the stream every ``every`` seconds or ``max_changes`` changes.

    After a capture whose Run failed (a source down, its lease held), the
    next waits twice as long as the last did, up to :data:`MAX_FOLLOW_PAUSE_S`
    (``waiting`` hears the pause and how many failed in a row): an outage of
    an hour is not a failed Run every few seconds. A capture that succeeds
    brings ``every`` back. ``failed``: how many failed in a row before (a follower
    started afresh in place carries its count on).
    """
    names = [f"{source}.{name}" for name, _ in cdc_datasets(engine, source)]
    options: dict[str, Any] = {"max_changes": max_changes} if max_changes else {}
    done = 0
    if failed:  # (started afresh in place right after a failed capture: its pause first)
        if waiting is not None:
            waiting(follow_pause(every, failed), failed)
        time.sleep(follow_pause(every, failed))
    while iterations is None or done < iterations:
        started = time.monotonic()
        runs = engine.capture(names, trigger="schedule", read_options=options)
        yield from runs
        done += 1
        if (stop is not None and stop()) or done == iterations:
            return
        failed = failed + 1 if any(r.state == "failed" for r in runs) else 0
        pause = follow_pause(every, failed)
        if failed and waiting is not None:
            waiting(pause, failed)
        full = any(
            max_changes
            and sum((s or {}).get("captured", 0) for s in (r.stats or {}).values()) >= max_changes
            for r in runs
        )
        if failed or not full:  # a full batch means a backlog: go again at once
            time.sleep(max(0.0, pause - (time.monotonic() - started)))


def follow_pause(every: float, failed: int) -> float:
    """Seconds from one capture's start to the next after ``failed`` failed in a row."""
    if failed == 0:
        return every
    base = max(every, 1.0)  # (--every 0 would try a down source in a tight loop)
    return max(every, min(base * 2.0 ** min(failed, 30), MAX_FOLLOW_PAUSE_S))
