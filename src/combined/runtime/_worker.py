"""The worker loop: take queued Runs from the catalog one at a time and execute them."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator

from combined.catalog import Run
from combined.errors import CatalogError, LakeUnreachable

_log = logging.getLogger("combined.worker")


def work(
    take: Callable[[], Run | None],
    execute: Callable[[Run], Run],
    stopping: Callable[[], bool],
    waiting: Callable[[], bool],
    *,
    poll_s: float = 2.0,
    once: bool = False,
    max_runs: int | None = None,
    give_back: Callable[[], object] = lambda: None,
    idle: Callable[[], object] = lambda: None,
) -> Iterator[Run]:
    """Execute queued Runs as they come; yields each Run once it reached a final state.

    ``stopping`` is asked between Runs and while idle: a stop request ends
    the loop after the current Run, never inside it. ``once`` ends the loop
    when no Run is ``waiting`` in the queue (one whose dataset another Run
    holds still waits) instead of waiting ``poll_s`` for more;
    ``max_runs`` ends it after that many Runs. After a catalog error
    (its connection lost), ``give_back`` puts back what this worker may have
    taken without knowing, before it takes again. ``idle`` is called each
    time no Run was taken, before the worker waits (it recovers what a dead
    worker left: its Run's retry is then taken at once).
    """
    done = 0
    while not stopping() and (max_runs is None or done < max_runs):
        try:
            run = take()
            ended = execute(run) if run is not None else None
            if run is None:
                idle()
        except (CatalogError, LakeUnreachable) as exc:
            # A catalog that closed its connections (a restart, a failover, an idle
            # timeout), or a lake store that stopped answering while the worker idled
            # (its recovery of a dead worker's Run probes it), must not end a worker
            # that runs for weeks: the next poll tries again; a Run it held is
            # recovered once its lease lapses.
            lost = isinstance(exc, LakeUnreachable) or exc.context.get("lost")
            if once or not lost:
                raise  # (refused credentials, a database that does not exist: say so)
            _log.warning("%s; trying again in %.0f s", exc.message, poll_s)
            _sleep(poll_s, stopping)
            with contextlib.suppress(CatalogError):  # (tried again after the next error)
                give_back()
            continue
        if run is not None and ended is not None:
            if ended.state != "queued":
                done += 1
                yield ended
                continue
            # Given back: another Run holds its dataset. Waiting a poll keeps
            # this worker from taking it again and again meanwhile.
        elif once and not waiting():
            return
        _sleep(poll_s, stopping)


def _sleep(seconds: float, stopping: Callable[[], bool]) -> None:
    """Sleep ``seconds``, waking early when a stop is requested."""
    deadline = time.monotonic() + seconds
    while not stopping():
        left = deadline - time.monotonic()
        if left <= 0:
            return
        time.sleep(min(left, 0.1))
