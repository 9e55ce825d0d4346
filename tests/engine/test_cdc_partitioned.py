"""CDC of partitioned tables and inheritance parents, against a real PostgreSQL.

A partitioned table's changes are published under its partitions' oids: the
stream routes them to the table's dataset. Partitions attached, detached or
dropped, and partitions truncated on their own, move rows without a change
the lake could apply: those captures fail, loudly, and never publish a lake
that quietly disagrees with the source.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg
import pytest

from combined import cdc
from combined.catalog import Run
from combined.connectors.abc import ReadRequest
from combined.connectors.postgres import PostgresSource
from combined.connectors.postgres._connect import Settings
from combined.connectors.postgres._publication import ensure_publication
from combined.connectors.postgres._replication import slot_status
from combined.engine import Engine
from combined.errors import ConfigError, NeedsSnapshot, SourceError
from combined.lake import LakeTable

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
      m:
        relation: public.{table}
        key: {key}
        strategy: cdc
"""

# Four partitions: two plain, one attached from a table whose columns are in
# another order (its rows come in that order), one itself partitioned.
SETUP = """
CREATE TABLE m (id int NOT NULL, region text NOT NULL, qty int, note text,
                PRIMARY KEY (id, region)) PARTITION BY LIST (region);
CREATE TABLE m_eu PARTITION OF m FOR VALUES IN ('eu');
CREATE TABLE m_us PARTITION OF m FOR VALUES IN ('us');
CREATE TABLE m_as (note text, qty int, region text NOT NULL, id int NOT NULL);
ALTER TABLE m ATTACH PARTITION m_as FOR VALUES IN ('as');
CREATE TABLE m_af PARTITION OF m FOR VALUES IN ('af', 'za') PARTITION BY LIST (region);
CREATE TABLE m_af_1 PARTITION OF m_af FOR VALUES IN ('af');
CREATE TABLE m_af_2 PARTITION OF m_af FOR VALUES IN ('za');
INSERT INTO m SELECT g, (ARRAY['eu', 'us', 'as', 'af', 'za'])[1 + g % 5], g, 'n' || g
  FROM generate_series(1, 100) g;
"""

QUERY = "SELECT id, region, qty, note FROM {} ORDER BY id, region"


@pytest.fixture
def project(tmp_path: Path, cdc_db: Any) -> tuple[Path, str, str]:
    dsn = cdc_db.dsn
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(SETUP)
    (tmp_path / "combined.yaml").write_text(
        PROJECT.format(dsn=dsn, prefix=cdc_db.prefix, table="m", key="[id, region]")
    )
    return tmp_path, dsn, cdc_db.slot("public.m")


