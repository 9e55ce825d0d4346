"""SIGKILL at each lifecycle boundary, then capture again: exactly once, nothing half-published."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from combined.engine import Engine

BOUNDARIES = ["after_staging", "during_commit", "after_commit", "after_projection", "after_ledger"]


def _lake(engine: Engine, table: str) -> list[tuple[object, ...]]:
    rows = engine.sql(f"SELECT id, customer_id, status, total FROM {table} ORDER BY id")
    return [tuple(r.values()) for r in rows.to_pylist()]


#: Each boundary once; the commit watchdog also fires 40 ms in, mid-write.
CASES = [(b, "0") for b in BOUNDARIES] + [("during_commit", "40")]


@pytest.mark.slow
@pytest.mark.parametrize(("boundary", "delay_ms"), CASES)
def test_kill_then_capture_again_lands_everything_once(
    tmp_path: Path, tools, boundary: str, delay_ms: str
) -> None:
    tools.make(tmp_path, orders=3000)
    ok = tools.cli(tmp_path, "capture")
    assert ok.returncode == 0, ok.stderr
    engine = Engine.open(tmp_path / "combined.yaml")
    before = _lake(engine, "shop.orders")
    published_before = engine.publications(1)[0]["id"]
    engine.close()

    tools.sql(
        tmp_path,
        "UPDATE orders SET status = 'shipped' WHERE id <= 300;"
        "DELETE FROM orders WHERE id > 2900;"
        "INSERT INTO orders SELECT id + 5000, customer_id, 'placed', total FROM orders "
        "WHERE id <= 150;",
    )
    killed = tools.cli(
        tmp_path,
        "capture",
        env={"COMBINED_FAULT": boundary, "COMBINED_FAULT_DELAY_MS": delay_ms},
    )
    assert killed.returncode == -signal.SIGKILL, (killed.returncode, killed.stderr)

    # nothing half-published: the basis is still the first publication, whatever the lake holds
    engine = Engine.open(tmp_path / "combined.yaml")
    assert engine.publications(1)[0]["id"] == published_before
    assert _lake(engine, "shop.orders") == before
    engine.close()

    again = tools.cli(tmp_path, "capture")
    assert again.returncode == 0, again.stderr
    engine = Engine.open(tmp_path / "combined.yaml")
    try:
        assert _lake(engine, "shop.orders") == [tuple(r) for r in tools.rows(tmp_path, "orders")]
        dup = (
            engine.sql("SELECT count(*) - count(DISTINCT _combined_id) AS d FROM shop.orders")
            .column("d")[0]
            .as_py()
        )
        assert dup == 0
        (orders,) = [u for u in engine.usage() if u["dataset"] == "orders"]
        # 3000 first seen + 150 new; updates and deletes touch rows already counted
        assert orders["mar"] == 3150
        assert (orders["inserts"], orders["updates"], orders["deletes"]) == (3150, 300, 100)
        history = engine.history("shop.orders")
        assert len(history) == 2
        assert (history[1]["inserts"], history[1]["updates"], history[1]["deletes"]) == (
            150,
            300,
            100,
        )
        from combined.catalog import data as cat

        with engine.catalog.begin() as conn:
            committed = cat.deliveries(conn, source="shop", dataset="orders", states=["committed"])
            ds = cat.get_dataset(conn, "shop", "orders")
        # each delivery sequence is committed exactly once, contiguous from 1
        seqs = [d.sequence for d in committed]
        assert seqs == list(range(1, len(seqs) + 1))
        assert sum(d.record_count for d in committed) == 3000 + 550
        from combined.lake import LakeTable

        lake = LakeTable(tmp_path / "lake" / "shop" / "orders", "combined:shop/orders")
        assert ds.last_sequence == lake.committed_sequence() == seqs[-1]
        runs = engine.runs(10)
        assert runs[0].state == "succeeded"
        assert any(r.state == "failed" for r in runs)  # the killed run was closed by recovery
    finally:
        engine.close()


@pytest.mark.slow
def test_a_run_taking_a_dataset_whose_holder_died_after_its_commit_projects_that_commit_first(
    tmp_path: Path, tools, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The lease of a run killed between its lake commit and its projection goes to a
    capture that repaired before that commit: the commit is projected, never skipped."""
    tools.make(tmp_path, orders=3000)
    assert tools.cli(tmp_path, "capture").returncode == 0
    declare = Engine._declare
    killed: list[int] = []

    def declare_after_a_dying_capture(self: Engine, source: str) -> None:
        # Between this capture's repair and its taking the lease, another one
        # commits to the lake and is killed before its catalog hears of it.
        if not killed:
            tools.sql(
                tmp_path,
                "UPDATE orders SET status = 'shipped' WHERE id <= 100;"
                "INSERT INTO orders SELECT id + 5000, customer_id, 'placed', total FROM orders "
                "WHERE id <= 50;",
            )
            dying = tools.cli(
                tmp_path, "capture", "shop.orders", env={"COMBINED_FAULT": "after_commit"}
            )
            killed.append(dying.returncode)
            tools.sql(tmp_path, "UPDATE orders SET status = 'lost' WHERE id BETWEEN 1000 AND 1009;")
        declare(self, source)

    monkeypatch.setattr(Engine, "_declare", declare_after_a_dying_capture)
    engine = Engine.open(tmp_path / "combined.yaml")
    try:
        (run,) = engine.capture(["shop.orders"])
        assert killed == [-signal.SIGKILL]
        assert run.state == "succeeded", run.error
        monkeypatch.setattr(Engine, "_declare", declare)
        engine.repair()  # closes the killed run and erases its staging
        assert _lake(engine, "shop.orders") == [tuple(r) for r in tools.rows(tmp_path, "orders")]
        (orders,) = [u for u in engine.usage() if u["dataset"] == "orders"]
        # the killed run's 100 updates and 50 inserts are billed, and the 10 updates after
        assert (orders["mar"], orders["inserts"], orders["updates"]) == (3050, 3050, 110)
        from combined.catalog import data as cat

        with engine.catalog.begin() as conn:
            committed = cat.deliveries(conn, source="shop", dataset="orders", states=["committed"])
        # the killed run's Delivery is recorded and kept in the raw layer
        assert [d.sequence for d in committed] == [1, 2, 3]
        assert all(Path(d.path).exists() for d in committed)
        assert [d.record_count for d in committed] == [3000, 150, 10]
        history = engine.history("shop.orders")
        assert [h["parent_id"] for h in history] == [None, history[0]["id"], history[1]["id"]]
        assert [h["row_count"] for h in history] == [3000, 3050, 3050]
        assert not list((tmp_path / "lake" / "_staging").iterdir())
    finally:
        engine.close()


