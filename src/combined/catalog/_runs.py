"""Runs, their Attempts and Admissions, with the legal state moves."""

from __future__ import annotations

import hashlib
import importlib
import json
import re
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal, cast, get_args

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from combined.catalog import _schema as t
from combined.catalog._catalog import LEDGER
from combined.catalog._governance import run_record
from combined.errors import NotFoundError, ProtocolViolation, RunCanceled
from combined.protocol import utcnow

RunState = Literal[
    "queued",
    "extracting",
    "committing",
    "succeeded",
    "failed",
    "needs_auth",
    "needs_review",
    "canceled",
]
Trigger = Literal["manual", "first_sync", "retry", "recovery", "schedule", "webhook"]

RUN_STATES: tuple[RunState, ...] = get_args(RunState)
TRIGGERS: tuple[Trigger, ...] = get_args(Trigger)
TERMINAL: frozenset[RunState] = frozenset(
    {"succeeded", "failed", "needs_auth", "needs_review", "canceled"}
)

#: The legal moves of a Run. Terminal states have none: a retry is a new Run.
TRANSITIONS: Mapping[RunState, frozenset[RunState]] = {
    "queued": frozenset({"extracting", "failed", "needs_auth", "canceled"}),
    "extracting": frozenset({"committing", "failed", "needs_auth", "needs_review", "canceled"}),
    "committing": frozenset({"succeeded", "failed", "needs_review"}),
    "succeeded": frozenset(),
    "failed": frozenset(),
    "needs_auth": frozenset(),
    "needs_review": frozenset(),
    "canceled": frozenset(),
}


def check_transition(current: RunState, target: RunState) -> None:
    """Raise ProtocolViolation unless ``current -> target`` is a legal move."""
    if target not in TRANSITIONS[current]:
        raise ProtocolViolation(
            f"a run cannot move from {current} to {target}",
            hint="a finished run is retried as a new run: `combined run retry RUN_ID`",
        )


@dataclass(frozen=True, slots=True)
class Admission:
    """The frozen snapshot a Run executes under."""

    id: str
    connector: str
    revision: str
    config_digest: str
    config: Mapping[str, Any]
    billing_policy: str
    venue: str

    @staticmethod
    def freeze(
        connector: str,
        revision: str,
        config_digest: str,
        config: Mapping[str, Any],
        billing_policy: str,
        venue: str,
    ) -> Admission:
        """Build an admission whose id is the digest of its whole body."""
        body = {
            "connector": connector,
            "revision": revision,
            "config_digest": config_digest,
            "config": config,
            "billing_policy": billing_policy,
            "venue": venue,
        }
        digest = hashlib.sha256(json.dumps(body, sort_keys=True, default=str).encode())
        return Admission(
            id=digest.hexdigest()[:32],
            connector=connector,
            revision=revision,
            config_digest=config_digest,
            config=config,
            billing_policy=billing_policy,
            venue=venue,
        )


@dataclass(frozen=True, slots=True)
class Run:
    """A Run as the catalog holds it."""

    id: str
    source: str
    datasets: tuple[str, ...]
    trigger: Trigger
    state: RunState
    admission_id: str
    retry_of: str | None
    created_at: datetime
    started_at: datetime | None
    ended_at: datetime | None
    error: str | None
    error_type: str | None
    stats: Mapping[str, Any] | None
    publication_id: str | None
    #: Who took the Run to execute it (``host:pid:start``); None while it waits
    #: in the queue for a worker.
    claimed_by: str | None = None
    claimed_at: datetime | None = None
    #: A cancel request (``combined run cancel``): when, by whom, why.
    cancel_requested_at: datetime | None = None
    canceled_by: str | None = None
    cancel_reason: str | None = None
    #: No worker takes the queued Run before this time (a source's Retry-After).
    not_before: datetime | None = None

    @property
    def terminal(self) -> bool:
        """Whether the Run reached a final state."""
        return self.state in TERMINAL


