"""A CDC table's values rewritten in place with no type changed: read again (``_rewrite``).

``ALTER TYPE ... RENAME VALUE`` changes the text of every row holding the
label, and ``ALTER COLUMN v TYPE int USING v * 10`` (``v`` already an
``int``) rewrites every value: logical decoding streams neither, and no
column's type tells them. Before this, the lake kept the old values for
every row not changed since, and the capture succeeded.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import psycopg
import pytest
from tests.engine.test_cdc_retype import PARTITIONED, PROJECT, _sql

from combined.connectors.abc import ReadRequest
from combined.connectors.postgres import PostgresSource
from combined.engine import Engine
from combined.lake import LakeTable
from combined.protocol import RecordBatchMessage, StateMessage

ENUMS = """
CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy');
CREATE DOMAIN dmood AS mood;
CREATE TABLE t (id int PRIMARY KEY, v mood, vs mood[], dv dmood, w int);
INSERT INTO t SELECT g, m, ARRAY[m, 'ok'], m, g
  FROM generate_series(1, 20) g,
  LATERAL (SELECT ((ARRAY['sad', 'ok', 'happy'])[1 + g % 3])::mood m) x;
"""

ENUM_ROWS = "SELECT id, v::text, vs::text[], dv::text, w FROM {} ORDER BY id"


def _opened(tmp_path: Path, cdc_db: Any, setup: str, key: str = "[id]") -> Engine:
    """The project over ``t`` (made by ``setup``), its first capture done."""
    _sql(cdc_db.dsn, setup)
    (tmp_path / "combined.yaml").write_text(
        PROJECT.replace("key: [id]", f"key: {key}").format(
            dsn=cdc_db.dsn, prefix=cdc_db.prefix, mode="incremental"
        )
    )
    engine = Engine.open(tmp_path / "combined.yaml")
    (run,) = engine.capture()
    assert run.state == "succeeded", run.error
    return engine


def _rows(engine: Engine, dsn: str, query: str) -> tuple[list[tuple[Any, ...]], list[Any]]:
    """``query``'s rows in the lake and in the source."""
    lake = [tuple(r.values()) for r in engine.sql(query.format("pg.t")).to_pylist()]
    with psycopg.connect(dsn) as conn:
        return lake, list(conn.execute(query.format("t")))


def _captured(engine: Engine) -> dict[str, int]:
    """One capture, which succeeds: its stats of ``t``."""
    (run,) = engine.capture()
    assert run.state == "succeeded", run.error
    assert run.stats is not None
    return dict(run.stats["t"])


def _updates_billed(engine: Engine) -> int:
    (usage,) = (u for u in engine.usage() if u["dataset"] == "t")
    return int(usage["updates"])


@pytest.mark.parametrize(
    "rename",
    [
        "ALTER TYPE mood RENAME VALUE 'sad' TO 'blue'",
        # its old text back as a new label: the labels' texts still hold 'sad', 'ok', 'happy'
        "ALTER TYPE mood RENAME VALUE 'sad' TO 'blue';"
        " ALTER TYPE mood ADD VALUE 'sad' AFTER 'blue'",
    ],
    ids=["renamed", "renamed-then-added-again"],
)
@pytest.mark.parametrize("touched", [True, False], ids=["a-change-follows", "no-change-follows"])
def test_an_enum_label_renamed_is_read_again(
    tmp_path: Path, cdc_db: Any, rename: str, touched: bool
) -> None:
    """Every row holding the label, in an enum column, an array of the enum and a domain
    over it, takes the new text; only those rows are updated and billed."""
    engine = _opened(tmp_path, cdc_db, ENUMS)
    try:
        _sql(cdc_db.dsn, rename)
        if touched:  # (a relation message shows no label: the run's start compares)
            _sql(cdc_db.dsn, "UPDATE t SET w = -1 WHERE id = 1")
        stats = _captured(engine)
        lake, source = _rows(engine, cdc_db.dsn, ENUM_ROWS)
        assert lake == source
        assert lake[2] == (3, "blue", ["blue", "ok"], "blue", 3)
        renamed = 6  # ids 3, 6, ..., 18; id 1 holds 'ok'
        assert stats["updates"] == renamed + touched
        assert _updates_billed(engine) == renamed + touched
        assert _captured(engine)["captured"] == 0  # read once: the labels were recorded
    finally:
        engine.close()


