"""Deliveries, dataset versions, publications, usage, activity, quarantine."""

from __future__ import annotations

import hashlib
import logging
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from combined.catalog import _governance, _resets
from combined.catalog import _schema as t
from combined.catalog._basis import newest_seqs
from combined.catalog._catalog import COMMITTED_LOG, LEDGER
from combined.errors import NotFoundError, ProtocolViolation, redact
from combined.protocol import utcnow

_log = logging.getLogger("combined.activity")

#: ``expired``: committed, its raw file removed under ``retention.raw`` (a recorded decision).
DeliveryState = Literal["staged", "committed", "rejected", "retained", "expired"]


# -- sources and datasets ---------------------------------------------------


def upsert_source(
    conn: Connection, name: str, connector: str, config: Mapping[str, Any], digest: str
) -> None:
    """Record a source's redacted configuration (never a secret)."""
    values = {
        "connector": connector,
        "config": dict(config),
        "config_digest": digest,
        "updated_at": utcnow(),
    }
    _upsert(conn, t.sources, {"name": name}, {}, values)


def _upsert(
    conn: Connection,
    table: sa.Table,
    key: Mapping[str, Any],
    new: Mapping[str, Any],
    values: Mapping[str, Any],
) -> None:
    """Update the row at ``key`` with ``values``, or insert it (with ``new`` too).

    Two processes declaring one source at once (two API requests, two
    workers) must not both insert it. PostgreSQL: one ``ON CONFLICT``
    statement. SQLite: the update, the transaction's first write, holds the
    database's one write lock until the insert commits.
    """
    if conn.dialect.name == "postgresql":
        from sqlalchemy.dialects.postgresql import insert

        conn.execute(
            insert(table)
            .values(**key, **new, **values)
            .on_conflict_do_update(index_elements=list(key), set_=dict(values))
        )
        return
    where = [table.c[k] == v for k, v in key.items()]
    if conn.execute(table.update().where(*where).values(**values)).rowcount == 0:
        conn.execute(table.insert().values(**key, **new, **values))


def record_discovery(
    conn: Connection, source: str, connector: str, revision: str, body: Mapping[str, Any]
) -> int:
    """Store a discovery as the source's next version; returns the version.

    A discovery that finds what the latest one found (its time aside) is no
    new version: the latest's number is returned.
    """
    latest = latest_discovery(conn, source)
    if latest is not None and (latest.connector, latest.revision) == (connector, revision):
        if _found(latest.body) == _found(body):
            return int(latest.version)
    version = int(latest.version if latest is not None else 0) + 1
    conn.execute(
        t.discoveries.insert().values(
            source=source,
            version=version,
            connector=connector,
            revision=revision,
            body=dict(body),
            discovered_at=utcnow(),
        )
    )
    return version


def _found(body: Mapping[str, Any]) -> str:
    """A discovery's findings, as comparable text: its time left out."""
    import json

    return json.dumps({k: v for k, v in body.items() if k != "discovered_at"}, sort_keys=True)


def latest_discovery(conn: Connection, source: str) -> sa.Row[Any] | None:
    """The newest stored discovery of a source."""
    return conn.execute(
        sa.select(t.discoveries)
        .where(t.discoveries.c.source == source)
        .order_by(t.discoveries.c.version.desc())
        .limit(1)
    ).first()


def ensure_dataset(
    conn: Connection,
    source: str,
    name: str,
    *,
    relation: str,
    key: Sequence[str],
    strategy: str,
    sync_mode: str,
    freshness_target_s: int | None,
) -> sa.Row[Any]:
    """Create or refresh the declaration part of a dataset row."""
    values = {
        "relation": relation,
        "key": list(key),
        "strategy": strategy,
        "sync_mode": sync_mode,
        "freshness_target_s": freshness_target_s,
    }
    _upsert(
        conn,
        t.datasets,
        {"source": source, "name": name},
        {"schema_revision": 0, "last_sequence": 0},
        values,
    )
    return get_dataset(conn, source, name)


def get_dataset(conn: Connection, source: str, name: str) -> sa.Row[Any]:
    """One dataset's catalog row."""
    row = conn.execute(
        sa.select(t.datasets).where(t.datasets.c.source == source, t.datasets.c.name == name)
    ).first()
    if row is None:
        raise NotFoundError(f"no dataset {source}.{name} in the catalog")
    return row


