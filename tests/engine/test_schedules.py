"""The scheduler over a real catalog: one Run per tick, joins, catch-up, real processes.

The scheduler's core takes the time as a parameter (``Scheduler.tick(now)``):
these tests name the instant instead of waiting for it. The end-to-end ones
run real ``combined schedule`` and ``combined worker`` processes on a
1-second interval.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from combined.catalog import _schema as t
from combined.engine import Engine
from combined.runtime._scheduler import Scheduler

T0 = datetime(2026, 11, 30, 12, 0, 30, tzinfo=UTC)


def _scheduled(root: Path, tools: Any, schedule: str, catalog: str | None = None) -> Path:
    """The sample shop whose source ``shop`` (both datasets) has ``schedule``."""
    project = tools.make(root, orders=20, **({"catalog": catalog} if catalog else {}))
    text = project.read_text().replace(
        "    datasets:\n", f"    schedule: {schedule}\n    datasets:\n", 1
    )
    project.write_text(text)
    return Path(project)


def _ticks(engine: Engine) -> list[tuple[str, datetime, str, bool]]:
    with engine.catalog.begin() as conn:
        rows = conn.execute(
            sa.select(t.schedule_ticks).order_by(
                t.schedule_ticks.c.tick, t.schedule_ticks.c.dataset
            )
        ).all()
    return [(r.dataset, r.tick, r.run_id, r.joined) for r in rows]


def _work(engine: Engine) -> list[str]:
    return [run.state for run in engine.work(lambda: False, poll_s=0.1, once=True)]


def test_a_tick_queues_one_run_of_the_source_with_trigger_schedule(
    tmp_path: Path, tools: Any
) -> None:
    engine = Engine.open(_scheduled(tmp_path, tools, "{interval: 1h}"))
    try:
        assert Scheduler(engine).tick(T0 - timedelta(hours=1, minutes=1)) != []
        assert _work(engine) == ["succeeded"]
        ((_, parts),) = Scheduler(engine).tick(T0)
        (part,) = parts
        assert not part.joined and part.run.trigger == "schedule"
        assert part.run.datasets == ("customers", "orders") and part.run.state == "queued"
        tick = datetime(2026, 11, 30, 12, tzinfo=UTC)
        assert _ticks(engine)[-2:] == [
            ("customers", tick, part.run.id, False),
            ("orders", tick, part.run.id, False),
        ]
        # the same instant again, or later within the hour: nothing more is due
        assert Scheduler(engine).tick(T0) == []
        assert Scheduler(engine).tick(T0 + timedelta(minutes=59)) == []
        assert [r.id for r in engine.queued()] == [part.run.id]
        assert _work(engine) == ["succeeded"]
    finally:
        engine.close()


@pytest.mark.parametrize(
    "backend", ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)]
)
def test_a_tick_another_scheduler_queued_is_not_queued_again_after_its_run_ended(
    tmp_path: Path, tools: Any, request: pytest.FixtureRequest, backend: str
) -> None:
    """Scheduler A queues the 12:00 tick and a worker executes it; scheduler B,
    late (it read the catalog before A wrote), comes to the same tick: without
    the tick's record B found no capture to join and queued a second Run."""
    catalog = request.getfixturevalue("pg_database") if backend == "postgresql" else None
    project = _scheduled(tmp_path, tools, "{interval: 1h}", catalog)
    first, late = Engine.open(project), Engine.open(project)
    try:
        ((_, (part,)),) = Scheduler(first).tick(T0)
        assert _work(first) == ["succeeded"]
        assert Scheduler(late).tick(T0) == []
        schedule_runs = [r for r in late.runs() if r.trigger == "schedule"]
        assert [r.id for r in schedule_runs] == [part.run.id]
        assert late.queued() == []
    finally:
        first.close()
        late.close()


def test_a_tick_joins_a_capture_already_queued(tmp_path: Path, tools: Any) -> None:
    engine = Engine.open(_scheduled(tmp_path, tools, "{interval: 1h}"))
    try:
        (queued,) = engine.enqueue(["shop.orders"])
        ((_, parts),) = Scheduler(engine).tick(T0)
        joined = next(p for p in parts if p.joined)
        new = next(p for p in parts if not p.joined)
        assert joined.run.id == queued.id and joined.datasets == ("orders",)
        assert new.datasets == ("customers",) and new.run.trigger == "schedule"
        assert sorted(r.id for r in engine.queued()) == sorted([queued.id, new.run.id])
        (event,) = engine.activity(kind="run.joined")
        assert event["run_id"] == queued.id and event["body"]["trigger"] == "schedule"
    finally:
        engine.close()


