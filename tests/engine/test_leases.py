"""Dataset leases: renewed while a Run lives, fenced when it stalls, honoured by recovery."""

from __future__ import annotations

import dataclasses
import os
import sqlite3
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import duckdb
import pytest

from combined.catalog import Run
from combined.catalog import _schema as t
from combined.catalog import data as cat
from combined.catalog import runs as runs_repo
from combined.engine import Engine
from combined.errors import ConfigError, LakeError, ProtocolViolation
from combined.protocol import utcnow
from combined.runtime._admit import admit
from combined.runtime._project import project_commit
from combined.runtime._reporter import NullReporter

OTHER = """\
  other:
    connector: sqlite
    config:
      path: ./other.db
    datasets:
      x:
        key: [id]
"""


class OnCommitting(NullReporter):
    """Calls ``action`` once, when the first dataset of the Run reaches its commit."""

    def __init__(self, action: Callable[[], None]) -> None:
        self.action = action
        self.fired = False

    def phase(self, dataset: str, phase: str) -> None:
        if phase == "committing" and not self.fired:
            self.fired = True
            self.action()


def _queue(engine: Engine) -> Run:
    """A queued Run of shop.orders, admitted as a capture admits it."""
    engine._declare("shop")
    return admit(
        engine.catalog,
        source="shop",
        datasets=["orders"],
        trigger="manual",
        admission=engine._admission("shop"),
    )


def _run(engine: Engine) -> Run:
    return engine.runner.execute(_queue(engine))


def _expire_leases(engine: Engine) -> None:
    # What a process on another host that stalled past the lease's time to
    # live looks like to the others (a holder on this host is live while its
    # process is, whatever the time).
    with engine.catalog.begin() as conn:
        conn.execute(
            t.leases.update().values(
                expires_at=utcnow() - timedelta(seconds=1), holder="elsewhere.example:4242:1"
            )
        )


def _lake_ids(engine: Engine) -> list[int]:
    files = engine.layout.dataset_table("shop", "orders").files()
    sql = f"SELECT id FROM read_parquet({[str(f) for f in files]!r}) ORDER BY id"
    return [int(r[0]) for r in duckdb.execute(sql).fetchall()]


def _total_of_7(engine: Engine) -> float:
    files = engine.layout.dataset_table("shop", "orders").files()
    sql = f"SELECT total FROM read_parquet({[str(f) for f in files]!r}) WHERE id = 7"
    row = duckdb.execute(sql).fetchone()
    assert row is not None
    return float(row[0])


def _mar(engine: Engine) -> int:
    return sum(int(u["mar"]) for u in engine.usage() if u["dataset"] == "orders")


def _capture_lands_all_eleven(project: Path) -> Engine:
    """Capture shop.orders again: every order lands once and is billed once."""
    engine = Engine.open(project)
    (run,) = engine.capture(["shop.orders"])
    assert run.state == "succeeded", run.error
    assert _lake_ids(engine) == list(range(1, 12))
    assert _mar(engine) == 11
    return engine


def _killed_after_commit(tmp_path: Path, tools: Any, change: str) -> Path:
    """The shop and another source; a capture of ``change`` killed after its lake commit."""
    project = _with_other_source(tools.make(tmp_path, orders=10).parent)
    assert tools.cli(tmp_path, "capture", "shop.orders").returncode == 0
    tools.sql(tmp_path, change)
    killed = tools.cli(tmp_path, "capture", "shop.orders", env={"COMBINED_FAULT": "after_commit"})
    assert killed.returncode < 0, killed.stderr
    return project


def _lose_deliveries(tmp_path: Path, staging: Path) -> None:
    """The killed run's Deliveries lost from its staging and from the raw layer both.

    No table file holds a delete's Delivery, so nothing can restore them (the
    raw layer's copy is put before the commit: losing staging alone loses nothing).
    """
    raw = tmp_path / "lake" / "_deliveries" / "shop" / "orders"
    for lost in (staging / "shop" / "orders" / "deliveries").iterdir():
        (raw / lost.name).unlink(missing_ok=True)
        lost.unlink()


def _with_other_source(root: Path) -> Path:
    con = sqlite3.connect(root / "other.db")
    con.execute("CREATE TABLE x (id INTEGER PRIMARY KEY)")
    con.execute("INSERT INTO x VALUES (1)")
    con.commit()
    con.close()
    project = root / "combined.yaml"
    project.write_text(project.read_text() + OTHER)
    return project


