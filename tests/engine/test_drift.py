"""Schema drift: each class meets its policy (evolve, quarantine, fail), always in the feed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from combined.catalog import data as cat
from combined.engine import Engine


def _policy(project: Path, **drift: str) -> None:
    text = project.read_text().split("      orders:")[0]
    spec = ", ".join(f"{k}: {v}" for k, v in drift.items())
    project.write_text(text + "      orders:\n        key: [id]\n        drift: {" + spec + "}\n")


def _drifts(engine: Engine) -> list[tuple[str, str, str]]:
    with engine.catalog.begin() as conn:
        rows = cat.activity(conn, kind="drift")
    return [(d.body["class"], d.body["field"], d.body["outcome"]) for d in reversed(rows)]


def _captured(tmp_path: Path, tools: Any, orders: int) -> Path:
    """The shop, its orders captured once; returns the project file."""
    project: Path = tools.make(tmp_path, orders=orders)
    engine = Engine.open(project)
    try:
        (first,) = engine.capture(["shop.orders"])
        assert first.state == "succeeded", first.error
    finally:
        engine.close()
    return project


def test_a_dropped_column_fails_by_default_with_its_event_and_nothing_held(
    tmp_path: Path, tools: Any
) -> None:
    project = _captured(tmp_path, tools, 30)
    tools.sql(tmp_path, "ALTER TABLE orders DROP COLUMN status;")
    engine = Engine.open(project)
    try:
        (run,) = engine.capture(["shop.orders"])
        assert run.state == "needs_review"
        assert "drop on field 'status' (policy: fail)" in (run.error or "")
        assert _drifts(engine) == [("drop", "status", "fail")]
        assert engine.quarantine() == []
        assert engine.sql("SELECT count(status) AS n FROM shop.orders").to_pylist() == [{"n": 30}]
        assert not engine.layout.staging(run.id).exists()
    finally:
        engine.close()


def test_a_drift_whose_policy_is_quarantine_holds_the_capture_for_review(
    tmp_path: Path, tools: Any
) -> None:
    project = _captured(tmp_path, tools, 30)
    _policy(project, drop="quarantine", new_field="evolve")
    tools.sql(
        tmp_path,
        "ALTER TABLE orders DROP COLUMN total; ALTER TABLE orders ADD COLUMN channel TEXT;"
        "UPDATE orders SET channel = 'web' WHERE id <= 10;",
    )
    engine = Engine.open(project)
    try:
        (run,) = engine.capture(["shop.orders"])
        assert run.state == "needs_review"
        assert "held in quarantine" in (run.error or "")
        (entry,) = engine.quarantine()
        assert entry["id"] in (run.error or "")
        assert entry["reason"] == "schema drift: drop 'total'" and entry["record_count"] == 30
        held = pq.read_table(entry["path"])
        assert "channel" in held.column_names and "total" not in held.column_names
        assert sorted(held.column("id").to_pylist()) == list(range(1, 31))
        # every drift class is in the feed with its outcome, the evolving one too
        assert sorted(_drifts(engine)) == [
            ("drop", "total", "quarantine"),
            ("new_field", "channel", "evolve"),
        ]
        # nothing was committed: the lake still has the column and not the new one
        assert engine.sql("SELECT count(total) AS n FROM shop.orders").to_pylist() == [{"n": 30}]
        assert not engine.layout.staging(run.id).exists()
    finally:
        engine.close()

    _policy(project, drop="evolve", new_field="evolve")  # the reviewer accepts the change
    engine = Engine.open(project)
    try:
        (accepted,) = engine.capture(["shop.orders"])
        assert accepted.state == "succeeded", accepted.error
        assert engine.sql(
            "SELECT count(channel) AS n FROM shop.orders WHERE channel = 'web'"
        ).to_pylist() == [{"n": 10}]
        (qid,) = [q["id"] for q in engine.quarantine()]
        engine.decide_quarantine(qid, "discarded", by="ana", reason="the drop was intended")
        assert engine.quarantine() == []
    finally:
        engine.close()


def test_fail_wins_over_quarantine_when_both_apply(tmp_path: Path, tools: Any) -> None:
    project = _captured(tmp_path, tools, 10)
    _policy(project, drop="quarantine", new_field="fail")
    tools.sql(
        tmp_path, "ALTER TABLE orders DROP COLUMN total; ALTER TABLE orders ADD COLUMN x INTEGER;"
    )
    engine = Engine.open(project)
    try:
        (run,) = engine.capture(["shop.orders"])
        assert run.state == "needs_review"
        assert "new_field on field 'x' (policy: fail)" in (run.error or "")
        assert engine.quarantine() == []
        assert sorted(_drifts(engine)) == [
            ("drop", "total", "quarantine"),
            ("new_field", "x", "fail"),
        ]
    finally:
        engine.close()


def test_a_quarantine_file_that_cannot_be_written_leaves_no_torn_file_and_no_entry(
    tmp_path: Path, tools: Any
) -> None:
    import pyarrow as pa
    import pytest

    from combined.runtime._plan import plans_from_admission
    from combined.runtime._quarantine import quarantine_capture

    engine = Engine.open(tools.make(tmp_path, orders=5))
    try:
        plan = plans_from_admission(engine._admission("shop"))["orders"]
        good = tmp_path / "good.arrow"
        batch = pa.record_batch({"id": pa.array([1, 2], pa.int64())})
        with pa.ipc.new_file(str(good), batch.schema) as writer:
            writer.write_batch(batch)
        torn = tmp_path / "torn.arrow"
        torn.write_bytes(good.read_bytes()[:40])  # a part cut short
        with pytest.raises(pa.ArrowInvalid):
            quarantine_capture(
                [torn, good],
                plan,
                run_id="r-test",
                reason="schema drift: drop 'x'",
                layout=engine.layout,
                catalog=engine.catalog,
            )
        area = Path(engine.layout.quarantine("shop", "orders"))
        assert list(area.iterdir()) == []
        assert engine.quarantine() == []
    finally:
        engine.close()


def test_the_same_drift_is_held_once_while_it_awaits_review(tmp_path: Path, tools: Any) -> None:
    project = _captured(tmp_path, tools, 30)
    _policy(project, drop="quarantine", new_field="quarantine")
    tools.sql(tmp_path, "ALTER TABLE orders DROP COLUMN total;")
    engine = Engine.open(project)
    try:
        (first,) = engine.capture(["shop.orders"])
        (entry,) = engine.quarantine()
        # Captured again before anyone reviewed it: the same drift, the same
        # rows still at the source; no second copy of the table.
        (again,) = engine.capture(["shop.orders"])
        assert again.state == "needs_review"
        assert f"awaits review in quarantine entry {entry['id']}" in (again.error or "")
        assert "not held again" in (again.error or "")
        assert [q["id"] for q in engine.quarantine()] == [entry["id"]]
        held = Path(engine.layout.quarantine("shop", "orders"))
        assert [p.name for p in held.glob("*.parquet")] == [Path(entry["path"]).name]
        assert not engine.layout.staging(again.id).exists()
        assert _drifts(engine) == [("drop", "total", "quarantine")] * 2  # each in the feed
        # Another drift is another entry.
        tools.sql(tmp_path, "ALTER TABLE orders ADD COLUMN channel TEXT;")
        (other,) = engine.capture(["shop.orders"])
        assert other.state == "needs_review" and "not held again" not in (other.error or "")
        assert len(engine.quarantine()) == 2
        # Once reviewed, the same drift met again is held again, for a new review.
        for q in engine.quarantine():
            engine.decide_quarantine(q["id"], "released", by="ana", reason="seen")
        (after,) = engine.capture(["shop.orders"])
        assert "not held again" not in (after.error or "")
        (fresh,) = engine.quarantine()
        assert fresh["id"] not in (entry["id"], first.id)
    finally:
        engine.close()


def test_an_evolved_column_still_null_everywhere_is_published(tmp_path: Path, tools: Any) -> None:
    # No row changes (a null column is absent to the payload hash), yet the
    # published table must have the column the capture evolved to.
    project = _captured(tmp_path, tools, orders=20)
    tools.sql(tmp_path, "ALTER TABLE orders ADD COLUMN channel TEXT;")
    engine = Engine.open(project)
    try:
        (run,) = engine.capture(["shop.orders"])
        assert run.state == "succeeded", run.error
        assert run.stats is not None and run.stats["orders"]["updates"] == 0
        assert engine.sql(
            "SELECT count(*) AS n, count(channel) AS web FROM shop.orders"
        ).to_pylist() == [{"n": 20, "web": 0}]
        assert _drifts(engine) == [("new_field", "channel", "evolve")]
        assert len(engine.history("shop.orders")) == 1  # the parent version, re-admitted
        usage = engine.usage()
        (again,) = engine.capture(["shop.orders"])  # and then nothing more is written
        assert again.state == "succeeded", again.error
        assert engine.run(again.id)["deliveries"] == []
        assert engine.usage() == usage
    finally:
        engine.close()


def test_a_column_widened_to_real_keeps_its_fractions(tmp_path: Path, tools: Any) -> None:
    # integer -> real, accepted (a float's identity text is not an integer's: not a
    # widening, held by default): the lake's column stayed bigint and 2.5 landed as 2,
    # silently, in the merged and the appended table alike.
    project = tools.make(tmp_path, orders=3)
    _policy(project, narrowed_type="evolve")
    project.write_text(
        project.read_text()
        + "      events:\n        sync_mode: append\n        drift: {narrowed_type: evolve}\n"
    )
    tools.sql(
        tmp_path, "CREATE TABLE events (id INTEGER, qty INTEGER); INSERT INTO events VALUES (1, 1);"
    )
    engine = Engine.open(project)
    try:
        (first,) = engine.capture(["shop.orders", "shop.events"])
        assert first.state == "succeeded", first.error
        tools.sql(
            tmp_path,
            "CREATE TABLE o2 (id INTEGER PRIMARY KEY, customer_id REAL, status TEXT, total REAL);"
            "INSERT INTO o2 SELECT * FROM orders; DROP TABLE orders;"
            "ALTER TABLE o2 RENAME TO orders;"
            "UPDATE orders SET customer_id = 2.5 WHERE id = 2;"
            "DROP TABLE events; CREATE TABLE events (id INTEGER, qty REAL);"
            "INSERT INTO events VALUES (2, 3.5);",
        )
        (widened,) = engine.capture(["shop.orders", "shop.events"])
        assert widened.state == "succeeded", widened.error
        assert engine.sql("SELECT id, customer_id FROM shop.orders ORDER BY id").to_pylist() == [
            {"id": 1, "customer_id": 2.0},
            {"id": 2, "customer_id": 2.5},
            {"id": 3, "customer_id": 4.0},
        ]
        assert engine.sql("SELECT id, qty FROM shop.events ORDER BY id").to_pylist() == [
            {"id": 1, "qty": 1.0},
            {"id": 2, "qty": 3.5},
        ]
        assert ("narrowed_type", "customer_id", "evolve") in _drifts(engine)
    finally:
        engine.close()


def test_a_row_updated_after_its_column_was_dropped_does_not_keep_the_old_value(
    tmp_path: Path, tools: Any
) -> None:
    # drop: evolve keeps the column in the lake (Delta drops none); a row that
    # changes afterwards is a new version without it, as its Delivery (and a
    # replay of it) says, not the old value under the new payload hash. A row
    # that did not change keeps its value, unbilled (tests/engine/test_drop_kept.py).
    project = tools.make(tmp_path, orders=3)
    _policy(project, drop="evolve")
    engine = Engine.open(project)
    try:
        engine.capture(["shop.orders"])
        tools.sql(
            tmp_path,
            "ALTER TABLE orders DROP COLUMN status; UPDATE orders SET total = 9 WHERE id = 1;",
        )
        (run,) = engine.capture(["shop.orders"])
        assert run.state == "succeeded", run.error
        assert engine.sql(
            "SELECT id, status, total, _combined_op AS op FROM shop.orders ORDER BY id"
        ).to_pylist() == [
            {"id": 1, "status": None, "total": 9.0, "op": "update"},
            {"id": 2, "status": "placed", "total": 3.0, "op": "snapshot"},  # (as it was)
            {"id": 3, "status": "placed", "total": 4.5, "op": "snapshot"},
        ]
    finally:
        engine.close()


def test_a_drift_in_one_dataset_names_the_datasets_it_held_back_and_how_to_capture_them(
    tmp_path: Path, tools: Any
) -> None:
    """A Run publishes its datasets together: the error only named the drifted
    one, and the source's other datasets went uncaptured without a word."""
    project: Path = tools.make(tmp_path, orders=30)
    engine = Engine.open(project)
    try:
        (first,) = engine.capture([])
        assert first.state == "succeeded", first.error
        tools.sql(tmp_path, "ALTER TABLE orders DROP COLUMN status;")
        tools.sql(tmp_path, "INSERT INTO customers VALUES (99, 'new', 'Paris');")
        (run,) = engine.capture([])
        assert run.state == "needs_review"
        error = run.error or ""
        assert "drop on field 'status' (policy: fail)" in error
        assert (
            "this Run's other datasets (shop.customers) were not committed either (a Run "
            "publishes its datasets together): `combined capture shop.customers` captures "
            "them meanwhile" in error
        )
        assert engine.sql("SELECT count(*) AS n FROM shop.customers").to_pylist() == [{"n": 20}]
        (alone,) = engine.capture(["shop.customers"])
        assert alone.state == "succeeded", alone.error
        assert engine.sql("SELECT count(*) AS n FROM shop.customers").to_pylist() == [{"n": 21}]
        # A failure naming no dataset (or the only one) says nothing of others.
        (again,) = engine.capture(["shop.orders"])
        assert again.state == "needs_review"
        assert "other datasets" not in (again.error or "")
    finally:
        engine.close()
