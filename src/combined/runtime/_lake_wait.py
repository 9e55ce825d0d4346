"""A worker whose lake's store does not answer waits for it, instead of exiting.

A worker started while the object store is unreachable (a reboot after a
network blip, the store restarting) exited with status 2 before it took a
Run: under systemd or Kubernetes a restart loop, or nothing running at all,
and nobody told. It now says so (a log line, and the alert
``alert.lake_unreachable``, sent to the notification targets and shown by
``combined status``), tries the store
again with exponential backoff (tenacity), and runs as usual once it
answers (``lake.reachable``). A store that answers and refuses (the bucket
does not exist, the credentials are refused or lack a permission, a store
setting is not valid) is a configuration to fix, not a wait: the worker
exits as before, its message saying that it is not retried.

The probe runs in a thread of its own, so that SIGTERM or Ctrl-C stops the
wait at once: a probe of a store that never answers takes a minute.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import tenacity

from combined.catalog import Catalog, worker_identity
from combined.catalog import data as cat
from combined.errors import LakeUnreachable

_log = logging.getLogger("combined.worker")

#: The first wait after a probe the store did not answer, and the longest one (seconds).
FIRST_WAIT_S, LONGEST_WAIT_S = 2.0, 60.0
#: The alert that says the lake's store stopped answering, and the event that ends it.
UNREACHABLE, REACHABLE = "alert.lake_unreachable", "lake.reachable"


def when_reachable(
    probe: Callable[[], None],
    stopping: Callable[[], bool],
    catalog: Catalog,
    *,
    first_s: float = FIRST_WAIT_S,
    longest_s: float = LONGEST_WAIT_S,
    send: Callable[[], object] = lambda: None,
) -> bool:
    """Return once ``probe`` passes (True), or once ``stopping`` (False).

    ``probe`` raises :class:`~combined.errors.LakeUnreachable` while the store
    does not answer: tried again after ``first_s`` doubled each time (at most
    ``longest_s``, plus up to ``first_s`` at random). Any other error is raised.
    ``send`` is called once an alert or its end is recorded (the engine's sender).
    """
    started, told = time.monotonic(), _told_unreachable(catalog)
    retrying = tenacity.Retrying(
        retry=tenacity.retry_if_exception_type(LakeUnreachable),
        wait=tenacity.wait_exponential(multiplier=first_s, max=longest_s)
        + tenacity.wait_random(0, first_s),
        stop=lambda state: stopping(),
        sleep=lambda seconds: _sleep(seconds, stopping),
        before_sleep=lambda state: _tell(catalog, state, told, send),
        reraise=True,
    )
    try:
        for attempt in retrying:
            with attempt:
                if stopping() or not _interruptible(probe, stopping):
                    return False
    except LakeUnreachable:
        if stopping():
            return False
        raise
    if told:
        waited = round(time.monotonic() - started)
        _log.warning("the lake's store answers again: the worker goes on")
        with catalog.begin() as conn:
            cat.emit(conn, REACHABLE, worker=worker_identity(), waited_s=waited)
        send()
    return True


def _tell(
    catalog: Catalog, state: tenacity.RetryCallState, told: list[bool], send: Callable[[], object]
) -> None:
    """Log each failed probe; the first also as the alert ``alert.lake_unreachable``."""
    exc = state.outcome.exception() if state.outcome else None
    if not isinstance(exc, LakeUnreachable):
        return
    wait = state.next_action.sleep if state.next_action else 0.0
    hint = (exc.hint or "").removesuffix("; nothing was captured")
    _log.warning("%s; trying again in %.0f s (hint: %s)", exc.message, wait, hint)
    if told:
        return
    told.append(True)
    with catalog.begin() as conn:
        cat.emit(conn, UNREACHABLE, worker=worker_identity(), error=exc.message, hint=hint)
    send()


def _told_unreachable(catalog: Catalog) -> list[bool]:
    """``[True]`` when the newest word on the store is its alert (a worker that ended
    while it waited): this worker says ``lake.reachable`` once it answers."""
    return [True] if last_word(catalog) is not None else []


def _interruptible(probe: Callable[[], None], stopping: Callable[[], bool]) -> bool:
    """Run ``probe`` in a thread; False if ``stopping`` came first (the probe left to end
    by itself: it writes and deletes one probe object, nothing else)."""
    box: list[BaseException | None] = []

    def run() -> None:
        try:
            probe()
            box.append(None)
        except BaseException as exc:  # handed to the caller's thread
            box.append(exc)

    thread = threading.Thread(target=run, name="lake-probe", daemon=True)
    thread.start()
    while not box:
        if stopping():
            return False
        thread.join(0.1)
    if box[0] is not None:
        raise box[0]
    return True


def _sleep(seconds: float, stopping: Callable[[], bool]) -> None:
    """Sleep ``seconds``, waking early when a stop is requested."""
    deadline = time.monotonic() + seconds
    while not stopping() and (left := deadline - time.monotonic()) > 0:
        time.sleep(min(left, 0.1))


def last_word(catalog: Catalog) -> dict[str, Any] | None:
    """The newest ``alert.lake_unreachable``'s time and body when no ``lake.reachable``
    followed it (a worker waits for the store, or ended while it waited); else None."""
    with catalog.begin() as conn:
        last = [
            e
            for kind in (UNREACHABLE, REACHABLE)
            for e in cat.activity(conn, kind=kind, limit=1, exact=True)
        ]
    newest = max(last, key=lambda e: e.id, default=None)
    if newest is None or newest.kind != UNREACHABLE:
        return None
    return {"at": newest.at, **(newest.body or {})}
