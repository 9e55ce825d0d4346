"""Which signal a command received, for errors a library turned it into.

DuckDB stops a statement that a signal's exception reaches and raises its
own error instead ("Query interrupted", ``duckdb.InterruptException``): the
KeyboardInterrupt of a Ctrl-C was gone, and the Run it stopped ended
``failed`` (with an alert, and once after its lake commit) where the
command should stop, the Run left for the next capture to close.
"""

from __future__ import annotations

import signal
from typing import Any

#: The signal the process received last ("SIGINT"), if any.
received: str | None = None


def watch_sigint() -> None:
    """Note each SIGINT, then raise KeyboardInterrupt as Python's own handler does."""
    if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        return  # (whoever started Combined handles it)

    def handler(signum: int, frame: Any) -> None:
        global received
        received = "SIGINT"
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, handler)


def raise_if_interrupted(exc: BaseException) -> None:
    """Raise KeyboardInterrupt when ``exc`` (or what it was raised from) is a library's word
    for a SIGINT received."""
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
