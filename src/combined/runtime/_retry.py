"""Waiting between Attempts, and retries a source asked to defer (``Retry-After``).

A transient error (:class:`~combined.errors.SourceUnavailable`,
:class:`~combined.errors.CommitAmbiguous`) is retried as another Attempt
after an exponential backoff with jitter (tenacity's
``wait_exponential`` plus ``wait_random``: ``COMBINED_RETRY_BACKOFF_S``
doubled each Attempt, plus up to as much again at random, at most
:data:`MAX_BACKOFF_S`), and never sooner than the source asked: an error
carrying ``retry_after_s`` (a ``Retry-After`` within the source's ceiling)
waits at least that long.

A source that asks for longer than its ceiling
(:class:`~combined.errors.RetryLater`) is not waited for, nor asked again:
the Attempt ends, the Run fails, and :func:`defer_retry` queues a retry
under the same admission that no worker takes before the time asked.
"""

from __future__ import annotations

from datetime import datetime, timedelta

import tenacity
from sqlalchemy.engine import Connection

from combined.catalog import Catalog, Run
from combined.catalog import data as cat
from combined.errors import CombinedError, RetryLater
from combined.protocol import utcnow
from combined.runtime._admit import admit_retry

#: The longest backoff between two Attempts (a source's own Retry-After aside).
MAX_BACKOFF_S = 60.0


def asked_wait(exc: BaseException) -> float | None:
    """The seconds a source asked to wait (``Retry-After``), as an error carries them."""
    if not isinstance(exc, CombinedError):
        return None
    value = exc.context.get("retry_after_s")
    return float(value) if isinstance(value, int | float) else None


def _wait(initial: float) -> tenacity.wait.wait_base:
    """``initial`` doubled each time (at most :data:`MAX_BACKOFF_S`), plus up to ``initial``."""
    return tenacity.wait_exponential(multiplier=initial, max=MAX_BACKOFF_S) + tenacity.wait_random(
        0, initial
    )


def backoff(initial: float, attempt: int, exc: BaseException | None = None) -> float:
    """Seconds to wait after failed Attempt ``attempt`` (1-based) before the next one."""
    strategy = _wait(initial)
    state = tenacity.RetryCallState(tenacity.Retrying(), None, (), {})
    state.attempt_number = attempt
    computed = strategy(state) if initial > 0 else 0.0
    return max(computed, asked_wait(exc) or 0.0) if exc is not None else computed


def retrying(tries: int, initial: float = 0.5) -> tenacity.Retrying:
    """``tries`` calls at most, with exponential backoff and jitter; the last error raised."""
    return tenacity.Retrying(
        stop=tenacity.stop_after_attempt(tries),
        wait=_wait(initial),
        reraise=True,
    )


def defer_retry(catalog: Catalog, conn: Connection, run: Run, exc: RetryLater) -> Run:
    """Queue a retry of the failed ``run`` that no worker takes before the time the source asked."""
    not_before: datetime = utcnow() + timedelta(seconds=asked_wait(exc) or 0.0)
    later = admit_retry(catalog, conn, run, enqueue=True, not_before=not_before)
    cat.emit(
        conn,
        "run.retry_deferred",
        source=run.source,
        run_id=run.id,
        retry=later.id,
        not_before=not_before.isoformat(),
    )
    return later


__all__ = ["MAX_BACKOFF_S", "asked_wait", "backoff", "defer_retry", "retrying"]
