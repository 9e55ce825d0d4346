"""``combined explain SOURCE.DATASET --id HEX``: a row found by its identity (docs/explain.md).

A table without a key (``key: []``, docs/identity.md section 9) has no key
values to look a row up by: each row's ``_combined_id`` is its content and
its number among equal rows, and that id is how it is explained. A keyed
row's id gives the same explanation as its key. Both forms of table: v2
holds the id's 16 bytes, v1 its 32 hex digits.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from tests.engine.test_keyless import _change

from combined.engine import Engine
from combined.protocol import _digest

PROJECT = """\
version: 1
lake: ./lake
catalog: sqlite:///.combined/catalog.db
sources:
  pg:
    connector: postgres
    config:
      dsn: {dsn}
    datasets:
{datasets}"""

LINES = "      lines:\n        key: []\n"
ORDERS = "      orders:\n        key: [id]\n"


def _project(root: Path, dsn: str, datasets: str, *statements: str) -> Path:
    _change(dsn, *statements)
    project = root / "combined.yaml"
    project.write_text(PROJECT.format(dsn=dsn, datasets=datasets))
    return project


def _capture(project: Path) -> None:
    engine = Engine.open(project)
    try:
        for run in engine.capture():
            assert run.state == "succeeded", run.error
    finally:
        engine.close()


def _first_capture(project: Path, digest: _digest.Digest, monkeypatch: pytest.MonkeyPatch) -> None:
    """The first capture, which sets the table's identity encoding (v1: hex, v2: binary)."""
    monkeypatch.setattr(_digest, "DEFAULT_DIGEST", digest)
    _capture(project)
    monkeypatch.undo()


def _ids(project: Path, query: str) -> list[str]:
    """The ``_combined_id`` of each row ``query`` finds, in hex (as `combined sql` shows it)."""
    engine = Engine.open(project)
    try:
        rows = engine.sql(query).to_pylist()
    finally:
        engine.close()
    return sorted(_digest.digest_text(r["_combined_id"]) for r in rows)


def _explain(tools: Any, root: Path, *args: str) -> dict[str, Any]:
    result = tools.cli(root, "explain", *args, "--json")
    assert result.returncode == 0, result.stderr
    found: dict[str, Any] = json.loads(result.stdout)
    return found


@pytest.mark.parametrize("sync_mode", ["incremental", "full_refresh"])
def test_two_equal_rows_have_two_ids_each_with_its_own_history(
    tmp_path: Path, pg_database: str, tools: Any, sync_mode: str
) -> None:
    project = _project(
        tmp_path,
        pg_database,
        LINES + f"        sync_mode: {sync_mode}\n",
        "CREATE TABLE lines (sku text, qty int)",
        "INSERT INTO lines VALUES ('a', 1), ('a', 1), ('b', 2)",
    )
    _capture(project)
    twice = _ids(project, "SELECT _combined_id FROM pg.lines WHERE sku = 'a'")
    assert len(set(twice)) == 2  # equal rows, numbered apart
    # one of the two goes
    _change(pg_database, "DELETE FROM lines WHERE ctid = (SELECT min(ctid) FROM lines)")
    _capture(project)
    (kept,) = _ids(project, "SELECT _combined_id FROM pg.lines WHERE sku = 'a'")
    (gone,) = set(twice) - {kept}

    present = _explain(tools, tmp_path, "pg.lines", "--id", kept)
    assert present["status"] == "present" and present["id"] == kept and present["key"] == {}
    assert [v["identity"] for v in present["versions"]] == [kept]
    assert present["versions"][0]["values"] == {"sku": "a", "qty": 1}
    assert [(r["sku"], r["qty"]) for r in present["current"]] == [("a", 1)]

    deleted = _explain(tools, tmp_path, "pg.lines", "--id", gone)
    assert deleted["status"] == "deleted" and deleted["current"] == []
    assert [v["identity"] for v in deleted["versions"]] == [gone, gone]
    assert deleted["versions"][0]["values"] == {"sku": "a", "qty": 1}
    assert deleted["versions"][-1]["op"] == "delete"
    first, second = deleted["versions"]
    assert first["run_id"] == present["versions"][0]["run_id"] != second["run_id"]

    text = tools.cli(tmp_path, "explain", "pg.lines", "--id", gone)
    assert text.returncode == 0, text.stderr
    assert f"pg.lines (_combined_id {gone}): deleted" in " ".join(text.stdout.split())


@pytest.mark.parametrize("digest", ["binary", "hex"])
def test_a_changed_keyless_row_is_its_old_id_deleted_and_a_new_id_present(
    tmp_path: Path, pg_database: str, digest: _digest.Digest, monkeypatch: pytest.MonkeyPatch
) -> None:
    project = _project(
        tmp_path,
        pg_database,
        LINES,
        "CREATE TABLE lines (sku text, qty int)",
        "INSERT INTO lines VALUES ('a', 1), ('b', 2)",
    )
    _first_capture(project, digest, monkeypatch)
    (old,) = _ids(project, "SELECT _combined_id FROM pg.lines WHERE sku = 'b'")
    _change(pg_database, "UPDATE lines SET qty = 9 WHERE sku = 'b'")
    _capture(project)
    (new,) = _ids(project, "SELECT _combined_id FROM pg.lines WHERE sku = 'b'")
    assert new != old

    engine = Engine.open(project)
    try:
        before = engine.explain("pg.lines", id=old)
        after = engine.explain("pg.lines", id=new)
    finally:
        engine.close()
    assert before.status == "deleted" and before.id == old
    assert [v.op for v in before.versions][-1] == "delete"
    assert before.versions[0].values == {"sku": "b", "qty": 2}
    assert after.status == "present" and after.id == new
    assert len(after.versions) == 1 and after.versions[0].values == {"sku": "b", "qty": 9}
    assert after.versions[0].lake_version == before.versions[-1].lake_version
    assert [r["qty"] for r in after.current] == [9]


