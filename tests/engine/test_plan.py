"""``combined plan``: each source's design from evidence; unproven claims say so (issue 22).

A declared key that is not unique is refuted by a measured count; a cursor
column no trigger maintains on update is unproven; an unreachable source
yields a diagnostic document naming what could not be read.
"""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

import psycopg

PROJECT = """\
version: 1
lake: ./lake
sources:
  pg:
    connector: postgres
    config:
      dsn: {dsn}
      slot_prefix: {prefix}
    datasets:
      orders:
        relation: public.orders
        key: [id]
        strategy: cursor
        cursor:
          column: updated_at
          lookback: 5m
          trust: "the application sets updated_at on every write"
      notes:
        relation: public.notes
        key: [ref]
      stamped:
        relation: public.stamped
        key: [id]
        strategy: cursor
        cursor:
          column: updated_at
          trust: "a trigger sets it"
      items:
        relation: public.items
        key: [id]
        strategy: cdc
"""

SCHEMA = """
CREATE TABLE orders (id bigint PRIMARY KEY, total numeric,
                     updated_at timestamptz NOT NULL DEFAULT now());
INSERT INTO orders SELECT g, g, now() FROM generate_series(1, 30) g;
CREATE TABLE notes (ref int, body text);
INSERT INTO notes VALUES (1, 'a'), (2, 'b'), (2, 'c'), (NULL, 'd');
CREATE TABLE stamped (id bigint PRIMARY KEY, updated_at timestamptz NOT NULL DEFAULT now());
CREATE FUNCTION touch() RETURNS trigger LANGUAGE plpgsql AS
  $$ BEGIN NEW.updated_at := now(); RETURN NEW; END $$;
CREATE TRIGGER stamped_touch BEFORE UPDATE ON stamped FOR EACH ROW EXECUTE FUNCTION touch();
CREATE TABLE items (id bigint PRIMARY KEY, qty int);
INSERT INTO items SELECT g, g FROM generate_series(1, 10) g;
"""


def _project(root: Path, cdc_db: Any) -> None:
    with psycopg.connect(cdc_db.dsn, autocommit=True) as conn:
        conn.execute(SCHEMA)
    (root / "combined.yaml").write_text(PROJECT.format(dsn=cdc_db.dsn, prefix=cdc_db.prefix))
    cdc_db.slot("public.items")


def _claims(plan: dict[str, Any], section: str) -> list[dict[str, Any]]:
    (found,) = [s for s in plan["sections"] if s["title"] == section]
    claims: list[dict[str, Any]] = found["claims"]
    return claims


def _about(claims: list[dict[str, Any]], dataset: str, words: str) -> dict[str, Any]:
    (claim,) = [c for c in claims if c["text"].startswith(f"{dataset}:") and words in c["text"]]
    return claim


def test_a_plan_states_what_the_evidence_proves_and_refutes(
    tmp_path: Path, tools: Any, cdc_db: Any
) -> None:
    _project(tmp_path, cdc_db)
    captured = tools.cli(tmp_path, "capture", "pg.orders", "pg.items")
    assert captured.returncode == 0, captured.stderr
    result = tools.cli(tmp_path, "plan", "pg", "--json")
    assert result.returncode == 0, result.stderr
    (plan,) = json.loads(result.stdout)
    assert plan["reachable"] and plan["source"] == "pg"

    ident = _claims(plan, "Idempotency")
    refuted = _about(ident, "notes", "NOT unique")
    assert refuted["status"] == "refuted"
    assert "4 rows, 2 distinct keys, 1 with a null part" in refuted["text"]
    assert "count(DISTINCT" in refuted["basis"] and refuted["prove"]
    assert _about(ident, "orders", "primary key")["status"] == "fact"

    extraction = _claims(plan, "Extraction pattern")
    update = _about(extraction, "orders", "no trigger or ON UPDATE rule maintains updated_at")
    assert update["status"] == "unproven" and "BEFORE UPDATE trigger" in update["prove"]
    assert _about(extraction, "orders", "trust basis")["status"] == "declared"
    assert _about(extraction, "orders", "starts 5m before")["status"] == "fact"
    stamped = [c for c in extraction if c["text"].startswith("stamped:")]
    assert any("trigger stamped_touch" in c["text"] for c in stamped)
    assert not any("no trigger" in c["text"] for c in stamped)
    assert _about(extraction, "stamped", "no lookback")["status"] == "unproven"

    feed = _claims(plan, "Change feed")
    assert any("max_slot_wal_keep_size" in c["text"] for c in feed)
    assert _about(feed, "items", "stitched at")["status"] == "fact"
    assert _about(feed, "items", "slot")["status"] == "fact"
    deletes = _claims(plan, "Deletes")
    assert "deletes will not arrive" in _about(deletes, "orders", "cursor")["text"]
    assert "tombstones" in _about(deletes, "items", "tombstones")["text"]
    recon = _claims(plan, "Reconciliation")
    assert _about(recon, "notes", "not reconciled")["status"] == "unproven"
    assert _about(recon, "items", "lake")["status"] == "fact"

    written = tools.cli(tmp_path, "plan", "--output", str(tmp_path / "plans"))
    assert written.returncode == 0, written.stderr
    text = (tmp_path / "plans" / "pg.md").read_text()
    assert text.startswith("# Ingestion plan: pg (postgres)")
    assert "**refuted**: notes: the key (ref) is NOT unique" in text
    assert "## Change feed" in text and "## Reconciliation" in text


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


