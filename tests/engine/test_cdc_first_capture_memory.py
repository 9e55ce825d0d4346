"""A cdc dataset's first capture (its stitched snapshot) reduces as a snapshot's first baseline.

The stitched snapshot reads rows, none a change, yet they were staged
unhashed, as a change stream's are: the reduction hashed every row into a
table of keys, checked them for duplicates and materialised the transition,
all of it spilled from DuckDB beside the process's own memory (a 2M-row
table peaked at 554 MB, its snapshot strategy at 331; issue 25). Staging now
hashes them as it does a snapshot's, and the reduction streams them to the
Deliveries; the stream that follows resolves onto the rows by the same ids.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg
import pytest

from combined.capture._reduce import Reducer
from combined.engine import Engine

ROWS = 20_000


def _reductions(monkeypatch: pytest.MonkeyPatch) -> list[tuple[bool, list[str]]]:
    """Each reduction's (whether it streamed its staged rows, the tables its database made)."""
    seen: list[tuple[bool, list[str]]] = []
    output = Reducer.output

    def observed(self: Reducer, *args: Any, **kwargs: Any) -> Any:
        yield from output(self, *args, **kwargs)
        made = self.con.execute("SELECT table_name FROM duckdb_tables() ORDER BY 1").fetchall()
        seen.append((self.all_new, [name for (name,) in made]))

    monkeypatch.setattr(Reducer, "output", observed)
    return seen


def test_a_stitched_snapshot_streams_its_rows_and_the_stream_resolves_onto_them(
    tmp_path: Path, cdc_db, monkeypatch: pytest.MonkeyPatch, tools: Any
) -> None:
    with psycopg.connect(cdc_db.dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (id bigint PRIMARY KEY, v int, s text, at timestamptz)")
        conn.execute(
            "INSERT INTO t SELECT g, g % 1000, 'row ' || g, timestamptz '2024-01-01' + "
            f"g * interval '1 second' FROM generate_series(1, {ROWS}) g"
        )
    project = tools.pg_cdc_project(cdc_db.dsn, cdc_db.prefix, "public.t", ["id"])
    (tmp_path / "combined.yaml").write_text(project)
    cdc_db.slot("public.t")
    reductions = _reductions(monkeypatch)
    check = "SELECT count(*), sum(v), sum(length(s)), sum(id * v) FROM {}"
    engine = Engine.open(tmp_path / "combined.yaml")
    try:
        (run,) = engine.capture()  # the stitched snapshot
        assert run.state == "succeeded", run.error
        assert run.stats is not None and run.stats["items"]["inserts"] == ROWS
        # Streamed from its staged parts: no table of its keys nor of its transition.
        assert reductions == [(True, [])]
        with psycopg.connect(cdc_db.dsn, autocommit=True) as conn:
            conn.execute("UPDATE t SET v = v + 1 WHERE id % 3 = 0")
            conn.execute("DELETE FROM t WHERE id % 7 = 0")
            conn.execute("INSERT INTO t VALUES (-1, 5, 'new', now())")
            source = conn.execute(check.format("t")).fetchone()
        (run,) = engine.capture()
        assert run.state == "succeeded", run.error
        # The stream's changes found the snapshot's rows by their ids.
        assert run.stats is not None
        stats = run.stats["items"]
        assert (stats["inserts"], stats["deletes"]) == (1, ROWS // 7)
        assert stats["updates"] == ROWS // 3 - ROWS // 21
        (lake,) = [tuple(r.values()) for r in engine.sql(check.format("pg.items")).to_pylist()]
    finally:
        engine.close()
    assert source is not None and lake == tuple(source)