def _run(row: sa.Row[Any]) -> Run:
    return Run(
        id=row.id,
        source=row.source,
        datasets=tuple(row.datasets),
        trigger=cast(Trigger, row.trigger),
        state=cast(RunState, row.state),
        admission_id=row.admission_id,
        retry_of=row.retry_of,
        created_at=row.created_at,
        started_at=row.started_at,
        ended_at=row.ended_at,
        error=row.error,
        error_type=row.error_type,
        stats=row.stats,
        publication_id=row.publication_id,
        claimed_by=row.claimed_by,
        claimed_at=row.claimed_at,
        cancel_requested_at=row.cancel_requested_at,
        canceled_by=row.canceled_by,
        cancel_reason=row.cancel_reason,
        not_before=row.not_before,
    )


def new_run_id() -> str:
    """A sortable, unique Run id."""
    return f"r{utcnow():%Y%m%d%H%M%S}-{uuid.uuid4().hex[:8]}"


def save_admission(conn: Connection, admission: Admission) -> None:
    """Store an admission once (its id is its content digest).

    Two processes admitting under the same admission at once (two webhooks
    for two datasets of a source) both find it missing: the insert skips a
    row that another one stored meanwhile.
    """
    # Only the dialect in use: importing PostgreSQL's costs a SQLite catalog 0.2-0.4 s.
    name = "postgresql" if conn.dialect.name == "postgresql" else "sqlite"
    dialect = importlib.import_module(f"sqlalchemy.dialects.{name}")
    conn.execute(
        dialect.insert(t.admissions)
        .values(
            id=admission.id,
            connector=admission.connector,
            revision=admission.revision,
            config_digest=admission.config_digest,
            config=dict(admission.config),
            billing_policy=admission.billing_policy,
            venue=admission.venue,
            created_at=utcnow(),
        )
        .on_conflict_do_nothing(index_elements=["id"])
    )


def get_admission(conn: Connection, admission_id: str) -> Admission:
    """The admission a Run executes under."""
    row = conn.execute(sa.select(t.admissions).where(t.admissions.c.id == admission_id)).first()
    if row is None:
        raise NotFoundError(f"no admission {admission_id!r}")
    return Admission(
        id=row.id,
        connector=row.connector,
        revision=row.revision,
        config_digest=row.config_digest,
        config=row.config,
        billing_policy=row.billing_policy,
        venue=row.venue,
    )


def create_run(
    conn: Connection,
    *,
    source: str,
    datasets: Sequence[str],
    trigger: Trigger,
    admission: Admission,
    retry_of: str | None = None,
    claimed_by: str | None = None,
    not_before: datetime | None = None,
) -> Run:
    """Admit a new queued Run under ``admission``.

    ``claimed_by`` names the process that will execute it at once; without
    one, the Run waits in the queue until a worker takes it.
    """
    save_admission(conn, admission)
    run_id = new_run_id()
    now = utcnow()
    conn.execute(
        t.runs.insert().values(
            id=run_id,
            source=source,
            datasets=list(datasets),
            trigger=trigger,
            state="queued",
            admission_id=admission.id,
            retry_of=retry_of,
            created_at=now,
            claimed_by=claimed_by,
            claimed_at=now if claimed_by is not None else None,
            not_before=not_before,
        )
    )
    return get_run(conn, run_id)


def get_run(conn: Connection, run_id: str) -> Run:
    """One Run by id (a unique prefix is accepted, letters' case as written).

    Only a run id's characters are looked for: ``%`` and ``_`` were LIKE's
    wildcards (``%-287f6b74`` canceled the Run ending so), SQLite's LIKE
    ignores case, and 50,000 characters made it fail with the SQL in a 500.
    """
    if _RUN_ID.fullmatch(run_id) is None:
        raise NotFoundError(
            f"no run {run_id[:80]!r}{'...' if len(run_id) > 80 else ''}",
            hint="a run id is letters, digits and '-' (list runs with `combined runs`)",
        )
    row = conn.execute(sa.select(t.runs).where(t.runs.c.id == run_id)).first()
    if row is None:
        rows = [
            found
            for found in conn.execute(
                sa.select(t.runs).where(t.runs.c.id.startswith(run_id, autoescape=True)).limit(2)
            ).fetchall()
            if found.id.startswith(run_id)
        ]
        if len(rows) != 1:
            raise NotFoundError(f"no run {run_id!r}", hint="list runs with `combined runs`")
        row = rows[0]
    return _run(row)