def test_a_tick_and_capture_enqueue_join_a_capture_already_running(
    tmp_path: Path, tools: Any
) -> None:
    """While another process captures shop.orders (admitted, about to take its
    lease), a tick of a schedule on orders and `capture --enqueue shop.orders`
    both answer with that Run instead of queueing a second capture of it."""
    project = tools.make(tmp_path, orders=20)
    project.write_text(
        project.read_text().replace(
            "      orders:\n        key: [id]\n",
            "      orders:\n        key: [id]\n        schedule: {interval: 1h}\n",
        )
    )
    seen: dict[str, Any] = {}

    def meanwhile() -> subprocess.CompletedProcess[str]:
        engine = Engine.open(project)
        try:
            seen["tick"] = Scheduler(engine).tick(T0)
            seen["queued"] = engine.queued()
        finally:
            engine.close()
        result: subprocess.CompletedProcess[str] = tools.cli(
            tmp_path, "capture", "--enqueue", "shop.orders"
        )
        return result

    out, enqueued = tools.while_held(tmp_path, tools.capture_held, "admitted", meanwhile)
    assert out.split()[0] == "succeeded", out
    engine = Engine.open(project)
    try:
        (run,) = engine.runs()
        run_id = run.id
    finally:
        engine.close()
    ((entry, (part,)),) = seen["tick"]
    assert entry.datasets == ("orders",) and part.joined and part.run.id == run_id
    assert seen["queued"] == []
    assert enqueued.returncode == 0, enqueued.stderr
    assert f"run {run_id} joined: shop (orders), already " in enqueued.stdout
    engine = Engine.open(project)
    try:
        assert engine.queued() == []
        assert [r.id for r in engine.runs()] == [run_id]
        assert _ticks(engine) == [("orders", datetime(2026, 11, 30, 12, tzinfo=UTC), run_id, True)]
    finally:
        engine.close()


def test_capture_enqueue_returns_the_queued_run_instead_of_a_second(
    tmp_path: Path, tools: Any
) -> None:
    tools.make(tmp_path, orders=20)
    first = tools.cli(tmp_path, "capture", "--enqueue", "shop.orders")
    assert first.returncode == 0, first.stderr
    again = tools.cli(tmp_path, "capture", "--enqueue", "shop")
    assert again.returncode == 0, again.stderr
    run_id = first.stdout.split()[1]
    assert first.stdout.strip() == f"run {run_id} queued: shop (orders)"
    lines = again.stdout.strip().splitlines()
    assert lines[0] == f"run {run_id} joined: shop (orders), already queued"
    assert lines[1].endswith("queued: shop (customers)")
    engine = Engine.open(tmp_path / "combined.yaml")
    try:
        assert [r.datasets for r in engine.queued()] == [("orders",), ("customers",)]
        assert engine.enqueue(["shop.orders"])[0].id == run_id  # the API's answer too
    finally:
        engine.close()


def test_a_tick_recorded_while_the_clock_ran_ahead_does_not_hold_the_schedule_back(
    tmp_path: Path, tools: Any
) -> None:
    """A machine booted with its clock a day ahead, then set right: the tick recorded
    then was the newest, and nothing was due until the clock caught up with it."""
    engine = Engine.open(_scheduled(tmp_path, tools, "{interval: 1h}"))
    try:
        assert Scheduler(engine).tick(T0 + timedelta(days=1)) != []
        assert _work(engine) == ["succeeded"]
        ((entry, _),) = Scheduler(engine).tick(T0)  # set right: the hour's tick is due
        assert entry.tick == datetime(2026, 11, 30, 12, tzinfo=UTC)
        assert _work(engine) == ["succeeded"]
        assert Scheduler(engine).tick(T0 + timedelta(minutes=30)) == []  # once an hour
        ((entry, _),) = Scheduler(engine).tick(T0 + timedelta(hours=1))
        assert entry.tick == datetime(2026, 11, 30, 13, tzinfo=UTC)
    finally:
        engine.close()


def test_after_downtime_one_catch_up_run_not_one_per_missed_tick(
    tmp_path: Path, tools: Any
) -> None:
    engine = Engine.open(_scheduled(tmp_path, tools, "{cron: '*/5 * * * *'}"))
    try:
        Scheduler(engine).tick(T0)
        assert _work(engine) == ["succeeded"]
        # down for a day and a half: 432 ticks missed
        later = T0 + timedelta(days=1, hours=12, minutes=3)
        ((entry, (part,)),) = Scheduler(engine).tick(later)
        assert entry.tick == datetime(2026, 12, 2, 0, 0, tzinfo=UTC)
        assert len([r for r in engine.runs(50) if r.trigger == "schedule"]) == 2
        assert Scheduler(engine).tick(later + timedelta(minutes=1)) == []
        assert [r.id for r in engine.queued()] == [part.run.id]
    finally:
        engine.close()


def _project_with_interval(root: Path, tools: Any, catalog: str | None) -> Path:
    return _scheduled(root, tools, "{interval: 1s}", catalog)


