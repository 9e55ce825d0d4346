"""Queued Runs and workers: enqueue, take exactly once across processes, stop, recover."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from combined.catalog import runs as runs_repo
from combined.engine import Engine
from combined.protocol import utcnow
from combined.runtime._admit import admit, freeze_admission

WORKER = "from combined.cli import main; main()"


def _spawn(root: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    """A ``combined`` process started in ``root`` (not waited for)."""
    return subprocess.Popen(
        [sys.executable, "-c", WORKER, *args],
        cwd=root,
        env={**os.environ, "COMBINED_RETRY_BACKOFF_S": "0", **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _attempts(engine: Engine, run_id: str) -> list[Any]:
    with engine.catalog.begin() as conn:
        return runs_repo.list_attempts(conn, run_id)


def _count(engine: Engine, table: str) -> int:
    return int(engine.sql(f"SELECT count(*) AS n FROM {table}").to_pylist()[0]["n"])


def test_an_enqueued_capture_reads_nothing_until_a_worker_executes_it(
    shop: Path, tools: Any
) -> None:
    queued = tools.cli(shop, "capture", "--enqueue", "shop.orders")
    assert queued.returncode == 0, queued.stderr
    assert "queued" in queued.stdout
    assert not (shop / "lake" / "shop" / "orders").exists()  # nothing was read
    engine = Engine.open(shop / "combined.yaml")
    try:
        (run,) = engine.runs()
        assert (run.state, run.trigger, run.datasets) == ("queued", "first_sync", ("orders",))
        assert run.claimed_by is None  # waiting for a worker
        assert [r.id for r in engine.queued()] == [run.id]

        worked = tools.cli(shop, "worker", "--once")
        assert worked.returncode == 0, worked.stderr
        assert f"run {run.id} succeeded" in worked.stderr
        done = engine.run(run.id)["run"]
        assert done.state == "succeeded", done.error
        assert done.publication_id is not None
        (attempt,) = _attempts(engine, run.id)
        assert attempt.worker.startswith("worker:")
        (taken,) = engine.activity(kind="run.taken", run_id=run.id)
        assert taken["body"]["by"].split(":")[1] == str(attempt.pid)
        assert _count(engine, "shop.orders") == 200
        assert engine.queued() == []
    finally:
        engine.close()


def test_a_worker_with_an_empty_queue_and_once_exits_at_once(shop: Path, tools: Any) -> None:
    worked = tools.cli(shop, "worker", "--once")
    assert worked.returncode == 0, worked.stderr
    assert "succeeded" not in worked.stderr


def test_a_queued_run_waiting_longer_than_a_lease_survives_repair(shop: Path, tools: Any) -> None:
    # Runs wait in the queue for minutes when the workers are busy: recovery,
    # which closes Runs whose process died, must not take them for dead.
    env = {"COMBINED_LEASE_TTL_S": "1"}
    assert tools.cli(shop, "capture", "--enqueue", "shop.orders", env=env).returncode == 0
    time.sleep(1.5)
    repaired = tools.cli(shop, "repair", env=env)
    assert repaired.returncode == 0, repaired.stderr
    assert "interrupted" not in repaired.stdout
    captured = tools.cli(shop, "capture", "shop.customers", env=env)  # repairs too
    assert captured.returncode == 0, captured.stderr
    engine = Engine.open(shop / "combined.yaml")
    try:
        waiting = [r for r in engine.runs() if r.datasets == ("orders",)]
        assert [r.state for r in waiting] == ["queued"]
    finally:
        engine.close()
    worked = tools.cli(shop, "worker", "--once", env=env)
    assert worked.returncode == 0, worked.stderr
    assert "succeeded" in worked.stderr


_TAKE_AND_DIE = """
import os, sys
from combined.engine import Engine
engine = Engine.open(sys.argv[1] + "/combined.yaml")
run = engine.take_run()
print(run.id, flush=True)
os._exit(0)  # taken, its leases never taken: the process died in between
"""


def test_a_run_taken_by_a_worker_that_died_before_its_leases_is_closed(
    shop: Path, tools: Any
) -> None:
    assert tools.cli(shop, "capture", "--enqueue", "shop.orders").returncode == 0
    taker = subprocess.run(
        [sys.executable, "-c", _TAKE_AND_DIE, str(shop)], capture_output=True, text=True
    )
    assert taker.returncode == 0, taker.stderr
    run_id = taker.stdout.strip()
    repaired = tools.cli(shop, "repair")
    assert f"run {run_id} was interrupted" in repaired.stdout
    engine = Engine.open(shop / "combined.yaml")
    try:
        assert engine.run(run_id)["run"].state == "failed"
    finally:
        engine.close()


def test_a_worker_killed_mid_run_leaves_it_to_recovery_which_retries_it(
    shop: Path, tools: Any
) -> None:
    assert tools.cli(shop, "capture", "--enqueue", "shop.orders").returncode == 0
    killed = tools.cli(shop, "worker", "--once", env={"COMBINED_FAULT": "after_staging"})
    assert killed.returncode == -signal.SIGKILL
    engine = Engine.open(shop / "combined.yaml")
    try:
        (run,) = engine.runs()
        assert run.state == "extracting"
        # the next worker repairs before its Run: the dead one is closed, and retried
        worked = tools.cli(shop, "worker", "--once")
        assert worked.returncode == 0, worked.stderr
        closed = engine.run(run.id)["run"]
        assert closed.state == "failed"
        # what happened, told: where it stopped, that its process died, that
        # nothing was committed (it was killed before its commit), and its retry
        (retry,) = [r for r in engine.runs() if r.retry_of == run.id]
        assert "interrupted while extracting" in (closed.error or "")
        assert "its process ended" in (closed.error or "")
        assert "nothing of it was committed" in (closed.error or "")
        assert f"run {retry.id} retries orders" in (closed.error or "")
        # (a worker executed it: nobody had to ask for it)
        assert (retry.state, retry.trigger) == ("succeeded", "recovery"), retry.error
        assert f"run {retry.id} succeeded" in worked.stderr
        assert _count(engine, "shop.orders") == 200
    finally:
        engine.close()


def _race(root: Path, env: dict[str, str] | None = None) -> None:
    """Queue eight Runs (two datasets), let two worker processes race: each runs once.

    A capture request joins a queued capture of its dataset: these Runs are
    admitted to the queue directly, as eight requests that did not join would be.
    """
    engine = Engine.open(root / "combined.yaml")
    try:
        for _ in range(4):
            engine._admit("shop", ["orders"], None, enqueue=True)
            engine._admit("shop", ["customers"], None, enqueue=True)
    finally:
        engine.close()
    workers = [_spawn(root, "worker", "--once", "--poll", "0.1", env=env) for _ in range(2)]
    outputs = [w.communicate(timeout=300) for w in workers]
    for w, (_, err) in zip(workers, outputs, strict=True):
        assert w.returncode == 0, err
    engine = Engine.open(root / "combined.yaml")
    try:
        runs = engine.runs(50)
        assert len(runs) == 8
        executed: dict[int, set[str]] = {w.pid: set() for w in workers}
        for run in runs:
            assert run.state == "succeeded", (run.id, run.error)
            (attempt,) = _attempts(engine, run.id)  # executed once, by one worker
            assert attempt.worker == f"worker:{attempt.pid}"
            executed[attempt.pid].add(run.id)
        assert set().union(*executed.values()) == {r.id for r in runs}
        # each worker printed exactly the Runs the catalog says it executed
        for w, (_, err) in zip(workers, outputs, strict=True):
            told = {
                words[1]
                for words in map(str.split, err.splitlines())
                if words[:1] == ["run"] and words[2:3] == ["succeeded"]
            }
            assert told == executed[w.pid]
        assert _count(engine, "shop.orders") == 200
    finally:
        engine.close()


def test_two_workers_never_execute_the_same_run_on_a_sqlite_catalog(shop: Path, tools: Any) -> None:
    _race(shop)


@pytest.mark.postgres
def test_two_workers_never_execute_the_same_run_on_a_postgresql_catalog(
    tmp_path: Path, tools: Any, pg_database: str
) -> None:
    tools.make(tmp_path, catalog=pg_database)
    _race(tmp_path)
    assert not (tmp_path / ".combined" / "catalog.db").exists()


def test_sigterm_stops_a_worker_after_its_current_run_with_status_143(
    shop: Path, tools: Any
) -> None:
    assert tools.cli(shop, "capture", "--enqueue", "shop.orders").returncode == 0
    assert tools.cli(shop, "capture", "--enqueue", "shop.customers").returncode == 0
    child = subprocess.Popen(
        [sys.executable, "-c", tools.command_held, str(shop), "worker", "--poll", "0.1"],
        cwd=shop,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while not (shop / "reached").exists():
            assert child.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        child.send_signal(signal.SIGTERM)  # mid-Run: the Run goes on
        time.sleep(0.5)
        assert child.poll() is None
        (shop / "go").touch()
        _, err = child.communicate(timeout=120)
    finally:
        if child.poll() is None:
            child.kill()
    assert child.returncode == 143, err
    assert "stopped by SIGTERM" in err
    engine = Engine.open(shop / "combined.yaml")
    try:
        states = {r.datasets: r.state for r in engine.runs()}
        # the Run it was executing finished; the next one still waits
        assert states == {("orders",): "succeeded", ("customers",): "queued"}
    finally:
        engine.close()


def test_sigterm_stops_an_idle_worker_at_once(shop: Path) -> None:
    child = _spawn(shop, "worker", "--poll", "30")
    try:
        deadline = time.monotonic() + 60
        assert child.stderr is not None
        line = child.stderr.readline()
        assert "worker started" in line, line
        assert time.monotonic() < deadline
        started = time.monotonic()
        child.send_signal(signal.SIGTERM)
        _, err = child.communicate(timeout=20)
        assert time.monotonic() - started < 5  # not after its 30 s poll
    finally:
        if child.poll() is None:
            child.kill()
            child.communicate()
    assert child.returncode == 143, err
    assert "worker stopped by SIGTERM" in err


def test_a_worker_grown_past_recycle_mb_starts_afresh_in_place_between_runs(
    shop: Path, tools: Any
) -> None:
    """Each run makes this worker hold more than 1 MB over its start: it replaces itself
    (the same command, the same process) after each, never inside one, and its
    ``--max-runs`` counts on across the restarts."""
    for name in ("shop.orders", "shop.customers"):
        assert tools.cli(shop, "capture", "--enqueue", name).returncode == 0
    worked = tools.cli(shop, "worker", "--once", "--max-runs", "2", "--recycle-mb", "1")
    assert worked.returncode == 0, worked.stderr
    err = worked.stderr
    # (a third start, had the second been told --max-runs 2 again, or recycled after its last)
    assert err.count("worker started") == 2, err
    assert err.count("starting afresh in place") == 1, err
    assert err.count(" succeeded") == 2, err
    engine = Engine.open(shop / "combined.yaml")
    try:
        assert [r.state for r in engine.runs()] == ["succeeded", "succeeded"]
        pids = {a.pid for r in engine.runs() for a in _attempts(engine, r.id)}
        assert len(pids) == 1  # (one process id: replaced in place, not a child)
    finally:
        engine.close()

    assert tools.cli(shop, "capture", "--enqueue", "shop.orders").returncode == 0
    worked = tools.cli(shop, "worker", "--once", "--recycle-mb", "0")  # never
    assert worked.returncode == 0, worked.stderr
    assert "starting afresh" not in worked.stderr and " succeeded" in worked.stderr


def test_worker_options_are_checked(shop: Path, tools: Any) -> None:
    bad = tools.cli(shop, "worker", "--poll", "0")
    assert bad.returncode == 2
    assert "--poll" in bad.stderr


_SLOW_TAP = """
import json, sys, time
schema = {"type": "object", "properties": {"id": {"type": "integer"}}}
if "--discover" in sys.argv:
    stream = {"tap_stream_id": "things", "stream": "things", "schema": schema,
              "key_properties": ["id"], "metadata": []}
    print(json.dumps({"streams": [stream]}))
    sys.exit(0)
