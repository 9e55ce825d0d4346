"""Publications: a Run's commits made visible at once, or a capture's held for one publication.

A capture of several sources executes one Run per source. Published Run by
Run, a reader between two of them (``--as-of``) saw one source's new basis
beside another's old one. :class:`HeldPublications` keeps each Run's members
until every Run of the capture ended, then :meth:`HeldPublications.release`
publishes those of the Runs that succeeded in one catalog transaction.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from sqlalchemy.engine import Connection

from combined.catalog import Catalog, Member, Run
from combined.catalog import _schema as t
from combined.catalog import data as cat
from combined.catalog import runs as runs_repo

if TYPE_CHECKING:
    from combined.runtime._runner import Runner


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
        """Publish the members of the Runs that succeeded, together, and re-read the Runs."""
        done = [r for r in self.runs if r.state == "succeeded" and r.id in self.held]
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
