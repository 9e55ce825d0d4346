"""Partitioned backfill: one exported snapshot, N worker sessions.

A coordinator session opens ``REPEATABLE READ READ ONLY`` and calls
``pg_export_snapshot()`` as its first statement. Everything the plan states
(the automatic MIN/MAX bounds, the row count and the control sum) is read
next, inside that same snapshot, so a row committed after the plan was made
is neither counted nor read. The coordinator's transaction stays open until
:meth:`PartitionPlan.close`: an exported snapshot is importable only while
its exporting transaction lives. Each worker session imports it with
``SET TRANSACTION SNAPSHOT '<id>'`` (a literal: the statement takes no
parameter) and checks that its ``pg_current_snapshot()`` equals the
coordinator's, so every partition's receipt carries the same
``source_token``.

Partitions are half-open ranges of one column, ``[lower, upper)``: interior
split points are spread evenly over the data's MIN..MAX. The first and last
partitions reach the bounds the caller gave (``lower`` inclusive, ``upper``
exclusive) or, where a bound was left automatic, are open on that side, so
no row can fall between partitions. When both bounds are automatic, rows
whose column is NULL belong to the last partition and the count covers the
whole relation; with an explicit bound, NULLs are outside the range.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import Any

from psycopg import sql

from combined.connectors._shared import ControlTotals
from combined.connectors.abc import ReadRequest
from combined.connectors.postgres import _catalog as catalog
from combined.connectors.postgres._connect import Session, Settings, close_quietly
from combined.connectors.postgres._extract import range_predicate
from combined.connectors.postgres._types import ColumnPlan, value_from_text
from combined.errors import ConfigError, ProtocolViolation
from combined.protocol import snapshot_token_digest


@dataclass(frozen=True, slots=True)
class Partition:
    """One range of the partition column: ``lower <= col < upper`` (None: open side)."""

    index: int
    lower: Any
    upper: Any
    include_nulls: bool = False


def split_points(lo: Any, hi: Any, n: int) -> list[Any]:
    """Up to ``n - 1`` strictly increasing interior split points over ``[lo, hi]``."""
    if n < 2 or lo is None or hi is None or not lo < hi:
        return []
    points: list[Any] = []
    for i in range(1, n):
        if isinstance(lo, bool):
            break
        if isinstance(lo, int):
            p: Any = lo + ((hi - lo + 1) * i) // n
        elif isinstance(lo, datetime):
            p = lo + ((hi - lo) * i) // n
        elif isinstance(lo, date):
            p = lo + timedelta(days=((hi - lo).days * i) // n)
        elif isinstance(lo, Decimal):
            p = lo + (hi - lo) * i / n
        else:
            p = lo + (hi - lo) * i / n
        if lo < p <= hi and (not points or p > points[-1]):
            points.append(p)
    return points


def make_partitions(
    points: Sequence[Any], lower: Any, upper: Any, nulls: bool
) -> tuple[Partition, ...]:
    """Contiguous partitions split at ``points``, from ``lower`` to ``upper``."""
    edges = [lower, *points, upper]
    last = len(edges) - 2
    return tuple(
        Partition(i, edges[i], edges[i + 1], include_nulls=nulls and i == last)
        for i in range(last + 1)
    )


class PartitionPlan:
    """N ranges of one relation under one exported snapshot, and its control totals.

    ``snapshot_id`` is the exported id (importable while the plan is open),
    ``snapshot_text`` the ``pg_current_snapshot()`` it fixes, ``control`` the
    row count (and sum) of the whole range in that snapshot.

    Holds the coordinator session open (it keeps the snapshot importable)
    until :meth:`close`; use it as a context manager. Read a partition with
    :meth:`PostgresSource.read_partition`, from any thread.
    """

    def __init__(
        self,
        *,
        session: Session,
        request: ReadRequest,
        relation: str,
        column: str,
        snapshot_id: str,
        snapshot_text: str,
        snapshot_acquired_at: datetime,
        lower: Any,
        upper: Any,
        minimum: Any,
        maximum: Any,
        partitions: tuple[Partition, ...],
        control: ControlTotals,
    ) -> None:
        self._session: Session | None = session
        self._lock = threading.Lock()
        self.request = request
        self.relation = relation
        self.column = column
        self.snapshot_id = snapshot_id
        self.snapshot_text = snapshot_text
        self.snapshot_acquired_at = snapshot_acquired_at
        #: The bounds as given (None: automatic): lower inclusive, upper exclusive.
        self.lower = lower
        self.upper = upper
        #: MIN and MAX of the column within those bounds, read inside the snapshot.
        self.minimum = minimum
        self.maximum = maximum
        self.partitions = partitions
        self.control = control
        self.coordinator_pid = session.pid

    @property
    def source_token(self) -> str:
        """The digest every partition's receipt carries (of ``pg_current_snapshot()``)."""
        return snapshot_token_digest(self.snapshot_text)

    @property
    def closed(self) -> bool:
        """Whether the coordinator transaction has ended (workers can no longer start)."""
        return self._session is None

    def partition(self, index: int) -> Partition:
        """The partition at ``index``."""
        if not 0 <= index < len(self.partitions):
            raise ConfigError(
                f"partition {index} does not exist",
                hint=f"use 0..{len(self.partitions) - 1}",
            )
        return self.partitions[index]

    def close(self) -> None:
        """End the coordinator transaction and session; idempotent, never raises."""
        with self._lock:
            session, self._session = self._session, None
        if session is None:
            return
        try:
            session.run("COMMIT", "ending the coordinator transaction")
        except Exception:  # the snapshot dies with the session either way
            pass
        session.close()

    def __enter__(self) -> PartitionPlan:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"PartitionPlan({self.relation!r}, column={self.column!r}, "
            f"partitions={len(self.partitions)}, rows={self.control.rows}, closed={self.closed})"
        )


