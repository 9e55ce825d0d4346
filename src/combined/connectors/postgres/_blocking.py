"""A replication command's wait that a signal still reaches."""

from __future__ import annotations

import threading
from typing import Any


def interruptible(rconn: Any, cur: Any, command: str) -> Any:
    """``command``'s one row, read while this thread stays free to take a signal.

    Creating a slot waits for every transaction open on the server to end
    (its snapshot needs them settled): a session left idle in transaction
    holds it for as long as it stays open. psycopg2 waits in C, where no
    signal reaches Python: SIGINT (Ctrl-C) and SIGTERM waited with it. The
    statement runs in a thread; an exception the wait meets cancels it.
    """
    box: list[Any] = []

    def run() -> None:
        try:
            cur.execute(command)
            box.append(cur.fetchone())
        except BaseException as exc:  # handed to the waiting thread
            box.append(exc)

    worker = threading.Thread(target=run, name="create-slot", daemon=True)
    worker.start()
    try:
        while worker.is_alive():
            worker.join(0.2)
    except BaseException:
        rconn.cancel()  # the server ends the statement: no slot is made
        worker.join(10)
        raise
    if isinstance(box[0], BaseException):
        raise box[0]
    return box[0]
