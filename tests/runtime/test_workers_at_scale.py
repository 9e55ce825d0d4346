"""Three workers as on three hosts: sharing only a PostgreSQL catalog and an S3 lake.

Each worker runs in a working directory of its own, with its own copy of the
project file and its own local staging; what they share is the catalog (a
fresh PostgreSQL database) and the lake (a bucket on the S3 server on
127.0.0.1). One worker is killed (SIGKILL) while it holds a dataset's lease in
the middle of a capture. Every Run ends exactly once, the killed Run's dataset
is taken over once its lease expired, and the lake ends equal to the source:
no row lost, no Delivery committed twice, no identity billed twice.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from combined.catalog import data as cat
from combined.catalog import runs as runs_repo
from combined.engine import Engine
from combined.lake import LakeTable

CLI = "from combined.cli import main; main()"
TABLES = [f"t{i}" for i in range(1, 6)]
ROWS = 250_000
TTL_S = "4"  # a lease outlives its last renewal by 4 s (renewed every 0.8 s)


@pytest.fixture
def source_db(pg_server_dsn: str) -> Iterator[str]:
    """A fresh source database with five tables of ROWS rows each."""
    import psycopg

    name = f"combined_src_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(pg_server_dsn, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    dsn = f"{pg_server_dsn.rsplit('/', 1)[0]}/{name}"
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            for t in TABLES:
                conn.execute(
                    f"CREATE TABLE {t} (id bigint PRIMARY KEY, name text, qty bigint);"
                    f"INSERT INTO {t} SELECT g, 'name-' || g || '-' || md5(g::text), g % 1000 "
                    f"FROM generate_series(1, {ROWS}) g"
                )
        yield dsn
    finally:
        with psycopg.connect(pg_server_dsn, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _project(catalog: str, bucket: str, dsn: str) -> str:
    datasets = "".join(
        f"      {t}:\n        relation: public.{t}\n        key: [id]\n" for t in TABLES
    )
    return (
        f"version: 1\nlake: s3://{bucket}/lake\ncatalog: {catalog}\nsources:\n  pg:\n"
        f"    connector: postgres\n    config:\n      dsn: {dsn}\n    datasets:\n{datasets}"
    )


def _spawn(root: Path, *args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "COMBINED_LEASE_TTL_S": TTL_S, "COMBINED_RETRY_BACKOFF_S": "0"}
    return subprocess.Popen(
        [sys.executable, "-c", CLI, *args],
        cwd=root,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _run(root: Path, *args: str) -> str:
    done = _spawn(root, *args)
    out, err = done.communicate(timeout=300)
    assert done.returncode == 0, err
    return out


def _pid(run: Any) -> int:
    return int(str(run.claimed_by).split(":")[1])


def _victim(engine: Engine, pids: set[int], deadline: float) -> Any:
    """A Run a worker has been extracting for a second, while it holds its lease."""
    seen: dict[str, float] = {}
    while time.monotonic() < deadline:
        for run in engine.runs(50):
            if run.state != "extracting" or run.claimed_by is None or _pid(run) not in pids:
                continue
            (dataset,) = run.datasets
            if engine.catalog.lease_holder(run.source, dataset) != run.id:
                continue
            since = seen.setdefault(run.id, time.monotonic())
            if time.monotonic() - since >= 1.0:
                return run
        time.sleep(0.1)
    pytest.fail("no worker was seen extracting a Run")


def _stop(workers: list[subprocess.Popen[str]]) -> list[str]:
    for w in workers:
        if w.poll() is None:
            w.send_signal(signal.SIGTERM)
    errs = []
    for w in workers:
        _, err = w.communicate(timeout=300)
        errs.append(err)
    return errs


def _settle(engine: Engine, wanted: int, deadline: float) -> list[Any]:
    """Every Run once ``wanted`` of them ended (the queue empty)."""
    while time.monotonic() < deadline:
        runs = engine.runs(50)
        if len(runs) >= wanted and all(r.terminal for r in runs):
            return runs
        time.sleep(0.5)
    pytest.fail(f"runs still going: {[(r.id, r.state) for r in engine.runs(50)]}")


def _source_totals(dsn: str, table: str) -> tuple[Any, ...]:
    import psycopg

    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            f"SELECT count(*), sum(id), sum(qty), sum(length(name)), min(name), max(name) "
            f"FROM {table}"
        ).fetchone()
    assert row is not None
    return tuple(int(v) if isinstance(v, int) or hasattr(v, "as_integer_ratio") else v for v in row)


def _lake_totals(engine: Engine, table: str) -> tuple[Any, ...]:
    (row,) = engine.sql(
        "SELECT count(*) AS n, sum(id) AS i, sum(qty) AS q, sum(length(name)) AS l, "
        f"min(name) AS lo, max(name) AS hi, count(DISTINCT _combined_id) AS ids FROM pg.{table}"
    ).to_pylist()
    assert row["ids"] == row["n"]  # no identity twice
    return tuple(
        int(row[k]) if k not in ("lo", "hi") else row[k] for k in ("n", "i", "q", "l", "lo", "hi")
    )


def _ended_records(engine: Engine) -> dict[str, int]:
    """How many times the lake's ledger recorded each Run as ended."""
    store = engine.layout.store
    table = LakeTable(store.join("_combined", "runs"), "", store)
    counts: dict[str, int] = {}
    for path in table.files():
        for key in store.read_table(path).column("id").to_pylist():
            counts[key] = counts.get(key, 0) + 1
    return counts


