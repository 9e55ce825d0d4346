"""A Run admitted, then failed by its lake before it read anything, ends ``failed`` at once.

The lake's ledger records an ended Run before the catalog does; the same
store that failed the Run (its bucket gone, its credentials refused, a
local lake directory removed) refused that record too, and the Run stayed
``queued`` (or ``extracting``) until the next ``combined repair``, its
own error lost for the ledger's, a worker ending on it. A Run that
committed nothing now ends in the catalog alone, with its own error, and
no checkpoint moves.
"""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path
from typing import Any

from combined.catalog import data as cat
from combined.engine import Engine

#: shop.orders read by a cursor: a capture that went through would move its checkpoint.
CURSOR = (
    "        key: [id]\n        strategy: cursor\n"
    "        cursor: {column: id, trust: 'ids only grow'}\n"
)

#: What the store refuses once the probe at the lake's root passed: the dataset's
#: table (its log's listing names it in the query) and the ledger.
REFUSED = (
    {"contains": "orders", "status": 403, "times": -1},
    {"contains": "_combined", "status": 403, "times": -1},
)


def _shop(root: Path, tools: Any, lake: str) -> Path:
    """The shop, its orders read by cursor into ``lake``, captured once; its project file."""
    project: Path = tools.make(root, orders=20)
    text = project.read_text().replace("lake: ./lake", f"lake: {lake}")
    project.write_text(
        text.replace("      orders:\n        key: [id]\n", f"      orders:\n{CURSOR}")
    )
    first = tools.cli(root, "capture", "shop.orders")
    assert first.returncode == 0, first.stderr
    tools.sql(root, "INSERT INTO orders VALUES (500, 1, 'placed', 1.0)")
    return project


def _checkpoints(project: Path) -> tuple[Any, ...]:
    """shop.orders' checkpoint as the catalog and the lake hold it, and its lake version."""
    engine = Engine.open(project)
    try:
        with engine.catalog.begin() as conn:
            row = cat.get_dataset(conn, "shop", "orders")
        lake = engine.committed_checkpoint("shop", "orders")
        version = engine.layout.dataset_table("shop", "orders").version()
        return row.checkpoint, row.last_sequence, row.lake_version, lake, version
    finally:
        engine.close()


def _runs(root: Path) -> list[tuple[str, str, str | None, str | None]]:
    """Every Run of the shop's catalog, oldest first: id, state, error, error_type."""
    con = sqlite3.connect(root / ".combined" / "catalog.db")
    try:
        query = "SELECT id, state, error, error_type FROM runs ORDER BY created_at, id"
        return con.execute(query).fetchall()
    finally:
        con.close()


def _assert_failed_by_the_lake(root: Path, run_id: str) -> None:
    """The Run ended failed with the lake's refusal of its read as its error."""
    (_, state, error, error_type) = next(r for r in _runs(root) if r[0] == run_id)
    assert (state, error_type) == ("failed", "LakeError"), error
    said = " ".join((error or "").split())
    assert "shop.orders: the lake at s3://" in said and "could not be read" in said
    assert "lack permission to list (ListBucket) or read (GetObject)" in said
    assert "AccessDenied" in said and "nothing was changed" in said


def test_a_capture_whose_lake_refuses_its_first_read_ends_failed_at_once(
    tmp_path: Path, tools: Any, s3_faults: Any
) -> None:
    project = _shop(tmp_path, tools, f"s3://{s3_faults.bucket}/lake")
    before = _checkpoints(project)
    s3_faults.fail(*REFUSED)
    result = tools.cli(tmp_path, "capture", "shop.orders")
    assert s3_faults.faulted() > 0
    assert result.returncode == 1, result.stderr
    run_id = _runs(tmp_path)[-1][0]
    assert f"run {run_id} failed" in result.stdout
    assert "`combined repair`" not in result.stderr  # nothing is left for it to end
    assert f"run {run_id} ended failed, in the catalog alone: the lake's ledger" in " ".join(
        result.stderr.split()
    )
    _assert_failed_by_the_lake(tmp_path, run_id)
    s3_faults.fail()
    assert _checkpoints(project) == before
    engine = Engine.open(project)
    try:
        (event,) = engine.activity(kind="run.failed", run_id=run_id)
        assert "the lake's ledger" in event["body"]["unledgered"]
        (run,) = engine.capture(["shop.orders"])  # no lease or claim left behind
        assert run.state == "succeeded", run.error
        assert run.stats is not None and run.stats["orders"]["captured"] == 1
    finally:
        engine.close()


def test_a_worker_whose_lake_refuses_a_runs_first_read_ends_it_failed_and_goes_on(
    tmp_path: Path, tools: Any, s3_faults: Any
) -> None:
    project = _shop(tmp_path, tools, f"s3://{s3_faults.bucket}/lake")
    queued = tools.cli(tmp_path, "capture", "--enqueue", "shop.orders")
    assert queued.returncode == 0, queued.stderr
    run_id = _runs(tmp_path)[-1][0]
    before = _checkpoints(project)
    s3_faults.fail(*REFUSED)
    result = tools.cli(tmp_path, "worker", "--once")
    assert result.returncode == 0, result.stderr
    assert f"run {run_id} failed" in result.stderr
    _assert_failed_by_the_lake(tmp_path, run_id)
    s3_faults.fail()
    assert _checkpoints(project) == before
    engine = Engine.open(project)
    try:
        assert engine.queued() == []
    finally:
        engine.close()


def test_a_local_lake_removed_after_admission_ends_the_run_failed(
    tmp_path: Path, tools: Any
) -> None:
    project = _shop(tmp_path, tools, "./lake")
    before = _checkpoints(project)
    lake, kept = tmp_path / "lake", tmp_path / "lake.kept"

    def lake_replaced_by_a_file() -> Any:
        lake.rename(kept)
        lake.write_text("not a lake")  # (root, as the tests run, is refused this too)

    out, _ = tools.while_held(tmp_path, tools.capture_held, "admitted", lake_replaced_by_a_file)
    assert out.split()[0] == "failed", out
    assert "Not a directory" in out
    (_, state, error, _) = _runs(tmp_path)[-1]
    assert state == "failed" and "Not a directory" in (error or "")
    lake.unlink()
    shutil.move(kept, lake)
    assert _checkpoints(project) == before


def test_a_retry_under_an_admission_this_release_cannot_read_ends_failed(
    tmp_path: Path, tools: Any
) -> None:
    """Its plans were read from the admission before the Run's errors ended it: a KeyError
    left the retry queued (an internal error, exit 70), and every later retry of the Run
    was refused for it."""
    tools.make(tmp_path, orders=20)
    queued = tools.cli(tmp_path, "capture", "--enqueue", "shop.orders")
    assert queued.returncode == 0, queued.stderr
    run_id = _runs(tmp_path)[-1][0]
    canceled = tools.cli(tmp_path, "run", "cancel", run_id)
    assert canceled.returncode == 0, canceled.stderr
    # (as an admission frozen before a setting this release reads was frozen)
    con = sqlite3.connect(tmp_path / ".combined" / "catalog.db")
    with con:
        con.execute(
            "UPDATE admissions SET config = json_remove(config, '$.datasets.orders.batch_rows')"
        )
    con.close()
    result = tools.cli(tmp_path, "run", "retry", run_id)
    assert result.returncode == 1, result.stderr
    (retry, state, error, _) = _runs(tmp_path)[-1]
    assert f"run {retry} failed (retry of {run_id})" in result.stdout
    assert state == "failed" and "batch_rows" in (error or "")
