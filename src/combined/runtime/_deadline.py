"""An Attempt's deadline: a read that outlives it is stopped, so no source holds a worker.

A read can block inside its connector for as long as its source likes (an
API dripping its answer, a program that never writes, a file on a hung
mount), while the lease heartbeat keeps renewing the Run's datasets: nothing
else would ever end it, and the worker and the datasets stay taken. So every
Attempt runs under an :class:`AttemptDeadline`. When it passes, a timer
thread finishes (``abort``) every read the Attempt is reading, which any
thread may do: it closes the read's connections or stops its program. The
error the read then raises, whatever it is, becomes
:class:`~combined.errors.SourceUnavailable` naming the deadline: transient,
so the Run tries again as another Attempt, up to its attempts.

Each read is consumed inside :func:`reading`, which puts it under the
deadline of the thread that runs the Attempt while it is read, and only
then: the engine's own work after it (reduction, commit) is never cut off,
and a read that ended is never stopped.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Protocol

from combined.errors import CombinedError, ConfigError, SourceUnavailable

#: An Attempt's default deadline (``COMBINED_ATTEMPT_TIMEOUT_S``): six hours.
DEFAULT_ATTEMPT_TIMEOUT_S = 6 * 3600.0

_current = threading.local()
#: The Attempts in progress in this process, for a signal that stops them all.
_running: set[AttemptDeadline] = set()
_running_lock = threading.Lock()


class Finishable(Protocol):
    """A read the deadline can stop: an extraction, or a group of them."""

    def finish(self, outcome: Any) -> Any:
        """Accept the read's terminal outcome (``abort`` from the deadline), from any thread."""
        ...


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
        #: Why the reads were stopped before the deadline (a cancel), if they were.
        self.reason: CombinedError | None = None
        self._watched: list[Finishable] = []
        self._lock = threading.Lock()
        self._timer = threading.Timer(seconds, self._expire)
        self._timer.daemon = True

    def start(self) -> AttemptDeadline:
        """Start the clock; the reads this thread opens from now on are watched."""
        _current.deadline = self
        with _running_lock:
            _running.add(self)
        self._timer.start()
        return self

    def cancel(self) -> None:
        """Stop the clock (the Attempt ended): its reads are never stopped by it."""
        self._timer.cancel()
        with _running_lock:
            _running.discard(self)
        if getattr(_current, "deadline", None) is self:
            _current.deadline = None

    def interrupt(self, reason: CombinedError) -> None:
        """Stop the Attempt's reads now, from any thread; they end with ``reason`` (a cancel)."""
        self._timer.cancel()
        with self._lock:
            if self.expired:
                return
            self.reason = reason
        self._expire()

    def error(self, cause: BaseException) -> CombinedError:
        """The error an Attempt whose reads were stopped ends with (``cause``: the read's)."""
        if self.reason is not None:
            return self.reason
        return SourceUnavailable(
            f"attempt {self.attempt} ran past its deadline ({self.seconds:g} s): its reads "
            f"were stopped ({type(cause).__name__}) and nothing of it was committed",
            hint="the Run is retried as another Attempt; if the source is slow rather "
            "than stuck, raise COMBINED_ATTEMPT_TIMEOUT_S",
            attempt_timeout_s=self.seconds,
        )

    def watch(self, read: Finishable) -> bool:
        """Stop ``read`` when the deadline passes; False (and stopped) if it has passed."""
        with self._lock:
            if not self.expired:
                self._watched.append(read)
                return True
        read.finish("abort")
        return False

    def unwatch(self, read: Finishable) -> bool:
        """Leave ``read`` alone from now on; False if the deadline stopped it already."""
        with self._lock:
            if any(r is read for r in self._watched):
                self._watched = [r for r in self._watched if r is not read]
                return True
            return False

    def _expire(self) -> None:
        with self._lock:
            self.expired = True
            watched, self._watched = self._watched, []
        for read in watched:
            try:
                read.finish("abort")
            except Exception:  # noqa: BLE001, S112 - the others are stopped all the same
                continue


def interrupt_every(reason: CombinedError) -> None:
    """Stop the reads of every Attempt in progress in this process, as a cancel does.

    A signal that stops the command (``combined._interrupts``) calls it from
    a thread of its own: the main thread may be blocked in a read's statement.
    """
    with _running_lock:
        running = list(_running)
    for deadline in running:
        deadline.interrupt(reason)


@contextmanager
def reading(read: Finishable) -> Iterator[None]:
    """The block that reads ``read``, under the running Attempt's deadline (if any).

    A failing block aborts the read; its error, once the deadline stopped the
    read, is the deadline's (transient). A read the deadline stopped just as
    it ended is failed the same way: its extraction is finished as aborted.
    """
    deadline: AttemptDeadline | None = getattr(_current, "deadline", None)
    watched = deadline is not None and deadline.watch(read)
    try:
        yield
    except BaseException as exc:
        read.finish("abort")
        if deadline is not None and deadline.expired and isinstance(exc, Exception):
            raise deadline.error(exc) from exc
        raise
    finally:
        stopped = deadline is not None and not (watched and deadline.unwatch(read))
    if stopped and deadline is not None:
        raise deadline.error(TimeoutError())


__all__ = [
    "DEFAULT_ATTEMPT_TIMEOUT_S",
    "AttemptDeadline",
    "Finishable",
    "env_seconds",
    "interrupt_every",
    "reading",
]
