"""MAR's write failing after the lake commit landed: billed once, by the next capture's repair.

The lake commit is the fact; billing follows it exactly once. A usage
write the store refuses (or a process killed around it) leaves the catalog
behind the lake, the durable record of what is unbilled: the Run says the
rows were committed and their billing is pending, and the next capture (or
`combined repair`) projects the commit and bills it, never twice, without
changing the lake again.
"""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import pytest

from combined.catalog import data as cat
from combined.engine import Engine
from combined.lake import LakeTable
from combined.usage import month_counts

#: The second capture's changes: 10 updates and one insert (MAR 201 with the baseline's 200).
CHANGES = (
    "UPDATE orders SET status = 'shipped' WHERE id <= 10;"
    "INSERT INTO orders VALUES (500, 3, 'placed', 1.0);"
)
BILLED = {"mar": 201, "inserts": 201, "updates": 10, "deletes": 0}


def _billed(engine: Engine) -> dict[str, int]:
    """The orders' month of MAR in the catalog, checked against a recount of the usage table."""
    (row,) = [u for u in engine.usage() if u["dataset"] == "orders"]
    counts = {k: row[k] for k in BILLED}
    assert counts == month_counts(engine.layout, "shop", "orders", row["month"])
    return counts


def _committed(engine: Engine) -> list[tuple[str, int | None]]:
    with engine.catalog.begin() as conn:
        found = cat.deliveries(conn, source="shop", dataset="orders")
    return sorted((d.state, d.lake_version) for d in found)


def _first_capture(root: Path, tools: Any, lake: str) -> Engine:
    """The shop captured once (its lake at ``lake``), then changed: the engine."""
    tools.make(root)
    project = root / "combined.yaml"
    project.write_text(project.read_text().replace("lake: ./lake", f"lake: {lake}"))
    engine = Engine.open(project)
    (run,) = engine.capture(["shop.orders"])
    assert run.state == "succeeded", run.error
    tools.sql(root, CHANGES)
    return engine


#: The usage table's writes a store refuses: its data file's upload, its log entry's.
REFUSED = {
    "data file": {"method": "PUT", "contains": "/lake/_usage/shop/orders/part-", "status": 500},
    "log entry": {
        "method": "PUT",
        "contains": "/lake/_usage/shop/orders/_delta_log/",
        "status": 503,
    },
}


@pytest.mark.parametrize("write", list(REFUSED))
def test_a_usage_write_the_store_refuses_is_billed_once_by_the_next_repair(
    tmp_path: Path, tools: Any, s3_faults: Any, write: str
) -> None:
    engine = _first_capture(tmp_path, tools, f"s3://{s3_faults.bucket}/lake")
    try:
        table = LakeTable(f"s3://{s3_faults.bucket}/lake/shop/orders", "combined:shop/orders")
        s3_faults.fail({**REFUSED[write], "times": -1})
        (run,) = engine.capture(["shop.orders"])
        assert s3_faults.faulted() > 0
        assert run.state == "failed"
        said = " ".join((run.error or "").split())
        assert (
            "shop.orders: lake version 1 was committed (its rows are in the lake), "
            "but its MAR could not be billed" in said
        ), said
        assert (
            "its billing is pending: the next capture of the dataset (or `combined repair`) "
            "bills it, once" in said
        ), said
        assert table.version() == 1
        # Not billed, nor projected: the catalog behind the lake records what is unbilled.
        assert _billed(engine) == {"mar": 200, "inserts": 200, "updates": 0, "deletes": 0}
        assert _committed(engine) == [("committed", 0)]
        shown = tools.cli(tmp_path, "run", "show", run.id, env={"COLUMNS": "400"})
        assert "its billing is pending" in " ".join(shown.stdout.split()), shown.stdout

        s3_faults.fail()
        notes = engine.repair()
        assert any("projected lake version 1" in n for n in notes), notes
        assert _billed(engine) == BILLED
        assert _committed(engine) == [("committed", 0), ("committed", 1)]
        assert table.version() == 1  # the lake unchanged by the repair
        (again,) = engine.capture(["shop.orders"])  # nothing new: nothing more billed
        assert again.state == "succeeded", again.error
        assert _billed(engine) == BILLED
        assert table.version() == 1
    finally:
        engine.close()


def test_a_usage_commit_whose_answer_was_lost_is_billed_once(
    tmp_path: Path, tools: Any, s3_faults: Any
) -> None:
    # The store writes the usage table's log entry, the client sees an error:
    # billing computed again from the newer version adds nothing.
    engine = _first_capture(tmp_path, tools, f"s3://{s3_faults.bucket}/lake")
    try:
        lost = REFUSED["log entry"]
        s3_faults.fail({**lost, "after": True, "times": 1})
        (run,) = engine.capture(["shop.orders"])
        assert s3_faults.faulted() == 1
        assert run.state == "succeeded", run.error
        assert _billed(engine) == BILLED
        usage = LakeTable(
            f"s3://{s3_faults.bucket}/lake/_usage/shop/orders", "combined-usage:shop/orders"
        )
        assert usage.version() == 1  # the first capture's usage commit, then this one's
    finally:
        engine.close()


@pytest.mark.parametrize("boundary", ["after_commit", "after_usage"])
def test_a_capture_killed_around_its_billing_is_billed_once_by_the_next(
    tmp_path: Path, tools: Any, boundary: str
) -> None:
    # after_commit: killed before the usage write; after_usage: after it,
    # before the catalog heard of either.
    _first_capture(tmp_path, tools, "./lake").close()
    killed = tools.cli(tmp_path, "capture", "shop.orders", env={"COMBINED_FAULT": boundary})
    assert killed.returncode == -signal.SIGKILL, (killed.returncode, killed.stderr)
    again = tools.cli(tmp_path, "capture", "shop.orders")
    assert again.returncode == 0, again.stderr
    engine = Engine.open(tmp_path / "combined.yaml")
    try:
        assert _billed(engine) == BILLED
        assert _committed(engine) == [("committed", 0), ("committed", 1)]
        assert (
            LakeTable(tmp_path / "lake" / "shop" / "orders", "combined:shop/orders").version() == 1
        )
    finally:
        engine.close()