def list_datasets(conn: Connection) -> list[sa.Row[Any]]:
    """Every dataset row, by source and name."""
    return list(
        conn.execute(sa.select(t.datasets).order_by(t.datasets.c.source, t.datasets.c.name))
    )


def update_dataset(conn: Connection, source: str, name: str, **values: Any) -> None:
    """Set projection fields of a dataset (checkpoint, lake version, current version...)."""
    conn.execute(
        t.datasets.update()
        .where(t.datasets.c.source == source, t.datasets.c.name == name)
        .values(**values)
    )


# -- deliveries ---------------------------------------------------------------


def record_delivery(conn: Connection, **values: Any) -> None:
    """Record a staged Delivery (idempotent on its deterministic id)."""
    exists = conn.execute(
        sa.select(t.deliveries.c.id).where(t.deliveries.c.id == values["id"])
    ).first()
    if exists is None:
        conn.execute(t.deliveries.insert().values(created_at=utcnow(), **values))


def mark_deliveries(
    conn: Connection,
    ids: Sequence[str],
    state: DeliveryState,
    *,
    lake_version: int | None = None,
    committed_at: datetime | None = None,
    path: str | None = None,
) -> None:
    """Move Deliveries to a new commit state."""
    values: dict[str, Any] = {"state": state}
    if lake_version is not None:
        values["lake_version"] = lake_version
    if committed_at is not None:
        values["committed_at"] = committed_at
    for delivery_id in ids:
        row_values = dict(values)
        if path is not None:
            row_values["path"] = path.format(id=delivery_id)
        conn.execute(
            t.deliveries.update().where(t.deliveries.c.id == delivery_id).values(**row_values)
        )


def deliveries(
    conn: Connection,
    *,
    run_id: str | None = None,
    source: str | None = None,
    dataset: str | None = None,
    states: Sequence[DeliveryState] | None = None,
) -> list[sa.Row[Any]]:
    """Deliveries by run or dataset, in sequence order."""
    q = sa.select(t.deliveries).order_by(t.deliveries.c.dataset, t.deliveries.c.sequence)
    if run_id is not None:
        q = q.where(t.deliveries.c.run_id == run_id)
    if source is not None:
        q = q.where(t.deliveries.c.source == source)
    if dataset is not None:
        q = q.where(t.deliveries.c.dataset == dataset)
    if states:
        q = q.where(t.deliveries.c.state.in_(list(states)))
    return list(conn.execute(q))


# -- dataset versions ---------------------------------------------------------


@dataclass(frozen=True, slots=True)
class VersionTotals:
    """The totals a dataset version's identity covers."""

    row_count: int
    content_digest: str


def version_id(
    dataset: str, parent: str | None, transition_digest: str, totals: VersionTotals
) -> str:
    """Identity of a dataset version: hash(dataset, parent, transition digest, totals).

    The dataset is part of it so that two datasets with equal content never
    share a version id.
    """
    body = (
        f"v2|{dataset}|{parent or '-'}|{transition_digest}|"
        f"{totals.row_count}|{totals.content_digest}"
    )
    return hashlib.sha256(body.encode()).hexdigest()[:32]


def get_version(conn: Connection, version: str) -> sa.Row[Any] | None:
    """One dataset version by id."""
    return conn.execute(
        sa.select(t.dataset_versions).where(t.dataset_versions.c.id == version)
    ).first()


def add_version(conn: Connection, **values: Any) -> None:
    """Record a dataset version (idempotent on its id)."""
    if get_version(conn, values["id"]) is None:
        conn.execute(t.dataset_versions.insert().values(created_at=utcnow(), **values))


def versions(conn: Connection, source: str, dataset: str) -> list[sa.Row[Any]]:
    """A dataset's versions, oldest first."""
    return list(
        conn.execute(
            sa.select(t.dataset_versions)
            .where(t.dataset_versions.c.source == source, t.dataset_versions.c.dataset == dataset)
            .order_by(t.dataset_versions.c.lake_version, t.dataset_versions.c.created_at)
        )
    )