def _spawn(root: Path, *args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "COMBINED_RETRY_BACKOFF_S": "0"}
    return subprocess.Popen(
        [sys.executable, "-c", "from combined.cli import main; main()", *args],
        cwd=root,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _two_schedulers_and_a_worker(root: Path, tools: Any, catalog: str | None) -> None:
    project = _project_with_interval(root, tools, catalog)
    engine = Engine.open(project)
    assert engine.catalog  # the catalog exists (and is migrated) before three processes open it
    engine.close()
    procs = [
        _spawn(root, "schedule"),
        _spawn(root, "schedule"),
        _spawn(root, "worker", "--poll", "0.2"),
    ]
    engine = Engine.open(project)
    try:
        deadline = time.monotonic() + 90
        while len([r for r in engine.runs(100) if r.trigger == "schedule" and r.terminal]) < 3:
            assert time.monotonic() < deadline, [p.poll() for p in procs]
            assert all(p.poll() is None for p in procs), [p.communicate() for p in procs]
            time.sleep(0.2)
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
        outs = [p.communicate(timeout=120) for p in procs]
    try:
        assert [p.returncode for p in procs] == [143, 143, 143], outs
        ticks = _ticks(engine)
        runs = {r.id: r for r in engine.runs(200) if r.trigger == "schedule"}
        # every schedule Run was queued by exactly one tick, for both datasets
        queued_by = [(run_id, d) for d, _, run_id, joined in ticks if not joined]
        assert sorted(queued_by) == sorted((r, d) for r in runs for d in ("customers", "orders"))
        # every tick was recorded once per dataset (the key) and names a schedule Run
        assert {run_id for _, _, run_id, _ in ticks} <= set(runs)
        # no capture piled up: a schedule Run was queued only once the one before ended
        ordered = sorted(runs.values(), key=lambda r: r.created_at)
        for before, after in zip(ordered, ordered[1:], strict=False):
            assert before.ended_at is not None and before.ended_at <= after.created_at
        assert all(r.state == "succeeded" for r in ordered if r.terminal)
        both = "".join(err for _, err in outs[:2])
        assert both.count("queued: shop (customers, orders)") == len(runs), both
    finally:
        engine.close()


def test_two_scheduler_processes_over_one_sqlite_catalog_queue_one_run_per_tick(
    tmp_path: Path, tools: Any
) -> None:
    _two_schedulers_and_a_worker(tmp_path, tools, None)


@pytest.mark.postgres
def test_two_scheduler_processes_over_one_postgresql_catalog_queue_one_run_per_tick(
    tmp_path: Path, tools: Any, pg_database: str
) -> None:
    _two_schedulers_and_a_worker(tmp_path, tools, pg_database)


def test_a_worker_with_schedule_executes_what_its_scheduler_queues(
    tmp_path: Path, tools: Any
) -> None:
    _project_with_interval(tmp_path, tools, None)
    worker = _spawn(tmp_path, "worker", "--schedule", "--poll", "0.2")
    engine = Engine.open(tmp_path / "combined.yaml")
    try:
        deadline = time.monotonic() + 90
        while not any(r.trigger == "schedule" and r.state == "succeeded" for r in engine.runs()):
            assert time.monotonic() < deadline and worker.poll() is None, worker.stderr
            time.sleep(0.2)
    finally:
        worker.send_signal(signal.SIGTERM)
        _, err = worker.communicate(timeout=120)
        engine.close()
    assert worker.returncode == 143, err
    assert "scheduler started" in err and "queued: shop (customers, orders)" in err


def test_schedule_once_queues_what_is_due_and_exits(tmp_path: Path, tools: Any) -> None:
    _scheduled(tmp_path, tools, "{cron: '0 3 * * *', timezone: Europe/Paris}")
    result = tools.cli(tmp_path, "schedule", "--once")
    assert result.returncode == 0, result.stderr
    assert "2 scheduled datasets" in result.stderr
    assert "(cron 0 3 * * * (Europe/Paris)): run " in result.stderr
    again = tools.cli(tmp_path, "schedule", "--once")
    assert again.returncode == 0 and "queued" not in again.stderr, again.stderr


def test_serve_runs_the_scheduler(tmp_path: Path, tools: Any) -> None:
    """`combined serve` queues scheduled captures (a worker executes them)."""
    pytest.importorskip("uvicorn")
    _project_with_interval(tmp_path, tools, None)
    server = _spawn(tmp_path, "serve", "--insecure-no-auth", "--port", "0")
    engine = Engine.open(tmp_path / "combined.yaml")
    try:
        deadline = time.monotonic() + 90
        while not any(r.trigger == "schedule" for r in engine.queued()):
            assert time.monotonic() < deadline and server.poll() is None, server.stderr
            time.sleep(0.2)
    finally:
        server.send_signal(signal.SIGTERM)
        _, err = server.communicate(timeout=120)
        engine.close()
    assert "scheduler started" in err and "queued: shop (customers, orders)" in err, err


def test_schedule_without_any_schedule_says_what_to_declare(tmp_path: Path, tools: Any) -> None:
    tools.make(tmp_path, orders=5)
    result = tools.cli(tmp_path, "schedule")
    assert result.returncode == 2
    assert "declares a schedule" in result.stderr and "schedule: {interval: 1h}" in result.stderr
