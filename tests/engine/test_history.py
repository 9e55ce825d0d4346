"""History mode (``history: true``, issue 22 item 5): every version of every row.

A real PostgreSQL source, real Delta tables. The history, read as of any
publication's instant, must equal what the projection was at that
publication; it must never hold a version twice, whatever crashed or was
retried; and it must show only what is published.
"""

from __future__ import annotations

import json
import signal
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest

from combined.engine import Engine
from combined.lake._history import history_table, maintain_history

SNAPSHOT = """\
version: 1
lake: ./lake
sources:
  pg:
    connector: postgres
    config:
      dsn: {dsn}
    datasets:
      items:
        relation: public.items
        key: [id]
        history: true
"""

CDC = """\
version: 1
lake: ./lake
sources:
  pg:
    connector: postgres
    config:
      dsn: {dsn}
      slot_prefix: {prefix}
    datasets:
      items:
        relation: public.items
        key: [id]
        strategy: cdc
        history: true
"""

ROWS = "SELECT id, qty, note FROM pg.items ORDER BY id"
AS_OF = (
    "SELECT id, qty, note FROM pg.items__history WHERE _combined_valid_from <= '{t}' "
    "AND (_combined_valid_to IS NULL OR _combined_valid_to > '{t}') ORDER BY id"
)
CHANGES = [
    "UPDATE items SET qty = qty + 100 WHERE id <= 5; DELETE FROM items WHERE id BETWEEN 30 AND 34;"
    "INSERT INTO items VALUES (101, 1, 'new'), (102, 2, 'new')",
    "UPDATE items SET note = 'again' WHERE id <= 2 OR id = 101; DELETE FROM items WHERE id = 102;"
    "INSERT INTO items VALUES (30, 30, 'back')",
    "DELETE FROM items WHERE id BETWEEN 40 AND 49; UPDATE items SET qty = 0 WHERE id = 3",
]