# -- publications -------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Member:
    """One dataset's place in a publication."""

    source: str
    dataset: str
    dataset_version: str | None
    lake_version: int | None
    source_position: str | None
    extraction_receipt: Mapping[str, Any] | None
    committed_at: datetime | None
    changed: bool


def publish(
    conn: Connection, run_id: str | None, members: Sequence[Member], runs: Sequence[str] = ()
) -> str:
    """Insert one publication and its member set (the caller's transaction makes it atomic).

    Raises ProtocolViolation when a member is older than the lake version its
    dataset was last published at: the basis never moves back (a Run that
    stalled while another published the dataset after it).
    """
    one_publisher(conn)
    _refuse_older(conn, run_id, members)
    seq = int(conn.execute(sa.select(sa.func.max(t.publications.c.seq))).scalar() or 0) + 1
    pub_id = f"p{seq:06d}-{uuid.uuid4().hex[:6]}"
    now = utcnow()
    token = hashlib.sha256(
        "|".join(f"{m.source}.{m.dataset}@{m.lake_version}" for m in members).encode()
    ).hexdigest()[:32]
    row = {"id": pub_id, "seq": seq, "run_id": run_id, "published_at": now, "snapshot_token": token}
    ledger = conn.info.get(LEDGER)
    if ledger is not None:  # the lake first: a publication the catalog holds is in the lake
        ledger.publication(
            _governance.record(conn, row, members, runs or ([run_id] if run_id else []))
        )
        from combined.runtime._faults import fault

        fault("after_ledger")
    conn.execute(t.publications.insert().values(**row))
    for m in members:
        conn.execute(
            t.publication_members.insert().values(
                publication_id=pub_id,
                source=m.source,
                dataset=m.dataset,
                dataset_version=m.dataset_version,
                lake_version=m.lake_version,
                source_position=m.source_position,
                extraction_receipt=dict(m.extraction_receipt) if m.extraction_receipt else None,
                committed_at=m.committed_at,
                changed=m.changed,
            )
        )
        conn.execute(
            t.datasets.update()
            .where(t.datasets.c.source == m.source, t.datasets.c.name == m.dataset)
            .values(published_at=now)
        )
    return pub_id


def _refuse_older(conn: Connection, run_id: str | None, members: Sequence[Member]) -> None:
    """Raise if a member is older than the lake version its dataset was last published at."""
    pm, p = t.publication_members, t.publications
    for m in members:
        if m.lake_version is None:
            continue
        # (a member published before the dataset's reset read the table it forgot)
        since = _resets.reset_seq(conn, m.source, m.dataset)
        newest = conn.execute(
            sa.select(pm.c.lake_version)
            .join(p, p.c.id == pm.c.publication_id)
            .where(pm.c.source == m.source, pm.c.dataset == m.dataset, p.c.seq > since)
            .order_by(p.c.seq.desc())
            .limit(1)
        ).scalar()
        if newest is not None and int(newest) > int(m.lake_version):
            raise ProtocolViolation(
                f"{m.source}.{m.dataset} is published at lake version {newest}; run {run_id} "
                f"would publish it at the older version {m.lake_version}: nothing was published",
                hint="capture again: the next run publishes from the lake's newest version",
            )


#: The PostgreSQL advisory lock that publishers take in turn ("combined" in ASCII).
_PUBLISH_LOCK = 0x636F6D62696E6564


def one_publisher(conn: Connection) -> None:
    """Make publishing one at a time until the transaction ends.

    Publications are numbered (``seq``) and stamped in order: two processes
    publishing at once (two workers, two captures of different sources) must
    not read the same newest number. PostgreSQL: a transaction-scoped
    advisory lock. SQLite: a write that changes nothing, which takes the
    database's one write lock (every read after it sees the newest rows).
    """
    if conn.dialect.name == "postgresql":
        conn.execute(sa.text("SELECT pg_advisory_xact_lock(:key)"), {"key": _PUBLISH_LOCK})
    else:
        conn.execute(t.publications.update().where(sa.false()).values(seq=t.publications.c.seq))


def published_version(conn: Connection, source: str, dataset: str) -> str | None:
    """The dataset version of a dataset's newest publication (None: never published)."""
    pm, p = t.publication_members, t.publications
    row = conn.execute(
        sa.select(pm.c.dataset_version)
        .join(p, p.c.id == pm.c.publication_id)
        .where(pm.c.source == source, pm.c.dataset == dataset)
        .order_by(p.c.seq.desc())
        .limit(1)
    ).first()
    return None if row is None else row.dataset_version