print(json.dumps({"type": "SCHEMA", "stream": "things", "schema": schema,
                  "key_properties": ["id"]}), flush=True)
print(json.dumps({"type": "RECORD", "stream": "things", "record": {"id": 1}}), flush=True)
time.sleep(30)
"""


def test_a_worker_killed_while_reading_leaves_no_attempt_running(
    tmp_path: Path, tools: Any
) -> None:
    # SIGKILL while the source is being read: the Run recovery closes ends
    # its Attempt too (run show said "attempt 1 ...: running" for ever) and
    # says what happened, not that committed deliveries were projected.
    (tmp_path / "tap.py").write_text(_SLOW_TAP)
    (tmp_path / "combined.yaml").write_text(
        "version: 1\nlake: ./lake\nsources:\n  tap:\n    connector: singer\n"
        f"    config: {{command: [{sys.executable}, ./tap.py]}}\n"
        "    datasets: {things: {key: [id]}}\n"
    )
    assert tools.cli(tmp_path, "capture", "--enqueue", "tap").returncode == 0
    worker = _spawn(tmp_path, "worker", "--once")
    engine = Engine.open(tmp_path / "combined.yaml")
    try:
        deadline = time.monotonic() + 120
        # (extracting, and its Attempt recorded: the state is set a moment before)
        while (
            not (runs := engine.runs())
            or runs[0].state != "extracting"
            or not _attempts(engine, runs[0].id)
        ):
            assert time.monotonic() < deadline and worker.poll() is None
            time.sleep(0.2)
        worker.kill()
        worker.communicate(timeout=60)
        assert tools.cli(tmp_path, "repair").returncode == 0
        closed = engine.run(runs[0].id)["run"]
        assert closed.state == "failed"
        error = closed.error or ""
        assert "interrupted while extracting" in error and "its process ended" in error
        assert "nothing of it was committed" in error and "(automatic retry 1 of 2)" in error
        (attempt,) = _attempts(engine, closed.id)
        assert attempt.outcome == "interrupted" and attempt.ended_at is not None
        shown = tools.cli(tmp_path, "run", "show", closed.id)
        assert "attempt 1 on worker:" in shown.stdout and ": running" not in shown.stdout
    finally:
        engine.close()
        if worker.poll() is None:
            worker.kill()
            worker.communicate()


@pytest.mark.postgres
def test_a_worker_outlives_a_catalog_that_closes_its_connections(
    tmp_path: Path, tools: Any, pg_database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A catalog server that ends its sessions (a restart, a failover, an idle timeout)
    killed the worker at its next poll: internal error (PendingRollbackError); one that
    refused connections for a while killed it too (OperationalError)."""
    import psycopg

    tools.make(tmp_path, catalog=pg_database)
    project = tmp_path / "combined.yaml"  # a password too (trust ignores it): never told
    project.write_text(
        project.read_text().replace(
            "\nsources:", '\ncatalog_password: {secret: "env:REV_CATALOG_PW"}\nsources:', 1
        )
    )
    password = "Catalog-pw-7f3a9c1e"
    monkeypatch.setenv("REV_CATALOG_PW", password)
    worker = _spawn(tmp_path, "worker", "--poll", "0.2")
    try:
        name = pg_database.rsplit("/", 1)[1]
        server = pg_database.rsplit("/", 1)[0] + "/postgres"
        with psycopg.connect(server, autocommit=True) as conn:
            # polling, its pooled connection idle between polls (a loaded machine
            # starts it slowly: a fixed 3 s found no session of it, now and then)
            deadline = time.monotonic() + 60
            while not conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = %s", (name,)
            ).fetchone()[0]:  # type: ignore[index]
                assert worker.poll() is None and time.monotonic() < deadline
                time.sleep(0.2)
            time.sleep(1)
            # down for a while (its sessions ended, none allowed), then back
            conn.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false')
            killed = conn.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE datname = %s",
                (name,),
            ).fetchone()
            assert killed is not None and killed[0] >= 1
            time.sleep(2)  # polls meet a server that refuses them
            conn.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')
        time.sleep(1)
        assert worker.poll() is None, worker.communicate()[1]
        assert tools.cli(tmp_path, "capture", "--enqueue", "shop.orders").returncode == 0
        engine = Engine.open(tmp_path / "combined.yaml")
        try:
            deadline = time.monotonic() + 120
            ended = ("succeeded", "failed", "needs_review", "needs_auth", "canceled")
            while engine.runs()[0].state not in ended:
                assert worker.poll() is None and time.monotonic() < deadline
                time.sleep(0.2)
            assert engine.runs()[0].state == "succeeded"
            assert _count(engine, "shop.orders") == 200
        finally:
            engine.close()
    finally:
        worker.send_signal(signal.SIGTERM)
        _, err = worker.communicate(timeout=60)
    assert "internal error" not in err, err
    assert "trying again" in err and password not in err, err


