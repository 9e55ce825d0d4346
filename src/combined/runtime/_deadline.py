"""An Attempt's deadline: a read that outlives it is stopped, so no source holds a worker.

A read can block inside its connector for as long as its source likes (an
API dripping its answer, a program that never writes, a file on a hung
mount), while the lease heartbeat keeps renewing the Run's datasets: nothing
else would ever end it, and the worker and the datasets stay taken. So every
Attempt runs under an :class:`AttemptDeadline`. When it passes, a timer
thread finishes (``abort``) every extraction the Attempt opened, which any
thread may do: it closes the read's connections or stops its program. The
error the read then raises, whatever it is, becomes (:func:`overtime`)
:class:`~combined.errors.SourceUnavailable` naming the deadline: transient,
so the Run tries again as another Attempt, up to its attempts.

The reads register themselves (:func:`watch`, called where an extraction is
opened) with the deadline of the thread that runs the Attempt. The deadline
stops reads only: the engine's own work (reduction, commit) is not cut off.
"""

from __future__ import annotations

import os
import threading

from combined.connectors.abc import Extraction
from combined.errors import ConfigError, SourceUnavailable

#: An Attempt's default deadline (``COMBINED_ATTEMPT_TIMEOUT_S``): six hours.
DEFAULT_ATTEMPT_TIMEOUT_S = 6 * 3600.0

_current = threading.local()


def env_seconds(name: str, default: float, minimum: float = 1.0) -> float:
    """Seconds from the environment variable ``name`` (``default`` when unset)."""
    text = os.environ.get(name, "")
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value >= minimum or value == float("inf"):
        raise ConfigError(
            f"{name} is {text!r}, not a number of seconds of at least {minimum:g}",
            hint=f"unset it ({default:g} s) or give a number of seconds of at least {minimum:g}",
        )
    return value


class AttemptDeadline:
    """A block (one Attempt) whose reads are stopped once ``seconds`` have passed."""

    def __init__(self, seconds: float, attempt: int) -> None:
        self.seconds = seconds
        self.attempt = attempt
        self.expired = False
        self._watched: list[Extraction] = []
        self._lock = threading.Lock()
        self._timer = threading.Timer(seconds, self._expire)
        self._timer.daemon = True

    def start(self) -> AttemptDeadline:
        """Start the clock; the reads this thread opens from now on are watched."""
        _current.deadline = self
        self._timer.start()
        return self

    def cancel(self) -> None:
        """Stop the clock (the Attempt ended): its reads are never stopped by it."""
        self._timer.cancel()
        if getattr(_current, "deadline", None) is self:
            _current.deadline = None

    def error(self, cause: BaseException) -> SourceUnavailable:
        """The error an Attempt whose deadline passed ends with (``cause``: the read's)."""
        return SourceUnavailable(
            f"attempt {self.attempt} ran past its deadline ({self.seconds:g} s): its reads "
            f"were stopped ({type(cause).__name__}) and nothing of it was committed",
            hint="the Run is retried as another Attempt; if the source is slow rather "
            "than stuck, raise COMBINED_ATTEMPT_TIMEOUT_S",
            attempt_timeout_s=self.seconds,
        )

    def watch(self, extraction: Extraction) -> None:
        """Stop ``extraction`` when the deadline passes (at once, if it has)."""
        with self._lock:
            if not self.expired:
                self._watched.append(extraction)
                return
        extraction.finish("abort")

    def _expire(self) -> None:
        with self._lock:
            self.expired = True
            watched = list(self._watched)
        for extraction in watched:
            try:
                extraction.finish("abort")
            except Exception:  # noqa: BLE001, S112 - the others are stopped all the same
                continue


def overtime(exc: BaseException) -> None:
    """Raise the deadline's error if a read failed (``exc``) once its Attempt's deadline passed.

    Else return, for the caller to raise ``exc`` itself.
    """
    deadline: AttemptDeadline | None = getattr(_current, "deadline", None)
    if deadline is not None and deadline.expired and isinstance(exc, Exception):
        raise deadline.error(exc) from exc


def watch(extraction: Extraction) -> Extraction:
    """Put ``extraction`` under the running Attempt's deadline, if any; returns it."""
    deadline: AttemptDeadline | None = getattr(_current, "deadline", None)
    if deadline is not None:
        deadline.watch(extraction)
    return extraction


__all__ = [
    "DEFAULT_ATTEMPT_TIMEOUT_S",
    "AttemptDeadline",
    "env_seconds",
    "overtime",
    "watch",
]