def get_publication(
    conn: Connection, *, publication_id: str | None = None, as_of: datetime | None = None
) -> sa.Row[Any] | None:
    """The latest publication, one by id or prefix, or the newest at or before ``as_of``."""
    q = sa.select(t.publications).order_by(t.publications.c.seq.desc()).limit(1)
    if publication_id is not None:
        return _publication_by_id(conn, publication_id)
    if as_of is not None:
        q = q.where(t.publications.c.published_at <= as_of)
    return conn.execute(q).first()


def _publication_by_id(conn: Connection, publication_id: str) -> sa.Row[Any]:
    """The publication of that id, or the only one whose id starts with it."""
    p = t.publications
    exact = conn.execute(sa.select(p).where(p.c.id == publication_id)).first()
    if exact is not None:
        return exact
    # A prefix names a publication only when it names one (the newest of
    # several would be a guess), and its characters are matched as they are:
    # a ``%`` or ``_`` in it is no pattern.
    found = list(
        conn.execute(
            sa.select(p.c.id)
            .where(p.c.id.startswith(publication_id, autoescape=True))
            .order_by(p.c.seq)
            .limit(6)
        ).scalars()
    )
    if not found:
        raise NotFoundError(
            f"no publication {publication_id!r}", hint="list them with `combined publications`"
        )
    if len(found) > 1:
        many = f"{len(found)}" if len(found) <= 5 else "more than 5"
        listed = ", ".join(found[:5]) + (", ..." if len(found) > 5 else "")
        raise NotFoundError(
            f"publication prefix {publication_id!r} matches {many} publications ({listed})",
            hint="give more of the id; `combined publications` lists them",
        )
    return conn.execute(sa.select(p).where(p.c.id == found[0])).one()


def first_publication(conn: Connection) -> sa.Row[Any] | None:
    """The oldest publication (None before the first one)."""
    return conn.execute(sa.select(t.publications).order_by(t.publications.c.seq).limit(1)).first()


def published_basis(conn: Connection, publication_seq: int) -> list[Member]:
    """Each dataset's newest member published at or before publication ``seq``."""
    pm, p = t.publication_members, t.publications
    newest = newest_seqs(publication_seq)
    rows = conn.execute(
        sa.select(pm)
        .join(p, p.c.id == pm.c.publication_id)
        .join(
            newest,
            sa.and_(
                newest.c.source == pm.c.source,
                newest.c.dataset == pm.c.dataset,
                newest.c.seq == p.c.seq,
            ),
        )
        .order_by(pm.c.source, pm.c.dataset)
    )
    return [
        Member(
            source=r.source,
            dataset=r.dataset,
            dataset_version=r.dataset_version,
            lake_version=r.lake_version,
            source_position=r.source_position,
            extraction_receipt=r.extraction_receipt,
            committed_at=r.committed_at,
            changed=r.changed,
        )
        for r in rows
    ]


def kept_lake_versions(
    conn: Connection, source: str, dataset: str, since: datetime | None
) -> set[int]:
    """The dataset's lake versions a publication reads at ``since`` or after (None: ever).

    The basis in force at ``since`` is kept too: ``--as-of`` any instant from
    then on reads it until a newer publication of the dataset.
    """
    pm, p = t.publication_members, t.publications
    q = sa.select(pm.c.lake_version).join(p, p.c.id == pm.c.publication_id)
    q = q.where(pm.c.source == source, pm.c.dataset == dataset, pm.c.lake_version.is_not(None))
    if since is None:
        return {int(v) for v in conn.execute(q.distinct()).scalars()}
    kept = {int(v) for v in conn.execute(q.where(p.c.published_at >= since)).scalars()}
    at_horizon = conn.execute(
        q.where(p.c.published_at < since).order_by(p.c.seq.desc()).limit(1)
    ).scalar()
    if at_horizon is not None:
        kept.add(int(at_horizon))
    return kept