_RUN_ID = re.compile(r"[0-9A-Za-z-]{1,80}")


def lock_run(conn: Connection, run_id: str) -> None:
    """Serialize what is decided about ``run_id`` (a retry of it) until the transaction ends.

    A write that changes nothing: on PostgreSQL it locks the Run's row, on
    SQLite it starts the write transaction (one writer at a time), so a check
    that nothing retried the Run yet and the retry admitted after it are
    atomic.
    """
    conn.execute(t.runs.update().where(t.runs.c.id == run_id).values(state=t.runs.c.state))


def retries(conn: Connection, run_id: str) -> list[Run]:
    """Every Run that retried ``run_id``, directly or by retrying one of its retries."""
    found: list[Run] = []
    pending = [run_id]
    while pending:
        rows = conn.execute(
            sa.select(t.runs)
            .where(t.runs.c.retry_of.in_(pending))
            .order_by(t.runs.c.created_at, t.runs.c.id)
        ).fetchall()
        found.extend(_run(r) for r in rows)
        pending = [r.id for r in rows]
    return found


def list_runs(
    conn: Connection,
    *,
    limit: int = 20,
    states: Sequence[RunState] | None = None,
    source: str | None = None,
) -> list[Run]:
    """Newest Runs first (of ``source`` only, when given)."""
    q = sa.select(t.runs).order_by(t.runs.c.created_at.desc(), t.runs.c.id.desc())
    if states:
        q = q.where(t.runs.c.state.in_(list(states)))
    if source is not None:
        q = q.where(t.runs.c.source == source)
    return [_run(r) for r in conn.execute(q.limit(limit))]


#: The end states that raise an alert (``alert.run_failed``, ...): each needs someone.
ALERTED = ("failed", "needs_review", "needs_auth")

#: How many ended Runs :func:`last_ended` reads at most, newest first.
LAST_ENDED_SCAN = 10_000


def last_ended(
    conn: Connection, wanted: set[tuple[str, str]], scan: int = LAST_ENDED_SCAN
) -> dict[tuple[str, str], dict[str, Any]]:
    """The newest ended Run (``id``, ``state``, ``ended_at``) of each ``(source, dataset)``.

    One query, whatever the number of datasets: the ended Runs newest first
    (by id, which sorts by creation: the primary key's index, nothing sorted),
    read in pages until every dataset of ``wanted`` has one, or ``scan`` Runs
    were read. A canceled Run says nothing of its source and is passed over,
    as for the alerts.
    """
    q = (
        sa.select(
            t.runs.c.id, t.runs.c.source, t.runs.c.datasets, t.runs.c.state, t.runs.c.ended_at
        )
        .where(t.runs.c.state.in_(sorted(TERMINAL - {"canceled"})))
        .order_by(t.runs.c.id.desc())
        .limit(scan)
    )
    found: dict[tuple[str, str], dict[str, Any]] = {}
    with conn.execution_options(yield_per=200).execute(q) as rows:  # (closed when left early)
        for row in rows:
            for dataset in row.datasets:
                if (row.source, dataset) in wanted:
                    found.setdefault(
                        (row.source, dataset),
                        {"id": row.id, "state": row.state, "ended_at": row.ended_at},
                    )
            if len(found) == len(wanted):
                break
    return found