def _run(dsn: str, *statements: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for statement in statements:
            conn.execute(statement)


def _lake(engine: Engine) -> list[tuple[object, ...]]:
    return [tuple(r.values()) for r in engine.sql(QUERY.format("pg.m")).to_pylist()]


def _source(dsn: str) -> list[tuple[object, ...]]:
    with psycopg.connect(dsn) as conn:
        return list(conn.execute(QUERY.format("m")))


def _captured(engine: Engine, dsn: str) -> None:
    """One capture that succeeds, reconciles and leaves the lake equal to the source."""
    (run,) = engine.capture()
    assert run.state == "succeeded", run.error
    assert run.stats is not None and run.stats["m"]["reconciliation"] != "mismatch"
    assert _lake(engine) == _source(dsn)


def test_a_partitioned_table_streams_every_partitions_changes(
    project: tuple[Path, str, str],
) -> None:
    # The publication listed the partitions, not the table: setup failed with
    # "relation m is already member of publication", and a publication made
    # by hand through the root lost every truncate of a single partition.
    root, dsn, slot = project
    engine = Engine.open(root / "combined.yaml")
    try:
        notes, run = cdc.setup(engine, "pg")
        assert run.state == "succeeded", run.error
        assert run.stats is not None and run.stats["m"]["reconciliation"] == "reconciled"
        assert _lake(engine) == _source(dsn) and len(_source(dsn)) == 100
        assert slot_status(Settings(dsn), slot).exists

        _run(
            dsn,
            "INSERT INTO m VALUES (101, 'eu', 1, 'a'), (102, 'as', 2, 'b'), (103, 'za', 3, 'c')",
            "UPDATE m SET qty = -qty WHERE id IN (1, 2, 3, 4, 5)",  # one in each partition
            "DELETE FROM m WHERE id IN (6, 7, 8)",
            # moves across partitions: a delete in one, an insert in another
            "UPDATE m SET region = 'us', note = 'moved' WHERE id IN (10, 12, 13)",
            "UPDATE m SET region = 'as' WHERE id = 101",
            "UPDATE m SET region = 'eu' WHERE id = 101",
        )
        _captured(engine, dsn)

        # A partition created as one streams from its creation on.
        _run(
            dsn,
            "CREATE TABLE m_sa PARTITION OF m FOR VALUES IN ('sa')",
            "INSERT INTO m VALUES (200, 'sa', 1, 'new partition')",
            "UPDATE m SET region = 'sa' WHERE id = 20",
        )
        _captured(engine, dsn)
        _run(dsn, "INSERT INTO m VALUES (201, 'sa', 2, 'again')", "DELETE FROM m WHERE id = 200")
        _captured(engine, dsn)

        # A truncate of the table names every partition: every row goes.
        _run(dsn, "TRUNCATE m", "INSERT INTO m VALUES (1, 'za', 1, 'after'), (2, 'as', 2, 'x')")
        (run,) = engine.capture()
        assert run.state == "succeeded", run.error
        assert _lake(engine) == _source(dsn) == [(1, "za", 1, "after"), (2, "as", 2, "x")]
    finally:
        engine.close()


def test_a_partition_renamed_or_moved_after_its_creation_still_streams(
    project: tuple[Path, str, str],
) -> None:
    # A partition made by CREATE TABLE ... PARTITION OF, then renamed or moved
    # to another schema before the next capture (a migration tool's naming,
    # an archive schema), was taken for a table attached with rows: every
    # capture failed, and only a new snapshot of the whole table got past it.
    root, dsn, _ = project
    engine = Engine.open(root / "combined.yaml")
    try:
        _, run = cdc.setup(engine, "pg")
        assert run.state == "succeeded", run.error
        _run(
            dsn,
            "CREATE TABLE m_sa PARTITION OF m FOR VALUES IN ('sa')",
            "INSERT INTO m VALUES (200, 'sa', 1, 'new partition')",
            "ALTER TABLE m_sa RENAME TO m_south_america",
            "CREATE SCHEMA archive",
            "ALTER TABLE m_south_america SET SCHEMA archive",
            "INSERT INTO m VALUES (201, 'sa', 2, 'after the move')",
        )
        _captured(engine, dsn)
    finally:
        engine.close()


@pytest.mark.parametrize(
    "statements",
    [
        [
            "CREATE TABLE m_sa (id int NOT NULL, region text NOT NULL, qty int, note text)",
            "INSERT INTO m_sa VALUES (300, 'sa', 1, 'loaded before attaching')",
            "ALTER TABLE m ATTACH PARTITION m_sa FOR VALUES IN ('sa')",
        ],
        [
            "BEGIN",
            "CREATE TABLE m_sa (id int NOT NULL, region text NOT NULL, qty int, note text)",
            "INSERT INTO m_sa VALUES (300, 'sa', 1, 'loaded before attaching')",
            "ALTER TABLE m ATTACH PARTITION m_sa FOR VALUES IN ('sa')",
            "COMMIT",
        ],
        ["ALTER TABLE m DETACH PARTITION m_us"],
        ["DROP TABLE m_af_2"],
        [
            "ALTER TABLE m DETACH PARTITION m_us",
            "ALTER TABLE m ATTACH PARTITION m_us FOR VALUES IN ('us')",
        ],
        ["TRUNCATE m_eu"],
        ["TRUNCATE m_af"],
    ],
    ids=[
        "attached",
        "created_loaded_and_attached_at_once",
        "detached",
        "dropped",
        "detached_and_attached_again",
        "partition_truncated",
        "partitioned_partition_truncated",
    ],
)
def test_rows_moved_outside_the_stream_fail_the_capture(
    project: tuple[Path, str, str], statements: list[str]
) -> None:
    # Attaching brings rows no change carried; detaching, dropping and
    # truncating one partition (which pgoutput sends through the root not at
    # all) remove rows without a delete: the lake went on holding them.
    root, dsn, slot = project
    engine = Engine.open(root / "combined.yaml")
    try:
        cdc.setup(engine, "pg")
        _run(dsn, "UPDATE m SET qty = 0 WHERE id = 1")
        _captured(engine, dsn)
        before = _lake(engine)
        with psycopg.connect(dsn, autocommit=True) as conn:
            for statement in statements:
                conn.execute(statement)
            conn.execute("INSERT INTO m VALUES (400, 'eu', 4, 'after')")
        (run,) = engine.capture()
        assert run.state == "needs_review"  # (only a new snapshot mends it)
        error = run.error or ""
        assert "teardown" in error and "partition" in error
        assert len(engine.run(run.id)["attempts"]) == 1  # a person decides: no blind retry
        assert _lake(engine) == before
        (again,) = engine.capture()
        assert again.state == "needs_review"  # it does not pass by being retried

        # The hint's way out: a new slot and a new snapshot.
        cdc.teardown(engine, "pg")
        _, run = cdc.setup(engine, "pg")
        assert run.state == "succeeded", run.error
        assert _lake(engine) == _source(dsn)
        _run(dsn, "INSERT INTO m VALUES (401, 'eu', 4, 'later')")
        _captured(engine, dsn)
    finally:
        engine.close()


def _checkpoint(root: Path) -> dict[str, Any]:
    """Set the dataset up; its first checkpoint."""
    engine = Engine.open(root / "combined.yaml")
    try:
        cdc.setup(engine, "pg")
    finally:
        engine.close()
    table = LakeTable(root / "lake" / "pg" / "m", "combined:pg/m").latest_commit()
    assert table is not None
    return dict(table["checkpoint"])


@pytest.mark.parametrize(
    ("statements", "said"),
    [
        (
            [
                "CREATE TABLE m_sa (id int NOT NULL, region text NOT NULL, qty int, note text)",
                "INSERT INTO m_sa VALUES (300, 'sa', 1, 'never streamed')",
                "ALTER TABLE m ATTACH PARTITION m_sa FOR VALUES IN ('sa')",
            ],
            "m_sa was attached to public.m while the capture",
        ),
        (["ALTER TABLE m DETACH PARTITION m_us"], "m_us was detached from or dropped"),
    ],
    ids=["attached", "detached"],
)
def test_a_partition_attached_or_detached_while_the_capture_streams_fails_it(
    project: tuple[Path, str, str], statements: list[str], said: str
) -> None:
    """Only a new snapshot mends it (the detach was a plain SourceError: a Run ``failed``,
    which schedules and followers retried for ever)."""
    root, dsn, _ = project
    checkpoint = _checkpoint(root)
    _run(dsn, "INSERT INTO m SELECT g, 'eu', 1, 'streamed' FROM generate_series(500, 504) g")
    source = PostgresSource({"dsn": dsn, "slot_prefix": _prefix(root)})
    request = ReadRequest(
        dataset="m",
        relation="public.m",
        key=("id", "region"),
        strategy="cdc",
        state=checkpoint,
        batch_rows=2,  # a full batch is handed over while the stream is read
    )
    ext = source.read(request)
    try:
        messages = iter(ext)
        next(messages)  # streaming: its end was fixed when it started
        _run(dsn, *statements)
        with pytest.raises(NeedsSnapshot, match=said) as info:
            list(messages)
        assert "combined cdc teardown" in (info.value.hint or "")
    finally:
        ext.finish("abort")
        source.close()


def test_a_checkpoint_without_its_partitions_needs_a_new_snapshot(
    project: tuple[Path, str, str],
) -> None:
    """Which partitions the stream covered is unknown: only a new snapshot mends it."""
    root, dsn, _ = project
    state = {k: v for k, v in _checkpoint(root).items() if k != "partitions"}
    source = PostgresSource({"dsn": dsn, "slot_prefix": _prefix(root)})
    try:
        with pytest.raises(NeedsSnapshot, match="does not record its partitions") as info:
            source.read(ReadRequest("m", "public.m", ("id", "region"), "cdc", state=state))
        assert "combined cdc teardown" in (info.value.hint or "")
    finally:
        source.close()


def test_a_foreign_table_attached_after_setup_needs_a_new_snapshot(
    tmp_path: Path, cdc_db: Any
) -> None:
    """Logical replication carries no foreign table's changes: the Run ends ``needs_review``
    (it ended ``failed``, retried for ever), naming the new snapshot."""
    dsn = cdc_db.dsn
    _run(
        dsn,
        "CREATE TABLE f (id int NOT NULL, region text NOT NULL) PARTITION BY LIST (region)",
        "ALTER TABLE f REPLICA IDENTITY FULL",
        "CREATE TABLE f_eu PARTITION OF f FOR VALUES IN ('eu')",
        "ALTER TABLE f_eu REPLICA IDENTITY FULL",
        "INSERT INTO f VALUES (1, 'eu')",
    )
    engine = _opened(tmp_path, cdc_db, "f")
    try:
        run = _set_up_then(
            engine,
            dsn,
            "CREATE FOREIGN DATA WRAPPER combined_test_fdw",
            "CREATE SERVER combined_test_server FOREIGN DATA WRAPPER combined_test_fdw",
            "CREATE FOREIGN TABLE f_us PARTITION OF f FOR VALUES IN ('us') "
            "SERVER combined_test_server",
        )
        assert run.state == "needs_review", run.error
        error = run.error or ""
        assert "f_us of public.f" in error and "is a foreign table" in error
        assert "combined cdc teardown" in error
        assert len(engine.run(run.id)["attempts"]) == 1  # not retried
    finally:
        engine.close()


def _opened(tmp_path: Path, cdc_db: Any, table: str) -> Engine:
    """An engine on a project capturing ``table`` (keyed on ``id``) with cdc."""
    project = PROJECT.format(dsn=cdc_db.dsn, prefix=cdc_db.prefix, table=table, key="[id]")
    (tmp_path / "combined.yaml").write_text(project)
    cdc_db.slot(f"public.{table}")
    return Engine.open(tmp_path / "combined.yaml")


def _set_up_then(engine: Engine, dsn: str, *statements: str) -> Run:
    """Set the dataset up, run ``statements`` on the source, capture: that capture's Run."""
    _, run = cdc.setup(engine, "pg")
    assert run.state == "succeeded", run.error
    _run(dsn, *statements)
    (run,) = engine.capture()
    return run


def _prefix(root: Path) -> str:
    text = (root / "combined.yaml").read_text()
    return text.split("slot_prefix: ", 1)[1].split("\n", 1)[0]


def test_a_publication_made_through_the_root_is_switched_or_refused(
    project: tuple[Path, str, str],
) -> None:
    # Through the root, pgoutput drops a TRUNCATE of one partition on the floor.
    root, dsn, slot = project
    _run(dsn, f"CREATE PUBLICATION {slot} FOR TABLE m WITH (publish_via_partition_root = true)")
    engine = Engine.open(root / "combined.yaml")
    try:
        _, run = cdc.setup(engine, "pg")
        assert run.state == "succeeded", run.error
        with psycopg.connect(dsn) as conn:
            query = "SELECT pubviaroot FROM pg_publication WHERE pubname = %s"
            assert conn.execute(query, (slot,)).fetchone() == (False,)
        _run(dsn, f"ALTER PUBLICATION {slot} SET (publish_via_partition_root = true)")
        _run(dsn, "TRUNCATE m_eu")
        (run,) = engine.capture()
        assert run.state == "needs_review"  # (only a new snapshot mends it)
        assert "publish_via_partition_root = false" in (run.error or "")
    finally:
        engine.close()
    with pytest.raises(SourceError, match="through their root"):
        ensure_publication(Settings(dsn), slot, ["public.m"])


def test_setup_refuses_a_partitioned_table_whose_partitions_cannot_be_streamed(
    tmp_path: Path, cdc_db: Any
) -> None:
    dsn = cdc_db.dsn
    _run(
        dsn,
        "CREATE TABLE k (id int, region text) PARTITION BY LIST (region)",
        "CREATE TABLE k_eu PARTITION OF k FOR VALUES IN ('eu')",
        "ALTER TABLE k REPLICA IDENTITY FULL",  # the table's own: its partitions keep theirs
        "CREATE FOREIGN DATA WRAPPER combined_test_fdw",
        "CREATE SERVER combined_test_server FOREIGN DATA WRAPPER combined_test_fdw",
        "CREATE TABLE f (id int, region text NOT NULL) PARTITION BY LIST (region)",
        "ALTER TABLE f REPLICA IDENTITY FULL",
        "CREATE TABLE f_eu PARTITION OF f FOR VALUES IN ('eu')",
        "ALTER TABLE f_eu REPLICA IDENTITY FULL",
        "CREATE FOREIGN TABLE f_us PARTITION OF f FOR VALUES IN ('us') SERVER combined_test_server",
    )
    settings = Settings(dsn)
    slot = cdc_db.slot("public.k")
    with pytest.raises(SourceError, match="partition public.k_eu of public.k has no replica"):
        ensure_publication(settings, slot, ["public.k"])
    _run(dsn, "ALTER TABLE k_eu REPLICA IDENTITY FULL")
    assert ensure_publication(settings, slot, ["public.k"]).created
    with pytest.raises(SourceError, match="public.f_us of public.f is a foreign table"):
        ensure_publication(settings, cdc_db.slot("public.f"), ["public.f"])


def test_an_inheritance_parent_is_refused_for_cdc(tmp_path: Path, cdc_db: Any) -> None:
    # Its snapshot holds its children's rows, its stream only its own: the
    # lake kept every child row as the snapshot found it, for ever.
    dsn = cdc_db.dsn
    _run(
        dsn,
        "CREATE TABLE animals (id int PRIMARY KEY, name text)",
        "CREATE TABLE dogs (breed text) INHERITS (animals)",
        "INSERT INTO animals VALUES (1, 'generic')",
        "INSERT INTO dogs VALUES (2, 'rex', 'collie')",
        "CREATE TABLE plants (id int PRIMARY KEY, name text)",
        "INSERT INTO plants VALUES (1, 'fern')",
    )
    engine = _opened(tmp_path, cdc_db, "animals")
    try:
        with pytest.raises(SourceError, match="public.animals has inheritance children"):
            cdc.setup(engine, "pg")
        # A first capture without setup is refused alike, before any Run: it
        # failed its Run (exit 1, as if a retry could help), which `combined
        # check` had passed.
        with pytest.raises(
            ConfigError, match=r"public.animals has inheritance children \(public.dogs\)"
        ) as caught:
            engine.capture()
        assert "strategy snapshot or cursor" in (caught.value.hint or "")
        assert engine.runs() == []
    finally:
        engine.close()

    # A table that gains a child after setup fails its next capture.
    engine = _opened(tmp_path, cdc_db, "plants")
    try:
        run = _set_up_then(
            engine,
            dsn,
            "CREATE TABLE trees (height int) INHERITS (plants)",
            "INSERT INTO trees VALUES (2, 'oak', 30)",
        )
        assert run.state == "failed"
        assert "gained inheritance children since the last capture (public.trees)" in (
            run.error or ""
        )
    finally:
        engine.close()


def test_a_column_added_to_a_partitioned_table_is_filled_in_every_partition(
    project: tuple[Path, str, str],
) -> None:
    """Every partition's rows get the added column's value (issue 23, #26).

    Reproduction: after ``ALTER TABLE m ADD COLUMN flag boolean NOT NULL
    DEFAULT false`` and an update of one row, the capture of the partitioned
    table ``m`` published NULL in ``flag`` on the 99 other rows (only a
    plain table was filled) and reconciliation reported ``not_null_violations
    {"flag": 99}``. The partition attached with its columns in another order
    (``m_as``) and the sub-partitioned one (``m_af``) are filled too.
    """
    from combined.catalog import data as cat

    root, dsn, _ = project
    engine = Engine.open(root / "combined.yaml")
    try:
        _captured(engine, dsn)
        _run(
            dsn,
            "ALTER TABLE m ADD COLUMN flag boolean NOT NULL DEFAULT false",
            "ALTER TABLE m ADD COLUMN x int DEFAULT 5",
            "UPDATE m SET qty = -1, x = NULL WHERE id = 1",
            "INSERT INTO m VALUES (101, 'as', 1, 'new', true, 6)",
        )
        _captured(engine, dsn)
        query = "SELECT id, region, flag, x FROM {} ORDER BY id, region"
        lake = [tuple(r.values()) for r in engine.sql(query.format("pg.m")).to_pylist()]
        with psycopg.connect(dsn) as conn:
            assert lake == list(conn.execute(query.format("m")))
        with engine.catalog.begin() as conn:
            assert not cat.activity(conn, kind="alert.reconciliation_failed")
            (event, *_) = cat.activity(conn, kind="reconciliation", exact=True)
        assert event.body["filled_nulls"] == {
            "flag": {"source": 0, "lake": 0},
            "x": {"source": 1, "lake": 1},
        }
    finally:
        engine.close()