@pytest.mark.slow
@pytest.mark.beside
@pytest.mark.postgres
def test_three_workers_sharing_only_the_catalog_and_the_lake_survive_a_killed_one(
    tmp_path: Path, pg_database: str, source_db: str, s3_bucket: str
) -> None:
    text = _project(pg_database, s3_bucket, source_db)
    homes = [tmp_path / f"host{i}" for i in (1, 2, 3)]
    observer = tmp_path / "observer"  # where the test enqueues, retries and looks
    for home in [*homes, observer]:
        home.mkdir()
        (home / "combined.yaml").write_text(text)
    for t in TABLES:
        _run(observer, "capture", "--enqueue", f"pg.{t}")
    started = time.monotonic()
    workers = [_spawn(home, "worker", "--poll", "0.2") for home in homes]
    engine = Engine.open(observer / "combined.yaml")
    try:
        pids = {w.pid for w in workers}
        victim = _victim(engine, pids, time.monotonic() + 240)
        killed = next(w for w in workers if w.pid == _pid(victim))
        killed.send_signal(signal.SIGKILL)
        killed.communicate(timeout=30)  # (its pipes closed)
        survivors = [w for w in workers if w is not killed]
        # The dead Run holds its lease until it expires; then the next repair
        # (a survivor's, before each Run) closes it once and queues its retry,
        # which takes the dataset over: nobody asks for it.
        runs = _settle(engine, len(TABLES) + 1, time.monotonic() + 300)
        elapsed = time.monotonic() - started
        errs = _stop(survivors)
        assert [w.returncode for w in survivors] == [143, 143], errs

        by_id = {r.id: r for r in runs}
        dead = by_id[victim.id]
        assert dead.state == "failed" and "interrupted" in str(dead.error)
        (retry,) = [r for r in runs if r.retry_of == victim.id]
        assert retry.state == "succeeded", retry.error
        assert retry.trigger == "recovery"  # queued by the survivors' recovery, unasked
        assert _pid(retry) in {w.pid for w in survivors}  # taken over by another host
        assert [r.state for r in runs if r.id != victim.id].count("succeeded") == len(TABLES)
        # every Run ended exactly once (the ledger records each end), and every
        # succeeded Run was executed by one Attempt of one worker
        assert _ended_records(engine) == {r.id: 1 for r in runs}
        with engine.catalog.begin() as conn:
            for run in runs:
                attempts = runs_repo.list_attempts(conn, run.id)
                assert len(attempts) == 1, (run.id, attempts)
                assert attempts[0].pid == _pid(run)
        # the lake equals the source; each Delivery committed once; MAR once
        usage = {u["dataset"]: u for u in engine.usage()}
        for t in TABLES:
            assert _lake_totals(engine, t) == _source_totals(source_db, t), t
            versions = engine.history(f"pg.{t}")
            assert sum(v["inserts"] for v in versions) == ROWS
            assert sum(v["updates"] + v["deletes"] for v in versions) == 0
            assert (usage[t]["mar"], usage[t]["inserts"]) == (ROWS, ROWS)
            with engine.catalog.begin() as conn:
                delivered = cat.deliveries(conn, source="pg", dataset=t, states=["committed"])
            assert len({d.id for d in delivered}) == len(delivered)
            assert sum(d.record_count for d in delivered) == ROWS
        print(
            f"\n{len(TABLES)} datasets x {ROWS:,} rows, 3 workers, one killed while extracting "
            f"{victim.source}.{victim.datasets[0]}: all ended in {elapsed:.1f} s; "
            f"runs by worker: "
            + ", ".join(
                f"{w.pid}{' (killed)' if w is killed else ''}: "
                f"{sum(1 for r in runs if _pid(r) == w.pid)}"
                for w in workers
            )
        )
    finally:
        engine.close()
        for w in workers:
            if w.poll() is None:
                w.kill()
                w.communicate()
