"""Canceling a Run: the request (CLI, API), and a running Run's watch for it.

A queued Run is canceled at once. A running one (``extracting``, in this
process or another: a worker, a ``combined capture``) is asked: the request
is written to its catalog row (who, why, when), and the process executing
it polls for that (:class:`CancelWatch`, every ``COMBINED_CANCEL_POLL_S``,
default 1 s). Once seen, the Attempt's reads are stopped through the
mechanism that stops them at the Attempt's deadline
(:meth:`~combined.runtime._deadline.AttemptDeadline.interrupt`): each read
is finished ``abort``, so nothing is committed and nothing acknowledged (a
CDC slot is not confirmed, a binlog position not checkpointed), and nothing
is billed. The Run ends ``canceled``. The move to ``committing`` is
conditional on no request (one transaction decides): a Run that already
commits what it read finishes, and its cancel is refused.
"""

from __future__ import annotations

import threading

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from combined._credentials import redact
from combined.catalog import Catalog, Run
from combined.catalog import _schema as t
from combined.catalog import data as cat
from combined.catalog import runs as runs_repo
from combined.errors import ProtocolViolation, RunCanceled
from combined.protocol import utcnow
from combined.runtime._beat import Beating
from combined.runtime._deadline import AttemptDeadline, env_seconds


def request_cancel(conn: Connection, run_id: str, by: str, reason: str | None) -> Run:
    """Cancel a queued Run now, or ask a running one to stop; the Run as it is then.

    Raises :class:`~combined.errors.NotFoundError` for an unknown Run and
    :class:`~combined.errors.ProtocolViolation` for one that ended or is
    committing. Asking twice is harmless: the first request stands.
    """
    # A person's words, kept on the Run and shown by `combined runs` and the API: masked
    # as the Activity event masks them (a password pasted into --reason).
    by, reason = redact(by), None if reason is None else redact(reason)
    run = runs_repo.get_run(conn, run_id)
    if run.terminal:
        raise ProtocolViolation(
            f"run {run.id} already ended {run.state}: there is nothing to cancel",
            hint=f"see `combined run show {run.id}`; a finished run is never undone",
        )
    if run.state == "committing":
        raise ProtocolViolation(
            f"run {run.id} is committing what it read and can no longer be canceled",
            hint=f"it ends in moments: see `combined run show {run.id}`",
        )
    if run.cancel_requested_at is not None:
        return run
    asked = conn.execute(
        t.runs.update()
        .where(
            t.runs.c.id == run.id,
            t.runs.c.state.in_(("queued", "extracting")),
            t.runs.c.cancel_requested_at.is_(None),
        )
        .values(cancel_requested_at=utcnow(), canceled_by=by, cancel_reason=reason)
    )
    run = runs_repo.get_run(conn, run.id)  # its row is now this transaction's
    if asked.rowcount != 1:
        return request_cancel(conn, run.id, by, reason)  # it moved meanwhile: say how
    cat.emit(conn, "run.cancel_requested", source=run.source, run_id=run.id, by=by, reason=reason)
    if run.state != "queued":
        return run
    error = runs_repo.canceled(run)
    run = runs_repo.move_run(conn, run.id, "canceled", error=error)
    cat.emit(
        conn,
        "run.canceled",
        source=run.source,
        run_id=run.id,
        by=by,
        reason=reason,
        error=run.error,
        error_type=type(error).__name__,
    )
    return run


class CancelWatch(Beating):
    """Polls the catalog for a cancel request of a running Run; stops its Attempt's reads.

    :meth:`attach` hands it each Attempt's deadline; :meth:`check` raises the
    cancel between the Attempt's steps (a request seen while nothing was read).
    """

    def __init__(self, catalog: Catalog, run_id: str, poll_s: float | None = None) -> None:
        poll_s = poll_s or env_seconds("COMBINED_CANCEL_POLL_S", 1.0, minimum=0.05)
        super().__init__(f"cancel-{run_id[:8]}", poll_s)
        self.catalog = catalog
        self.run_id = run_id
        self.error: RunCanceled | None = None
        self._deadline: AttemptDeadline | None = None
        self._lock = threading.Lock()
        self._seen = threading.Event()

    def attach(self, deadline: AttemptDeadline) -> None:
        """Stop ``deadline``'s reads on a cancel (at once if one was seen already)."""
        with self._lock:
            self._deadline = deadline
            error = self.error
        if error is not None:
            deadline.interrupt(error)

    def pause(self, seconds: float) -> None:
        """Wait ``seconds`` (a backoff between Attempts); a cancel ends the wait and is raised."""
        self._seen.wait(seconds)
        self.check()

    def check(self) -> None:
        """Raise the Run's cancel if one was seen."""
        if self.error is not None:
            raise self.error

    def beat(self) -> bool:
        """Look for a cancel request; once one is there, stop the reads and end the watch."""
        try:
            with self.catalog.begin() as conn:
                requested = conn.execute(
                    sa.select(t.runs.c.cancel_requested_at).where(t.runs.c.id == self.run_id)
                ).scalar()
                if requested is None:
                    return False
                run = runs_repo.get_run(conn, self.run_id)
        except Exception:  # noqa: BLE001 - a catalog hiccup: asked again next poll
            return False
        with self._lock:
            self.error = runs_repo.canceled(run)
            deadline = self._deadline
        self._seen.set()
        if deadline is not None:
            deadline.interrupt(self.error)
        return True


__all__ = ["CancelWatch", "request_cancel"]