def newest_members(conn: Connection) -> dict[tuple[str, str], Member]:
    """Each published dataset's member in its newest publication."""
    seq = conn.execute(sa.select(sa.func.max(t.publications.c.seq))).scalar()
    if seq is None:
        return {}
    return {(m.source, m.dataset): m for m in published_basis(conn, int(seq))}


def list_publications(conn: Connection, limit: int = 20) -> list[sa.Row[Any]]:
    """Newest publications first, with their member counts."""
    pm, p = t.publication_members, t.publications
    q = (
        sa.select(p, sa.func.count(pm.c.dataset).label("members"))
        .join(pm, pm.c.publication_id == p.c.id, isouter=True)
        .group_by(p.c.id, p.c.seq, p.c.run_id, p.c.published_at, p.c.snapshot_token)
        .order_by(p.c.seq.desc())
        .limit(limit)
    )
    return list(conn.execute(q))


def members_of(conn: Connection, publication_id: str) -> list[sa.Row[Any]]:
    """The member rows of one publication."""
    pm = t.publication_members
    return list(
        conn.execute(
            sa.select(pm).where(pm.c.publication_id == publication_id).order_by(pm.c.dataset)
        )
    )


# -- usage, activity, quarantine ----------------------------------------------


def set_usage(
    conn: Connection,
    source: str,
    dataset: str,
    month: str,
    *,
    mar: int,
    inserts: int,
    updates: int,
    deletes: int,
) -> None:
    """Project a month's MAR (computed from the lake's identity set)."""
    where = (t.usage.c.source == source, t.usage.c.dataset == dataset, t.usage.c.month == month)
    values = {
        "mar": mar,
        "inserts": inserts,
        "updates": updates,
        "deletes": deletes,
        "updated_at": utcnow(),
    }
    if conn.execute(t.usage.update().where(*where).values(**values)).rowcount == 0:
        conn.execute(t.usage.insert().values(source=source, dataset=dataset, month=month, **values))


def usage_rows(conn: Connection, month: str | None = None) -> list[sa.Row[Any]]:
    """MAR rows, optionally of one month."""
    q = sa.select(t.usage).order_by(t.usage.c.month, t.usage.c.source, t.usage.c.dataset)
    if month is not None:
        q = q.where(t.usage.c.month == month)
    return list(conn.execute(q))


def emit(
    conn: Connection,
    kind: str,
    *,
    source: str | None = None,
    dataset: str | None = None,
    run_id: str | None = None,
    **body: Any,
) -> None:
    """Append one event to the Activity feed (its body's text redacted, as every error is).

    It is logged too (``combined.activity``, INFO), with its fields, once the
    catalog transaction commits (:data:`~combined.catalog._catalog.COMMITTED_LOG`).
    """
    redacted = _redacted_text(body)
    conn.execute(
        t.activity.insert().values(
            at=utcnow(),
            kind=kind,
            source=source,
            dataset=dataset,
            run_id=run_id,
            body=redacted,
        )
    )
    if not _log.isEnabledFor(logging.INFO):
        return
    where = ".".join(p for p in (source, dataset) if p)
    extra = {"event": kind, "source": source, "dataset": dataset, "run_id": run_id}

    def tell() -> None:
        _log.info(
            "%s%s%s",
            kind,
            f" {where}" if where else "",
            f" run {run_id}" if run_id else "",
            extra={**{k: v for k, v in extra.items() if v is not None}, "body": redacted},
        )

    told = conn.info.get(COMMITTED_LOG)
    if told is None:
        tell()  # a connection of no catalog transaction: told now
    else:
        told.append(tell)  # told when the transaction commits, never when it rolls back


