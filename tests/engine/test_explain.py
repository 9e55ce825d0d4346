"""``combined explain DATASET KEY...``: every version of one row, from the raw layer (issue 22).

Each version names its operation, Run, Delivery, lake and dataset version,
source position, extraction receipt, publication and acceptance time; a key
not in the projection says why (deleted, left out by a replacement,
quarantined, not yet published, never captured).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from combined import Engine


def _explain(tools: Any, root: Path, *args: str) -> dict[str, Any]:
    result = tools.cli(root, "explain", *args, "--json")
    assert result.returncode == 0, result.stderr
    found: dict[str, Any] = json.loads(result.stdout)
    return found


def _capture(tools: Any, root: Path, expect: int = 0) -> None:
    result = tools.cli(root, "capture")
    assert result.returncode == expect, result.stderr


def _use_lake(root: Path, lake_url: str, extra: str = "") -> None:
    project = root / "combined.yaml"
    project.write_text(project.read_text().replace("lake: ./lake", f"lake: {lake_url}") + extra)


def test_a_rows_life_insert_update_delete(tmp_path: Path, tools: Any, lake_url: str) -> None:
    """Every version of a row, with the evidence of the commit and publication behind it."""
    tools.make(tmp_path)
    _use_lake(tmp_path, lake_url)
    _capture(tools, tmp_path)
    tools.sql(tmp_path, "UPDATE orders SET status = 'shipped' WHERE id = 5")
    _capture(tools, tmp_path)
    tools.sql(tmp_path, "DELETE FROM orders WHERE id = 5")
    _capture(tools, tmp_path)

    found = _explain(tools, tmp_path, "shop.orders", "5")
    assert found["status"] == "deleted"
    assert [v["op"] for v in found["versions"]] == ["snapshot", "update", "delete"]
    first, second, gone = found["versions"]
    assert first["values"]["status"] == "placed" and second["values"]["status"] == "shipped"
    assert gone["values"] == {}
    assert first["identity"] == second["identity"] == gone["identity"]
    assert first["payload_hash"] != second["payload_hash"]

    # The evidence agrees with what run show, history and publications say.
    assert len({v["run_id"] for v in found["versions"]}) == 3
    engine = Engine.open(tmp_path / "combined.yaml")
    try:
        versions = {v["id"]: v for v in engine.history("shop.orders")}
        for v in found["versions"]:
            assert v["accepted_at"] and v["receipt"]["extraction_started_at"]
            run = engine.run(v["run_id"])
            assert v["delivery_id"] in {d.id for d in run["deliveries"]}
            assert run["run"].publication_id == v["publication"]
            assert versions[v["dataset_version"]]["run_id"] == v["run_id"]
            assert v["publication"] in versions[v["dataset_version"]]["publications"]
    finally:
        engine.close()
    assert [v["lake_version"] for v in found["versions"]] == [0, 1, 2]
    assert "deleted by run " + gone["run_id"] in found["reason"]

    present = _explain(tools, tmp_path, "shop.orders", "6")
    assert present["status"] == "present"
    assert [v["op"] for v in present["versions"]] == ["snapshot"]
    assert present["current"][0]["id"] == 6 and present["current"][0]["status"] == "placed"

    text = tools.cli(tmp_path, "explain", "shop.orders", "5")
    assert text.returncode == 0
    assert "deleted" in text.stdout and gone["run_id"] in text.stdout


def test_a_key_never_captured_and_a_dataset_never_captured(tmp_path: Path, tools: Any) -> None:
    tools.make(tmp_path)
    before = _explain(tools, tmp_path, "shop.orders", "5")
    assert before["status"] == "never" and before["versions"] == []
    assert "no published capture" in before["reason"]
    _capture(tools, tmp_path)
    after = _explain(tools, tmp_path, "shop.orders", "100000")
    assert after["status"] == "never"
    assert "no capture up to the newest publication" in after["reason"]


def test_a_full_refresh_says_which_observations_changed(tmp_path: Path, tools: Any) -> None:
    """A replacement delivers unchanged rows too: only the changes are versions."""
    tools.make(tmp_path)
    project = tmp_path / "combined.yaml"
    project.write_text(
        project.read_text().replace(
            "      orders:\n        key: [id]",
            "      orders:\n        key: [id]\n        sync_mode: full_refresh",
        )
    )
    _capture(tools, tmp_path)
    _capture(tools, tmp_path)  # unchanged: no version
    tools.sql(tmp_path, "UPDATE orders SET total = 99 WHERE id = 7")
    _capture(tools, tmp_path)
    tools.sql(tmp_path, "DELETE FROM orders WHERE id = 7")
    _capture(tools, tmp_path)
    found = _explain(tools, tmp_path, "shop.orders", "7")
    assert [v["op"] for v in found["versions"]] == ["insert", "update", "delete"]
    assert found["versions"][1]["values"]["total"] == 99
    assert found["status"] == "deleted"
    kept = _explain(tools, tmp_path, "shop.orders", "8")
    assert [v["op"] for v in kept["versions"]] == ["insert"]
    assert kept["status"] == "present"


def test_a_quarantined_key_says_where_it_waits(tmp_path: Path, tools: Any) -> None:
    tools.make(tmp_path)
    tools.sql(
        tmp_path,
        "CREATE TABLE tags (id INTEGER, label TEXT); "
        "INSERT INTO tags VALUES (1, 'a'), (2, 'b'), (2, 'c');",
    )
    project = tmp_path / "combined.yaml"
    project.write_text(project.read_text() + "      tags:\n        key: [id]\n")
    result = tools.cli(tmp_path, "capture", "shop.tags")
    assert result.returncode != 0  # duplicate keys: the Run needs review
    found = _explain(tools, tmp_path, "shop.tags", "2")
    assert found["status"] == "quarantined", found
    (entry,) = found["quarantined"]
    assert sorted(r["label"] for r in entry["rows"]) == ["b", "c"]
    assert entry["decision"] is None and "awaiting review" in found["reason"]
    clean = _explain(tools, tmp_path, "shop.tags", "1")
    assert clean["quarantined"] == []


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["shop.orders"], "give one value for each"),
        (["shop.orders", "1", "2"], "key has 1 column (id)"),
        (["shop.orders", "abc"], "is not a BIGINT value"),
        # DuckDB's cast rounds: these explained rows 2, 1 and 0
        (["shop.orders", "1.5"], "'1.5' is not a BIGINT value, the type of key column 'id' (it "),
        (["shop.orders", "0x1"], "'0x1' is not a BIGINT value"),
        (["shop.orders", "1e-1"], "'1e-1' is not a BIGINT value"),
        (["shop.nope", "1"], "unknown dataset 'nope'"),
        (["orders", "1"], "does not name a dataset"),
    ],
)
def test_bad_input_is_exit_2_with_the_key_columns(
    shop: Path, tools: Any, args: list[str], says: str
) -> None:
    _capture(tools, shop)
    result = tools.cli(shop, "explain", *args)
    assert result.returncode == 2, result.stdout + result.stderr
    assert says in result.stderr


def test_a_change_streams_versions_carry_their_positions(
    tmp_path: Path, tools: Any, cdc_db: Any
) -> None:
    """CDC: a composite key, each version at its LSN; a TRUNCATE ends the row."""
    import psycopg

    with psycopg.connect(cdc_db.dsn, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE items (id bigint, region text, qty int, PRIMARY KEY (id, region))"
        )
        conn.execute("INSERT INTO items SELECT g, 'eu', g FROM generate_series(1, 20) g")
    (tmp_path / "combined.yaml").write_text(
        tools.pg_cdc_project(cdc_db.dsn, cdc_db.prefix, "public.items", ["id", "region"])
    )
    cdc_db.slot("public.items")
    _capture(tools, tmp_path)
    with psycopg.connect(cdc_db.dsn, autocommit=True) as conn:
        conn.execute("UPDATE items SET qty = 100 WHERE id = 3")
        conn.execute("UPDATE items SET qty = 200 WHERE id = 3")
    _capture(tools, tmp_path)
    found = _explain(tools, tmp_path, "pg.items", "3", "eu")
    assert found["status"] == "present" and found["current"][0]["qty"] == 200
    ops = [v["op"] for v in found["versions"]]
    assert ops[0] in ("snapshot", "insert") and ops[-1] == "update"
    streamed = [v for v in found["versions"] if v["op"] == "update"]
    assert all(v["source_position"] for v in streamed)  # an LSN per change
    assert streamed[-1]["values"]["qty"] == 200

    with psycopg.connect(cdc_db.dsn, autocommit=True) as conn:
        conn.execute("TRUNCATE items")
    _capture(tools, tmp_path)
    gone = _explain(tools, tmp_path, "pg.items", "3", "eu")
    # The stream's TRUNCATE is committed as a delete of every row it emptied.
    assert gone["versions"][-1]["op"] in ("delete", "truncate")
    assert gone["status"] in ("deleted", "truncated") and gone["current"] == []

    arity = tools.cli(tmp_path, "explain", "pg.items", "3")
    assert arity.returncode == 2 and "(id, region)" in arity.stderr


def test_the_python_api_takes_a_key_value_and_a_name_alone(tmp_path: Path, tools: Any) -> None:
    """`explain("shop.orders", 12)` raised TypeError, `explain(..., [12])` AttributeError,
    and `capture("shop.orders")` said "unknown source 's'" (found by a new-user review)."""
    engine = Engine.open(tools.make(tmp_path))
    try:
        (run,) = engine.capture("shop.orders")
        assert run.state == "succeeded", run.error
        assert run.datasets == ("orders",)
        by_text = engine.explain("shop.orders", ["12"])
        for given in (12, [12], "12"):
            told = engine.explain("shop.orders", given)
            assert told.status == "present" and told.id == by_text.id
    finally:
        engine.close()


@pytest.mark.parametrize(
    ("text", "kind", "exact"),
    [
        ("42", "BIGINT", True),
        (" 7 ", "UINTEGER", True),
        ("1_0", "BIGINT", False),
        ("1.01", "DECIMAL(10,2)", True),
        ("1.0100", "DECIMAL(10,2)", True),
        ("1.005", "DECIMAL(10,2)", False),
        ("1.01000001", "DECIMAL(10,2)", False),
        ("0.1", "DOUBLE", True),
        ("2024-01-01 10:00:00.5", "TIMESTAMP", True),
        ("2024-01-01 10:00:00.500000000", "TIMESTAMP", True),
        ("2024-01-01 10:00:00.5000001", "TIMESTAMP", False),
        ("2024-01-01 10:00:00.5+05:00", "TIMESTAMP", False),
        ("2024-01-01T10:00:00Z", "TIMESTAMP", False),
        ("2024-01-01 10:00:00.5+05:00", "TIMESTAMP WITH TIME ZONE", True),
        ("2024-01-01 10:00:00.1234", "TIMESTAMP_MS", False),
        ("10:00:00+02", "TIME", False),
        ("10:00:00.5", "TIME", True),
        ("2024-01-01", "DATE", True),
        ("2024-01-01 10:00", "DATE", False),
    ],
)
def test_a_key_value_is_taken_only_as_the_value_it_writes(
    text: str, kind: str, exact: bool
) -> None:
    """`explain pg.orders 1.5` explained row 2; `1.005` the decimal 1.01; a timestamp with
    an offset, the naive one without it (found by an API review)."""
    import duckdb

    from combined.evidence._explain import _exactly

    (held,) = duckdb.connect().execute(f"SELECT CAST('{text}' AS {kind})").fetchall()[0]
    assert _exactly(text, kind, held) is exact