def test_a_run_longer_than_its_lease_keeps_it_while_others_capture_and_repair(
    tmp_path: Path, tools: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COMBINED_LEASE_TTL_S", "1")
    project = _with_other_source(tools.make(tmp_path, orders=50).parent)
    seen: dict[str, Any] = {}

    def meanwhile() -> None:
        time.sleep(2.5)  # well past the 1 s time to live: only renewals keep the lease
        other = Engine.open(project)
        try:
            (x,) = other.capture(["other.x"])  # recovers first, then captures another source
            (same,) = other.capture(["shop.orders"])
            seen["other"], seen["same"] = x.state, same
        finally:
            other.close()

    engine = Engine.open(project, reporter=OnCommitting(meanwhile))
    try:
        run = _run(engine)
        assert run.state == "succeeded", run.error
        assert seen["other"] == "succeeded"
        assert seen["same"].state == "failed"
        assert f"being captured by run {run.id}" in (seen["same"].error or "")
        assert _lake_ids(engine) == list(range(1, 51))
        assert not engine.layout.staging(run.id).exists()
    finally:
        engine.close()


@pytest.mark.parametrize("retaken", [False, True], ids=["lease-lost", "lease-retaken"])
def test_a_stalled_run_overtaken_by_another_commits_bills_and_acknowledges_nothing(
    tmp_path: Path, tools: Any, retaken: bool
) -> None:
    # A stalls at its commit past the lease's time to live; B takes the dataset
    # and commits another change as the next sequence. A then finds its lease
    # gone, or (``retaken``: A holds the dataset again when it commits, the
    # check behind the lease) the lake's commit of its sequences is B's.
    project = tools.make(tmp_path, orders=10)
    first = Engine.open(project)
    first.capture(["shop.orders"])
    first.close()
    tools.sql(tmp_path, "INSERT INTO orders VALUES (11, 1, 'placed', 99.0);")  # only A sees it
    seen: dict[str, Run] = {}
    engine = Engine.open(project)
    queued = _queue(engine)

    def stall() -> None:
        _expire_leases(engine)
        tools.sql(
            tmp_path, "DELETE FROM orders WHERE id = 11; UPDATE orders SET total = 0 WHERE id = 7;"
        )
        other = Engine.open(project)
        try:
            seen["b"] = _run(other)
        finally:
            other.close()
        if retaken:
            assert engine.catalog.acquire_lease("shop", "orders", queued.id)

    engine.reporter = OnCommitting(stall)
    try:
        a = engine.runner.execute(queued)
        assert seen["b"].state == "succeeded", seen["b"].error
        assert a.state == "failed"
        expected = (
            f"committed by run {seen['b'].id}" if retaken else "lost its lease on shop.orders"
        )
        assert expected in (a.error or "")
        assert _lake_ids(engine) == list(range(1, 11))
        assert _total_of_7(engine) == 0.0  # B's change
        assert _mar(engine) == 10  # id 11 never reached the lake: never billed
        with engine.catalog.begin() as conn:
            assert cat.deliveries(conn, run_id=a.id) == []  # recorded once the lake holds one
            assert a.id not in {v.run_id for v in cat.versions(conn, "shop", "orders")}
        assert engine.publications(1)[0]["run_id"] == seen["b"].id
        raw = sorted(p.name for p in Path(engine.layout.deliveries("shop", "orders")).iterdir())
        assert len(raw) == 2  # the first capture's and B's: A's never reached the raw layer
    finally:
        engine.close()


def test_recovery_fences_a_stalled_run_before_closing_it(tmp_path: Path, tools: Any) -> None:
    project = _with_other_source(tools.make(tmp_path, orders=10).parent)
    first = Engine.open(project)
    first.capture(["shop.orders"])
    first.close()
    tools.sql(tmp_path, "INSERT INTO orders VALUES (11, 1, 'placed', 99.0);")
    notes: list[str] = []

    def stall() -> None:
        _expire_leases(engine)
        other = Engine.open(project)
        try:
            notes.extend(other.repair())
        finally:
            other.close()

    engine = Engine.open(project, reporter=OnCommitting(stall))
    try:
        a = _run(engine)
        assert any(a.id in n for n in notes)  # recovery closed it while it stalled ...
        assert a.state == "failed"
        assert _lake_ids(engine) == list(range(1, 11))  # ... and it committed nothing after
        assert engine.layout.dataset_table("shop", "orders").committed_sequence() == 1
        _capture_lands_all_eleven(project).close()
    finally:
        engine.close()


def test_recovery_projects_a_dead_runs_commit_even_for_a_dataset_no_longer_declared(
    tmp_path: Path, tools: Any
) -> None:
    project = _killed_after_commit(
        tmp_path, tools, "INSERT INTO orders VALUES (11, 1, 'placed', 99.0);"
    )
    # the shop source leaves the project file (renamed, say) before anything recovers it
    text = project.read_text()
    head, _, _ = text.partition("sources:\n")
    project.write_text(head + "sources:\n" + OTHER)
    ok = tools.cli(tmp_path, "capture", "other.x")
    assert ok.returncode == 0, ok.stderr

    raw = engine_raw = sorted(
        p.name[:9] for p in (tmp_path / "lake" / "_deliveries" / "shop" / "orders").iterdir()
    )
    assert raw == ["000000001", "000000002"], engine_raw
    engine = Engine.open(project)
    try:
        with engine.catalog.begin() as conn:
            row = cat.get_dataset(conn, "shop", "orders")
            runs = runs_repo.list_runs(conn, limit=10)
        assert int(row.last_sequence or 0) == 2
        assert not any(r.state in ("queued", "extracting", "committing") for r in runs)
        assert not any(engine.layout.staging(r.id).exists() for r in runs)
    finally:
        engine.close()


def test_a_lease_time_to_live_that_is_not_a_positive_number_is_refused(
    tmp_path: Path, tools: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    project = tools.make(tmp_path, orders=3)
    for bad in ("0", "0.5", "-5", "soon", "inf", "nan"):
        monkeypatch.setenv("COMBINED_LEASE_TTL_S", bad)
        engine = Engine.open(project)
        try:
            with pytest.raises(ConfigError, match="COMBINED_LEASE_TTL_S"):
                engine.capture(["shop.orders"])
        finally:
            engine.close()


def test_a_commit_landing_after_recovery_erased_its_staging_still_reaches_the_raw_layer(
    tmp_path: Path, tools: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A stalls inside its commit: its Delivery is linked into the table, the
    # log not yet written, when recovery (its lease expired) erases its staging.
    # The commit then lands; the raw layer gets the Delivery back from the
    # table file that is its bytes, and nothing is left half-projected.
    import combined.lake._table as table_module

    project = _with_other_source(tools.make(tmp_path, orders=10).parent)
    first = Engine.open(project)
    first.capture(["shop.orders"])
    first.close()
    tools.sql(tmp_path, "INSERT INTO orders VALUES (11, 1, 'placed', 99.0);")
    link = table_module.link_data_files  # type: ignore[attr-defined]
    erased: list[bool] = []
    fired: list[bool] = []

    def stalled_link(table: str, files: Any, store: Any = None) -> list[Any]:
        actions = link(table, files, store)
        if not fired:  # once, for A's commit (the other capture commits too)
            fired.append(True)
            _expire_leases(engine)
            other = Engine.open(project)
            try:
                other.capture(["other.x"])  # recovery runs first
            finally:
                other.close()
            erased.append(not engine.layout.staging(a_id[0]).exists())
        return actions

    monkeypatch.setattr(table_module, "link_data_files", stalled_link)
    a_id: list[str] = []
    engine = Engine.open(project)
    queued = _queue(engine)
    a_id.append(queued.id)
    try:
        a = engine.runner.execute(queued)
        assert erased == [True]
        assert a.state == "failed"  # recovery closed it; its commit is published next time
        raw = Path(engine.layout.deliveries("shop", "orders"))
        assert sorted(p.name[:9] for p in raw.iterdir()) == ["000000001", "000000002"]
    finally:
        engine.close()
    monkeypatch.setattr(table_module, "link_data_files", link)
    again = _capture_lands_all_eleven(project)
    try:
        with again.catalog.begin() as conn:
            committed = cat.deliveries(conn, source="shop", dataset="orders", states=["committed"])
        assert sorted(d.sequence for d in committed) == [1, 2]
        assert all(Path(d.path).exists() for d in committed)
    finally:
        again.close()


def test_projecting_a_commit_whose_delivery_is_gone_restores_it_or_says_what_is_missing(
    tmp_path: Path, tools: Any
) -> None:
    project = tools.make(tmp_path, orders=10)
    engine = Engine.open(project)
    try:
        engine.capture(["shop.orders"])
        meta = engine.layout.dataset_table("shop", "orders").latest_commit()
        assert meta is not None and len(meta["deliveries"]) == 1
        raw = Path(engine.layout.deliveries("shop", "orders")) / meta["deliveries"][0]["file"]
        kept = raw.read_bytes()
        raw.unlink()  # the loss under test: staging erased before promotion

        project_commit(engine.catalog, engine.layout, "shop", "orders", meta)
        assert raw.read_bytes() == kept  # linked back from the table file with its bytes

        raw.unlink()
        other = {**meta["deliveries"][0], "content_hash": "0" * 64}
        with pytest.raises(LakeError, match="neither its run's staging nor the raw layer") as err:
            project_commit(
                engine.catalog, engine.layout, "shop", "orders", {**meta, "deliveries": [other]}
            )
        assert other["file"] in err.value.message and not raw.exists()
        assert "restore the files into the raw layer" in (err.value.hint or "")

        # a Delivery without rows (a quiet stream's position) holds nothing to lose
        empty = {**other, "records": 0}
        project_commit(
            engine.catalog, engine.layout, "shop", "orders", {**meta, "deliveries": [empty]}
        )
        assert _mar(engine) == 10
    finally:
        engine.close()


def _race_for_lease(catalogs: list[Any], dataset: str) -> list[str]:
    """Every catalog asks for the dataset's lease at once; the runs that got it."""
    import threading

    start = threading.Barrier(len(catalogs))
    won: list[str] = []

    def take(i: int) -> None:
        start.wait()
        if catalogs[i].acquire_lease("s", dataset, f"run{i}"):
            won.append(f"run{i}")

    threads = [threading.Thread(target=take, args=(i,)) for i in range(len(catalogs))]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return won


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_of_many_takers_of_one_expired_lease_exactly_one_gets_it(
    tmp_path: Path, request: pytest.FixtureRequest, backend: str
) -> None:
    from combined.catalog import Catalog

    if backend == "sqlite":
        url = f"sqlite:///{tmp_path / 'catalog.db'}"
    else:
        url = str(request.getfixturevalue("pg_database"))
    catalogs = [Catalog.open(url) for _ in range(6)]
    try:
        for round_ in range(15):
            dataset = f"d{round_}"
            with catalogs[0].begin() as conn:  # expired, its holder on another host
                conn.execute(
                    t.leases.insert().values(
                        source="s",
                        dataset=dataset,
                        run_id="dead",
                        holder="elsewhere.example:4242:1",
                        expires_at=utcnow() - timedelta(seconds=1),
                    )
                )
            won = _race_for_lease(catalogs, dataset)
            assert len(won) == 1, (round_, won)
            assert catalogs[0].lease_holder("s", dataset) == won[0]
    finally:
        for c in catalogs:
            c.close()


def test_a_live_holder_on_this_host_keeps_its_lease_past_its_time_and_a_dead_one_loses_it(
    tmp_path: Path,
) -> None:
    import subprocess
    import sys

    from combined.catalog import Catalog
    from combined.catalog._catalog import worker_identity

    catalog = Catalog.open(f"sqlite:///{tmp_path / 'catalog.db'}")
    try:
        # this process, its lease long expired: it could still commit, so it keeps it
        assert catalog.acquire_lease("s", "live", "stalled", timedelta(seconds=-60))
        assert catalog.lease_holder("s", "live") == "stalled"
        assert not catalog.acquire_lease("s", "live", "other")
        assert not catalog.break_leases("s", ["live"], "stalled")
        # a process that exited: its lease is free at once, however long it had
        gone = subprocess.run(
            [sys.executable, "-c", "import os; print(os.getpid())"],
            capture_output=True,
            text=True,
            check=True,
        )
        with catalog.begin() as conn:
            conn.execute(
                t.leases.insert().values(
                    source="s",
                    dataset="dead",
                    run_id="exited",
                    holder=f"{worker_identity().rsplit(':', 2)[0]}:{gone.stdout.strip()}:1",
                    expires_at=utcnow() + timedelta(hours=1),
                )
            )
        assert catalog.lease_holder("s", "dead") is None
        assert catalog.break_leases("s", ["dead"], "exited")
        assert catalog.acquire_lease("s", "dead", "next")
        # a reused pid (same pid, another start time) is not the holder
        pid = os.getpid()
        with catalog.begin() as conn:
            conn.execute(
                t.leases.update()
                .where(t.leases.c.dataset == "live")
                .values(holder=f"{worker_identity().rsplit(':', 2)[0]}:{pid}:1")
            )
        assert catalog.lease_holder("s", "live") is None
    finally:
        catalog.close()


def test_recovery_that_cannot_project_one_dataset_still_recovers_and_captures_the_others(
    tmp_path: Path, tools: Any
) -> None:
    # no table file holds a delete's Delivery
    project = _killed_after_commit(tmp_path, tools, "DELETE FROM orders WHERE id = 7;")
    (staging,) = (tmp_path / "lake" / "_staging").iterdir()
    _lose_deliveries(tmp_path, staging)  # the loss under test

    engine = Engine.open(project)
    try:
        (x,) = engine.capture(["other.x"])
        assert x.state == "succeeded", x.error
        notes = engine.repair()
        assert any("shop.orders: its lake commits could not be projected" in n for n in notes), (
            notes
        )
        assert staging.exists()  # kept: it is what a restore would need
        with engine.catalog.begin() as conn:
            alerts = cat.activity(conn, kind="alert.recovery_failed")
        assert alerts and alerts[0].dataset == "orders"
    finally:
        engine.close()


def test_a_lake_under_a_path_with_spaces_and_accents_is_captured_and_queried(
    tmp_path: Path, tools: Any
) -> None:
    root = tmp_path / "my lakes é"
    project = tools.make(root, orders=20)
    engine = Engine.open(project)
    try:
        engine.capture(["shop.orders"])
        tools.sql(
            root, "UPDATE orders SET status = 'x' WHERE id < 5; DELETE FROM orders WHERE id = 9;"
        )
        (run,) = engine.capture(["shop.orders"])  # reads and rewrites the table's files
        assert run.state == "succeeded", run.error
        rows = engine.sql(
            "SELECT count(*) AS n, count(*) FILTER (status = 'x') AS x FROM shop.orders"
        )
        assert rows.to_pylist() == [{"n": 19, "x": 4}]
        assert _mar(engine) == 20
    finally:
        engine.close()


def test_a_publication_never_moves_a_dataset_back_to_an_older_lake_version(
    tmp_path: Path, tools: Any
) -> None:
    project = tools.make(tmp_path, orders=10)
    engine = Engine.open(project)
    try:
        engine.capture(["shop.orders"])
        tools.sql(tmp_path, "UPDATE orders SET total = 0 WHERE id = 7;")
        engine.capture(["shop.orders"])
        newest = engine.publications(1)[0]
        with engine.catalog.begin() as conn:
            members = cat.published_basis(conn, int(newest["seq"]))
        orders = next(m for m in members if m.dataset == "orders")
        assert orders.lake_version is not None and orders.lake_version >= 1
        stale = dataclasses.replace(orders, lake_version=orders.lake_version - 1)
        with pytest.raises(ProtocolViolation, match="would publish it at the older version"):
            with engine.catalog.begin() as conn:
                cat.publish(conn, "stale-run", [stale])
        assert engine.publications(1)[0]["id"] == newest["id"]  # nothing was published
        with engine.catalog.begin() as conn:
            assert cat.publish(conn, "same-run", [orders])  # the same version is fine
    finally:
        engine.close()


def test_an_ended_run_keeps_its_staging_until_its_lake_commit_is_projected_then_loses_it(
    tmp_path: Path, tools: Any
) -> None:
    # An update's Delivery is in no table file: only the Run's staging holds it
    # until the projection promotes it into the raw layer.
    project = _killed_after_commit(tmp_path, tools, "UPDATE orders SET status = 'x' WHERE id = 3;")
    (staging,) = (tmp_path / "lake" / "_staging").iterdir()
    staged = sorted(p.name for p in (staging / "shop" / "orders" / "deliveries").iterdir())
    assert staged
    engine = Engine.open(project)
    try:
        with engine.catalog.begin() as conn:
            # as if its own process had failed it after the commit landed
            runs_repo.move_run(conn, staging.name, "failed", error="projection failed")
        notes = engine.repair()
        assert f"run {staging.name} (failed): its staging was erased" in notes, notes
        assert not staging.exists()
        raw = Path(engine.layout.deliveries("shop", "orders"))
        assert set(staged) <= {p.name for p in raw.iterdir()}  # promoted before the erasure
        with engine.catalog.begin() as conn:
            (event,) = cat.activity(conn, kind="run.staging_erased")
            assert event.run_id == staging.name
            assert cat.get_dataset(conn, "shop", "orders").last_sequence == (
                engine.layout.dataset_table("shop", "orders").committed_sequence()
            )
        assert engine.repair() == []  # nothing left to do
    finally:
        engine.close()


def test_an_ended_run_whose_commit_cannot_be_projected_keeps_its_staging(
    tmp_path: Path, tools: Any
) -> None:
    project = _killed_after_commit(tmp_path, tools, "DELETE FROM orders WHERE id = 7;")
    (staging,) = (tmp_path / "lake" / "_staging").iterdir()
    _lose_deliveries(tmp_path, staging)
    (staging / "keep").write_text("evidence")
    engine = Engine.open(project)
    try:
        with engine.catalog.begin() as conn:
            runs_repo.move_run(conn, staging.name, "failed", error="projection failed")
        notes = engine.repair()
        assert any("could not be projected" in n for n in notes), notes
        assert not any("staging was erased" in n for n in notes)
        assert (staging / "keep").exists()
    finally:
        engine.close()


def test_staging_of_a_run_the_catalog_does_not_know_is_left_alone(
    tmp_path: Path, tools: Any
) -> None:
    project = tools.make(tmp_path, orders=5)
    stray = tmp_path / "lake" / "_staging" / "not-a-run"
    stray.mkdir(parents=True)
    engine = Engine.open(project)
    try:
        (run,) = engine.capture(["shop.orders"])
        assert run.state == "succeeded", run.error
        assert stray.exists()
        assert not engine.layout.staging(run.id).exists()
    finally:
        engine.close()


def test_recovery_leaves_alone_a_run_admitted_by_a_live_process_before_its_lease(
    tmp_path: Path, tools: Any
) -> None:
    tools.make(tmp_path, orders=10)
    assert tools.cli(tmp_path, "capture").returncode == 0
    tools.sql(tmp_path, "INSERT INTO orders VALUES (11, 1, 'placed', 99.0);")
    # another process recovers while the capture is admitted, its lease not taken yet
    out, repaired = tools.while_held(
        tmp_path, tools.capture_held, "admitted", lambda: tools.cli(tmp_path, "repair")
    )
    assert repaired.returncode == 0, repaired.stderr
    assert out.split()[0] == "succeeded", out
    assert "interrupted" not in repaired.stdout
    engine = Engine.open(tmp_path / "combined.yaml")
    try:
        assert _lake_ids(engine) == list(range(1, 12))
        assert [r.state for r in engine.runs(5)] == ["succeeded", "succeeded"]
    finally:
        engine.close()


@pytest.mark.postgres
def test_two_processes_closing_one_dead_run_at_once_both_carry_on(
    tmp_path: Path, tools: Any, pg_database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Surviving workers each repair before their next Run: both found the dead
    # Run open, and the one that moved it second stopped with "run ... left
    # extracting while it was being moved to failed" (exit status 2).
    project = tools.make(tmp_path, catalog=pg_database)
    engine, other = Engine.open(project), Engine.open(project)
    try:
        dead = _queue(engine)
        with engine.catalog.begin() as conn:
            runs_repo.move_run(conn, dead.id, "extracting")  # then its process died
        move = runs_repo.move_run

        def after_the_other_closed_it(conn: Any, run_id: str, target: Any, **kw: Any) -> Run:
            monkeypatch.setattr(runs_repo, "move_run", move)
            assert any(dead.id in note for note in other.repair())  # committed first
            return move(conn, run_id, target, **kw)

        monkeypatch.setattr(runs_repo, "move_run", after_the_other_closed_it)
        notes = engine.repair()  # read the Run open, then moved it second
        assert not any(dead.id in note for note in notes)
        with engine.catalog.begin() as conn:
            assert runs_repo.get_run(conn, dead.id).state == "failed"
        assert _run(engine).state == "succeeded"  # and the process carries on
    finally:
        other.close()
        engine.close()
