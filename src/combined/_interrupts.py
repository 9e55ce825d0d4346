"""The signals a command receives: counted as they arrive, whatever its main thread does.

Python runs a signal's handler in the main thread, between two of its
bytecodes. A main thread blocked in a database driver (ADBC's fetch waiting
for the rows of a statement that sleeps, in C) runs none until the driver
returns: a worker's SIGTERM was not acknowledged, a second SIGTERM sent
meanwhile was merged with the first (the handler ran once) and the Run went
on to its end, and Ctrl-C of a capture waited for the statement. So every
signal :func:`watch` handles is also written, one byte each, to a pipe
(``signal.set_wakeup_fd``) that a thread of its own reads at once: that
thread counts each arrival, does what needs no main thread (``told``: a
worker says it heard), and when the count unwinds the command it stops the
reads of the Attempts in progress, as an Attempt's deadline or a cancel does
(a PostgreSQL statement is canceled on the server), so that the driver
returns and the handler raises in the main thread.

DuckDB stops a statement that a signal's exception reaches and raises its
own error instead ("Query interrupted", ``duckdb.InterruptException``): the
KeyboardInterrupt of a Ctrl-C was gone, and the Run it stopped ended
``failed`` (with an alert, and once after its lake commit) where the
command should stop, the Run left for the next capture to close
(:func:`raise_if_interrupted`).
"""

from __future__ import annotations

import _thread
import os
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

#: The signal the process received last ("SIGINT"), if any.
received: str | None = None


@dataclass(frozen=True)
class _Rule:
    """What a command does with one signal."""

    unwind: Callable[[], BaseException]  # raised in the main thread
    unwind_at: int  # at the how-many-th arrival
    told: Callable[[int], None] | None  # called (in the watching thread) with each arrival's count


class _Watch:
    """The pipe the signals are written to, the thread reading it, and the counts."""

    def __init__(self) -> None:
        self.lock = threading.RLock()  # (taken by handlers too: reentrant)
        self.rules: dict[int, _Rule] = {}
        self.arrived: dict[int, int] = {}  # bytes read from the pipe
        self.handled: dict[int, int] = {}  # the main thread's handler runs for the signal
        self.acted: dict[int, int] = {}  # the count up to which ``told`` was called
        self.unwound: set[int] = set()
        self.poked: dict[int, int] = {}  # our own trips of a handler, not signals
        read, write = os.pipe()
        os.set_blocking(write, False)
        self.previous = signal.set_wakeup_fd(write, warn_on_full_buffer=False)
        self.read_fd = read
        threading.Thread(target=self._read, name="combined-signals", daemon=True).start()

    def count(self, signum: int) -> int:
        """How many times ``signum`` arrived since its rule was set (a lower bound, exact once
        the pipe and the handler have caught up: two arrivals the handler took as one are two
        bytes)."""
        return max(self.arrived.get(signum, 0), self.handled.get(signum, 0))

    def due(self, signum: int) -> BaseException | None:
        """The exception ``signum``'s arrivals unwind the main thread with, once (None: not yet)."""
        with self.lock:
            rule = self.rules.get(signum)
            if rule is None or signum in self.unwound or self.count(signum) < rule.unwind_at:
                return None
            self.unwound.add(signum)
        return rule.unwind()

    def handler(self, signum: int, frame: Any) -> None:
        """The Python handler: counts the arrival, raises when its rule says so."""
        global received
        with self.lock:
            if self.poked.get(signum, 0):
                self.poked[signum] -= 1  # (a trip :meth:`_act` made, not a signal)
            else:
                self.handled[signum] = self.handled.get(signum, 0) + 1
        if signum == signal.SIGINT:
            received = "SIGINT"
        exc = self.due(signum)
        if exc is not None:
            raise exc

    def _read(self) -> None:
        while True:
            try:
                data = os.read(self.read_fd, 64)
            except InterruptedError:
                continue
            for signum in data:
                self.arrived_now(signum)

    def arrived_now(self, signum: int) -> None:
        """Count an arrival of ``signum``; tell it, and unwind when its rule says so."""
        global received
        with self.lock:
            rule = self.rules.get(signum)
            if rule is None or signal.getsignal(signum) != self.handler:
                return  # (a signal another handler owns for now: uvicorn's, in `serve`)
            if self.poked.get(-signum, 0):
                self.poked[-signum] -= 1  # (the byte of our own trip)
                return
            self.arrived[signum] = self.arrived.get(signum, 0) + 1
            counts = range(self.acted.get(signum, 0) + 1, self.count(signum) + 1)
            self.acted[signum] = self.count(signum)
        if signum == signal.SIGINT:
            received = "SIGINT"
        for n in counts:
            if rule.told is not None:
                rule.told(n)
            if n == rule.unwind_at:
                self._act(signum)

    def _act(self, signum: int) -> None:
        """Unwind the command: stop the reads the main thread may be blocked in, and have
        its handler run again once it is free (should it have run before this count)."""
        name = signal.Signals(signum).name
        threading.Thread(
            target=_stop_reads, args=(name,), name="combined-stop-reads", daemon=True
        ).start()
        with self.lock:
            if signum in self.unwound:
                return
            self.poked[signum] = self.poked.get(signum, 0) + 1
            self.poked[-signum] = self.poked.get(-signum, 0) + 1  # (its byte in the pipe)
        _thread.interrupt_main(signal.Signals(signum))


