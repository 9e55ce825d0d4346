"""A daemon thread that does one thing at a steady interval until stopped (lease, cancel poll)."""

from __future__ import annotations

import threading


class Beating:
    """Calls :meth:`beat` every ``interval`` seconds from a daemon thread.

    It ends when :meth:`stop` is called, or once :meth:`beat` returns True.
    """

    def __init__(self, name: str, interval: float) -> None:
        self._interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)

    def start(self) -> None:
        """Start beating."""
        self._thread.start()

    def stop(self) -> None:
        """Stop beating; returns once the thread ended."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def beat(self) -> bool:
        """One beat; True ends the thread."""
        raise NotImplementedError

    def _loop(self) -> None:
        while not self._stop.wait(self._interval):
            if self.beat():
                return


__all__ = ["Beating"]
