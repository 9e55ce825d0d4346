"""`combined check` of a PostgreSQL source tells what its role may not do, before any Run.

A role without SELECT on a captured column, without REPLICATION for a cdc
dataset, or unable to create a cdc table's publication passed `check` ("ok")
and failed the first capture (`needs_auth`).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from combined.connectors.postgres._stitch import slot_name
from combined.engine import Engine
from combined.errors import AuthRejected, ConfigError, NeedsSnapshot

PREFIX = "grants"


@pytest.fixture
def role(cdc_db: object, pg_database: str) -> Iterator[str]:
    """A LOGIN role holding no privilege on the test database's table ``t``."""
    name = f"combined_lim_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(pg_database, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY, v text, secret text)")
        conn.execute("INSERT INTO t VALUES (1, 'a', 's'), (2, 'b', 's')")
        conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(name)))
    try:
        yield name
    finally:
        with psycopg.connect(pg_database, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(name)))
            conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(name)))


def _admin(pg_database: str, statement: str, role: str) -> None:
    with psycopg.connect(pg_database, autocommit=True) as conn:
        conn.execute(sql.SQL(statement).format(role=sql.Identifier(role)))


def _engine(tmp_path: Path, pg_database: str, role: str, dataset: str) -> Engine:
    dsn = pg_database.replace("://postgres@", f"://{role}@", 1)
    (tmp_path / "combined.yaml").write_text(
        "version: 1\nlake: ./lake\nsources:\n  pg:\n    connector: postgres\n"
        f"    config:\n      dsn: {dsn}\n      slot_prefix: {PREFIX}\n"
        f"    datasets:\n      t:\n{dataset}"
    )
    return Engine.open(tmp_path / "combined.yaml")


def test_check_names_the_columns_the_role_may_not_read(
    tmp_path: Path, pg_database: str, role: str
) -> None:
    engine = _engine(tmp_path, pg_database, role, "        key: [id]\n")
    try:
        with pytest.raises(AuthRejected) as info:
            engine.check("pg")
        assert "may not read any of its columns" in info.value.message
        assert f'GRANT SELECT ON "public"."t" TO "{role}"' in (info.value.hint or "")
        _admin(pg_database, "GRANT SELECT (id, v) ON t TO {role}", role)
        with pytest.raises(AuthRejected) as info:
            engine.check("pg")
        assert 'column(s) "secret"' in info.value.message
        assert f'GRANT SELECT ("secret") ON "public"."t" TO "{role}"' in (info.value.hint or "")
    finally:
        engine.close()
    engine = _engine(tmp_path, pg_database, role, "        key: [id]\n        columns: [id, v]\n")
    try:
        engine.check("pg")  # the columns it may read: passed, and so is the capture
        (run,) = engine.capture()
        assert run.state == "succeeded", run.error
    finally:
        engine.close()


def test_check_of_a_cdc_dataset_names_the_publication_and_replication_it_lacks(
    tmp_path: Path, pg_database: str, role: str
) -> None:
    _admin(pg_database, "GRANT SELECT ON t TO {role}", role)
    engine = _engine(tmp_path, pg_database, role, "        key: [id]\n        strategy: cdc\n")
    publication = slot_name(PREFIX, "t")
    try:
        with pytest.raises(AuthRejected) as info:
            engine.check("pg")
        assert "needs the REPLICATION attribute" in info.value.message
        assert f'ALTER ROLE "{role}" WITH REPLICATION' in (info.value.hint or "")
        _admin(pg_database, "ALTER ROLE {role} WITH REPLICATION", role)
        with pytest.raises(AuthRejected) as info:
            engine.check("pg")
        assert f"publication {publication!r}" in info.value.message
        assert f"role {role!r} may not create it" in info.value.message
        assert f'CREATE PUBLICATION "{publication}" FOR TABLE "public"."t"' in (
            info.value.hint or ""
        )
        _admin(pg_database, f'CREATE PUBLICATION "{publication}" FOR TABLE t', role)
        engine.check("pg")
        (run,) = engine.capture()  # the role now does what check said it could
        assert run.state == "succeeded", run.error
        assert engine.sql("SELECT count(*) AS n FROM pg.t").to_pylist() == [{"n": 2}]
        engine.check("pg")  # (its slot exists now, and is verified as a capture does)
        with psycopg.connect(pg_database, autocommit=True) as conn:
            conn.execute("SELECT pg_drop_replication_slot(%s)", (publication,))
        with pytest.raises(NeedsSnapshot, match="does not exist"):
            engine.check("pg")  # (the lake resumes from a slot gone: a capture would stop)
        _admin(pg_database, f'ALTER PUBLICATION "{publication}" SET TABLE t WHERE (id > 1)', role)
        with pytest.raises(NeedsSnapshot, match="row filter"):
            engine.check("pg")
    finally:
        engine.close()


def test_a_member_of_rds_replication_may_stream_changes(
    tmp_path: Path, pg_database: str, role: str
) -> None:
    """On Amazon RDS a role streams changes through membership of rds_replication, not the
    REPLICATION attribute (which RDS does not give): check must not refuse it there."""
    publication = slot_name(PREFIX, "t")
    _admin(pg_database, "GRANT SELECT ON t TO {role}", role)
    _admin(pg_database, f'CREATE PUBLICATION "{publication}" FOR TABLE t', role)
    engine = _engine(tmp_path, pg_database, role, "        key: [id]\n        strategy: cdc\n")
    try:
        with pytest.raises(AuthRejected, match="REPLICATION attribute") as info:
            engine.check("pg")
        assert f'GRANT rds_replication TO "{role}"' in (info.value.hint or "")
        _admin(
            pg_database,
            "DO $$ BEGIN CREATE ROLE rds_replication; "
            "EXCEPTION WHEN duplicate_object THEN NULL; END $$",
            role,
        )
        try:
            _admin(pg_database, "GRANT rds_replication TO {role}", role)
            engine.check("pg")
        finally:
            _admin(pg_database, "REVOKE rds_replication FROM {role}", role)
            _admin(pg_database, "DROP ROLE IF EXISTS rds_replication", role)
    finally:
        engine.close()


def test_a_capture_tells_a_datasets_configuration_before_another_ones_grants(
    tmp_path: Path, pg_database: str, role: str
) -> None:
    """A dataset the role may not read stopped the preflight before the next dataset's
    configuration was checked: the capture was admitted, and ended needs_auth."""
    with psycopg.connect(pg_database, autocommit=True) as conn:
        conn.execute("CREATE TABLE flags (id int PRIMARY KEY, ok boolean)")
    _admin(pg_database, "GRANT SELECT ON flags TO {role}", role)
    datasets = (
        "        key: [id]\n      flags:\n        key: [id]\n        strategy: cursor\n"
        "        cursor: {column: ok, trust: ok}\n"
    )
    engine = _engine(tmp_path, pg_database, role, datasets)
    try:
        with pytest.raises(ConfigError, match="cannot serve as a cursor"):
            engine.capture()
    finally:
        engine.close()