def test_a_worker_gives_back_what_it_took_unknowingly_after_a_catalog_error(
    shop: Path, tools: Any
) -> None:
    """A take whose answer was lost with its connection may have kept its claim: while
    that worker lived, no other took the Run, nor did recovery close it."""
    from combined.catalog import queue, worker_identity
    from combined.errors import CatalogError
    from combined.runtime._worker import work

    assert tools.cli(shop, "capture", "--enqueue", "shop.orders").returncode == 0
    engine = Engine.open(shop / "combined.yaml")
    try:
        calls: list[str] = []

        def take() -> Any:
            calls.append("take")
            if len(calls) == 1:
                with engine.catalog.begin() as conn:  # taken, then the answer lost
                    assert queue.take(conn, worker_identity()) is not None
                raise CatalogError("the catalog at x closed its connection: gone", lost=True)
            return None

        list(
            work(
                take,
                engine.execute_taken,
                lambda: len(calls) > 1,
                lambda: False,
                poll_s=0.01,
                give_back=engine._give_back_taken,
            )
        )
        (run,) = engine.queued()
        assert run.claimed_by is None  # any worker may take it again
    finally:
        engine.close()


def _going(engine: Engine, n: int) -> None:
    """``n`` Runs more that are going: waiting until a source's Retry-After, or taken by
    this (live) process and about to take their leases."""
    admission = freeze_admission(engine.project, "shop")
    later = utcnow() + timedelta(hours=1)
    for i in range(n):
        admit(
            engine.catalog,
            source="shop",
            datasets=["orders"],
            trigger="manual",
            admission=admission,
            enqueue=i % 2 == 0,
            not_before=later if i % 2 == 0 else None,
        )


