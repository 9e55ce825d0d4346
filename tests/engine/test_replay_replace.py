"""``combined replay --replace`` (issue 22 item 4): the replay as the table's newest version.

A real PostgreSQL source and real Delta tables: a table altered outside
Combined is rebuilt from its Deliveries, only with the explicit flag, only
after the comparison is shown, recorded in Activity, and published by the
next capture; publications keep what they pinned.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import psycopg
from deltalake import DeltaTable
from tests.engine.test_history import SNAPSHOT

from combined.engine import Engine

PROJECT = SNAPSHOT.replace("        history: true\n", "")
ROWS = "SELECT id, qty, note FROM pg.items ORDER BY id"


def _rows(engine: Engine, **basis: Any) -> list[tuple[Any, ...]]:
    return [tuple(r.values()) for r in engine.sql(ROWS, **basis).to_pylist()]


def _head(table: Path) -> list[tuple[Any, ...]]:
    rows = DeltaTable(str(table)).to_pyarrow_table(columns=["id", "qty", "note"]).to_pylist()
    return sorted(tuple(r.values()) for r in rows)


def test_replace_writes_the_replay_as_a_new_version_only_when_asked(
    tmp_path: Path, pg_database: str, tools: Any
) -> None:
    with psycopg.connect(pg_database, autocommit=True) as conn:
        conn.execute("CREATE TABLE items (id bigint PRIMARY KEY, qty int, note text)")
        conn.execute("INSERT INTO items SELECT g, g, 'n' || g FROM generate_series(1, 40) g")
    (tmp_path / "combined.yaml").write_text(PROJECT.format(dsn=pg_database))
    table = tmp_path / "lake" / "pg" / "items"
    engine = Engine.open(tmp_path / "combined.yaml")
    try:
        (run,) = engine.capture()
        assert run.state == "succeeded", run.error
        published = _rows(engine)
        checkpoint = engine.layout.dataset_table("pg", "items").latest_commit()
    finally:
        engine.close()
    # an outside tool alters the table: two rows gone, one rewritten
    DeltaTable(str(table)).delete("id <= 2")
    DeltaTable(str(table)).update(predicate="id = 7", updates={"note": "'tampered'"})
    tampered = DeltaTable(str(table)).version()

    # never without the flag: --into the table itself is refused, naming --replace
    refused = tools.cli(tmp_path, "replay", "pg.items", "--into", str(table))
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "--replace" in refused.stderr
    both = tools.cli(tmp_path, "replay", "pg.items", "--replace", "--into", str(tmp_path / "x"))
    assert both.returncode == 2 and "--into" in both.stderr
    compared = tools.cli(tmp_path, "replay", "pg.items")
    assert compared.returncode == 3, compared.stdout + compared.stderr
    assert DeltaTable(str(table)).version() == tampered  # nothing written

    replaced = tools.cli(tmp_path, "replay", "pg.items", "--replace")
    assert replaced.returncode == 3, replaced.stdout + replaced.stderr
    out = replaced.stdout
    # the comparison is shown in full before the table is written (the rewritten note
    # kept its row's payload hash: the comparison cannot see it, the replacement mends it)
    assert out.index("DIFFERENT: 2 only in the replay, 0 only in the projection, 0 with") < (
        out.index(f"replaced: lake version {tampered + 1}")
    )
    assert DeltaTable(str(table)).version() == tampered + 1
    assert _head(table) == published
    again = tools.cli(tmp_path, "replay", "pg.items", "--json")
    assert again.returncode == 0, again.stdout + again.stderr
    assert json.loads(again.stdout)["equal"] is True
    nothing = tools.cli(tmp_path, "replay", "pg.items", "--replace")
    assert nothing.returncode == 0 and "nothing replaced" in nothing.stdout
    assert DeltaTable(str(table)).version() == tampered + 1

    engine = Engine.open(tmp_path / "combined.yaml")
    try:
        (event,) = engine.activity(kind="dataset.replaced")
        assert event["body"]["lake_version"] == tampered + 1
        assert event["body"]["replaced_version"] == tampered
        assert event["body"]["only_in_replay"] == 2
        # the checkpoint is the last capture's; publications keep what they pinned
        assert engine.layout.dataset_table("pg", "items").latest_commit() == checkpoint
        assert _rows(engine) == published
        # the next capture reconciles (it failed on the tampered table) and publishes it
        with psycopg.connect(pg_database, autocommit=True) as conn:
            conn.execute("UPDATE items SET qty = 0 WHERE id = 40")
        (run,) = engine.capture()
        assert run.state == "succeeded", run.error
        with psycopg.connect(pg_database) as conn:
            assert _rows(engine) == list(
                conn.execute("SELECT id, qty, note FROM items ORDER BY id")
            )
    finally:
        engine.close()