def move_run(
    conn: Connection,
    run_id: str,
    target: RunState,
    *,
    error: BaseException | str | None = None,
    stats: Mapping[str, Any] | None = None,
    publication_id: str | None = None,
) -> Run:
    """Move a Run to ``target`` if the transition table allows it."""
    run = get_run(conn, run_id)
    check_transition(run.state, target)
    values: dict[str, Any] = {"state": target}
    now = utcnow()
    if target == "extracting" and run.started_at is None:
        values["started_at"] = now
    if target in TERMINAL:
        values["ended_at"] = now
    if error is not None:
        values.update(_error_values(error))
    if stats is not None:
        values["stats"] = dict(stats)
    if publication_id is not None:
        values["publication_id"] = publication_id
    where = [t.runs.c.id == run.id, t.runs.c.state == run.state]
    if target == "committing":  # past it, a cancel request comes too late: decided atomically
        where.append(t.runs.c.cancel_requested_at.is_(None))
    moved = conn.execute(t.runs.update().where(*where).values(**values))
    if moved.rowcount != 1 and target == "committing":
        asked = get_run(conn, run.id)
        if asked.cancel_requested_at is not None:
            raise canceled(asked)
    if moved.rowcount != 1:  # another process moved it meanwhile (recovery, say)
        raise ProtocolViolation(
            f"run {run.id} left {run.state} while it was being moved to {target}",
            hint="see `combined run show` for the state it reached",
        )
    if target in ALERTED:
        _alert(conn, run, target, values.get("error"))
    if target == "succeeded":
        _recovered(conn, run)
    if target in TERMINAL:
        _ended(conn, run, target, now)
    return get_run(conn, run.id)


def _error_values(error: BaseException | str) -> dict[str, Any]:
    """A Run's ``error`` (redacted) and ``error_type`` columns for ``error``."""
    from combined.errors import CombinedError, redact

    if isinstance(error, CombinedError):
        text = redact(error.describe())
    else:
        text = redact(str(error))
    return {
        "error": text,
        "error_type": type(error).__name__ if isinstance(error, BaseException) else None,
    }


def _alert(conn: Connection, run: Run, target: RunState, error: str | None) -> None:
    """Emit ``alert.run_<target>``: the Run ended in a state that needs someone.

    Once per incident: not when each of the Run's datasets was left in that
    state by its previous Run already (a scheduled capture of a source that
    stays down fails at every tick; its first failure was told).
    """
    from combined.catalog._data import emit

    if _same_incident(conn, run, target):
        return
    emit(
        conn,
        f"alert.run_{target}",
        source=run.source,
        run_id=run.id,
        datasets=list(run.datasets),
        trigger=run.trigger,
        error=error,
    )


def _same_incident(conn: Connection, run: Run, target: RunState) -> bool:
    """Whether the previous ended Run of each of ``run``'s datasets ended in ``target`` too."""
    last = _last_states(conn, run)
    return bool(run.datasets) and all(last.get(d) == target for d in run.datasets)


def _recovered(conn: Connection, run: Run) -> None:
    """Emit ``run.recovered`` for datasets whose previous Run was alerted: the incident ended.

    One event per alert it resolves (``resolves: alert.run_failed``, ...),
    sent to the targets that were sent that alert (``runtime._notify``): a
    person told a source was down is told when it is back.
    """
    from combined.catalog._data import emit

    last = _last_states(conn, run)
    ended: dict[str, list[str]] = {}
    for dataset in run.datasets:
        state = last.get(dataset)
        if state in ALERTED:
            ended.setdefault(state, []).append(dataset)
    for state, datasets in ended.items():
        emit(
            conn,
            "run.recovered",
            source=run.source,
            run_id=run.id,
            datasets=datasets,
            resolves=f"alert.run_{state}",
            why=f"a Run of {', '.join(datasets)} succeeded after a Run that ended {state}",
        )


def _last_states(conn: Connection, run: Run, scan: int = 200) -> dict[str, str]:
    """The end state of the previous ended Run of each dataset of ``run``'s source.

    A canceled Run says nothing of the source and is passed over.
    """
    rows = conn.execute(
        sa.select(t.runs.c.datasets, t.runs.c.state)
        .where(
            t.runs.c.source == run.source,
            t.runs.c.id != run.id,
            t.runs.c.state.in_(sorted(TERMINAL - {"canceled"})),
            t.runs.c.ended_at.is_not(None),
        )
        .order_by(t.runs.c.ended_at.desc(), t.runs.c.id.desc())
        .limit(scan)
    ).all()
    last: dict[str, str] = {}
    for row in rows:
        for dataset in row.datasets:
            last.setdefault(dataset, row.state)
    return last


