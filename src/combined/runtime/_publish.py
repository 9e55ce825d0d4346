"""Publish: a Run's commits made visible at once, or a capture's held for one publication.

A Run's reads end by what the lake holds of them (:func:`end_reads`): a
read's terminal outcome is decided only when the engine knows it:
``success`` once committed, ``retain_commit_unknown`` for the one whose
commit failed in an unknown state, ``abort`` for reads never committed. The
source is closed only afterwards (closing it first would end every read as
``abort``). Each decision is an Activity event (``read.ended``) with the
outcome the read accepted.

A capture of several sources executes one Run per source. Published Run by
Run, a reader between two of them (``--as-of``) saw one source's new basis
beside another's old one. :class:`HeldPublications` keeps each Run's members
until every Run of the capture ended, then :meth:`HeldPublications.release`
publishes those of the Runs that succeeded in one catalog transaction.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

from sqlalchemy.engine import Connection

from combined.catalog import Catalog, Member, Run
from combined.catalog import _schema as t
from combined.catalog import data as cat
from combined.catalog import runs as runs_repo
from combined.protocol import TerminalOutcome
from combined.quality import Reconciliation
from combined.runtime._gap import ended_by
from combined.runtime._plan import Prepared, Staged

if TYPE_CHECKING:
    from combined.runtime._runner import Runner

#: The end states of a Run whose members were committed in full.
_COMMITTED = ("succeeded", "needs_review")


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

    The Run succeeds with its stats, or ends ``needs_review`` when a read
    ended at a gap in its change stream, the changes before it committed
    (``runtime._gap.ended_by``). A member counts as changed since the
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
            **({} if p.staged.unchanged_rows is None else {"unchanged": p.staged.unchanged_rows}),
            # (whether the rows' fold was compared before hashing them: runtime._fold)
            **({} if p.staged.fold_verdict is None else {"fold": p.staged.fold_verdict}),
            # (whether the rows were compared with the lake's by value: capture._values)
            **({} if p.staged.compared is None else {"compared": p.staged.compared}),
            **_checked(checks[p.staged.plan.name]),
        }
        for p in prepared
    }
    gap = ended_by(conn, run, prepared, members)
    if gap is not None:
        run = runs_repo.move_run(
            conn, run.id, "needs_review", error=gap, stats=stats, publication_id=pub
        )
        cat.emit(
            conn,
            "run.needs_review",
            source=run.source,
            run_id=run.id,
            error=run.error,
            error_type=type(gap).__name__,
            publication=pub,
        )
        return run
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


def _publish(conn: Connection, by_run: Mapping[str, Sequence[Member]], run_id: str | None) -> str:
    """Publish every Run's members as one publication; tell each dataset that changed."""
    pub = cat.publish(
        conn, run_id, [m for members in by_run.values() for m in members], runs=list(by_run)
    )
    for changed_by, members in by_run.items():
        for m in members:
            if m.changed:
                cat.emit(
                    conn,
                    "dataset.changed",
                    source=m.source,
                    dataset=m.dataset,
                    run_id=changed_by,
                    publication=pub,
                    version=m.dataset_version,
                )
    return pub


def publish_now(conn: Connection, run: Run, members: Sequence[Member]) -> str | None:
    """A Run's own publication (what a Run does unless its capture holds it)."""
    pub = _publish(conn, {run.id: members}, run.id)
    cat.emit(conn, "publication", source=run.source, run_id=run.id, publication=pub)
    return pub


class HeldPublications:
    """The members of a capture's Runs, held until every Run ended (see the module).

    Used as a context: :meth:`hold` a Runner before each Run executes, add the
    Run to :attr:`runs`; leaving the context publishes what succeeded (even
    when the capture is interrupted) and re-reads :attr:`runs`. With
    ``together`` False (a capture of one source) each Run publishes itself.
    """

    def __init__(self, catalog: Catalog, *, together: bool) -> None:
        self.catalog = catalog
        self.together = together
        self.held: dict[str, list[Member]] = {}
        self.runs: list[Run] = []
        #: The capture's one publication once released (None: nothing, or not together).
        self.publication: str | None = None

    def hold(self, runner: Runner) -> Runner:
        """``runner``, made to hold its Runs' members here when the capture is together."""
        if self.together:
            runner.publish = self
        return runner

    def __call__(self, conn: Connection, run: Run, members: Sequence[Member]) -> str | None:
        """Hold a succeeding Run's members; nothing is published yet."""
        self.held[run.id] = list(members)
        return None

    def __enter__(self) -> HeldPublications:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.together:
            self.release()

    def release(self) -> None:
        """Publish the members of the Runs that committed (succeeded, or ended
        ``needs_review`` at a gap once committed), together, and re-read the Runs."""
        done = [r for r in self.runs if r.state in _COMMITTED and r.id in self.held]
        if not done:
            return
        with self.catalog.begin() as conn:
            # Several sources' publication names no one Run; its event names them all.
            only = done[0].id if len(done) == 1 else None
            pub = _publish(conn, {r.id: self.held[r.id] for r in done}, only)
            for r in done:
                conn.execute(t.runs.update().where(t.runs.c.id == r.id).values(publication_id=pub))
            cat.emit(
                conn,
                "publication",
                publication=pub,
                runs=[r.id for r in done],
                sources=sorted({r.source for r in done}),
                withheld=[r.id for r in self.runs if r not in done],
            )
            self.runs = [runs_repo.get_run(conn, r.id) for r in self.runs]
        self.held.clear()
        self.publication = pub
