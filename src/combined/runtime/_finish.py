"""How a Run ends once its lake commits are known: each read's outcome, the publication.

A read's terminal outcome is decided only when the engine knows what the
lake holds of it: ``success`` once committed, ``retain_commit_unknown`` for
the one whose commit failed in an unknown state, ``abort`` for reads never
committed. The source is closed only afterwards (closing it first would end
every read as ``abort``). Each decision is an Activity event
(``read.ended``) with the outcome the read accepted.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

from sqlalchemy.engine import Connection

from combined.catalog import Catalog, Member, Run
from combined.catalog import data as cat
from combined.catalog import runs as runs_repo
from combined.protocol import TerminalOutcome
from combined.quality import Reconciliation
from combined.runtime._pipeline import Prepared, Staged


def end_reads(
    catalog: Catalog, run_id: str, reads: Sequence[Staged], outcomes: Sequence[TerminalOutcome]
) -> None:
    """Finish each read with its outcome and record the outcome each one accepted."""
    receipts = [st.extraction.finish(o) for st, o in zip(reads, outcomes, strict=True)]
    try:
        with catalog.begin() as conn:
            for st, r in zip(reads, receipts, strict=True):
                cat.emit(
                    conn,
                    "read.ended",
                    source=st.plan.source,
                    dataset=st.plan.name,
                    run_id=run_id,
                    outcome=r.outcome,
                    cleanup_succeeded=r.cleanup_succeeded,
                    cleanup_error=r.cleanup_error_code,
                )
    except Exception:  # noqa: S110 - the record never replaces the Run's own outcome or error
        pass


def after_failed_commit(count: int, committed: int, refused: bool) -> list[TerminalOutcome]:
    """The outcomes of ``count`` reads when the commit of read ``committed`` failed.

    Those before it committed; it is unknown unless it was ``refused`` before
    or instead of its commit (a lost lease, sequences another Run committed);
    the rest never committed.
    """
    return [
        "success"
        if i < committed
        else "retain_commit_unknown"
        if i == committed and not refused
        else "abort"
        for i in range(count)
    ]


def publish_run(
    conn: Connection,
    run: Run,
    prepared: Sequence[Prepared],
    members: Sequence[Member],
    checks: dict[str, Reconciliation],
    publish: Callable[[Connection, Run, list[Member]], str | None],
) -> Run:
    """Publish a Run's committed members (``publish``: now, or held for its capture).

    The Run succeeds with its stats. A member counts as changed since the
    dataset's last publication, not merely by this Run: a commit of a Run that
    died before publishing is published (and told) by the next one, which may
    itself change nothing.
    """
    members = [
        dataclasses.replace(
            m, changed=m.dataset_version != cat.published_version(conn, m.source, m.dataset)
        )
        for m in members
    ]
    pub = publish(conn, run, list(members))
    stats = {
        p.staged.plan.name: {
            "captured": p.transition.captured,
            "inserts": p.transition.inserts,
            "updates": p.transition.updates,
            "deletes": p.transition.deletes,
            "deliveries": len(p.deliveries),
            **_checked(checks[p.staged.plan.name]),
        }
        for p in prepared
    }
    run = runs_repo.move_run(conn, run.id, "succeeded", stats=stats, publication_id=pub)
    cat.emit(conn, "run.succeeded", source=run.source, run_id=run.id, publication=pub)
    return run


def _checked(result: Reconciliation) -> dict[str, object]:
    """A dataset's reconciliation in a Run's stats: its status, and counts when it disagrees."""
    out: dict[str, object] = {"reconciliation": result.source_status}
    if result.source_status in ("mismatch", "expected_variance"):
        out.update(lake_rows=result.lake_rows, source_rows=result.source_rows)
        if result.expected_variance is not None:
            out["expected_variance"] = result.expected_variance
    return out