def test_an_enum_label_added_reads_nothing_and_a_later_rename_is_read(
    tmp_path: Path, cdc_db: Any
) -> None:
    """``ADD VALUE`` changes no row's text: no row is read again; the labels it added
    are recorded, so a rename after it is told apart."""
    engine = _opened(tmp_path, cdc_db, ENUMS)
    try:
        _sql(cdc_db.dsn, "ALTER TYPE mood ADD VALUE 'meh' BEFORE 'ok'")
        assert _captured(engine)["captured"] == 0
        _sql(cdc_db.dsn, "ALTER TYPE mood RENAME VALUE 'ok' TO 'fine'")
        stats = _captured(engine)
        lake, source = _rows(engine, cdc_db.dsn, ENUM_ROWS)
        assert lake == source and lake[0][1:3] == ("fine", ["fine", "fine"])
        assert stats["updates"] == 20  # every row's array holds 'ok'
    finally:
        engine.close()


def test_a_key_columns_enum_label_renamed_needs_a_new_snapshot(tmp_path: Path, cdc_db: Any) -> None:
    """The rows holding it changed identity: a read by key cannot mend them."""
    setup = (
        "CREATE TYPE mood AS ENUM ('sad', 'ok'); CREATE TABLE t (id mood PRIMARY KEY, w int);"
        " INSERT INTO t VALUES ('sad', 1), ('ok', 2)"
    )
    engine = _opened(tmp_path, cdc_db, setup)
    try:
        _sql(cdc_db.dsn, "ALTER TYPE mood ADD VALUE 'meh'")
        assert _captured(engine)["captured"] == 0  # an added label keeps every identity
        _sql(cdc_db.dsn, "ALTER TYPE mood RENAME VALUE 'sad' TO 'blue'")
        (run,) = engine.capture()
        assert run.state == "needs_review"
        assert "key column 'id'" in (run.error or "") and "cdc setup" in (run.error or "")
    finally:
        engine.close()


PLAIN = """
CREATE TABLE t (id int PRIMARY KEY, v int, w int);
INSERT INTO t SELECT g, g, g FROM generate_series(1, 20) g;
"""


@pytest.mark.parametrize("touched", [True, False], ids=["a-change-follows", "no-change-follows"])
@pytest.mark.parametrize("table", ["plain", "partitioned"])
def test_a_column_rewritten_in_its_own_type_is_read_again(
    tmp_path: Path, cdc_db: Any, table: str, touched: bool
) -> None:
    """``ALTER COLUMN v TYPE int USING v * 10`` writes the table (each partition) anew."""
    partitioned = table == "partitioned"
    setup, key = (PARTITIONED, "[id, region]") if partitioned else (PLAIN, "[id]")
    engine = _opened(tmp_path, cdc_db, setup, key)
    try:
        _sql(cdc_db.dsn, "ALTER TABLE t ALTER COLUMN v TYPE int USING v * 10")
        if touched:
            _sql(cdc_db.dsn, "UPDATE t SET w = -1 WHERE id = 1")
        stats = _captured(engine)
        lake, source = _rows(engine, cdc_db.dsn, "SELECT id, v, w FROM {} ORDER BY id")
        assert lake == source and lake[6] == (7, 70, 7)
        assert stats["updates"] == 20
        assert _captured(engine)["captured"] == 0  # the new files were recorded
    finally:
        engine.close()