def _orderable(plan: ColumnPlan, role: str) -> None:
    if plan.route == "unsupported" or not (plan.orderable_number or plan.temporal):
        raise ConfigError(
            f"column {plan.name!r} ({plan.source_type}) cannot be a {role}",
            hint="choose a number, date or timestamp column",
            column=plan.name,
        )


def create_plan(
    settings: Settings,
    request: ReadRequest,
    partitions: int,
    column: str | None,
    lower: Any,
    upper: Any,
    sum_column: str | None,
) -> PartitionPlan:
    """Open the coordinator, export its snapshot, resolve bounds and totals inside it."""
    if isinstance(partitions, bool) or not isinstance(partitions, int) or partitions < 1:
        raise ConfigError("partitions must be a positive integer", hint="e.g. --partitions 8")
    column = _split_column(request, column)
    session = Session(settings)
    try:
        session.run("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY", "opening the coordinator")
        # First statement: it fixes the snapshot that is exported and counted.
        snap_id, snap_text, at = session.rows(
            "SELECT pg_export_snapshot(), CAST(pg_current_snapshot() AS text), clock_timestamp()",
            "exporting the snapshot",
        )[0]
        rel = catalog.find_relation(session, request.relation)
        plan = _split_plan(session, rel, column, sum_column)
        automatic = lower is None and upper is None
        where = range_predicate(plan, lower, upper, include_nulls=automatic)
        lo_text, hi_text, rows, summed = _bounds_and_totals(session, rel, column, sum_column, where)
        hint = (
            "give the range to split: "
            f"`combined backfill SOURCE.{request.dataset} --from LOW --to HIGH`"
        )
        lo, hi = (value_from_text(t, plan, hint=hint) for t in (lo_text, hi_text))
        parts = make_partitions(split_points(lo, hi, partitions), lower, upper, automatic)
        return PartitionPlan(
            session=session,
            request=request,
            relation=rel.name,
            column=column,
            snapshot_id=snap_id,
            snapshot_text=snap_text,
            snapshot_acquired_at=at.astimezone(UTC),
            lower=lower,
            upper=upper,
            minimum=lo,
            maximum=hi,
            partitions=parts,
            control=ControlTotals(int(rows), sum_column, summed),
        )
    except BaseException as exc:
        close_quietly(session, exc)
        raise


def _split_column(request: ReadRequest, column: str | None) -> str:
    """The column to split on: the one named, else the single-column key, else the cursor."""
    if column is not None:
        return column
    if len(request.key) == 1:
        return request.key[0]
    if request.cursor is not None:
        return request.cursor.column
    raise ConfigError(
        "a partitioned read needs a column to split on",
        hint="name the column, or declare a single-column key or a cursor",
    )


def _split_plan(
    session: Session, rel: catalog.Relation, column: str, sum_column: str | None
) -> ColumnPlan:
    """The split column's plan, once it and the control sum's column are checked."""
    cols = catalog.columns(session, [rel.oid]).get(rel.oid, [])
    types = catalog.load_types(session, {c.typoid for c in cols})
    by_name = {p.name: p for p in catalog.column_plans(cols, types)}
    for name in (column, sum_column):
        if name is not None and name not in by_name:
            raise ConfigError(
                f"column {name!r} does not exist in {rel.name!r}",
                hint="`combined discover SOURCE` lists the relation's columns",
            )
    plan = by_name[column]
    _orderable(plan, "partition column")
    if sum_column is not None and not by_name[sum_column].orderable_number:
        raise ConfigError(
            f"column {sum_column!r} is not numeric and cannot be summed",
            hint="name a number column as the control sum",
        )
    return plan


def _bounds_and_totals(
    session: Session,
    rel: catalog.Relation,
    column: str,
    sum_column: str | None,
    where: sql.Composable | None,
) -> tuple[Any, ...]:
    """The split column's min and max as text, the row count and the control sum."""
    col = sql.Identifier(column)
    total = (
        sql.SQL("CAST(sum({}) AS text)").format(sql.Identifier(sum_column))
        if sum_column
        else sql.SQL("NULL")
    )
    q = sql.SQL(
        "SELECT CAST(min({c}) AS text), CAST(max({c}) AS text), count(*), {t} FROM {r}"
    ).format(c=col, t=total, r=rel.ident)
    if where is not None:
        q = q + sql.SQL(" WHERE ") + where
    return tuple(session.rows(q, "resolving bounds and control totals")[0])


def check_open(plan: PartitionPlan) -> None:
    """Refuse to start a worker on a closed plan."""
    if plan.closed:
        raise ProtocolViolation(
            "the partition plan is closed: its exported snapshot is gone",
            hint="read every partition before closing the plan",
        )