def _redacted_text(value: Any) -> Any:
    """``value`` with each text in it passed through :func:`redact` (keys and numbers kept)."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, Mapping):
        return {key: _redacted_text(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_redacted_text(item) for item in value]
    return value


def activity(
    conn: Connection,
    *,
    limit: int = 50,
    kind: str | None = None,
    run_id: str | None = None,
    source: str | None = None,
    dataset: str | None = None,
    since: datetime | None = None,
    exact: bool = False,
) -> list[sa.Row[Any]]:
    """Newest Activity events first.

    ``kind`` matches that kind and the kinds below it (``alert`` matches
    ``alert.freshness``), or that kind alone when ``exact``; ``since`` keeps
    the events at or after that instant.
    """
    q = sa.select(t.activity).order_by(t.activity.c.id.desc()).limit(limit)
    for column, value in (("run_id", run_id), ("source", source), ("dataset", dataset)):
        if value is not None:
            q = q.where(t.activity.c[column] == value)
    if kind is not None and exact:
        q = q.where(t.activity.c.kind == kind)
    elif kind is not None:
        q = q.where(
            sa.or_(
                t.activity.c.kind == kind, t.activity.c.kind.startswith(f"{kind}.", autoescape=True)
            )
        )
    if since is not None:
        q = q.where(t.activity.c.at >= since)
    return list(conn.execute(q))


def add_quarantine(conn: Connection, **values: Any) -> None:
    """Record a quarantined batch (its payload lives in the lake's quarantine area)."""
    row = {"created_at": utcnow(), "decision": None, "decided_at": None, "decided_by": None}
    row.update(values)
    _to_ledger(conn, row)
    conn.execute(t.quarantine.insert().values(**row))


def _to_ledger(conn: Connection, row: Mapping[str, Any]) -> None:
    """Give a quarantine entry, as it now is, to the lake's ledger (the lake first)."""
    ledger = conn.info.get(LEDGER)
    if ledger is not None:
        ledger.quarantine(_governance.jsonable(dict(row)))


def _quarantine_changed(conn: Connection, quarantine_id: str) -> None:
    row = conn.execute(sa.select(t.quarantine).where(t.quarantine.c.id == quarantine_id)).one()
    _to_ledger(conn, dict(row._mapping))


def quarantined(conn: Connection, source: str | None = None) -> list[sa.Row[Any]]:
    """Quarantine entries, newest first."""
    q = sa.select(t.quarantine).order_by(t.quarantine.c.created_at.desc())
    if source is not None:
        q = q.where(t.quarantine.c.source == source)
    return list(conn.execute(q))


#: Decisions that close a quarantine's review. ``released``: the records were
#: reviewed and stay in quarantine as evidence; ``discarded``: they were
#: reviewed and their file is deleted. Only a released entry may be decided
#: again (discarded later); a discarded one is final.
QUARANTINE_DECISIONS = ("released", "discarded")


def get_quarantine(conn: Connection, quarantine_id: str) -> sa.Row[Any]:
    """One quarantine entry; NotFoundError when there is none of that id."""
    row = conn.execute(sa.select(t.quarantine).where(t.quarantine.c.id == quarantine_id)).first()
    if row is None:
        raise NotFoundError(
            f"no quarantine entry {quarantine_id!r}",
            hint="`combined quarantine list --all` lists every entry",
        )
    return row


def decide_quarantine(
    conn: Connection, quarantine_id: str, decision: str, *, by: str, before: str | None
) -> bool:
    """Record ``decision`` on an entry still in state ``before`` (None: undecided).

    Returns False when the entry moved meanwhile (another reviewer decided first).
    """
    q = t.quarantine
    done = conn.execute(
        q.update()
        .where(
            q.c.id == quarantine_id,
            q.c.decision.is_(None) if before is None else q.c.decision == before,
        )
        .values(decision=decision, decided_at=utcnow(), decided_by=by)
    )
    if done.rowcount == 1:
        _quarantine_changed(conn, quarantine_id)
    return bool(done.rowcount == 1)


def overdue_quarantine(conn: Connection, now: datetime) -> list[sa.Row[Any]]:
    """Undecided entries whose review is due at or before ``now``, oldest first."""
    q = t.quarantine
    return list(
        conn.execute(
            sa.select(q)
            .where(q.c.decision.is_(None), q.c.review_due_at <= now)
            .order_by(q.c.review_due_at)
        )
    )


def postpone_review(
    conn: Connection, quarantine_id: str, *, was: datetime, until: datetime
) -> bool:
    """Move an undecided entry's next review from ``was`` to ``until`` (once: compare-and-set)."""
    q = t.quarantine
    done = conn.execute(
        q.update()
        .where(q.c.id == quarantine_id, q.c.decision.is_(None), q.c.review_due_at == was)
        .values(review_due_at=until)
    )
    if done.rowcount == 1:
        _quarantine_changed(conn, quarantine_id)
    return bool(done.rowcount == 1)
