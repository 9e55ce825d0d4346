"""``combined replay``: the projection rebuilt from the raw Deliveries alone (issue 22).

The replay contacts no source and reads no table row: it must equal the
projection, row by row (identity and payload hash), after every kind of
capture; and it must tell when the table no longer matches its Deliveries.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from combined import Engine


def _replay(tools: Any, root: Path, *args: str, expect: int = 0) -> dict[str, Any]:
    result = tools.cli(root, "replay", *args, "--json")
    assert result.returncode == expect, result.stdout + result.stderr
    done: dict[str, Any] = json.loads(result.stdout)
    return done


def _capture(tools: Any, root: Path) -> None:
    result = tools.cli(root, "capture")
    assert result.returncode == 0, result.stdout + result.stderr


EXTRA = """\
      events:
        key: [id]
        strategy: cursor
        sync_mode: append
        cursor:
          column: id
          trust: "events.id is an INTEGER PRIMARY KEY assigned in increasing order"
"""


def _shop(root: Path, tools: Any, lake_url: str) -> None:
    tools.make(root)
    tools.sql(
        root,
        "CREATE TABLE events (id INTEGER PRIMARY KEY, kind TEXT);"
        "INSERT INTO events SELECT id, 'placed' FROM orders WHERE id <= 30;",
    )
    project = root / "combined.yaml"
    text = project.read_text().replace("lake: ./lake", f"lake: {lake_url}")
    text = text.replace(
        "      customers:\n        key: [id]\n",
        "      customers:\n        key: [id]\n        sync_mode: full_refresh\n",
    )
    project.write_text(text + EXTRA)


def test_replay_equals_every_projection_through_a_shops_history(
    tmp_path: Path, tools: Any, lake_url: str
) -> None:
    """Snapshot merges, a full refresh, a cursor's events, a schema evolution: all equal."""
    _shop(tmp_path, tools, lake_url)
    _capture(tools, tmp_path)
    tools.sql(
        tmp_path,
        "UPDATE orders SET status = 'shipped' WHERE id % 7 = 0; DELETE FROM orders WHERE id > 190;"
        "INSERT INTO orders VALUES (500, 1, 'placed', 1.0);"
        "UPDATE customers SET city = 'Paris' WHERE id < 4; DELETE FROM customers WHERE id = 20;"
        "INSERT INTO events SELECT id, 'shipped' FROM orders WHERE id BETWEEN 31 AND 60;",
    )
    _capture(tools, tmp_path)
    tools.sql(
        tmp_path,
        "ALTER TABLE orders ADD COLUMN note TEXT; UPDATE orders SET note = 'n' WHERE id < 10;"
        "ALTER TABLE customers ADD COLUMN tier INTEGER; UPDATE customers SET tier = 2;",
    )
    _capture(tools, tmp_path)
    tools.sql(tmp_path, "DELETE FROM customers")  # a replacement with nothing
    _capture(tools, tmp_path)

    expected = {"shop.orders": 191, "shop.customers": 0, "shop.events": 60}
    for name, rows in expected.items():
        done = _replay(tools, tmp_path, name)
        assert done["equal"], done
        assert done["replayed_rows"] == done["projection_rows"] == rows
        assert done["commits"] >= 2
    # An earlier version replays to what the table held then.
    first = _replay(tools, tmp_path, "shop.orders", "--to-version", "0")
    assert first["equal"] and first["replayed_rows"] == 200
    customers = _replay(tools, tmp_path, "shop.customers", "--to-version", "1")
    assert customers["equal"] and customers["replayed_rows"] == 19


def test_replay_into_a_new_table_holds_the_projections_rows(tmp_path: Path, tools: Any) -> None:
    import deltalake

    _shop(tmp_path, tools, "./lake")
    _capture(tools, tmp_path)
    tools.sql(tmp_path, "UPDATE orders SET total = 0 WHERE id = 2; DELETE FROM orders WHERE id = 3")
    _capture(tools, tmp_path)
    into = tmp_path / "rebuilt"
    done = _replay(tools, tmp_path, "shop.orders", "--into", str(into))
    assert done["equal"] and done["into"]
    rebuilt = deltalake.DeltaTable(str(into)).to_pyarrow_table().to_pylist()
    engine = Engine.open(tmp_path / "combined.yaml")
    try:
        lake = engine.sql("SELECT id, total FROM shop.orders ORDER BY id").to_pylist()
    finally:
        engine.close()
    assert sorted((r["id"], r["total"]) for r in rebuilt) == [(r["id"], r["total"]) for r in lake]
    again = tools.cli(tmp_path, "replay", "shop.orders", "--into", str(into))
    assert again.returncode == 2 and "already holds a Delta table" in again.stderr


def test_a_table_changed_outside_combined_differs_from_its_replay(
    tmp_path: Path, tools: Any
) -> None:
    """Rows removed and altered behind Combined's back: exit 3, each difference named."""
    import deltalake

    _shop(tmp_path, tools, "./lake")
    _capture(tools, tmp_path)
    table = deltalake.DeltaTable(str(tmp_path / "lake" / "shop" / "orders"))
    table.delete("id = 3")
    table.update(updates={"_combined_payload_hash": "'forged'"}, predicate="id = 4")
    done = _replay(tools, tmp_path, "shop.orders", expect=3)
    assert not done["equal"]
    assert (done["only_in_replay"], done["only_in_projection"], done["other_payload"]) == (1, 0, 1)
    assert {d["kind"] for d in done["differences"]} == {"only_in_replay", "other_payload"}
    assert done["foreign_versions"] == [1, 2] and done["lake_version"] == 2
    text = tools.cli(tmp_path, "replay", "shop.orders")
    assert text.returncode == 3 and "DIFFERENT" in text.stdout


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["shop.orders", "--to-version", "99"], "lake version 99 is not a commit"),
        (["shop.orders", "--to-version", "zzz"], "no dataset version starts with"),
        (["orders"], "does not name a dataset"),
        (["shop.nope"], "unknown dataset"),
    ],
)
def test_bad_input_is_exit_2(shop: Path, tools: Any, args: list[str], says: str) -> None:
    _capture(tools, shop)
    result = tools.cli(shop, "replay", *args)
    assert result.returncode == 2, result.stdout + result.stderr
    assert says in result.stderr


def test_replay_equals_a_change_streams_projection_across_a_truncate(
    tmp_path: Path, tools: Any, cdc_db: Any
) -> None:
    import psycopg

    with psycopg.connect(cdc_db.dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE items (id bigint PRIMARY KEY, qty int)")
        conn.execute("INSERT INTO items SELECT g, g FROM generate_series(1, 50) g")
    (tmp_path / "combined.yaml").write_text(
        tools.pg_cdc_project(cdc_db.dsn, cdc_db.prefix, "public.items", ["id"])
    )
    cdc_db.slot("public.items")
    _capture(tools, tmp_path)
    with psycopg.connect(cdc_db.dsn, autocommit=True) as conn:
        conn.execute("UPDATE items SET qty = qty + 1 WHERE id < 10")
        conn.execute("DELETE FROM items WHERE id > 45")
        conn.execute("TRUNCATE items")
        conn.execute("INSERT INTO items SELECT g, -g FROM generate_series(5, 12) g")
        conn.execute("UPDATE items SET qty = 0 WHERE id = 6")
    _capture(tools, tmp_path)
    done = _replay(tools, tmp_path, "pg.items")
    assert done["equal"] and done["replayed_rows"] == done["projection_rows"] == 8
