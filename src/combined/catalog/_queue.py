"""The Run queue: queued Runs wait for a worker, and exactly one worker takes each.

A Run admitted to be executed at once (``combined capture``) is taken at
admission by the process that admitted it. A Run admitted to the queue
(``combined capture --enqueue``, the API, a webhook) has no taker until a
worker takes it with :func:`take`; that move is atomic across processes and
hosts, so two workers never execute the same Run.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from combined.catalog import _schema as t
from combined.catalog._catalog import _live
from combined.catalog._runs import Run, get_run
from combined.protocol import utcnow

#: Lease holders that are a recovery projecting a dataset: a Run waits for them.
_REPAIR = "repair:"


def take(conn: Connection, holder: str, *, scan: int = 20) -> Run | None:
    """Take the oldest queued Run whose datasets no live Run holds; None when none waits.

    On PostgreSQL the candidates are read ``FOR UPDATE SKIP LOCKED``: a
    worker never waits on, nor takes, a candidate another worker is looking
    at. On SQLite (no row locks) the conditional update decides: of two
    takers of one Run only the first still finds it untaken. A Run whose
    dataset another Run holds is left queued for a later turn rather than
    failed for being busy.
    """
    rows = conn.execute(
        sa.select(t.runs.c.id, t.runs.c.source, t.runs.c.datasets)
        .where(t.runs.c.state == "queued", t.runs.c.claimed_by.is_(None), _due())
        .order_by(t.runs.c.created_at, t.runs.c.id)
        .limit(scan)
        .with_for_update(skip_locked=True)
    ).all()
    for row in rows:
        if _held(conn, row.source, list(row.datasets)):
            continue
        taken = conn.execute(
            t.runs.update()
            .where(
                t.runs.c.id == row.id,
                t.runs.c.state == "queued",
                t.runs.c.claimed_by.is_(None),
            )
            .values(claimed_by=holder, claimed_at=utcnow())
        )
        if taken.rowcount == 1:
            return get_run(conn, row.id)
    return None


def _due() -> sa.ColumnElement[bool]:
    """A queued Run's ``not_before`` (a source's Retry-After) has passed, or it has none."""
    return sa.or_(t.runs.c.not_before.is_(None), t.runs.c.not_before <= utcnow())


def _held(conn: Connection, source: str, datasets: Sequence[str]) -> bool:
    """Whether a live Run (not a repair, which a Run waits for) leases one of ``datasets``."""
    rows = conn.execute(
        sa.select(t.leases).where(t.leases.c.source == source, t.leases.c.dataset.in_(datasets))
    ).all()
    return any(
        not str(r.run_id).startswith(_REPAIR) and _live(r.holder, r.expires_at) for r in rows
    )


def give_back(conn: Connection, run_id: str, holder: str) -> bool:
    """Put a Run ``holder`` took, still queued, back in the queue; False when it moved on."""
    result = conn.execute(
        t.runs.update()
        .where(
            t.runs.c.id == run_id,
            t.runs.c.state == "queued",
            t.runs.c.claimed_by == holder,
        )
        .values(claimed_by=None, claimed_at=None)
    )
    return bool(result.rowcount == 1)


def give_back_all(conn: Connection, holder: str) -> int:
    """Put every Run ``holder`` took and has not started back in the queue; how many.

    After a catalog connection lost while ``holder`` took a Run, the claim may have
    been kept though the worker never learned of it: while the worker lives, no other
    would take that Run, nor recovery close it.
    """
    result = conn.execute(
        t.runs.update()
        .where(t.runs.c.state == "queued", t.runs.c.claimed_by == holder)
        .values(claimed_by=None, claimed_at=None)
    )
    return int(result.rowcount or 0)


def lock_dataset(conn: Connection, source: str, dataset: str) -> None:
    """Serialize admissions of one dataset until the transaction ends.

    A write that changes nothing: on PostgreSQL it locks the dataset's row,
    on SQLite it starts the write transaction (one writer at a time), so a
    check for a waiting Run and the admission that follows it are atomic.
    """
    conn.execute(
        t.datasets.update()
        .where(t.datasets.c.source == source, t.datasets.c.name == dataset)
        .values(name=t.datasets.c.name)
    )


def waiting(conn: Connection, source: str, dataset: str) -> Run | None:
    """The oldest queued Run no worker took yet that captures ``source.dataset``."""
    rows = conn.execute(
        sa.select(t.runs.c.id, t.runs.c.datasets)
        .where(
            t.runs.c.source == source,
            t.runs.c.state == "queued",
            t.runs.c.claimed_by.is_(None),
        )
        .order_by(t.runs.c.created_at, t.runs.c.id)
    ).all()
    for row in rows:
        if dataset in row.datasets:
            return get_run(conn, row.id)
    return None


def queued(conn: Connection, limit: int = 100, *, due: bool = False) -> list[Run]:
    """Runs waiting for a worker, oldest first (with ``due``: only those a worker may take now).

    A retry held back until a source's ``Retry-After`` is not ``due`` before that time.
    """
    query = sa.select(t.runs.c.id).where(t.runs.c.state == "queued", t.runs.c.claimed_by.is_(None))
    if due:
        query = query.where(_due())
    rows = conn.execute(query.order_by(t.runs.c.created_at, t.runs.c.id).limit(limit)).all()
    return [get_run(conn, r.id) for r in rows]


def taker_live(run: Run, ttl: timedelta) -> bool:
    """Whether the process that took a queued Run may still take its leases.

    On this host: while that process lives. Elsewhere: for a lease's time
    to live after it took the Run. A Run nobody took is waiting, not dead.
    """
    return _taker_live(run.claimed_by, run.claimed_at or run.created_at, ttl)


def _taker_live(claimed_by: str | None, taken: datetime, ttl: timedelta) -> bool:
    """:func:`taker_live` of a Run ``claimed_by`` took at ``taken`` (None: nobody took it)."""
    return claimed_by is None or _live(claimed_by, taken + ttl)


def live(
    conn: Connection, source: str, dataset: str, ttl: timedelta, *, besides: str | None = None
) -> Run | None:
    """The oldest capture of ``source.dataset`` waiting in the queue or running; None if none.

    A Run not finished whose process died (it neither waits for a worker
    nor holds a live lease, nor is its taker alive) does not count: the
    next repair closes it. Nor does the Run ``besides`` (one being retried).
    """
    rows = conn.execute(
        sa.select(t.runs.c.id, t.runs.c.datasets)
        .where(
            t.runs.c.source == source, t.runs.c.state.in_(("queued", "extracting", "committing"))
        )
        .order_by(t.runs.c.created_at, t.runs.c.id)
    ).all()
    for row in rows:
        if dataset not in row.datasets or row.id == besides:
            continue
        run = get_run(conn, row.id)
        if run.state == "queued" and run.claimed_by is None or _leased(conn, run.id):
            return run
        if run.claimed_by and taker_live(run, ttl):
            return run
    return None


def abandoned(conn: Connection, ttl: timedelta) -> list[str]:
    """The Runs not ended that lost their process: recovery would close them now.

    Neither waiting for a worker, nor taken by a live one and not started,
    nor holding a live lease. Read from the catalog alone (no lake) in one
    query, whatever the number of Runs going: an idle worker asks at each
    poll.
    """
    return list(gone(conn, ttl))


def gone(conn: Connection, ttl: timedelta) -> dict[str, datetime]:
    """:func:`abandoned`'s Runs, each with when its process was last heard from: its
    leases' newest renewal (their expiry less ``ttl``), else when it was taken.

    Reads only (a listing tells a dead Run apart; the repair ends it).
    """
    runs, leases = t.runs, t.leases
    rows = conn.execute(
        sa.select(
            runs.c.id,
            runs.c.state,
            runs.c.claimed_by,
            runs.c.claimed_at,
            runs.c.created_at,
            runs.c.started_at,
            leases.c.holder,
            leases.c.expires_at,
        )
        .select_from(runs.outerjoin(leases, leases.c.run_id == runs.c.id))
        .where(runs.c.state.in_(("queued", "extracting", "committing")))
        .order_by(runs.c.created_at, runs.c.id)
    ).all()
    alive = {
        r.id
        for r in rows
        if (r.state == "queued" and _taker_live(r.claimed_by, r.claimed_at or r.created_at, ttl))
        or (r.holder is not None and _live(r.holder, r.expires_at))
    }
    heard: dict[str, datetime] = {}
    for r in rows:
        if r.id not in alive:
            at = (
                r.expires_at - ttl
                if r.expires_at is not None
                else r.started_at or r.claimed_at or r.created_at
            )
            heard[r.id] = max(heard[r.id], at) if r.id in heard else at
    return heard


def _leased(conn: Connection, run_id: str) -> bool:
    rows = conn.execute(sa.select(t.leases).where(t.leases.c.run_id == run_id)).all()
    return any(_live(r.holder, r.expires_at) for r in rows)


def last_ticks(conn: Connection, now: datetime | None = None) -> dict[tuple[str, str], datetime]:
    """The newest scheduled tick recorded for each (source, dataset), at or before ``now``.

    A tick after ``now`` was recorded while the clock ran ahead (a machine booted with
    a wrong clock, then set right): taken as the newest, it held every tick back until
    the clock caught up with it, silently.
    """
    ticks = t.schedule_ticks
    q = sa.select(ticks.c.source, ticks.c.dataset, sa.func.max(ticks.c.tick).label("tick"))
    if now is not None:
        q = q.where(ticks.c.tick <= now)
    rows = conn.execute(q.group_by(ticks.c.source, ticks.c.dataset)).all()
    # max() reads the stored text on SQLite: the column type turns it back.
    return {(r.source, r.dataset): _as_time(r.tick) for r in rows}


def _as_time(value: object) -> datetime:
    return t.UTCDateTime().process_result_value(value, None)  # type: ignore[arg-type,return-value]


def record_tick(
    conn: Connection, source: str, dataset: str, tick: datetime, run_id: str, *, joined: bool
) -> None:
    """Record that ``tick`` of ``source.dataset`` queued (or joined) ``run_id``.

    Raises :class:`sqlalchemy.exc.IntegrityError` when another scheduler
    recorded that tick first: its transaction queued the tick's Run.
    """
    conn.execute(
        t.schedule_ticks.insert().values(
            source=source,
            dataset=dataset,
            tick=tick,
            run_id=run_id,
            joined=joined,
            created_at=utcnow(),
        )
    )
