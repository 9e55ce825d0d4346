"""Partitioned backfill: one exported snapshot, distinct worker sessions, totals inside it."""

from __future__ import annotations

import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal

import pytest

from combined.connectors.postgres import EXPORTED_SNAPSHOT, ControlTotals, PostgresSource
from combined.connectors.postgres._partition import make_partitions, split_points
from combined.errors import ConfigError, ProtocolViolation, SchemaMismatch


def _fill(admin, schema, rows):
    admin.execute(f"CREATE TABLE {schema}.t (id int PRIMARY KEY, amount numeric(12,2), at date)")
    admin.execute(
        f"INSERT INTO {schema}.t SELECT g, g * 0.5, date '2024-01-01' + g"
        f" FROM generate_series(1, {rows}) g"
    )


def _drain(source, plan, index, pgt):
    ext = source.read_partition(plan, index)
    try:
        messages = list(ext)
    finally:
        ext.finish("success")
    ids = [i for b in pgt.batches(messages) for i in b.column("id").to_pylist()]
    return ext, ids


def test_workers_are_distinct_sessions_importing_one_snapshot(
    admin, schema, source, make_request, pgt
):
    _fill(admin, schema, 10_000)
    with source.plan_partitions(make_request("t"), 4, sum_column="amount") as plan:
        # The exported snapshot is the coordinator's own: its xmin is the backend's.
        xmin = admin.execute(
            "SELECT backend_xmin::text FROM pg_stat_activity WHERE pid = %s",
            (plan.coordinator_pid,),
        ).fetchone()[0]
        assert plan.snapshot_text.split(":")[0] == xmin
        assert plan.control == ControlTotals(10_000, "amount", "25002500.00")
        assert len(plan.partitions) == 4

        # Concurrent changes after the export are invisible to every worker.
        admin.execute(
            f"INSERT INTO {schema}.t SELECT g, 1, NULL FROM generate_series(10001, 10500) g"
        )
        admin.execute(f"DELETE FROM {schema}.t WHERE id <= 100")

        exts = [source.read_partition(plan, i) for i in range(4)]
        iters = [iter(e) for e in exts]
        firsts = [next(it) for it in iters]  # every worker holds its session at once
        pids = {e.backend_pid for e in exts}
        assert len(pids) == 4 and plan.coordinator_pid not in pids

        def rest(i):
            return [firsts[i].batch, *pgt.batches(iters[i])]

        with ThreadPoolExecutor(4) as pool:
            parts = list(pool.map(rest, range(4)))
        for e in exts:
            e.finish("success")
    ids = [i for part in parts for b in part for i in b.column("id").to_pylist()]
    assert sorted(ids) == list(range(1, 10_001))  # each row once, the snapshot's rows only
    assert sum(e.receipt.rows for e in exts) == plan.control.rows
    landed = sum(a for part in parts for b in part for a in b.column("amount").to_pylist())
    assert landed == Decimal(plan.control.sum or "0")
    tokens = {e.receipt.source_token for e in exts}
    assert tokens == {plan.source_token}
    assert all(e.receipt.snapshot_authority == EXPORTED_SNAPSHOT for e in exts)
    assert all(e.receipt.completed for e in exts)


def test_automatic_bounds_are_resolved_inside_the_snapshot(
    admin, schema, source, make_request, pgt
):
    _fill(admin, schema, 1000)
    admin.execute(f"INSERT INTO {schema}.t VALUES (-5, NULL, NULL)")
    plan = source.plan_partitions(make_request("t"), 3, column="at")
    try:
        admin.execute(f"INSERT INTO {schema}.t VALUES (5000, 1, '2030-01-01')")
        admin.execute(f"INSERT INTO {schema}.t VALUES (5001, 1, NULL)")
        assert plan.minimum == date(2024, 1, 2) and plan.maximum == date(2026, 9, 27)
        # Both bounds automatic: the count covers the relation, NULLs included.
        assert plan.control.rows == 1001
        assert plan.partitions[0].lower is None and plan.partitions[-1].upper is None
        assert plan.partitions[-1].include_nulls
        ids = [i for p in range(3) for i in _drain(source, plan, p, pgt)[1]]
    finally:
        plan.close()
    assert sorted(ids) == [-5, *range(1, 1001)]


