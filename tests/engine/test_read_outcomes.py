"""Each read of a Run ends with the outcome the lake commit decided, on real databases."""

from __future__ import annotations

import uuid
from pathlib import Path

import psycopg
import pymysql
import pytest

from combined.catalog import data as cat
from combined.connectors.mariadb._connect import Settings
from combined.engine import Engine
from combined.runtime._reporter import NullReporter

PROJECT = """\
version: 1
lake: ./lake
sources:
  db:
    connector: {connector}
    config:
      dsn: {dsn}
    datasets:
      first:
        relation: {first}
        key: [id]
      second:
        relation: {second}
        key: [{second_key}]
"""


class _BreakTheLake(NullReporter):
    """When the first dataset's commit starts, a file stands where its table would be."""

    def __init__(self, table: Path) -> None:
        self.table = table

    def phase(self, dataset: str, phase: str) -> None:
        if dataset == "first" and phase == "committing":
            self.table.parent.mkdir(parents=True, exist_ok=True)
            self.table.write_text("not a table")


def _tables(kind: str, dsn: str) -> tuple[str, str]:
    """Two tables, ``first`` and ``second`` (whose ``grp`` repeats), in the database."""
    suffix = uuid.uuid4().hex[:8]
    first, second = f"first_{suffix}", f"second_{suffix}"
    statements = [
        f"CREATE TABLE {first} (id int PRIMARY KEY, v int)",
        f"INSERT INTO {first} VALUES (1, 10), (2, 20)",
        f"CREATE TABLE {second} (id int PRIMARY KEY, grp int)",
        f"INSERT INTO {second} VALUES (1, 7), (2, 7)",
    ]
    if kind == "postgres":
        with psycopg.connect(dsn, autocommit=True) as conn:
            for statement in statements:
                conn.execute(statement)
        return f"public.{first}", f"public.{second}"
    kwargs = Settings.from_config({"dsn": dsn}).connect_kwargs()
    kwargs.pop("conv")
    kwargs.pop("cursorclass")
    with pymysql.connect(**kwargs) as conn, conn.cursor() as cur:
        for statement in statements:
            cur.execute(statement)
        conn.commit()
    return first, second


@pytest.fixture(params=["postgres", "mariadb"])
def database(request: pytest.FixtureRequest) -> tuple[str, str]:
    """(connector, dsn) of a real database of each kind."""
    if request.param == "postgres":
        return "postgres", str(request.getfixturevalue("pg_database"))
    return "mariadb", str(request.getfixturevalue("mariadb_database"))


def _open(
    tmp_path: Path, database: tuple[str, str], second_key: str, reporter: NullReporter | None
) -> Engine:
    connector, dsn = database
    first, second = _tables(connector, dsn)
    project = tmp_path / "combined.yaml"
    project.write_text(
        PROJECT.format(
            connector=connector, dsn=dsn, first=first, second=second, second_key=second_key
        )
    )
    return Engine.open(project, reporter)


def _outcomes(engine: Engine, run_id: str) -> dict[str, str]:
    with engine.catalog.begin() as conn:
        rows = cat.activity(conn, kind="read.ended", run_id=run_id)
    return {str(r.dataset): r.body["outcome"] for r in rows}


def test_committed_reads_end_in_success(tmp_path: Path, database: tuple[str, str]) -> None:
    """A plain capture of two tables: each read ended as `abort`, because the
    source was closed (aborting its reads) before the lake commit was known.
    """
    engine = _open(tmp_path, database, "id", None)
    try:
        (run,) = engine.capture()
        assert run.state == "succeeded", run.error
        assert _outcomes(engine, run.id) == {"first": "success", "second": "success"}
    finally:
        engine.close()


def test_reads_of_a_run_that_never_committed_end_in_abort(
    tmp_path: Path, database: tuple[str, str]
) -> None:
    """The second dataset's declared key repeats (grp): the Run stops before any
    commit, and both reads end as `abort`.
    """
    engine = _open(tmp_path, database, "grp", None)
    try:
        (run,) = engine.capture()
        assert run.state == "needs_review", run.error
        assert _outcomes(engine, run.id) == {"first": "abort", "second": "abort"}
    finally:
        engine.close()


def test_a_read_whose_commit_failed_is_retained_as_unknown(
    tmp_path: Path, database: tuple[str, str]
) -> None:
    """The first dataset's lake commit fails (a file stands where its table goes):
    its read ended as `abort` (the source was closed before the commit), not
    `retain_commit_unknown`; the second, never committed, is `abort`.
    """
    engine = _open(tmp_path, database, "id", _BreakTheLake(tmp_path / "lake" / "db" / "first"))
    try:
        (run,) = engine.capture()
        assert run.state == "failed"
        assert _outcomes(engine, run.id) == {"first": "retain_commit_unknown", "second": "abort"}
    finally:
        engine.close()
