"""`combined check` verifies every declared relation, key and cursor column at the source.

Reproduction: a mistyped `relation:`, a mistyped cursor column and a table
dropped after discovery all passed `combined check` (ok, exit 0); the
capture then failed the whole source's Run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg
import pymysql
import pytest

from combined.connectors.mariadb._connect import Settings as MariaSettings
from combined.engine import Engine
from combined.errors import ConfigError

CURSOR = '        strategy: cursor\n        cursor: {{column: {column}, trust: "grows"{extra}}}\n'


def _project(root: Path, connector: str, config: str, datasets: str) -> None:
    (root / "combined.yaml").write_text(
        f"version: 1\nlake: ./lake\nsources:\n  src:\n    connector: {connector}\n"
        f"    config:\n{config}    datasets:\n{datasets}"
    )


def _refused(root: Path, tools: Any, *says: str) -> None:
    result = tools.cli(root, "check")
    text = " ".join(result.stdout.split())
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert "fail src:" in text
    for words in says:
        assert words in text, text


def _sqlite(root: Path, datasets: str) -> None:
    _project(root, "sqlite", "      path: ./shop.db\n", datasets)


@pytest.mark.parametrize(
    ("datasets", "says"),
    [
        (
            "      orders:\n        relation: ordres\n        key: [id]\n",
            (
                "dataset src.orders reads 'ordres', which the source does not have",
                "did you mean 'orders'?",
            ),
        ),
        (
            "      orders:\n        key: [id]\n" + CURSOR.format(column="totl", extra=""),
            (
                "dataset src.orders: cursor column 'totl' is not a column of 'orders'",
                "did you mean 'total'?",
            ),
        ),
        (
            "      orders:\n        key: [order_id]\n",
            ("key column 'order_id' is not a column of 'orders'", "its columns: id, customer_id"),
        ),
        (
            "      orders:\n        key: [id]\n        columns: [id, stat]\n",
            ("column 'stat' is not a column of 'orders'", "did you mean 'status'?"),
        ),
        (
            "      orders:\n        key: [id]\n"
            + CURSOR.format(column="id", extra=", lookback: 5m"),
            ("cursor column 'id' holds numbers (int64), but its lookback is the duration 5m",),
        ),
    ],
    ids=["relation", "cursor", "key", "columns", "duration_lookback_on_a_number"],
)
def test_sqlite_declarations_the_source_lacks_fail_check(
    shop: Path, tools: Any, datasets: str, says: tuple[str, ...]
) -> None:
    _sqlite(shop, datasets)
    _refused(shop, tools, *says)


def test_a_table_dropped_after_discovery_fails_check(shop: Path, tools: Any) -> None:
    _sqlite(shop, "      orders:\n        key: [id]\n      customers:\n        key: [id]\n")
    assert tools.cli(shop, "discover", "src").returncode == 0
    ok = tools.cli(shop, "check")
    assert ok.returncode == 0 and "ok   src" in ok.stdout, ok.stdout
    tools.sql(shop, "DROP TABLE customers")
    _refused(shop, tools, "dataset src.customers reads 'customers'", "combined discover src")


def test_postgres_declarations_are_checked(tmp_path: Path, pg_database: str, tools: Any) -> None:
    with psycopg.connect(pg_database, autocommit=True) as conn:
        conn.execute("CREATE TABLE items (id int PRIMARY KEY, at timestamptz, ok boolean)")
        conn.execute("CREATE TABLE gone (id int PRIMARY KEY)")
    config = f"      dsn: {pg_database}\n"
    good = "      items:\n        relation: public.items\n        key: [id]\n"
    good += CURSOR.format(column="at", extra=", lookback: 5m")
    _project(tmp_path, "postgres", config, good + "      gone:\n        key: [id]\n")
    engine = Engine.open(tmp_path / "combined.yaml")
    try:
        engine.check("src")  # every declaration holds
    finally:
        engine.close()
    with psycopg.connect(pg_database, autocommit=True) as conn:
        conn.execute("DROP TABLE gone")
    _refused(tmp_path, tools, "dataset src.gone reads 'gone'", "does not exist")
    typo = good.replace("relation: public.items", "relation: public.itemz")
    _project(tmp_path, "postgres", config, typo)
    _refused(tmp_path, tools, "dataset src.items reads 'public.itemz'", "mean 'public.items'?")
    _project(
        tmp_path, "postgres", config, good.replace("relation: public.items", "relation: itemz")
    )
    _refused(tmp_path, tools, "dataset src.items reads 'itemz'", "did you mean 'public.items'?")
    _project(tmp_path, "postgres", config, good.replace("column: at", "column: ok"))
    _refused(tmp_path, tools, "dataset 'items': column 'ok' (boolean) cannot serve as a cursor")


def test_check_tells_every_dataset_wrong_not_the_first(
    tmp_path: Path, pg_database: str, tools: Any
) -> None:
    """Three datasets wrong in three ways were told one a `combined check`: the user
    fixed one, checked again, met the next."""
    with psycopg.connect(pg_database, autocommit=True) as conn:
        conn.execute("CREATE TABLE items (id int PRIMARY KEY, at timestamptz, ok boolean)")
    config = f"      dsn: {pg_database}\n"
    datasets = (
        "      gone:\n        key: [id]\n"
        + "      items:\n        key: [id]\n"
        + CURSOR.format(column="ok", extra="")
        + "      fine:\n        relation: items\n        key: [id]\n"
        + "      typo:\n        relation: items\n        key: [idd]\n"
    )
    _project(tmp_path, "postgres", config, datasets)
    _refused(
        tmp_path,
        tools,
        "3 datasets of src cannot be read as declared",
        "dataset src.gone reads 'gone'",
        "dataset 'items': column 'ok' (boolean) cannot serve as a cursor",
        "key column 'idd' is not a column of 'public.items'",
    )
    told = tools.cli(tmp_path, "check").stdout
    assert "fine" not in told and told.count("hint:") >= 4, told


def test_mariadb_declarations_are_checked(
    tmp_path: Path, mariadb_database: str, tools: Any
) -> None:
    kwargs = MariaSettings.from_config({"dsn": mariadb_database}).connect_kwargs()
    with pymysql.connect(**kwargs) as conn, conn.cursor() as cur:
        cur.execute("CREATE TABLE ck (id int PRIMARY KEY, updated_at datetime(6))")
    config = f"      dsn: {mariadb_database}\n"
    good = "      ck:\n        key: [id]\n" + CURSOR.format(column="updated_at", extra="")
    _project(tmp_path, "mariadb", config, good)
    engine = Engine.open(tmp_path / "combined.yaml")
    try:
        engine.check("src")
    finally:
        engine.close()
    _project(tmp_path, "mariadb", config, good.replace("column: updated_at", "column: updated"))
    engine = Engine.open(tmp_path / "combined.yaml")
    try:
        with pytest.raises(ConfigError, match="cursor column 'updated' is not a column of 'ck'"):
            engine.check("src")
    finally:
        engine.close()
    _refused(tmp_path, tools, "did you mean 'updated_at'?")
    with pymysql.connect(**kwargs) as conn, conn.cursor() as cur:
        cur.execute("DROP TABLE ck")
        cur.execute("CREATE SEQUENCE sq")
    _refused(tmp_path, tools, "dataset src.ck reads 'ck', which the source does not have")
    _project(tmp_path, "mariadb", config, "      sq:\n        key: [next_not_cached_value]\n")
    _refused(tmp_path, tools, "'sq' in database", "is a SEQUENCE")  # (was "does not exist")


def test_postgres_columns_the_lake_cannot_store_as_named_fail_check(
    tmp_path: Path, pg_database: str, tools: Any
) -> None:
    """Two names differing only in case, or one under Combined's prefix, passed
    `combined check`; every capture then refused the dataset."""
    with psycopg.connect(pg_database, autocommit=True) as conn:
        conn.execute('CREATE TABLE cased (id int PRIMARY KEY, "Name" text, name text)')
        conn.execute("CREATE TABLE prefixed (id int PRIMARY KEY, _combined_x text)")
    config = f"      dsn: {pg_database}\n"
    _project(tmp_path, "postgres", config, "      cased:\n        key: [id]\n")
    _refused(tmp_path, tools, "columns 'Name' and 'name' of dataset src.cased differ only in case")
    _project(tmp_path, "postgres", config, "      prefixed:\n        key: [id]\n")
    _refused(tmp_path, tools, "column '_combined_x' of dataset src.prefixed starts with")
    # Leaving one of them out with `columns:` captures the table.
    _project(
        tmp_path,
        "postgres",
        config,
        "      cased:\n        key: [id]\n        columns: [id, name]\n",
    )
    assert tools.cli(tmp_path, "check").returncode == 0


def test_check_asks_a_local_lake_without_making_it(shop: Path, tools: Any) -> None:
    """`combined check` tells a lake that cannot be written (a capture would be refused),
    and creates nothing of one not made yet: it only reads."""
    assert not (shop / "lake").exists()
    done = tools.cli(shop, "check")
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"ok lake {shop / 'lake'}" in " ".join(done.stdout.split())
    assert not (shop / "lake").exists()
    (shop / "blocked").write_text("a file where the lake's directory would be")
    project = shop / "combined.yaml"
    project.write_text(project.read_text().replace("lake: ./lake", "lake: ./blocked/lake"))
    done = tools.cli(shop, "check")
    said = " ".join(done.stdout.split())
    assert done.returncode == 2, said
    assert "fail lake: the lake at" in said and "blocked is not a directory" in said, said