@pytest.mark.parametrize("statement", ["VACUUM FULL t", "CLUSTER t USING t_pkey"])
def test_a_table_written_anew_with_its_values_is_read_and_nothing_updated(
    tmp_path: Path, cdc_db: Any, statement: str
) -> None:
    """``VACUUM FULL`` and ``CLUSTER`` write the table anew too: it costs one read of
    its rows, found unchanged, neither updated nor billed."""
    engine = _opened(tmp_path, cdc_db, PLAIN)
    try:
        _sql(cdc_db.dsn, statement)
        stats = _captured(engine)
        assert stats["captured"] == 20 and stats["updates"] == 0
        assert _updates_billed(engine) == 0
        lake, source = _rows(engine, cdc_db.dsn, "SELECT id, v, w FROM {} ORDER BY id")
        assert lake == source
        assert _captured(engine)["captured"] == 0
    finally:
        engine.close()


def test_a_table_truncated_and_filled_again_lands_as_the_source_holds_it(
    tmp_path: Path, cdc_db: Any
) -> None:
    """The stream carries the truncate and the new rows; the new file has them read
    once more after them, found as the stream left them."""
    engine = _opened(tmp_path, cdc_db, PLAIN)
    try:
        _sql(
            cdc_db.dsn,
            "TRUNCATE t",
            "INSERT INTO t SELECT g, -g, g FROM generate_series(5, 25) g",
            "UPDATE t SET w = 0 WHERE id = 5",
        )
        stats = _captured(engine)
        lake, source = _rows(engine, cdc_db.dsn, "SELECT id, v, w FROM {} ORDER BY id")
        assert lake == source and lake[0] == (5, -5, 0)
        assert stats["captured"] == 1 + 22 + 21  # the truncate, the stream's rows, the read
        # what the stream's rows changed alone: the read changed nothing
        assert (stats["inserts"], stats["updates"], stats["deletes"]) == (5, 16, 4)
        assert _captured(engine)["captured"] == 0
    finally:
        engine.close()


def _checkpoint(root: Path) -> dict[str, Any]:
    meta = LakeTable(root / "lake" / "pg" / "t", "combined:pg/t").latest_commit()
    assert meta is not None
    return dict(meta["checkpoint"])


def _read(dsn: str, prefix: str, state: Mapping[str, Any], lake: list[str]) -> list[Any]:
    """One cdc read of ``t`` from ``state``, as the engine asks it: its messages."""
    source = PostgresSource({"dsn": dsn, "slot_prefix": prefix})
    request = ReadRequest(
        "t", "public.t", ("id",), "cdc", state=state, options={"lake_columns": lake}
    )
    ext = source.read(request)
    try:
        return list(ext)
    finally:
        ext.finish("abort")
        source.close()


def test_a_checkpoint_that_recorded_no_labels_or_files_takes_them_at_the_runs_end(
    tmp_path: Path, cdc_db: Any
) -> None:
    """A checkpoint written before labels and files were recorded reads on, taking the
    catalog's at its end; a rename after that is read again."""
    engine = _opened(tmp_path, cdc_db, ENUMS)
    engine.close()
    recorded = _checkpoint(tmp_path)
    assert recorded["labels"]["v"] == [[oid, text] for oid, text in _labels(cdc_db.dsn)]
    old = {k: v for k, v in recorded.items() if k not in ("labels", "files")}
    lake = ["id", "v", "vs", "dv", "w"]
    messages = _read(cdc_db.dsn, cdc_db.prefix, old, lake)
    assert not [m for m in messages if isinstance(m, RecordBatchMessage)]
    final = [m.state for m in messages if isinstance(m, StateMessage)][-1]
    assert final["labels"] == recorded["labels"] and final["files"] == recorded["files"]
    _sql(cdc_db.dsn, "ALTER TYPE mood RENAME VALUE 'happy' TO 'glad'")
    read = _read(cdc_db.dsn, cdc_db.prefix, final, lake)
    rows = [r for m in read if isinstance(m, RecordBatchMessage) for r in m.batch.to_pylist()]
    glad = [r for r in rows if r["v"] == "glad"]
    assert sorted(r["id"] for r in glad) == [2, 5, 8, 11, 14, 17, 20]


def _labels(dsn: str) -> list[tuple[int, str]]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT oid::bigint, enumlabel FROM pg_enum WHERE enumtypid = 'mood'::regtype"
            " ORDER BY enumsortorder"
        )
        return [(int(o), str(t)) for o, t in rows]
