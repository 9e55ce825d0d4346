"""The engine's reading side: queries, Runs, Activity, history, evidence and quarantine.

A mixin of :class:`~combined.engine.Engine`, which gives it the project,
the catalog, the lake layout and the reporter; nothing here starts a Run.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, cast

from combined.catalog import Run, RunState, resets
from combined.catalog import data as cat
from combined.catalog import runs as runs_repo
from combined.errors import CombinedError, ConfigError, NotFoundError

if TYPE_CHECKING:
    import pyarrow as pa

    from combined.catalog import Catalog
    from combined.config import Project
    from combined.engine import Engine
    from combined.evidence import Explanation, Replay, SourcePlan
    from combined.lake import LakeLayout
    from combined.lake._query import QueryError
    from combined.runtime._reporter import Reporter


class Reading:
    """What the engine answers without running a capture."""

    project: Project
    reporter: Reporter
    layout: LakeLayout

    @property
    def catalog(self) -> Catalog:
        """The catalog (the engine opens it on first use)."""
        raise NotImplementedError

    @property
    def _engine(self) -> Engine:
        """This object as the engine it is a part of (for helpers that take the engine)."""
        return cast("Engine", self)

    def sql(
        self,
        query: str,
        *,
        as_of: datetime | None = None,
        publication: str | None = None,
        **bounds: Any,
    ) -> pa.Table:
        """Run DuckDB SQL over a published basis (latest, by id, or as of an instant).

        A naive ``as_of`` is read as UTC, as ``combined sql --as-of`` reads it.
        ``bounds`` are :func:`~combined.lake._query.run_query`'s ``timeout_s``
        and ``memory_limit``.
        """
        from combined.lake._query import FilesRemoved, run_query

        if as_of is not None and publication is not None:
            # One of them would be ignored, and which basis the rows came from unsaid.
            raise ConfigError(
                "a query reads one published basis: give an instant or a publication, not both",
                hint="drop --as-of or --publication",
            )
        if as_of is not None and as_of.tzinfo is None:
            as_of = as_of.replace(tzinfo=UTC)

        with self.catalog.begin() as conn:
            pub = cat.get_publication(conn, publication_id=publication, as_of=as_of)
            if pub is None:
                first = cat.first_publication(conn)
                if as_of is not None and first is not None:
                    raise NotFoundError(
                        f"nothing was published at or before {as_of.isoformat()}: the first "
                        f"publication, {first.id}, is at {first.published_at.isoformat()}",
                        hint=f"give an instant at or after it, or --publication {first.id}",
                    )
                raise NotFoundError(
                    "nothing has been published yet", hint="run `combined capture` first"
                )
            members = cat.published_basis(conn, pub.seq)
            forgotten = resets.forgotten_members(conn, pub.seq)
        read = [m for m in members if (m.source, m.dataset) not in forgotten]
        unread = [
            _forgotten(m, reset, pub)
            for m in members
            if (reset := forgotten.get((m.source, m.dataset))) is not None
        ]
        try:
            return run_query(self.layout, read, query, pub, unread=unread, **bounds)
        except FilesRemoved as exc:
            from combined.maintain import explain_removed

            raise explain_removed(self.catalog, self.project, exc, pub) from None
        except OSError as exc:  # the lake's store unreachable, or refusing (an internal error)
            from combined.lake._probe import read_failure

            raise read_failure(
                f"the lake at {self.layout.store.root} could not be read", exc
            ) from None

    def runs(self, limit: int = 20, states: Sequence[RunState] | None = None) -> list[Run]:
        """Newest Runs first (only those in ``states`` when given)."""
        _check_limit(limit)
        with self.catalog.begin() as conn:
            return runs_repo.list_runs(conn, limit=limit, states=states)

    def lost_tables(self) -> CombinedError | None:
        """The error naming each declared dataset's table the lake lost, or holds at an
        older version than the catalog recorded (``runtime._lost``); None when none.

        A load of each table's log (its checkpoint and the entries after it):
        ``combined check`` asks, not ``status``, which lists the lake once a source.
        """
        from combined.runtime._lost import DeclaredDataset, lost_tables

        declared = [DeclaredDataset(s, n, d.strategy) for s, n, d in self.project.datasets()]
        return lost_tables(self.catalog, self.layout, declared)

    def gone(self) -> dict[str, datetime]:
        """The Runs not ended whose process is gone (a repair would end them now), each
        with when it was last heard from; read only, nothing is ended here."""
        from datetime import timedelta

        from combined.catalog import queue
        from combined.runtime._lease import lease_ttl

        with self.catalog.begin() as conn:
            return queue.gone(conn, timedelta(seconds=lease_ttl()))

    def activity(
        self,
        limit: int = 50,
        *,
        kind: str | None = None,
        run_id: str | None = None,
        source: str | None = None,
        dataset: str | None = None,
        since: datetime | None = None,
    ) -> list[dict[str, Any]]:
        """The Activity feed, newest first, filtered by kind, Run, source, dataset or time."""
        _check_limit(limit)
        with self.catalog.begin() as conn:
            rows = cat.activity(
                conn,
                limit=limit,
                kind=kind,
                run_id=run_id,
                source=source,
                dataset=dataset,
                since=since,
            )
        return [dict(r._mapping) for r in rows]

    def run(self, run_id: str) -> dict[str, Any]:
        """One Run with its admission, attempts and deliveries."""
        with self.catalog.begin() as conn:
            run = runs_repo.get_run(conn, run_id)
            return {
                "run": run,
                "admission": runs_repo.get_admission(conn, run.admission_id),
                "attempts": runs_repo.list_attempts(conn, run.id),
                "deliveries": cat.deliveries(conn, run_id=run.id),
                "activity": cat.activity(conn, run_id=run.id, limit=200),
            }

    def status(self, *, slots: bool = True) -> list[dict[str, Any]]:
        """Freshness and published position per declared dataset (see :mod:`._freshness`).

        ``slots`` adds each cdc dataset's replication slot lag, which asks
        the source; without it, only the catalog is read, and the lake listed
        (once a source) for the tables it records that the lake lost
        (``table_missing``: their captures are refused).
        """
        from combined._freshness import add_missing_tables, add_slot_lag, dataset_status

        rows = dataset_status(self.catalog, self.project)
        add_missing_tables(self.layout, rows)
        if slots:
            add_slot_lag(self._engine, rows)
        return rows

    def history(self, name: str) -> list[dict[str, Any]]:
        """A dataset's versions with their publications."""
        source, _, dataset = name.partition(".")
        self.project.dataset(source, dataset)
        import sqlalchemy as sa

        from combined.catalog import _schema as t

        with self.catalog.begin() as conn:
            out = []
            for v in cat.versions(conn, source, dataset):
                pubs = conn.execute(
                    sa.select(t.publication_members.c.publication_id).where(
                        t.publication_members.c.source == source,
                        t.publication_members.c.dataset == dataset,
                        t.publication_members.c.dataset_version == v.id,
                    )
                ).scalars()
                out.append({**dict(v._mapping), "publications": list(pubs)})
        return out

    def explain(
        self, name: str, key: Sequence[Any] | str | int = (), *, id: str | None = None
    ) -> Explanation:
        """Every version of one row of ``SOURCE.DATASET``, read from the raw layer, with
        its evidence; and why a row not in the projection is not there. The row is given
        by its key values, or by its ``id`` (its ``_combined_id`` in hex: the only way for
        a dataset without a key)."""
        from combined.evidence import explain

        # One value alone (``explain("shop.orders", 12)``), and values of any type,
        # as their text: a key's values are given as `combined explain` takes them.
        values = list(key) if isinstance(key, list | tuple) else [key]
        return explain(self._engine, name, [str(v) for v in values], row_id=id)

    def plan(self, sources: Sequence[str] = ()) -> list[SourcePlan]:
        """Each source's ingestion design, every claim with its evidence (``combined plan``)."""
        from combined.evidence import plans

        return plans(self._engine, sources)

    def replay(
        self,
        name: str,
        *,
        to_version: str | None = None,
        into: str | None = None,
        replace: bool = False,
        compared: Callable[[Replay], None] | None = None,
    ) -> Replay:
        """Rebuild ``SOURCE.DATASET``'s projection from its raw Deliveries alone (to
        ``to_version``), compare it row by row with the table, and write it ``into``
        a new table, or (``replace``, when they differ) as the table's newest version
        once ``compared`` was told the comparison."""
        from combined.evidence import replay

        try:
            return replay(
                self._engine,
                name,
                to_version=to_version,
                into=into,
                replace=replace,
                compared=compared,
            )
        except OSError as exc:  # the lake's store unreachable, or refusing (an internal error)
            from combined.lake._probe import read_failure

            raise read_failure(
                f"replaying {name}: the lake at {self.layout.store.root}", exc
            ) from None

    def publications(self, limit: int = 20) -> list[dict[str, Any]]:
        """Newest publications with their members."""
        _check_limit(limit)
        with self.catalog.begin() as conn:
            return [
                {
                    **dict(p._mapping),
                    "member_rows": [dict(m._mapping) for m in cat.members_of(conn, p.id)],
                }
                for p in cat.list_publications(conn, limit)
            ]

    def publication_map(self, limit: int = 20, dataset: str | None = None) -> list[dict[str, Any]]:
        """Per publication, each dataset's Delta version and table URI (``docs/readers.md``)."""
        from combined._published import publication_map

        _check_limit(limit)
        if dataset is not None:
            source, _, name = dataset.partition(".")
            self.project.dataset(source, name)
        try:
            return publication_map(self.catalog, self.layout, limit, dataset)
        except OSError as exc:  # (the store unreachable, refusing: not a bug)
            from combined.lake._probe import read_failure

            raise read_failure(
                f"the lake at {self.layout.store.root} could not be read", exc
            ) from None

    def usage(self, month: str | None = None) -> list[dict[str, Any]]:
        """MAR per source and dataset (and month)."""
        with self.catalog.begin() as conn:
            return [dict(r._mapping) for r in cat.usage_rows(conn, month)]

    # -- quarantine -------------------------------------------------------------------

    def quarantine(
        self, source: str | None = None, *, include_decided: bool = False
    ) -> list[dict[str, Any]]:
        """Quarantine entries awaiting a decision (or every one), newest first."""
        from combined.quality import quarantine

        rows = quarantine.entries(self.catalog, source=source, include_decided=include_decided)
        if not rows and source is not None and source not in self.project.sources:
            # A misspelt source would read as "nothing awaits review". A source
            # since removed from the file still lists the entries it left.
            self.project.source(source)
        return rows

    def quarantine_records(
        self, quarantine_id: str, limit: int = 20, offset: int = 0
    ) -> tuple[dict[str, Any], pa.Table]:
        """A quarantine entry and ``limit`` of its records from ``offset`` (all for 0)."""
        from combined.quality import quarantine

        return quarantine.records(self.catalog, self.layout, quarantine_id, limit, offset)

    def decide_quarantine(
        self, quarantine_id: str, decision: str, *, by: str, reason: str
    ) -> dict[str, Any]:
        """Release (keep as evidence) or discard (delete) a quarantine entry, recorded."""
        from combined.quality import quarantine

        return quarantine.decide(
            self.catalog, self.layout, quarantine_id, decision, by=by, reason=reason
        )

    def remind_quarantine(self, now: datetime | None = None) -> list[str]:
        """Alert (once a review period) on quarantine entries whose review is overdue."""
        from combined.quality import quarantine

        cadence = {(s, n): d.quarantine.review_every for s, n, d in self.project.datasets()}
        notes = quarantine.remind(self.catalog, lambda s, n: cadence.get((s, n)), now)
        for note in notes:
            self.reporter.note(note)
        return notes


def _check_limit(limit: int) -> None:
    # SQLite reads LIMIT -1 as "no limit", PostgreSQL refuses it: neither is what was asked.
    if limit < 0:
        raise ConfigError(f"--limit must be 0 or more, not {limit}", hint="e.g. --limit 20")


def _forgotten(member: Any, reset: Any, publication: Any) -> QueryError:
    """Why a query does not read ``member``: a ``combined reset`` forgot its table since."""
    from combined.lake._query import QueryError

    return QueryError(
        f"publication {publication.id} reads {member.source}.{member.dataset} at lake version "
        f"{member.lake_version} of the table `combined reset` forgot on "
        f"{reset.at.isoformat(timespec='seconds')} (by {reset.by}: {reset.reason})",
        hint="query a publication made since (`combined publications` lists them); its "
        "next capture publishes its new table",
        source=member.source,
        dataset=member.dataset,
    )