_watch: _Watch | None = None


def _stop_reads(name: str) -> None:
    """Stop the reads of every Attempt in progress in this process (their statements too)."""
    from combined.errors import CombinedError
    from combined.runtime._deadline import interrupt_every

    interrupt_every(
        CombinedError(
            f"{name} stopped the command while this Run read its source: nothing it read "
            "was committed",
            hint="the Run stays unfinished; the next capture of its source (or `combined "
            "repair`) marks it failed",
        )
    )


def watch(
    signum: int,
    unwind: Callable[[], BaseException],
    *,
    unwind_at: int = 1,
    told: Callable[[int], None] | None = None,
) -> None:
    """Handle ``signum`` from now on: raise ``unwind()`` in the main thread at its
    ``unwind_at``-th arrival (once), stopping the reads in progress then; call ``told`` with
    each arrival's count as it arrives. From the main thread.
    """
    global _watch
    if _watch is None:
        _watch = _Watch()
        if _watch.previous != -1:  # whoever started Combined watches the signals: theirs
            signal.set_wakeup_fd(_watch.previous)
    with _watch.lock:
        _watch.rules[signum] = _Rule(unwind, unwind_at, told)
        for counts in (_watch.arrived, _watch.handled, _watch.acted):
            counts.pop(signum, None)
        _watch.unwound.discard(signum)
    signal.signal(signum, _watch.handler)


def heard(signum: int) -> None:
    """A library's own handler took ``signum`` from Python's (ADBC's SIGINT, which cancels
    the statement it blocks in): count it as arrived, from any thread."""
    if _watch is not None:
        _watch.arrived_now(signum)


def watch_sigint() -> None:
    """Note each SIGINT, then raise KeyboardInterrupt as Python's own handler does."""
    if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        return  # (whoever started Combined handles it)
    watch(signal.SIGINT, KeyboardInterrupt)


def raise_if_interrupted(exc: BaseException) -> None:
    """Raise KeyboardInterrupt when ``exc`` (or what it was raised from) is a library's word
    for a SIGINT received; raise the exception a signal unwinds the command with when one
    is due (its reads were stopped for it, and ``exc`` may be their error)."""
    if _watch is not None:
        for signum in list(_watch.rules):
            due = _watch.due(signum)
            if due is not None:
                raise due from exc
    if received != "SIGINT":
        return
    import duckdb

    seen: BaseException | None = exc
    for _ in range(8):  # (an error translated from it, a few deep at most)
        if seen is None:
            return
        if isinstance(seen, duckdb.InterruptException | KeyboardInterrupt) or (
            isinstance(seen, RuntimeError) and "Query interrupted" in str(seen)
        ):
            raise KeyboardInterrupt from exc
        seen = seen.__cause__ or seen.__context__