def _ended(conn: Connection, run: Run, target: RunState, now: datetime) -> None:
    """End the Attempt that staged the capture with the Run's result; ledger the Run."""
    # The Attempt that staged the capture ends with the Run's result, not "staged".
    conn.execute(
        t.attempts.update()
        .where(t.attempts.c.run_id == run.id, t.attempts.c.outcome == "staged")
        .values(ended_at=now, outcome=target)
    )
    ledger = conn.info.get(LEDGER)
    if ledger is not None:  # the lake first: an ended Run is in the lake's ledger
        ledger.run(run_record(conn, run.id))
        _ledger_the_unledgered(conn, ledger)


#: How many Runs ended in the catalog alone one Run's end writes to the ledger.
UNLEDGERED_BATCH = 20


def _ledger_the_unledgered(conn: Connection, ledger: Any) -> None:
    """Write to the lake's ledger the Runs whose end the catalog recorded alone (the store
    refused it: ``run.unledgered``), now that it took this Run's; each then
    ``run.ledgered``. A store that refuses again leaves them for the next Run's end."""
    from combined.catalog._data import emit
    from combined.errors import LakeError

    done = sa.select(t.activity.c.run_id).where(t.activity.c.kind == "run.ledgered")
    pending = conn.execute(
        sa.select(t.activity.c.run_id)
        .where(t.activity.c.kind == "run.unledgered", t.activity.c.run_id.not_in(done))
        .order_by(t.activity.c.id)
        .limit(UNLEDGERED_BATCH)
    ).scalars()
    for run_id in list(pending):
        try:
            ledger.run(run_record(conn, run_id))
        except LakeError:
            return
        emit(conn, "run.ledgered", run_id=run_id, why="its end was recorded in the catalog alone")


def recapture(run: Run) -> str:
    """The command that captures again what ``run`` captured: its datasets, or its source."""
    if 0 < len(run.datasets) <= 3:
        return "combined capture " + " ".join(f"{run.source}.{d}" for d in run.datasets)
    return f"combined capture {run.source}"


def canceled(run: Run) -> RunCanceled:
    """The error a Run whose cancel was requested ends with: who canceled it, and why."""
    why = f": {run.cancel_reason}" if run.cancel_reason else ""
    return RunCanceled(
        f"run {run.id} was canceled by {run.canceled_by or 'someone'}{why}; nothing of it was "
        "committed, acknowledged or billed",
        hint=f"capture again with `{recapture(run)}` when wanted",
        canceled_by=run.canceled_by,
        reason=run.cancel_reason,
    )


def start_attempt(conn: Connection, run_id: str, worker: str, host: str, pid: int) -> int:
    """Record a new Attempt of a Run; returns its number (1-based)."""
    current = conn.execute(
        sa.select(sa.func.max(t.attempts.c.number)).where(t.attempts.c.run_id == run_id)
    ).scalar()
    number = int(current or 0) + 1
    conn.execute(
        t.attempts.insert().values(
            run_id=run_id, number=number, worker=worker, host=host, pid=pid, started_at=utcnow()
        )
    )
    return number


def end_attempt(
    conn: Connection, run_id: str, number: int, outcome: str, error: str | None = None
) -> None:
    """Close an Attempt with its outcome."""
    conn.execute(
        t.attempts.update()
        .where(t.attempts.c.run_id == run_id, t.attempts.c.number == number)
        .values(ended_at=utcnow(), outcome=outcome, error=error)
    )


def list_attempts(conn: Connection, run_id: str) -> list[sa.Row[Any]]:
    """The Attempts of a Run, in order."""
    return list(
        conn.execute(
            sa.select(t.attempts).where(t.attempts.c.run_id == run_id).order_by(t.attempts.c.number)
        )
    )
