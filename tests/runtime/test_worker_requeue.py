"""A Run whose worker died is retried by the next worker: bounded, never over its commits.

Each test runs real ``combined worker`` processes against a project capturing
from a real PostgreSQL database, and kills one with SIGKILL at a chosen point
of a Run (``COMBINED_FAULT``). Before, the next worker ended the dead Run
``failed`` and nothing ran it again: a Run queued by hand or through the API
was lost until someone noticed, a scheduled one waited for its next tick.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from combined.catalog import data as cat
from combined.catalog import runs as runs_repo
from combined.engine import Engine

pytestmark = pytest.mark.postgres

CLI = "from combined.cli import main; main()"
ROWS = {"items": 2000, "orders": 3000}


@pytest.fixture
def project(tmp_path: Path, pg_server_dsn: str, tools: Any) -> Iterator[Path]:
    """A project whose source ``pg`` is a fresh PostgreSQL database of two tables."""
    import psycopg

    with tools.scratch_database(pg_server_dsn, "h_worker") as dsn:
        with psycopg.connect(dsn, autocommit=True) as conn:
            for table, rows in ROWS.items():
                conn.execute(
                    f"CREATE TABLE {table} (id bigint PRIMARY KEY, name text, qty bigint);"
                    f"INSERT INTO {table} SELECT g, 'n-' || md5(g::text), g % 97 "
                    f"FROM generate_series(1, {rows}) g"
                )
        datasets = "".join(
            f"      {t}:\n        relation: public.{t}\n        key: [id]\n" for t in ROWS
        )
        (tmp_path / "combined.yaml").write_text(
            "version: 1\nlake: ./lake\nsources:\n  pg:\n    connector: postgres\n"
            f"    config:\n      dsn: {dsn}\n    datasets:\n{datasets}"
        )
        yield tmp_path


def _cli(root: Path, *args: str, fault: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COMBINED_RETRY_BACKOFF_S": "0"}
    env.pop("COMBINED_FAULT", None)
    if fault is not None:
        env["COMBINED_FAULT"] = fault
    return subprocess.run(
        [sys.executable, "-c", CLI, *args],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def _killed_worker(root: Path, fault: str) -> None:
    """A ``combined worker --once`` that kills itself (SIGKILL) at ``fault`` in its Run."""
    worker = _cli(root, "worker", "--once", fault=fault)
    assert worker.returncode == -signal.SIGKILL, (worker.returncode, worker.stderr)


def _worker(root: Path) -> subprocess.CompletedProcess[str]:
    worker = _cli(root, "worker", "--once")
    assert worker.returncode == 0, worker.stderr
    return worker


def _enqueue(root: Path, *names: str) -> None:
    queued = _cli(root, "capture", "--enqueue", *names)
    assert queued.returncode == 0, queued.stderr


def _lake_equals_source(engine: Engine, datasets: tuple[str, ...] = tuple(ROWS)) -> None:
    """Each published table's rows are its source's (count, sums, one identity a row)."""
    for table in datasets:
        (row,) = engine.sql(
            f"SELECT count(*) AS n, sum(id) AS i, sum(qty) AS q, "
            f"count(DISTINCT _combined_id) AS ids FROM pg.{table}"
        ).to_pylist()
        n = ROWS[table]
        assert (row["n"], row["i"], row["q"], row["ids"]) == (
            n,
            n * (n + 1) // 2,
            sum(g % 97 for g in range(1, n + 1)),
            n,
        ), table
        _billed_once(engine, table)


def _billed_once(engine: Engine, table: str) -> None:
    """Every row of ``table`` committed in one Delivery, once, and its MAR counted once."""
    (usage,) = [u for u in engine.usage() if u["dataset"] == table]
    n = ROWS[table]
    assert (usage["mar"], usage["inserts"], usage["updates"]) == (n, n, 0), table
    with engine.catalog.begin() as conn:
        mine = cat.deliveries(conn, source="pg", dataset=table, states=["committed"])
    assert len({d.sequence for d in mine}) == len(mine)  # no sequence committed twice
    assert sum(d.record_count for d in mine) == n


def _retries(engine: Engine, run_id: str) -> list[Any]:
    with engine.catalog.begin() as conn:
        return runs_repo.retries(conn, run_id)


def _interrupted(engine: Engine, run_id: str) -> dict[str, Any]:
    (event,) = engine.activity(kind="run.interrupted", run_id=run_id)
    return dict(event["body"])


def test_a_run_whose_worker_was_killed_is_retried_by_the_next_worker(project: Path) -> None:
    _enqueue(project, "pg")
    _killed_worker(project, "after_staging")  # every dataset staged, nothing committed
    engine = Engine.open(project / "combined.yaml")
    try:
        (dead,) = engine.runs()
        assert dead.state == "extracting"
        pid = dead.claimed_by.split(":")[1] if dead.claimed_by else ""

        worked = _worker(project)
        closed = engine.run(dead.id)["run"]
        assert closed.state == "failed"
        (retry,) = _retries(engine, dead.id)
        # recorded: the worker died (its pid and host), nothing committed, and its retry
        error = closed.error or ""
        assert f"pid {pid} on {socket.gethostname()}" in error, error
        assert "nothing of it was committed" in error
        assert f"run {retry.id} retries items, orders (automatic retry 1 of 2)" in error
        assert _interrupted(engine, dead.id)["retry"] == retry.id
        # the retry: linked to the dead Run, under its admission, executed by that worker
        assert (retry.trigger, retry.retry_of, retry.datasets) == (
            "recovery",
            dead.id,
            dead.datasets,
        )
        assert retry.admission_id == dead.admission_id
        assert retry.state == "succeeded", retry.error
        assert f"run {retry.id} succeeded" in worked.stderr
        (queued,) = engine.activity(kind="run.queued", run_id=retry.id)
        assert queued["body"]["trigger"] == "recovery"
        _lake_equals_source(engine)
        assert engine.queued() == []
        # retried once: asking again is refused, naming the retry
        again = _cli(project, "run", "retry", "--enqueue", dead.id)
        assert again.returncode != 0 and f"retried by run {retry.id}" in again.stderr
    finally:
        engine.close()


def test_a_worker_killed_after_a_lake_commit_retries_only_what_it_did_not_commit(
    project: Path,
) -> None:
    _enqueue(project, "pg")
    # killed right after its first dataset's lake commit, before the catalog knew of it
    _killed_worker(project, "after_commit")
    engine = Engine.open(project / "combined.yaml")
    try:
        (dead,) = engine.runs()
        assert dead.state == "committing"
        _worker(project)
        closed = engine.run(dead.id)["run"]
        assert closed.state == "failed"
        with engine.catalog.begin() as conn:
            done = {d.dataset for d in cat.deliveries(conn, run_id=dead.id, states=["committed"])}
        (first,) = done  # the commit recovery projected from the lake
        (rest,) = set(dead.datasets) - done
        (retry,) = _retries(engine, dead.id)
        assert retry.datasets == (rest,) and retry.state == "succeeded", retry.error
        error = closed.error or ""
        assert f"not retried: {first} (committed before it died" in error, error
        assert f"run {retry.id} retries {rest} (automatic retry 1 of 2)" in error
        assert first in _interrupted(engine, dead.id)["not_retried"]
        # the committed dataset was captured once: one version, by the dead Run
        assert [v["run_id"] for v in engine.history(f"pg.{first}")] == [dead.id]
        assert [v["run_id"] for v in engine.history(f"pg.{rest}")] == [retry.id]
        _lake_equals_source(engine, (rest,))
        _billed_once(engine, first)  # projected once by recovery
        # committed, not published: the next capture of it publishes it, committing nothing
        assert _cli(project, "capture", f"pg.{first}").returncode == 0
        assert [v["run_id"] for v in engine.history(f"pg.{first}")] == [dead.id]
        _lake_equals_source(engine)
    finally:
        engine.close()


@pytest.mark.parametrize("fault", ["after_projection", "after_ledger"])
def test_a_worker_killed_once_everything_was_committed_is_not_retried(
    project: Path, fault: str
) -> None:
    _enqueue(project, "pg.orders")
    _killed_worker(project, fault)
    engine = Engine.open(project / "combined.yaml")
    try:
        (dead,) = engine.runs()
        worked = _worker(project)
        assert f"run {dead.id} was interrupted" in worked.stdout + worked.stderr
        closed = engine.run(dead.id)["run"]
        assert closed.state == "failed"
        assert _retries(engine, dead.id) == [] and engine.runs(10) == [closed]
        assert "not retried: orders (committed before it died" in (closed.error or "")
        assert "run.joined" not in {e["kind"] for e in engine.activity()}
        _billed_once(engine, "orders")  # its commit projected once by recovery
        # the next capture publishes it, committing nothing twice
        assert _cli(project, "capture", "pg.orders").returncode == 0
        assert [v["run_id"] for v in engine.history("pg.orders")] == [dead.id]
        _lake_equals_source(engine, ("orders",))
    finally:
        engine.close()


def test_a_run_whose_worker_dies_every_time_stays_failed_once_its_retries_are_spent(
    project: Path,
) -> None:
    _enqueue(project, "pg.orders")
    for _ in range(3):  # the Run, then its two automatic retries, each kill its worker
        _killed_worker(project, "after_staging")
    engine = Engine.open(project / "combined.yaml")
    try:
        worked = _worker(project)  # it ends the third dead Run, and has nothing to take
        assert " succeeded" not in worked.stderr
        runs = sorted(engine.runs(10), key=lambda r: r.created_at)
        assert [r.state for r in runs] == ["failed"] * 3
        assert [r.retry_of for r in runs] == [None, runs[0].id, runs[1].id]
        assert [r.trigger for r in runs] == ["first_sync", "recovery", "recovery"]
        assert engine.queued() == []
        last = runs[-1]
        assert "died 3 times over this run and the automatic retries before it" in (
            last.error or ""
        )
        assert f"`combined run retry {last.id}`" in (last.error or "")
        body = _interrupted(engine, last.id)
        assert (body["retry"], body["deaths"], body["budget"]) == (None, 3, 3)
        (alert,) = engine.activity(kind="alert.run_retries_exhausted")
        assert alert["run_id"] == last.id and alert["body"]["deaths"] == 3
        shown = _cli(project, "activity", "--kind", "alert")
        assert "alert.run_retries_exhausted" in shown.stdout, shown.stdout
        assert _committed(engine) == []  # nothing was ever committed
        # a person who mended the cause retries it by hand
        assert _cli(project, "run", "retry", "--enqueue", last.id).returncode == 0
        _worker(project)
        _lake_equals_source(engine, ("orders",))
    finally:
        engine.close()


def _committed(engine: Engine) -> list[Any]:
    with engine.catalog.begin() as conn:
        return cat.deliveries(conn, source="pg", states=["committed"])


def test_a_dead_workers_run_joins_a_newer_one_queued_for_its_dataset(project: Path) -> None:
    _enqueue(project, "pg.orders")
    _killed_worker(project, "after_staging")
    _enqueue(project, "pg.orders")  # queued by hand meanwhile: the dead Run is not running
    engine = Engine.open(project / "combined.yaml")
    try:
        dead, newer = sorted(engine.runs(), key=lambda r: r.created_at)
        assert newer.state == "queued"
        _worker(project)
        assert _retries(engine, dead.id) == []  # no second capture of orders queued
        assert [r.state for r in sorted(engine.runs(), key=lambda r: r.created_at)] == [
            "failed",
            "succeeded",
        ]
        error = engine.run(dead.id)["run"].error or ""
        assert f"run {newer.id}, already queued or running, captures orders" in error
        (joined,) = engine.activity(kind="run.joined")
        assert joined["run_id"] == newer.id and joined["body"]["trigger"] == "recovery"
        assert _interrupted(engine, dead.id)["joined"] == [newer.id]
        _lake_equals_source(engine, ("orders",))
    finally:
        engine.close()


def test_a_capture_killed_outside_a_worker_is_not_retried(project: Path) -> None:
    # The command that executed it was killed: its exit status told whoever ran it.
    killed = _cli(project, "capture", "pg.orders", fault="after_staging")
    assert killed.returncode == -signal.SIGKILL
    assert _cli(project, "repair").returncode == 0
    engine = Engine.open(project / "combined.yaml")
    try:
        (dead,) = engine.runs()
        assert dead.state == "failed" and _retries(engine, dead.id) == []
        assert "`combined capture pg.orders` (or the next scheduled tick)" in (dead.error or "")
        assert "retry" not in _interrupted(engine, dead.id)
    finally:
        engine.close()


def _spawn(root: Path, *args: str, fault: str | None = None) -> subprocess.Popen[str]:
    """A Python process in ``root``; its standard error read by the test unless it is to die."""
    env = {**os.environ, "COMBINED_RETRY_BACKOFF_S": "0"}
    env.pop("COMBINED_FAULT", None)
    env.update({"COMBINED_FAULT": fault} if fault else {})
    err = subprocess.DEVNULL if fault else subprocess.PIPE
    return subprocess.Popen([sys.executable, *args], cwd=root, env=env, stderr=err, text=True)


def _until(done: Any, what: str, seconds: float = 120) -> None:
    deadline = time.monotonic() + seconds
    while not done():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


def test_an_idle_worker_retries_the_run_of_a_worker_killed_meanwhile(
    project: Path, tools: Any
) -> None:
    """Only a worker that takes a Run (or starts) repaired: a worker killed while the others
    idled left its Run unfinished until something else was queued."""
    _enqueue(project, "pg.orders")
    held = ("-c", tools.command_held, str(project), "worker", "--once")
    doomed = _spawn(project, *held, fault="after_staging")
    idle: subprocess.Popen[str] | None = None
    engine = Engine.open(project / "combined.yaml")
    try:
        _until(lambda: (project / "reached").exists(), "the doomed worker took no Run")
        idle = _spawn(project, "-c", CLI, "worker", "--poll", "0.2")
        assert idle.stderr is not None and "worker started" in idle.stderr.readline()
        time.sleep(1)  # idle: the doomed worker lives, its Run is its own
        (dead,) = engine.runs()
        assert dead.state == "queued" and _retries(engine, dead.id) == []
        (project / "go").touch()
        assert doomed.wait(timeout=120) == -signal.SIGKILL
        _until(
            lambda: any(r.state == "succeeded" for r in _retries(engine, dead.id)),
            "the idle worker did not retry the dead worker's Run",
        )
        (retry,) = _retries(engine, dead.id)
        with engine.catalog.begin() as conn:
            (attempt,) = runs_repo.list_attempts(conn, retry.id)
        assert attempt.pid == idle.pid  # the idle worker's own doing, nobody asked
        assert engine.run(dead.id)["run"].state == "failed"
        _lake_equals_source(engine, ("orders",))
    finally:
        engine.close()
        if doomed.poll() is None:
            doomed.kill()
            doomed.wait(timeout=60)
        if idle is not None:
            idle.send_signal(signal.SIGTERM)
            _, err = idle.communicate(timeout=60)
            assert idle.returncode == 143, err


def test_a_dataset_removed_from_the_project_is_left_out_of_the_retry(project: Path) -> None:
    _enqueue(project, "pg")
    _killed_worker(project, "after_staging")
    path = project / "combined.yaml"
    text = path.read_text()
    path.write_text(
        text.replace(
            "      items:\n        relation: public.items\n",
            "      gone:\n        relation: public.items\n",
        )
    )
    engine = Engine.open(path)
    try:
        (dead,) = engine.runs()
        _worker(project)
        (retry,) = _retries(engine, dead.id)
        assert retry.datasets == ("orders",) and retry.state == "succeeded", retry.error
        error = engine.run(dead.id)["run"].error or ""
        assert "not retried: items (no longer in the project file)" in error, error
    finally:
        engine.close()