@pytest.mark.slow
@pytest.mark.parametrize("boundary", ["after_commit", "after_projection"])
def test_changes_committed_by_a_killed_run_are_told_by_the_publication_that_shows_them(
    tmp_path: Path, tools, boundary: str
) -> None:
    tools.make(tmp_path, orders=300)
    assert tools.cli(tmp_path, "capture").returncode == 0
    tools.sql(tmp_path, "UPDATE orders SET status = 'shipped' WHERE id <= 10;")
    killed = tools.cli(tmp_path, "capture", env={"COMBINED_FAULT": boundary})
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    # nothing changes in the source since: this capture only publishes what the killed one did
    again = tools.cli(tmp_path, "capture")
    assert again.returncode == 0, again.stderr
    engine = Engine.open(tmp_path / "combined.yaml")
    try:
        latest, first = engine.publications(2)
        members = {m["dataset"]: m for m in latest["member_rows"]}
        before = {m["dataset"]: m for m in first["member_rows"]}
        assert members["orders"]["dataset_version"] != before["orders"]["dataset_version"]
        assert members["orders"]["changed"] is True
        assert members["customers"]["changed"] is False
        from combined.catalog import data as cat

        with engine.catalog.begin() as conn:
            told = cat.activity(conn, kind="dataset.changed", run_id=latest["run_id"])
        assert [(e.dataset, e.body["version"]) for e in told] == [
            ("orders", members["orders"]["dataset_version"])
        ]
    finally:
        engine.close()