def test_explicit_bounds_limit_the_range_and_its_totals(admin, schema, source, make_request, pgt):
    _fill(admin, schema, 1000)
    with source.plan_partitions(
        make_request("t"), 4, lower=101, upper="201", sum_column="amount"
    ) as plan:
        assert plan.lower == 101 and plan.upper == "201"
        assert (plan.minimum, plan.maximum) == (101, 200)
        assert plan.control == ControlTotals(100, "amount", "7525.00")
        assert [(p.lower, p.upper) for p in plan.partitions] == [
            (101, 126),
            (126, 151),
            (151, 176),
            (176, "201"),
        ]
        ids = [i for p in range(4) for i in _drain(source, plan, p, pgt)[1]]
    assert sorted(ids) == list(range(101, 201))


def test_closing_the_plan_ends_the_coordinator_and_its_snapshot(
    admin, schema, source, make_request, pgt
):
    _fill(admin, schema, 100)
    plan = source.plan_partitions(make_request("t"), 2)
    early = source.read_partition(plan, 0)  # built while open, started after close
    pid = plan.coordinator_pid
    assert pgt.backend_state(admin, pid) == "idle in transaction"
    plan.close()
    plan.close()  # idempotent
    assert plan.closed and pgt.wait_backend_gone(admin, pid)
    with pytest.raises(ProtocolViolation, match="closed"):
        source.read_partition(plan, 1)
    with pytest.raises(ProtocolViolation, match="exported snapshot"):
        list(early)
    assert early.finish("abort").cleanup_succeeded
    assert pgt.wait_backend_gone(admin, early.backend_pid)


def test_plans_refuse_columns_they_cannot_split(admin, schema, pg_dsn, make_request):
    admin.execute(f"CREATE TABLE {schema}.t (id text PRIMARY KEY, n int)")
    app = f"combined-test-{uuid.uuid4().hex[:8]}"
    source = PostgresSource({"dsn": pg_dsn, "schemas": [schema], "application_name": app})
    with pytest.raises(ConfigError, match="cannot be a partition column"):
        source.plan_partitions(make_request("t"), 2)
    with pytest.raises(ConfigError, match="'nope'"):
        source.plan_partitions(make_request("t"), 2, column="n", sum_column="nope")
    with pytest.raises(ConfigError, match="positive"):
        source.plan_partitions(make_request("t"), 0, column="n")
    # A failed plan leaves no coordinator behind.
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        count = admin.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", (app,)
        ).fetchone()[0]
        if count == 0:
            break
        time.sleep(0.05)
    assert count == 0


def test_automatic_bounds_past_year_9999_say_how_to_give_the_range(
    admin, schema, source, make_request
):
    # The hint said "bound the read explicitly" without saying how.
    admin.execute(f"CREATE TABLE {schema}.t (id int PRIMARY KEY, at date)")
    admin.execute(f"INSERT INTO {schema}.t VALUES (1, '2024-01-01'), (2, '10000-01-01')")
    with pytest.raises(SchemaMismatch, match="cannot bound a read") as info:
        source.plan_partitions(make_request("t"), 2, column="at")
    assert "combined backfill SOURCE.t --from LOW --to HIGH" in (info.value.hint or "")


def test_an_empty_relation_is_one_open_partition(admin, schema, source, make_request, pgt):
    admin.execute(f"CREATE TABLE {schema}.t (id int PRIMARY KEY)")
    with source.plan_partitions(make_request("t"), 8) as plan:
        assert len(plan.partitions) == 1 and plan.control.rows == 0
        ext, ids = _drain(source, plan, 0, pgt)
    assert ids == [] and ext.receipt.completed


def test_split_points_are_even_and_strictly_increasing():
    assert split_points(1, 100, 4) == [26, 51, 76]
    assert split_points(1, 3, 8) == [2, 3]
    assert split_points(5, 5, 4) == []
    t0 = datetime(2024, 1, 1, tzinfo=UTC)
    assert split_points(t0, t0 + timedelta(hours=4), 4) == [
        t0 + timedelta(hours=h) for h in (1, 2, 3)
    ]
    assert split_points(date(2024, 1, 1), date(2024, 1, 3), 4) == [date(2024, 1, 2)]
    assert split_points(Decimal("0"), Decimal("1"), 4) == [
        Decimal("0.25"),
        Decimal("0.5"),
        Decimal("0.75"),
    ]
    parts = make_partitions([10, 20], None, None, nulls=True)
    assert [(p.lower, p.upper, p.include_nulls) for p in parts] == [
        (None, 10, False),
        (10, 20, False),
        (20, None, True),
    ]