def test_an_unreachable_source_yields_a_diagnostic_document(
    tmp_path: Path, tools: Any, cdc_db: Any
) -> None:
    _project(tmp_path, cdc_db)
    assert tools.cli(tmp_path, "capture", "pg.orders").returncode == 0
    assert tools.cli(tmp_path, "discover", "pg").returncode == 0  # stored: used when unreachable
    project = tmp_path / "combined.yaml"
    gone = f"postgresql://postgres@127.0.0.1:{_closed_port()}/nowhere"
    project.write_text(project.read_text().replace(cdc_db.dsn, gone))
    result = tools.cli(tmp_path, "plan", "pg")
    assert result.returncode == 0, result.stderr
    assert "**The source could not be reached**" in result.stdout
    (plan,) = json.loads(tools.cli(tmp_path, "plan", "pg", "--json").stdout)
    assert not plan["reachable"] and plan["unreachable"]
    ident = _claims(plan, "Idempotency")
    notes = _about(ident, "notes", "is unique")
    assert notes["status"] == "unproven" and "could not be reached" in notes["basis"]
    # What the catalog and the lake hold is still stated, from the stored discovery.
    assert _about(ident, "orders", "primary key")["status"] == "fact"
    assert "stored; the source was not reachable" in _about(ident, "orders", "primary key")["basis"]
    feed = _claims(plan, "Change feed")
    assert _about(feed, "items", "slot")["status"] == "unproven"


def test_an_unknown_source_is_exit_2(shop: Path, tools: Any) -> None:
    result = tools.cli(shop, "plan", "nope")
    assert result.returncode == 2 and "nope" in result.stderr


def test_sqlite_and_mariadb_keys_are_measured(
    tmp_path: Path, tools: Any, mariadb_database: str
) -> None:
    """The same measure on the other SQL sources: a key with a duplicate and a null is refuted."""
    import pymysql

    from combined.connectors.mariadb._connect import Settings

    tools.make(tmp_path)
    tools.sql(
        tmp_path,
        "CREATE TABLE tags (id INTEGER, label TEXT);"
        "INSERT INTO tags VALUES (1, 'a'), (2, 'b'), (2, 'c'), (NULL, 'd');",
    )
    with pymysql.connect(**Settings.from_config({"dsn": mariadb_database}).connect_kwargs()) as c:
        with c.cursor() as cur:
            cur.execute("CREATE TABLE tags (id INT, label TEXT)")
            cur.execute("INSERT INTO tags VALUES (1, 'a'), (2, 'b'), (2, 'c'), (NULL, 'd')")
        c.commit()
    project = tmp_path / "combined.yaml"
    project.write_text(
        project.read_text()
        + "      tags:\n        key: [id]\n"
        + f"  maria:\n    connector: mariadb\n    config:\n      dsn: {mariadb_database}\n"
        + "    datasets:\n      tags:\n        key: [id]\n"
    )
    result = tools.cli(tmp_path, "plan", "--json")
    assert result.returncode == 0, result.stderr
    for plan in json.loads(result.stdout):
        refuted = _about(_claims(plan, "Idempotency"), "tags", "NOT unique")
        assert refuted["status"] == "refuted", plan["source"]
        assert "4 rows, 2 distinct keys, 1 with a null part" in refuted["text"]


def test_an_unreachable_sources_plan_never_shows_its_password(
    tmp_path: Path, tools: Any, monkeypatch: Any
) -> None:
    """The diagnostic quotes the source's error: the password it was given stays masked."""
    secret = "pl4n-s3cret-value"
    monkeypatch.setenv("COMBINED_TEST_PLAN_PASSWORD", secret)
    dsn = f"postgresql://postgres:{secret}@127.0.0.1:{_closed_port()}/nowhere"
    (tmp_path / "combined.yaml").write_text(
        "version: 1\nlake: ./lake\nsources:\n  pg:\n    connector: postgres\n    config:\n"
        '      dsn: {secret: "env:COMBINED_TEST_PLAN_DSN"}\n'
        '      password: {secret: "env:COMBINED_TEST_PLAN_PASSWORD"}\n'
        "    datasets:\n      orders:\n        relation: public.orders\n        key: [id]\n"
    )
    env = {"COMBINED_TEST_PLAN_DSN": dsn, "COMBINED_TEST_PLAN_PASSWORD": secret}
    for args in (["plan", "pg"], ["plan", "pg", "--json"]):
        result = tools.cli(tmp_path, *args, env=env)
        assert result.returncode == 0, result.stderr
        assert "could not be reached" in result.stdout
        assert secret not in result.stdout + result.stderr