def _source(dsn: str, *statements: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for sql in statements:
            conn.execute(sql)


def _items(dsn: str) -> None:
    _source(
        dsn,
        "CREATE TABLE items (id bigint PRIMARY KEY, qty int, note text)",
        "INSERT INTO items SELECT g, g, 'n' || g FROM generate_series(1, 60) g",
    )


def _rows(engine: Engine, sql: str, **basis: Any) -> list[tuple[Any, ...]]:
    return [tuple(r.values()) for r in engine.sql(sql, **basis).to_pylist()]


def _capture(engine: Engine) -> datetime:
    """Capture; the instant of its publication."""
    (run,) = engine.capture()
    assert run.state == "succeeded", run.error
    newest = engine.publications(1)[0]
    assert newest["id"] == run.publication_id
    at: datetime = newest["published_at"]
    return at


def _past_1s() -> datetime:
    """Two seconds from now: as of it, every Delivery committed so far is past a
    ``retention: {raw: 1s}`` (maintained as of it, a test waits for no clock)."""
    return datetime.now(UTC) + timedelta(seconds=2)


def _versions(engine: Engine) -> list[dict[str, Any]]:
    versions: list[dict[str, Any]] = engine.sql(
        "SELECT id, qty, note, _combined_valid_from AS f, _combined_valid_to AS t, "
        "_combined_is_current AS c FROM pg.items__history ORDER BY id, f"
    ).to_pylist()
    return versions


def _check_history(engine: Engine, published: list[datetime], projections: list[Any]) -> None:
    """As of each publication's instant, the history is that publication's projection."""
    for at, rows in zip(published, projections, strict=True):
        assert _rows(engine, AS_OF.format(t=at.isoformat())) == rows
        assert _rows(engine, ROWS, as_of=at) == rows
    versions = _versions(engine)
    # one version per identity and commit; one open version per live identity
    assert not [k for k, n in Counter((v["id"], v["f"]) for v in versions).items() if n > 1]
    current = [(v["id"], v["qty"], v["note"]) for v in versions if v["c"]]
    assert current == projections[-1]
    assert all((v["t"] is None) == v["c"] for v in versions)
    for v in versions:  # a closed version ends when its successor (if any) begins
        assert v["t"] is None or v["t"] > v["f"]


def test_snapshot_history_keeps_every_version_and_reads_as_of_any_publication(
    tmp_path: Path, pg_database: str, lake_url: str
) -> None:
    _items(pg_database)
    text = SNAPSHOT.format(dsn=pg_database).replace("lake: ./lake", f"lake: {lake_url}")
    (tmp_path / "combined.yaml").write_text(text)
    engine = Engine.open(tmp_path / "combined.yaml")
    try:
        published, projections = [_capture(engine)], [_rows(engine, ROWS)]
        for change in CHANGES:
            _source(pg_database, change)
            published.append(_capture(engine))
            projections.append(_rows(engine, ROWS))
        _check_history(engine, published, projections)
        versions = _versions(engine)
        # id 30: inserted, deleted by the second capture, inserted again by the third
        thirty = [v for v in versions if v["id"] == 30]
        assert [(v["note"], v["c"]) for v in thirty] == [("n30", False), ("back", True)]
        assert thirty[0]["t"] < thirty[1]["f"]
        # id 1: three versions, the first two closed when the next began
        one = [v for v in versions if v["id"] == 1]
        assert [(v["qty"], v["note"]) for v in one] == [(1, "n1"), (101, "n1"), (101, "again")]
        assert one[0]["t"] == one[1]["f"] and one[1]["t"] == one[2]["f"]
        # id 45: deleted by the last capture; its one version closed
        assert [(v["c"], v["t"] is not None) for v in versions if v["id"] == 45] == [(False, True)]
        # the history read at a publication shows only what that publication holds
        first = engine.sql(
            "SELECT count(*) AS n, bool_and(_combined_is_current) AS c FROM pg.items__history",
            as_of=published[0],
        ).to_pylist()
        assert first == [{"n": 60, "c": True}]
        # a repeated projection adds nothing
        before = history_table(engine.layout, "pg", "items").version()
        assert maintain_history(engine.layout, "pg", "items") == []
        assert history_table(engine.layout, "pg", "items").version() == before
        # compacted and vacuumed, it reads the same as of every publication
        (report,) = engine.maintain(["pg.items"])
        assert {"history_compacted", "history_vacuumed"} <= set(report), report
        _check_history(engine, published, projections)
    finally:
        engine.close()


def test_cdc_history_follows_the_change_stream(tmp_path: Path, cdc_db: Any) -> None:
    _items(cdc_db.dsn)
    cdc_db.slot("public.items")
    (tmp_path / "combined.yaml").write_text(CDC.format(dsn=cdc_db.dsn, prefix=cdc_db.prefix))
    engine = Engine.open(tmp_path / "combined.yaml")
    try:
        published, projections = [_capture(engine)], [_rows(engine, ROWS)]
        for change in CHANGES:
            _source(cdc_db.dsn, change)
            published.append(_capture(engine))
            projections.append(_rows(engine, ROWS))
        _check_history(engine, published, projections)
        one = [v for v in _versions(engine) if v["id"] == 1]
        assert [(v["qty"], v["note"], v["c"]) for v in one] == [
            (1, "n1", False),
            (101, "n1", False),
            (101, "again", True),
        ]
    finally:
        engine.close()


def test_history_enabled_later_is_backfilled_from_the_raw_layer(
    tmp_path: Path, pg_database: str
) -> None:
    _items(pg_database)
    project = tmp_path / "combined.yaml"
    project.write_text(SNAPSHOT.format(dsn=pg_database).replace("        history: true\n", ""))
    engine = Engine.open(project)
    try:
        published, projections = [_capture(engine)], [_rows(engine, ROWS)]
        _source(pg_database, CHANGES[0])
        published.append(_capture(engine))
        projections.append(_rows(engine, ROWS))
        missing = engine_error(engine, "SELECT count(*) FROM pg.items__history")
        assert "history: true" in missing
    finally:
        engine.close()
    project.write_text(SNAPSHOT.format(dsn=pg_database))
    engine = Engine.open(project)
    try:
        _source(pg_database, CHANGES[1])
        published.append(_capture(engine))
        projections.append(_rows(engine, ROWS))
        _check_history(engine, published[1:], projections[1:])
        # the first capture's versions are there too, from its Deliveries
        assert _rows(engine, AS_OF.format(t=published[0].isoformat())) == projections[0]
    finally:
        engine.close()


def engine_error(engine: Engine, sql: str) -> str:
    from combined.errors import CombinedError

    try:
        engine.sql(sql)
    except CombinedError as exc:
        return exc.describe()
    raise AssertionError("the query ran")


def test_a_crash_between_the_commits_leaves_the_history_consistent(
    tmp_path: Path, pg_database: str, tools: Any
) -> None:
    """Killed after the lake commit (history not written), then after the history commit
    (catalog not projected): nothing published disagrees, and nothing lands twice."""
    _items(pg_database)
    (tmp_path / "combined.yaml").write_text(SNAPSHOT.format(dsn=pg_database))
    engine = Engine.open(tmp_path / "combined.yaml")
    try:
        published, projections = [_capture(engine)], [_rows(engine, ROWS)]
    finally:
        engine.close()
    for change, fault in zip(CHANGES[:2], ("after_commit", "after_history"), strict=True):
        _source(pg_database, change)
        killed = tools.cli(tmp_path, "capture", env={"COMBINED_FAULT": fault})
        assert killed.returncode == -signal.SIGKILL, killed.stdout + killed.stderr
        shown = tools.cli(tmp_path, "sql", "--format", "json", AS_OF.format(t="9999-01-01"))
        assert shown.returncode == 0, shown.stderr
        # still the last publication's history: the killed capture published nothing
        assert [tuple(r.values()) for r in json.loads(shown.stdout)] == projections[-1]
        engine = Engine.open(tmp_path / "combined.yaml")
        try:
            engine.repair()  # projects the killed capture's commit (and mirrors it once)
            published.append(_capture(engine))  # nothing changed since: publishes it
            projections.append(_rows(engine, ROWS))
        finally:
            engine.close()
    engine = Engine.open(tmp_path / "combined.yaml")
    try:
        _check_history(engine, published, projections)
        history = history_table(engine.layout, "pg", "items")
        # one history commit per lake commit with Deliveries, never two
        mirrored = [m["table_version"] for m in history.commits()]
        assert len(mirrored) == len(set(mirrored)) == 3
    finally:
        engine.close()


@pytest.mark.parametrize("sync_mode", ["incremental", "full_refresh"])
def test_history_follows_a_replacement_and_the_schemas_drift(
    tmp_path: Path, pg_database: str, sync_mode: str
) -> None:
    """A full refresh's unchanged rows add no version; an added column and a widened type
    reach the history, its earlier versions kept (null in the new column)."""
    _items(pg_database)
    text = SNAPSHOT.format(dsn=pg_database)
    (tmp_path / "combined.yaml").write_text(
        text.replace(
            "        history: true\n", f"        history: true\n        sync_mode: {sync_mode}\n"
        )
    )
    engine = Engine.open(tmp_path / "combined.yaml")
    try:
        published, projections = [_capture(engine)], [_rows(engine, ROWS)]
        for change in [
            CHANGES[0],
            "ALTER TABLE items ADD COLUMN extra text; UPDATE items SET extra = 'x' WHERE id = 8",
            "ALTER TABLE items ALTER COLUMN qty TYPE bigint; UPDATE items SET qty = 5000000000 "
            "WHERE id = 9; DELETE FROM items WHERE id = 10",
        ]:
            _source(pg_database, change)
            published.append(_capture(engine))
            projections.append(_rows(engine, ROWS))
        _check_history(engine, published, projections)
        versions = engine.sql(
            "SELECT id, qty, extra, _combined_is_current AS c FROM pg.items__history "
            "WHERE id IN (8, 9, 11) ORDER BY id, _combined_valid_from"
        ).to_pylist()
        assert [tuple(v.values()) for v in versions] == [
            (8, 8, None, False),
            (8, 8, "x", True),
            (9, 9, None, False),
            (9, 5_000_000_000, None, True),
            (11, 11, None, True),  # never changed: one version, whatever was replaced
        ]
    finally:
        engine.close()


def test_history_enabled_after_the_raw_layer_expired_starts_from_the_projection(
    tmp_path: Path, pg_database: str
) -> None:
    """The Deliveries are gone (``retention.raw``): the history starts from the rows the
    projection holds, each since its own acceptance, and goes on from the raw layer."""
    _items(pg_database)
    project = tmp_path / "combined.yaml"
    kept = "        retention: {raw: 1s}\n"
    project.write_text(SNAPSHOT.format(dsn=pg_database).replace("        history: true\n", kept))
    engine = Engine.open(project)
    try:
        published, projections = [_capture(engine)], [_rows(engine, ROWS)]
        _source(pg_database, CHANGES[0])
        published.append(_capture(engine))
        projections.append(_rows(engine, ROWS))
        (report,) = engine.maintain(["pg.items"], now=_past_1s())
        assert report["raw_removed"] == 2
    finally:
        engine.close()
    project.write_text(
        SNAPSHOT.format(dsn=pg_database).replace("history: true\n", "history: true\n" + kept)
    )
    engine = Engine.open(project)
    try:
        _source(pg_database, CHANGES[1])
        published.append(_capture(engine))
        projections.append(_rows(engine, ROWS))
        _check_history(engine, published[1:], projections[1:])
        # before the second capture, only the versions it left alone are known
        first = _rows(engine, AS_OF.format(t=published[0].isoformat()))
        assert first and set(first) < set(projections[0])
        assert (1, 1, "n1") not in first  # replaced by the second capture
    finally:
        engine.close()


def _restarts(engine: Engine) -> list[Any]:
    from combined.catalog import data as cat

    with engine.catalog.begin() as conn:
        return list(cat.activity(conn, kind="history.restarted"))


def _history_on(project: Path, dsn: str, on: bool, extra: str) -> None:
    text = SNAPSHOT.format(dsn=dsn)
    line = "        history: true\n"
    project.write_text(text.replace(line, (line if on else "") + extra))


def _halfway(earlier: datetime, later: datetime) -> datetime:
    assert earlier < later
    return earlier + (later - earlier) / 2


def _retention_between(engine: Engine, published: list[datetime]) -> tuple[datetime, str]:
    """An instant and a retention under which, as of that instant, the first three captures'
    Deliveries are past ``retention.raw`` and the fourth publication is the basis in force
    at the horizon of ``retention.publications`` (the fifth is newer than it).

    Read from the instants the catalog recorded, not waited for: a wait for the first
    horizon to pass put the next captures in a race with the second (load failed it).
    """
    from combined.catalog import data as cat
    from combined.config._values import format_duration

    with engine.catalog.begin() as conn:
        committed = [d.committed_at for d in cat.deliveries(conn, source="pg", dataset="items")]
    # a capture's Deliveries are committed before it publishes, after the previous one did
    third = max(c for c in committed if c <= published[2])
    fourth = min(c for c in committed if c > published[2])
    assert fourth < published[3]
    raw_horizon = _halfway(third, fourth)
    now = _halfway(published[3], published[4]) + timedelta(hours=1)
    kept = f"raw: {format_duration(now - raw_horizon)}, publications: 1h"
    return now, f"        retention: {{{kept}}}\n"


def test_history_enabled_after_the_old_versions_were_vacuumed_starts_from_a_readable_one(
    tmp_path: Path, pg_database: str
) -> None:
    """The newest commit whose Deliveries expired is old: `combined maintain` vacuumed its
    files. The history starts from the oldest version still readable after it."""
    from combined.lake._history import _in_raw_layer

    _items(pg_database)
    project = tmp_path / "combined.yaml"
    _history_on(project, pg_database, False, "")
    engine = Engine.open(project)
    try:
        published, projections = [_capture(engine)], [_rows(engine, ROWS)]
        for change in [
            *CHANGES[:2],
            "UPDATE items SET qty = 7 WHERE id <= 3",
            "UPDATE items SET note = 'five' WHERE id <= 3",
        ]:
            _source(pg_database, change)
            published.append(_capture(engine))
            projections.append(_rows(engine, ROWS))
        now, kept = _retention_between(engine, published)
    finally:
        engine.close()
    _history_on(project, pg_database, False, kept)
    engine = Engine.open(project)
    try:
        (report,) = engine.maintain(["pg.items"], now=now)
        assert report["raw_removed"] == 3 and report["vacuumed"], report
        table = engine.layout.dataset_table("pg", "items")
        third, fourth = [m for m in reversed(table.commits()) if m.get("deliveries")][2:4]
        assert not _in_raw_layer(engine.layout, "pg", "items", third)
        assert _in_raw_layer(engine.layout, "pg", "items", fourth)
        # the newest commit whose Deliveries are gone can no longer be read
        lost = table.files(int(third["lake_version"]))
        assert not all(engine.layout.store.exists(f) for f in lost)
    finally:
        engine.close()
    _history_on(project, pg_database, True, kept)
    engine = Engine.open(project)
    try:
        for _ in range(2):  # not stuck: every capture publishes
            _source(pg_database, "UPDATE items SET qty = qty + 1 WHERE id = 20")
            published.append(_capture(engine))
            projections.append(_rows(engine, ROWS))
        # started at the fourth commit (kept by its publication), then mirrored
        _check_history(engine, published[3:], projections[3:])
        seeded = [m for m in history_table(engine.layout, "pg", "items").commits()]
        assert [bool(m.get("seeded")) for m in seeded] == [False, False, False, True]
    finally:
        engine.close()


def test_history_off_then_on_after_raw_expiry_restarts_and_expiry_waits_for_it(
    tmp_path: Path, pg_database: str, tools: Any
) -> None:
    """History on, off, Deliveries expired, on again: the history restarts from the
    projection (told as Activity). While a commit is not mirrored, its Deliveries stay."""
    from combined.lake._history import _in_raw_layer

    _items(pg_database)
    project = tmp_path / "combined.yaml"
    kept = "        retention: {raw: 1s}\n"
    _history_on(project, pg_database, True, kept)
    engine = Engine.open(project)
    try:
        _capture(engine)
        _source(pg_database, CHANGES[0])
        _capture(engine)
    finally:
        engine.close()
    _history_on(project, pg_database, False, kept)
    engine = Engine.open(project)
    try:
        _source(pg_database, CHANGES[1])
        _capture(engine)
        (report,) = engine.maintain(["pg.items"], now=_past_1s())
        assert report["raw_removed"] == 3, report
    finally:
        engine.close()
    _history_on(project, pg_database, True, kept)
    engine = Engine.open(project)
    try:
        _source(pg_database, CHANGES[2])
        published, projections = [_capture(engine)], [_rows(engine, ROWS)]
        (event,) = _restarts(engine)
        assert event.body["restart"] and "retention.raw" in event.body["reason"]
        _check_history(engine, published, projections)
    finally:
        engine.close()
    # off again for one capture; on, killed after the lake commit: the history has still
    # to mirror both, and maintain keeps their Deliveries
    _history_on(project, pg_database, False, kept)
    engine = Engine.open(project)
    try:
        _source(pg_database, "UPDATE items SET qty = 800 WHERE id = 8")
        published.append(_capture(engine))
        projections.append(_rows(engine, ROWS))
        unmirrored = engine.layout.dataset_table("pg", "items").commits()[0]
    finally:
        engine.close()
    _history_on(project, pg_database, True, kept)
    _source(pg_database, "UPDATE items SET qty = 900 WHERE id = 9")
    killed = tools.cli(tmp_path, "capture", env={"COMBINED_FAULT": "after_commit"})
    assert killed.returncode == -signal.SIGKILL, killed.stdout + killed.stderr
    engine = Engine.open(project)
    try:
        (report,) = engine.maintain(["pg.items"], now=_past_1s())
        assert _in_raw_layer(engine.layout, "pg", "items", unmirrored), report
        engine.repair()
        published.append(_capture(engine))
        projections.append(_rows(engine, ROWS))
        _check_history(engine, published, projections)
        assert len(_restarts(engine)) == 1  # mirrored from the raw layer, not restarted
    finally:
        engine.close()
