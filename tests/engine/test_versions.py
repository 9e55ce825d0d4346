"""Dataset versions, publications, time travel and the five kinds of evidence."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from combined.catalog import data as cat
from combined.engine import Engine
from combined.errors import NotFoundError

CHANGES = (
    "UPDATE orders SET status = 'shipped' WHERE id <= 10;"
    "DELETE FROM orders WHERE id > 195;"
    "INSERT INTO orders VALUES (500, 3, 'placed', 1.0);"
)


def _count(engine: Engine, *, as_of: datetime | None = None) -> int:
    result = engine.sql("SELECT count(*) AS n FROM shop.orders", as_of=as_of)
    return int(result.column("n")[0].as_py())


def _member(pub: dict[str, Any], dataset: str) -> dict[str, Any]:
    members: list[dict[str, Any]] = pub["member_rows"]
    (m,) = [m for m in members if m["dataset"] == dataset]
    return m


def _table_rows(stdout: str) -> list[list[str]]:
    return [
        [c.strip() for c in line.strip("│").split("│")]
        for line in stdout.splitlines()
        if line.startswith("│")
    ]


def test_history_cli_lists_versions_with_parent_counts_totals_run_publication_lake_version(
    shop: Path, tools: Any
) -> None:
    engine = Engine.open(shop / "combined.yaml")
    try:
        (first,) = engine.capture()
        tools.sql(shop, CHANGES)
        (second,) = engine.capture()
        (third,) = engine.capture()  # unchanged
        assert third.state == "succeeded", third.error
    finally:
        engine.close()
    shown = tools.cli(shop, "history", "shop.orders", env={"COLUMNS": "250"})
    assert shown.returncode == 0, shown.stderr
    engine = Engine.open(shop / "combined.yaml")
    try:
        v1, v2 = engine.history("shop.orders")
    finally:
        engine.close()
    assert _table_rows(shown.stdout) == [
        [v1["id"], "-", "200", "0", "0", "200", first.id, "0", first.publication_id],
        [
            v2["id"],
            v1["id"],
            "1",
            "10",
            "5",
            "196",
            second.id,
            "1",
            f"{second.publication_id}, {third.publication_id}",
        ],
    ]


def test_unchanged_observation_re_admits_the_parent_version(shop: Path, tools: Any) -> None:
    engine = Engine.open(shop / "combined.yaml")
    try:
        engine.capture()
        tools.sql(shop, CHANGES)
        engine.capture()
        (unchanged,) = engine.capture()
        newer, older = engine.publications(2)
        assert newer["id"] == unchanged.publication_id
        for dataset in ("customers", "orders"):
            now, before = _member(newer, dataset), _member(older, dataset)
            assert now["dataset_version"] == before["dataset_version"]
            assert now["lake_version"] == before["lake_version"]
            assert not now["changed"]
        (v1, v2) = engine.history("shop.orders")
        assert _member(newer, "orders")["dataset_version"] == v2["id"]
        assert v2["parent_id"] == v1["id"]
        assert v2["publications"] == [older["id"], newer["id"]]
    finally:
        engine.close()


def _changed_events(engine: Engine, run_id: str) -> list[dict[str, Any]]:
    with engine.catalog.begin() as conn:
        events = cat.activity(conn, kind="dataset.changed", run_id=run_id)
    return sorted(
        ({"dataset": e.dataset, **e.body} for e in events), key=lambda e: str(e["dataset"])
    )


def test_dataset_changed_fires_only_for_members_whose_version_changed(
    shop: Path, tools: Any
) -> None:
    engine = Engine.open(shop / "combined.yaml")
    try:
        (first,) = engine.capture()
        assert [e["dataset"] for e in _changed_events(engine, first.id)] == [
            "customers",
            "orders",
        ]
        tools.sql(shop, "UPDATE orders SET status = 'shipped' WHERE id = 7;")
        (second,) = engine.capture()
        pub = engine.publications(1)[0]
        assert _changed_events(engine, second.id) == [
            {
                "dataset": "orders",
                "publication": second.publication_id,
                "version": _member(pub, "orders")["dataset_version"],
            }
        ]
        assert not _member(pub, "customers")["changed"]
        (third,) = engine.capture()  # nothing changed anywhere
        assert third.state == "succeeded"
        assert _changed_events(engine, third.id) == []
    finally:
        engine.close()


def test_as_of_between_two_captures_returns_the_first_state_only(shop: Path, tools: Any) -> None:
    engine = Engine.open(shop / "combined.yaml")
    try:
        (first,) = engine.capture()
        first_pub = engine.publications(1)[0]
        time.sleep(0.02)
        between = datetime.now(UTC)
        time.sleep(0.02)
        tools.sql(shop, CHANGES)
        (second,) = engine.capture()
        second_pub = engine.publications(1)[0]
        committed = _member(second_pub, "orders")["committed_at"]
        # the lake accepted the new rows before they were published
        assert first_pub["published_at"] < between < committed < second_pub["published_at"]
        for instant in (first_pub["published_at"], between, committed):
            assert _count(engine, as_of=instant) == 200
            shipped = engine.sql(
                "SELECT count(*) AS n FROM shop.orders WHERE status = 'shipped'", as_of=instant
            ).to_pylist()
            assert shipped == [{"n": 0}]  # none of the changes
            runs = engine.sql(
                "SELECT DISTINCT _combined_run_id AS r FROM shop.orders", as_of=instant
            ).to_pylist()
            assert runs == [{"r": first.id}]
        later = second_pub["published_at"]
        assert _count(engine, as_of=later) == 196  # at or before: inclusive
        assert _count(engine, as_of=later + timedelta(days=1)) == 196
        with pytest.raises(NotFoundError):
            _count(engine, as_of=first_pub["published_at"] - timedelta(microseconds=1))
    finally:
        engine.close()
    cli = tools.cli(shop, "sql", "--format", "json", "--as-of", between.isoformat(), ORDERS_COUNT)
    assert cli.returncode == 0, cli.stderr
    assert json.loads(cli.stdout) == [{"n": 200}]
    assert second.publication_id != first.publication_id


ORDERS_COUNT = "SELECT count(*) AS n FROM shop.orders"


def _scripted(root: Path, position: str) -> Engine:
    project = {
        "version": 1,
        "lake": "./lake",
        "catalog": "sqlite:///.combined/catalog.db",
        "sources": {
            "api": {
                "connector": "scripted",
                "config": {
                    "datasets": {"orders": {"fields": {"id": "int64", "qty": "int64"}}},
                    "script": [
                        {
                            "rows": [{"id": i, "qty": i} for i in range(1, 4)],
                            "state": {"cursor": position},
                            "position": position,
                        }
                    ],
                },
                "datasets": {"orders": {"key": ["id"]}},
            }
        },
    }
    (root / "combined.yaml").write_text(json.dumps(project))
    return Engine.open(root / "combined.yaml")


def test_five_kinds_of_evidence_are_distinct_fields_of_a_member(tmp_path: Path) -> None:
    engine = _scripted(tmp_path, "pos-42")
    try:
        (run,) = engine.capture()
        assert run.state == "succeeded", run.error
        pub = engine.publications(1)[0]
        (member,) = pub["member_rows"]
        (version,) = engine.history("api.orders")
        # source position: where in the provider the capture stands
        assert member["source_position"] == "pos-42"
        rows = engine.sql("SELECT DISTINCT _combined_source_position AS p FROM api.orders")
        assert rows.to_pylist() == [{"p": "pos-42"}]
        # extraction interval: when the source was read
        receipt = member["extraction_receipt"]
        started = datetime.fromisoformat(receipt["extraction_started_at"])
        completed = datetime.fromisoformat(receipt["extraction_completed_at"])
        # dataset version: what content the dataset holds
        assert member["dataset_version"] == version["id"]
        assert version["row_count"] == 3
        # acceptance time: when the lake accepted it; temporal basis: when it was published
        committed = member["committed_at"]
        published = pub["published_at"]
        assert started <= completed < committed < published
        assert len({member["source_position"], member["dataset_version"]}) == 2
        assert pub["id"] == run.publication_id
    finally:
        engine.close()


def test_member_acceptance_time_is_the_one_stamped_on_rows_and_deliveries(shop: Path) -> None:
    engine = Engine.open(shop / "combined.yaml")
    try:
        (run,) = engine.capture(["shop.orders"])
        member = _member(engine.publications(1)[0], "orders")
        stamped = engine.sql(
            "SELECT DISTINCT _combined_ingested_at AS at FROM shop.orders"
        ).to_pylist()
        (delivery,) = engine.run(run.id)["deliveries"]
        assert delivery.committed_at == stamped[0]["at"]
        assert member["committed_at"] == delivery.committed_at
    finally:
        engine.close()


def test_two_datasets_with_the_same_content_each_have_their_own_history(
    shop: Path,
) -> None:
    project = shop / "combined.yaml"
    project.write_text(
        project.read_text() + "      orders_mirror:\n        relation: orders\n        key: [id]\n"
    )
    engine = Engine.open(project)
    try:
        (run,) = engine.capture()
        assert run.state == "succeeded", run.error
        (orders,) = engine.history("shop.orders")
        (mirror,) = engine.history("shop.orders_mirror")
        assert mirror["dataset"] == "orders_mirror"
        assert mirror["id"] != orders["id"]
    finally:
        engine.close()