def _extracting(engine: Engine) -> None:
    """One Run extracting each dataset, holding its lease (for this live process)."""
    admission = freeze_admission(engine.project, "shop")
    for dataset in ("orders", "customers"):
        run = admit(
            engine.catalog, source="shop", datasets=[dataset], trigger="manual", admission=admission
        )
        assert engine.catalog.acquire_lease("shop", dataset, run.id)
        with engine.catalog.begin() as conn:
            runs_repo.move_run(conn, run.id, "extracting")


def _idle_poll(engine: Engine) -> list[str]:
    """The catalog statements one idle poll of a worker issues (after its start-up repair)."""
    statements: list[str] = []
    asked = 0

    def count(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        statements.append(statement)

    def stopping() -> bool:  # asked before the poll, then in the wait after it
        nonlocal asked
        asked += 1
        if asked == 1:
            sa.event.listen(engine.catalog.engine, "before_cursor_execute", count)
        elif asked == 2:
            sa.event.remove(engine.catalog.engine, "before_cursor_execute", count)
        return asked > 1

    assert list(engine.work(stopping, poll_s=0.01)) == []  # nothing to take: idle
    assert asked > 1
    return statements


@pytest.mark.parametrize(
    "backend", ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)]
)
def test_an_idle_poll_issues_as_many_catalog_statements_whatever_the_runs_going(
    tmp_path: Path, tools: Any, backend: str, request: pytest.FixtureRequest
) -> None:
    """Reproduction: each idle poll (every 2 s, by each worker) read every Run not ended
    again, one statement each, to learn whether its process died: with hundreds of Runs
    waiting, idle workers kept the catalog busy."""
    catalog = {"catalog": request.getfixturevalue("pg_database")} if backend != "sqlite" else {}
    engine = Engine.open(tools.make(tmp_path, **catalog))
    try:
        _extracting(engine)
        _going(engine, 2)
        few = _idle_poll(engine)
        _going(engine, 20)
        many = _idle_poll(engine)
        assert len(many) == len(few), "\n".join(many)
        # none of them was taken for dead
        going = [r for r in engine.runs(100) if not r.terminal]
        assert len(going) == 24 and not engine.activity(kind="run.interrupted")
    finally:
        engine.close()
