"""A capture of many small tables: what each table costs besides its rows (issue 25).

An application database is hundreds of small tables; a capture's cost there
is what it spends a table. Each load of a table's Delta log is a listing and
reads of an object store (~1.5 ms of CPU even on a local disk): a changed
re-capture loaded each dataset's table four times and its MAR table twice.
Each catalog transaction that writes is a durable commit (SQLite's
``synchronous=FULL``: ~0.5 ms of CPU and ~3 ms of wall here): it made 15 a
table, among them a lease renewal and a release of each dataset's lease
one at a time.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import psycopg
import pytest

from combined.engine import Engine
from combined.lake import LakeTable

TABLES = 5

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
"""


def _project(root: Path, dsn: str) -> Engine:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for i in range(TABLES):
            conn.execute(f"CREATE TABLE t{i} (id bigint PRIMARY KEY, v int, s text)")
            conn.execute(f"INSERT INTO t{i} SELECT g, g, 's' || g FROM generate_series(1, 20) g")
    datasets = "".join(f"      t{i}:\n        key: [id]\n" for i in range(TABLES))
    (root / "combined.yaml").write_text(PROJECT.format(dsn=dsn) + datasets)
    return Engine.open(root / "combined.yaml")


def _captured_then_changed(root: Path, dsn: str) -> Engine:
    """The project captured once, then one row of each table changed."""
    engine = _project(root, dsn)
    (first,) = engine.capture()
    assert first.state == "succeeded", first.error
    with psycopg.connect(dsn, autocommit=True) as conn:
        for i in range(TABLES):
            conn.execute(f"UPDATE t{i} SET v = v + 1 WHERE id = 1")
    return engine


def test_a_changed_recapture_loads_each_table_log_at_most_three_times(
    tmp_path: Path, pg_database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = _captured_then_changed(tmp_path, pg_database)
    loads: Counter[str] = Counter()
    load = LakeTable._fresh

    def counted(self: LakeTable, version: int | None = None) -> Any:
        loads[Path(self.path).relative_to(tmp_path / "lake").as_posix()] += 1
        return load(self, version)

    monkeypatch.setattr(LakeTable, "_fresh", counted)
    (run,) = engine.capture()
    assert run.state == "succeeded", run.error
    for i in range(TABLES):
        # Before the Run's leases (recovery), under them (catching up, shared
        # by the checks, the read and the reconciliation), and the commit's own.
        assert loads[f"pg/t{i}"] == 3, loads
        # MAR computes the new identities from its table's one load and
        # appends on that load (it was twice: read, then written on).
        assert loads[f"_usage/pg/t{i}"] == 1, loads
    sums = engine.sql("SELECT sum(v) AS v FROM pg.t0").column("v").to_pylist()
    assert sums == [211]  # 1..20, one of them changed by one


def test_a_changed_recapture_makes_at_most_eleven_catalog_transactions_a_table(
    tmp_path: Path, pg_database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = _captured_then_changed(tmp_path, pg_database)
    begun = _count_transactions(engine, monkeypatch)
    # A Run's own transactions (admission, attempts, publication) from one
    # table's Run; what each further table adds from a Run of the others.
    (one,) = engine.capture(["pg.t0"])
    alone = len(begun)
    (rest,) = engine.capture([f"pg.t{i}" for i in range(1, TABLES)])
    assert one.state == rest.state == "succeeded", (one.error, rest.error)
    a_table = (len(begun) - 2 * alone) / (TABLES - 2)
    assert a_table <= 11, (alone, len(begun) - alone)


def _count_transactions(engine: Engine, monkeypatch: pytest.MonkeyPatch) -> list[None]:
    """A list that grows by one at each transaction ``engine``'s catalog begins."""
    begun: list[None] = []
    begin = engine.catalog.begin

    def counted() -> Any:
        begun.append(None)
        return begin()

    monkeypatch.setattr(engine.catalog, "begin", counted)
    return begun
