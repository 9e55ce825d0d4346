"""full_refresh replaces the projection, including with nothing and with a new column."""

from __future__ import annotations

from pathlib import Path

from combined.engine import Engine


def _project(root: Path, tools) -> Path:
    tools.make(root)
    path = root / "combined.yaml"
    path.write_text(
        path.read_text().replace(
            "      orders:\n        key: [id]\n",
            "      orders:\n        key: [id]\n        sync_mode: full_refresh\n",
        )
    )
    return path


def test_an_emptied_source_replaces_the_projection_with_nothing(tmp_path: Path, tools) -> None:
    engine = Engine.open(_project(tmp_path, tools))
    try:
        engine.capture(["shop.orders"])
        tools.sql(tmp_path, "DELETE FROM orders;")
        (run,) = engine.capture(["shop.orders"])
        assert run.state == "succeeded", run.error
        assert engine.sql("SELECT count(*) AS n FROM shop.orders").to_pylist() == [{"n": 0}]
    finally:
        engine.close()


def test_a_new_column_evolves_the_replaced_table(tmp_path: Path, tools) -> None:
    engine = Engine.open(_project(tmp_path, tools))
    try:
        engine.capture(["shop.orders"])
        tools.sql(
            tmp_path,
            "ALTER TABLE orders ADD COLUMN channel TEXT; UPDATE orders SET channel = 'web';",
        )
        (run,) = engine.capture(["shop.orders"])
        assert run.state == "succeeded", run.error
        rows = engine.sql(
            "SELECT count(*) AS n, count(*) FILTER (WHERE channel = 'web') AS web FROM shop.orders"
        ).to_pylist()
        assert rows == [{"n": 200, "web": 200}]
    finally:
        engine.close()