@pytest.mark.parametrize("digest", ["binary", "hex"])
def test_a_keyed_row_by_its_id_is_explained_as_by_its_key(
    tmp_path: Path,
    pg_database: str,
    tools: Any,
    digest: _digest.Digest,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    project = _project(
        tmp_path,
        pg_database,
        ORDERS,
        "CREATE TABLE orders (id int PRIMARY KEY, status text)",
        "INSERT INTO orders SELECT g, 'placed' FROM generate_series(1, 5) g",
    )
    _first_capture(project, digest, monkeypatch)
    _change(pg_database, "UPDATE orders SET status = 'shipped' WHERE id IN (2, 3)")
    _capture(project)
    _change(pg_database, "DELETE FROM orders WHERE id = 3")
    _capture(project)
    (two,) = _ids(project, "SELECT _combined_id FROM pg.orders WHERE id = 2")

    by_key = _explain(tools, tmp_path, "pg.orders", "2")
    by_id = _explain(tools, tmp_path, "pg.orders", "--id", two)
    assert by_key["status"] == "present" and len(by_key["versions"]) == 2
    assert by_id == by_key  # versions, status, current, key and id alike
    assert by_id["id"] == two and by_id["key"] == {"id": "2"}

    # a deleted row: its id is no longer in the table; its key's explanation names it
    three = _explain(tools, tmp_path, "pg.orders", "3")
    assert three["status"] == "deleted" and len(three["versions"]) == 3
    assert _explain(tools, tmp_path, "pg.orders", "--id", three["id"]) == three


def test_a_quarantined_key_is_found_by_its_id(tmp_path: Path, pg_database: str, tools: Any) -> None:
    _project(
        tmp_path,
        pg_database,
        ORDERS,
        "CREATE TABLE orders (id int, status text)",
        "INSERT INTO orders VALUES (1, 'placed'), (2, 'placed'), (2, 'shipped')",
    )
    result = tools.cli(tmp_path, "capture", "pg.orders")
    assert result.returncode != 0  # a duplicate key: held for review
    by_key = _explain(tools, tmp_path, "pg.orders", "2")
    assert by_key["status"] == "quarantined"
    held = {r["_combined_id"] for r in by_key["quarantined"][0]["rows"]}
    (two,) = held
    by_id = _explain(tools, tmp_path, "pg.orders", "--id", two)
    assert by_id["status"] == "quarantined" and by_id["reason"] == by_key["reason"]
    assert by_id["quarantined"] == by_key["quarantined"]


def test_bad_input_says_what_to_give(tmp_path: Path, pg_database: str, tools: Any) -> None:
    project = _project(
        tmp_path,
        pg_database,
        LINES + ORDERS,
        "CREATE TABLE lines (sku text, qty int)",
        "INSERT INTO lines VALUES ('a', 1)",
        "CREATE TABLE orders (id int PRIMARY KEY, status text)",
        "INSERT INTO orders VALUES (1, 'placed')",
    )
    _capture(project)
    (line,) = _ids(project, "SELECT _combined_id FROM pg.lines")
    cases = [
        # a keyless table's rows are found by id: where to read it
        (["pg.lines", "a"], ["pg.lines has no key", "--id", "_combined_id", "combined sql"]),
        (["pg.lines"], ["pg.lines has no key", "--id"]),
        (["pg.lines", "a", "--id", line], ["not both", "--id HEX"]),
        (["pg.orders", "1", "--id", line], ["not both", "combined explain pg.orders ID, or"]),
        (["pg.orders"], ["give one value for each", "or the row's id (--id)"]),
        (["pg.lines", "--id", "xyz"], ["'xyz' is not a row id", "32 hex digits"]),
        (["pg.lines", "--id", line[:31]], ["is not a row id"]),
        (["pg.lines", "--id", line + "0"], ["is not a row id"]),
        (["pg.lines", "--id", "g" * 32], ["is not a row id"]),
    ]
    for args, says in cases:
        result = tools.cli(tmp_path, "explain", *args)
        assert result.returncode == 2, (args, result.stdout + result.stderr)
        told = " ".join(result.stderr.split())
        assert all(s in told for s in says), (args, told)

    # an id no capture delivered: never, as for a key
    nobody = "0" * 32
    for name in ("pg.lines", "pg.orders"):
        never = _explain(tools, tmp_path, name, "--id", nobody)
        assert never["status"] == "never" and never["versions"] == []
        assert "no capture up to the newest publication" in never["reason"]
        assert never["id"] == nobody
