"""``combined maintain`` and compaction triggered by captures, on a local and an S3 lake.

(A compaction, a vacuum and the raw layer's retention on a ``gs://`` lake too.)

Before maintenance existed, nothing compacted or vacuumed a table (300
captures left 300 files), the raw layer only grew, and a query of a
publication whose files were vacuumed exited 70 ("this is a bug").
"""

from __future__ import annotations

import json
import shutil
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from tests.conftest import ON_EVERY_STORE

from combined.engine import Engine
from combined.errors import LakeError
from combined.lake._maintain import file_count, reading_version
from combined.lake._table import LakeTable

CLICKS = "      clicks:\n        sync_mode: append\n      people:\n        key: [id]\n"


def _project(root: Path, tools: Any, lake_url: str, extra: str = "", top: str = "") -> Path:
    tools.make(root)
    project = root / "combined.yaml"
    text = project.read_text().replace("lake: ./lake", f"lake: {lake_url}\n{top}".rstrip())
    project.write_text(text + CLICKS + extra)
    tools.sql(
        root,
        "CREATE TABLE clicks (page TEXT, n INTEGER);"
        "CREATE TABLE people (id INTEGER PRIMARY KEY, name TEXT);"
        "INSERT INTO people VALUES (1, 'a'), (2, 'b');",
    )
    return project


def _capture(engine: Engine, tools: Any, root: Path, i: int) -> str:
    """One small capture of clicks (a row more) and people (a row changed); its publication."""
    tools.sql(
        root,
        f"INSERT INTO clicks VALUES ('p{i}', {i}); UPDATE people SET name = 'n{i}' WHERE id = 1;",
    )
    (run,) = engine.capture(["shop.clicks", "shop.people"])
    assert run.state == "succeeded", run.error
    return str(engine.publications(1)[0]["id"])


def _deliveries(engine: Engine, dataset: str) -> list[Any]:
    from combined.catalog import data as cat

    with engine.catalog.begin() as conn:
        return cat.deliveries(conn, source="shop", dataset=dataset)


#: (A snapshot append keeps every capture's rows: count the pages, not the rows.)
_COUNT = "SELECT count(DISTINCT page) AS n, max(n) AS top FROM shop.clicks"


def _count(engine: Engine, **kw: Any) -> dict[str, Any]:
    (row,) = engine.sql(_COUNT, **kw).to_pylist()
    return dict(row)


@ON_EVERY_STORE
def test_maintain_compacts_and_vacuums_what_no_kept_publication_reads(
    tmp_path: Path, tools: Any, lake_url: str
) -> None:
    project = _project(tmp_path, tools, lake_url, top="retention: {publications: 2s}")
    engine = Engine.open(project)
    try:
        old = [_capture(engine, tools, tmp_path, i) for i in range(1, 6)]
        answers = {p: _count(engine, publication=p) for p in old}
        assert answers[old[2]] == {"n": 3, "top": 3}
        clicks = engine.layout.dataset_table("shop", "clicks")
        assert file_count(clicks) == 5
        (c, p) = engine.maintain(["shop.clicks", "shop.people"])
        # compacted; the newest publication reads every small file, so they stay
        assert (c["compacted"], c["vacuumed"]) == (5, 0), c
        assert file_count(clicks) == 1
        between = datetime.now(UTC)
        newest = _capture(engine, tools, tmp_path, 6)
        answers[newest] = _count(engine, publication=newest)
        # as of 2.5 s from now, every publication but the newest is past the retention
        later = datetime.now(UTC) + timedelta(seconds=2.5)
        (c, p) = engine.maintain(["shop.clicks", "shop.people"], now=later)
        assert c["compacted"] == 2 and c["vacuumed"] == 5, c  # the five small files
        assert p["vacuumed"] >= 1, p  # files the merges replaced
        # the newest publication reads the compacted version: the same rows
        assert _count(engine) == answers[newest] == {"n": 6, "top": 6}
        published = engine.publications(1)[0]["member_rows"]
        version = {m["dataset"]: m["lake_version"] for m in published}["clicks"]
        assert reading_version(clicks, version) > version
        # a publication older than the retention: a clear error naming it, exit 2
        out = tools.cli(tmp_path, "sql", _COUNT, "--publication", old[0])
        assert out.returncode == 2, out.stderr
        assert "retention.publications: 2s (retention)" in out.stderr
        assert "combined maintain" in out.stderr and old[0] in out.stderr
        # (its clicks are still read through their compaction; its people are gone)
        assert _count(engine, as_of=between) == answers[old[4]]
        people = "SELECT count(*) AS n FROM shop.people"
        out = tools.cli(tmp_path, "sql", people, "--as-of", between.isoformat())
        assert out.returncode == 2 and "retention.publications" in out.stderr, out.stderr
        kinds = [a["kind"] for a in engine.activity(kind="maintenance")]
        assert "maintenance.vacuumed" in kinds and "maintenance.compacted" in kinds
        # a second maintenance has nothing left to do, and changes no answer
        (c, p) = engine.maintain(["shop.clicks", "shop.people"], now=later)
        assert (c["compacted"], c["vacuumed"], p["compacted"]) == (0, 0, 0)
        assert _count(engine) == answers[newest]
        tools.sql(tmp_path, "INSERT INTO clicks VALUES ('late', 7);")
        (run,) = engine.capture(["shop.clicks"])  # a capture goes on after maintenance
        assert run.state == "succeeded", run.error
        assert _count(engine) == {"n": 7, "top": 7}
    finally:
        engine.close()


def test_by_default_every_publication_stays_readable(
    tmp_path: Path, tools: Any, lake_url: str
) -> None:
    """The default retention keeps every publication: maintain only compacts."""
    engine = Engine.open(_project(tmp_path, tools, lake_url))
    try:
        pubs = [_capture(engine, tools, tmp_path, i) for i in range(1, 5)]
        answers = [_count(engine, publication=p) for p in pubs]
        (c,) = engine.maintain(["shop.clicks"])
        assert c["compacted"] == 4 and c["raw_removed"] == 0
        assert [_count(engine, publication=p) for p in pubs] == answers
        # every dataset, and the ledger
        *_, ledger = engine.maintain()
        # (four publications and four ended Runs: a file each)
        assert ledger["dataset"] == "_combined (ledger)" and ledger["compacted"] == 8
        from combined.lake._ledger import Ledger

        assert [r["id"] for r in Ledger(engine.layout).records()] == pubs
    finally:
        engine.close()


def test_a_vacuum_outside_combined_is_a_clear_error(
    tmp_path: Path, tools: Any, lake_url: str
) -> None:
    engine = Engine.open(_project(tmp_path, tools, lake_url))
    try:
        first = _capture(engine, tools, tmp_path, 1)
        _capture(engine, tools, tmp_path, 2)
        table = engine.layout.dataset_table("shop", "people")
        table.delta().vacuum(retention_hours=0, dry_run=False, enforce_retention_duration=False)
    finally:
        engine.close()
    out = tools.cli(tmp_path, "sql", "SELECT * FROM shop.people", "--publication", first)
    assert out.returncode == 2, out.stderr
    assert "removed outside Combined" in out.stderr and "internal error" not in out.stderr


@pytest.mark.parametrize("lake_url", ["local"], indirect=True)
def test_a_table_deleted_outside_combined_is_a_clear_error(
    tmp_path: Path, tools: Any, lake_url: str
) -> None:
    """The lake's directory (or one table's) removed by hand, the catalog kept: a query
    of what it published failed with an internal error (an assertion: no schema)."""
    engine = Engine.open(_project(tmp_path, tools, lake_url))
    try:
        _capture(engine, tools, tmp_path, 1)
    finally:
        engine.close()
    shutil.rmtree(tmp_path / "lake" / "shop" / "people")
    out = tools.cli(tmp_path, "sql", "SELECT * FROM shop.people")
    assert out.returncode == 2, out.stderr
    assert "directory deleted" in out.stderr and "internal error" not in out.stderr


@ON_EVERY_STORE
def test_raw_deliveries_past_retention_are_removed_by_a_recorded_decision(
    tmp_path: Path, tools: Any, lake_url: str
) -> None:
    extra = "        retention: {raw: 1s}\n"  # on people only
    engine = Engine.open(_project(tmp_path, tools, lake_url, extra))
    try:
        for i in range(1, 4):
            _capture(engine, tools, tmp_path, i)
        store = engine.layout.store
        paths = {d: [r.path for r in _deliveries(engine, d)] for d in ("clicks", "people")}
        assert all(store.exists(p) for ps in paths.values() for p in ps) and paths["people"]
        later = datetime.now(UTC) + timedelta(seconds=1.2)  # past the 1 s retention as of it
        (c, p) = engine.maintain(["shop.clicks", "shop.people"], now=later)
        assert c["raw_removed"] == 0 and p["raw_removed"] == len(paths["people"])
        assert not any(store.exists(x) for x in paths["people"])
        assert all(store.exists(x) for x in paths["clicks"])  # forever, by default
        (event,) = engine.activity(kind="maintenance.raw_removed")
        assert event["dataset"] == "people"
        assert event["body"]["policy"] == (
            "retention.raw: 1s (sources.shop.datasets.people.retention)"
        )
        assert len(event["body"]["deliveries"]) == len(paths["people"])
        assert {r.state for r in _deliveries(engine, "people")} == {"expired"}
        # the table's rows are untouched; nothing is decided twice
        assert engine.sql("SELECT count(*) AS n FROM shop.people").to_pylist() == [{"n": 2}]
        # every Delivery gone: explain said a published row was "never captured"
        told = engine.explain("shop.people", ["1"])
        assert (told.status, told.versions, len(told.current)) == ("present", [], 1), told
        assert f"{len(paths['people'])} earlier Deliveries" in told.reason
        assert engine.explain("shop.people", ["99"]).status == "never"
        engine.maintain(["shop.people"], now=later)
        assert len(engine.activity(kind="maintenance.raw_removed")) == 1
    finally:
        engine.close()


def test_maintain_leaves_a_dataset_whose_run_died_after_its_lake_commit(
    tmp_path: Path, tools: Any
) -> None:
    """A capture killed after its lake commit, then maintain: compaction and vacuum took
    the table's files that complete the commit's raw layer, and with the run's staging
    lost (a worker's disk) every later capture of the dataset failed for good (found by
    an object-store review)."""
    project = _project(tmp_path, tools, "./lake", top="retention: {publications: 1s}")
    engine = Engine.open(project)
    try:
        for i in range(1, 4):
            _capture(engine, tools, tmp_path, i)
    finally:
        engine.close()
    tools.sql(tmp_path, "INSERT INTO clicks VALUES ('late', 9)")
    killed = tools.cli(tmp_path, "capture", "shop.clicks", env={"COMBINED_FAULT": "after_commit"})
    assert killed.returncode != 0
    engine = Engine.open(project)
    try:
        later = datetime.now(UTC) + timedelta(seconds=2)
        (report,) = engine.maintain(["shop.clicks"], now=later)
        assert "has not ended" in report["skipped"] and "combined repair" in report["skipped"]
        shutil.rmtree(engine.layout.staging_area())  # the worker's disk, lost
        (run,) = engine.capture(["shop.clicks"])
        assert run.state == "succeeded", run.error
        total = engine.sql("SELECT count(*) AS n, sum(n) AS s FROM shop.clicks").to_pylist()
        assert total == [{"n": 14, "s": 40}]  # (appends of 1, 2, 3, 4 and 4 rows: once each)
        (report,) = engine.maintain(["shop.clicks"], now=later)  # ended: maintained again
        assert "skipped" not in report and report["compacted"] > 0, report
    finally:
        engine.close()


def _failed_after_commit(engine: Engine, dataset: str, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A capture of ``dataset`` whose projection fails after its lake commit: its Run."""

    def store_hiccup(*args: Any, **kwargs: Any) -> None:
        raise OSError("the store failed while promoting the Deliveries")

    monkeypatch.setattr("combined.runtime._runner.project_commit", store_hiccup)
    (run,) = engine.capture([dataset])
    assert run.state == "failed", run.error
    monkeypatch.undo()
    return run


def test_maintain_projects_first_what_a_run_that_failed_after_its_commit_left(
    tmp_path: Path, tools: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Run whose projection failed after its lake commit ends `failed`, so the guard on
    Runs that have not ended let maintain compact and vacuum: the next capture, its
    staging lost, failed for good (found by a review of the guard)."""
    project = _project(tmp_path, tools, "./lake", top="retention: {publications: 1s}")
    engine = Engine.open(project)
    try:
        for i in range(1, 4):
            _capture(engine, tools, tmp_path, i)
        tools.sql(tmp_path, "INSERT INTO clicks VALUES ('late', 9)")
        _failed_after_commit(engine, "shop.clicks", monkeypatch)
        later = datetime.now(UTC) + timedelta(seconds=2)

        from combined.runtime._recover import catch_up

        def store_down(catalog: Any, layout: Any, source: str, name: str, *told: Any) -> Any:
            if name == "clicks":
                raise OSError("the store timed out reading the log")
            return catch_up(catalog, layout, source, name, *told)

        # any error stops the catch-up of this dataset alone (an OSError ended maintain)
        monkeypatch.setattr("combined.runtime._recover.catch_up", store_down)
        clicks, people = engine.maintain(["shop.clicks", "shop.people"], now=later)
        assert "could not be projected first" in clicks["skipped"], clicks
        assert clicks["not_projected"] is True
        assert "the store timed out reading the log" in clicks["skipped"], clicks
        assert "skipped" not in people and "projected" not in people, people
        monkeypatch.undo()
        (report,) = engine.maintain(["shop.clicks"], now=later)  # projected, then maintained
        assert "skipped" not in report and report["compacted"] > 0, report
        (told,) = report["projected"]
        assert told.startswith("shop.clicks: projected lake version"), told
        shutil.rmtree(engine.layout.staging_area())  # the worker's disk, lost
        (run,) = engine.capture(["shop.clicks"])
        assert run.state == "succeeded", run.error
        total = engine.sql("SELECT count(*) AS n, sum(n) AS s FROM shop.clicks").to_pylist()
        assert total == [{"n": 14, "s": 40}]
    finally:
        engine.close()


def test_maintain_on_a_lost_catalog_waits_for_repair(tmp_path: Path, tools: Any) -> None:
    """The catalog lost (or restored from an older backup): its vacuum kept only what the
    publications it knew read, and removed what every other publication of the lake read,
    whatever retention.publications said (found by a review)."""
    project = _project(tmp_path, tools, "./lake")
    engine = Engine.open(project)
    try:
        published = [_capture(engine, tools, tmp_path, i) for i in range(1, 4)]
        answers = {p: _count(engine, publication=p) for p in published}
    finally:
        engine.close()
    (tmp_path / ".combined" / "catalog.db").unlink()
    engine = Engine.open(project)
    try:
        (report,) = engine.maintain(["shop.clicks"], now=datetime.now(UTC) + timedelta(days=9))
        assert "combined repair" in report["skipped"], report
        engine.repair()
        assert {p: _count(engine, publication=p) for p in published} == answers
        (report,) = engine.maintain(["shop.clicks"])  # repaired: maintained
        assert "skipped" not in report, report
    finally:
        engine.close()


def _usage(engine: Engine) -> list[tuple[Any, ...]]:
    keys = ("dataset", "month", "mar", "inserts", "updates", "deletes")
    return sorted(tuple(u[k] for k in keys) for u in engine.usage())


def test_a_catalog_rebuilt_after_a_raw_retention_keeps_its_usage_and_captures_on(
    tmp_path: Path, tools: Any
) -> None:
    """`combined repair` of a lost catalog projected every lake commit from the raw layer,
    and failed on the Deliveries the retention had removed: the usage of the dataset was
    gone from the catalog, and every capture after failed the same way. (The decision
    names its files as commits do: a review found them named by path, which a lake
    restored elsewhere does not have.)"""
    extra = "        retention: {raw: 1s}\n"
    project = _project(tmp_path, tools, "./lake", extra)
    engine = Engine.open(project)
    try:
        for i in range(1, 4):
            _capture(engine, tools, tmp_path, i)
        usage = _usage(engine)
        expired = {r.id for r in _deliveries(engine, "people")}
        later = datetime.now(UTC) + timedelta(seconds=1.2)
        assert engine.maintain(["shop.people"], now=later)[0]["raw_removed"] == len(expired)
    finally:
        engine.close()
    # the project restored elsewhere (the lake at another path), without its catalog
    moved = tmp_path.parent / f"{tmp_path.name}-restored"
    shutil.move(tmp_path, moved)
    project = moved / "combined.yaml"
    (moved / ".combined" / "catalog.db").unlink()
    repaired = tools.cli(moved, "repair")
    assert repaired.returncode == 0, repaired.stderr
    assert "cannot be completed" not in repaired.stdout + repaired.stderr
    engine = Engine.open(project)
    try:
        assert _usage(engine) == usage and {u[0] for u in usage} == {"clicks", "people"}
        people = {r.id: r.state for r in _deliveries(engine, "people")}
        assert people == {d: "expired" for d in expired}
        _capture(engine, tools, moved, 4)
        rows = engine.sql("SELECT id, name FROM shop.people ORDER BY id").to_pylist()
        assert rows == [{"id": 1, "name": "n4"}, {"id": 2, "name": "b"}]
        # explain shows what the raw layer keeps, and says what it no longer does;
        # a replay, which needs every Delivery, says why it cannot
        told = engine.explain("shop.people", ["1"])
        assert told.status == "present" and [v.values["name"] for v in told.versions] == ["n4"]
        assert f"{len(expired)} earlier Deliveries" in told.reason
        with pytest.raises(LakeError, match="left the raw layer under its retention.raw"):
            engine.replay("shop.people")
    finally:
        engine.close()


def test_a_repair_that_cannot_bring_a_dataset_up_to_the_lake_exits_1(
    tmp_path: Path, tools: Any
) -> None:
    """It printed the dataset's failure and exited 0, as if the catalog matched the lake."""
    project = _project(tmp_path, tools, "./lake")
    engine = Engine.open(project)
    try:
        _capture(engine, tools, tmp_path, 1)
        tools.sql(tmp_path, "DELETE FROM people WHERE id = 2;")  # no table file holds it
        (run,) = engine.capture(["shop.people"])
        assert run.state == "succeeded", run.error
        lost = _deliveries(engine, "people")[-1]
    finally:
        engine.close()
    Path(lost.path).unlink()  # neither expired nor restorable: a file lost
    (tmp_path / ".combined" / "catalog.db").unlink()
    repaired = tools.cli(tmp_path, "repair")
    assert repaired.returncode == 1, repaired.stdout + repaired.stderr
    assert "shop.people: its lake commits could not be projected" in repaired.stdout


def test_a_capture_compacts_its_table_past_the_threshold(
    tmp_path: Path, tools: Any, lake_url: str
) -> None:
    top = "retention: {compact_files: 3}"
    engine = Engine.open(_project(tmp_path, tools, lake_url, top=top))
    try:
        pubs = [_capture(engine, tools, tmp_path, i) for i in range(1, 9)]
        clicks = engine.layout.dataset_table("shop", "clicks")
        assert file_count(clicks) <= 3
        # MAR's table took a file a capture (a click is a new row), each billing read them all
        usage = LakeTable(engine.layout.usage("shop", "clicks"), "", engine.layout.store)
        assert file_count(usage) <= 3
        events = engine.activity(kind="maintenance.compacted")
        assert events and all(e["body"]["trigger"] == "capture" for e in events)
        assert {e["body"]["table"] for e in events} == {"data", "usage"}
        assert events[0]["run_id"] is not None
        # billed as before: each click once
        (billed,) = [u for u in engine.usage() if u["dataset"] == "clicks"]
        assert (billed["mar"], billed["inserts"]) == (8, 8)
        # nothing vacuumed: every publication still answers as it did
        assert [_count(engine, publication=p)["n"] for p in pubs] == list(range(1, 9))
    finally:
        engine.close()


def test_captures_compact_the_ledger_at_one_publication_in_so_many(
    tmp_path: Path, tools: Any, monkeypatch: Any
) -> None:
    # A Run and a publication record each capture, a file each: never compacted before.
    from combined.lake._ledger import Ledger
    from combined.runtime import _compaction

    monkeypatch.setattr(_compaction, "DEFAULT_COMPACT_FILES", 2)
    monkeypatch.setattr(_compaction, "LEDGER_EVERY", 2)
    engine = Engine.open(_project(tmp_path, tools, "./lake"))
    try:
        for i in range(1, 6):
            _capture(engine, tools, tmp_path, i)
        runs = Ledger(engine.layout).table("runs")
        assert file_count(runs) <= 3  # five records; compacted at publications 2 and 4
        events = engine.activity(kind="maintenance.compacted")
        assert {e["body"]["table"] for e in events} >= {"ledger runs", "ledger publications"}
        assert len(Ledger(engine.layout).runs()) == 5
    finally:
        engine.close()


def test_maintain_compacts_the_usage_tables_and_prints_json(
    tmp_path: Path, tools: Any, lake_url: str
) -> None:
    engine = Engine.open(_project(tmp_path, tools, lake_url))
    try:
        for i in range(1, 5):
            _capture(engine, tools, tmp_path, i)
        billed = engine.usage()
    finally:
        engine.close()
    out = tools.cli(tmp_path, "maintain", "shop.people", "--json")
    assert out.returncode == 0, out.stderr
    (report,) = json.loads(out.stdout)
    assert report["dataset"] == "shop.people" and report["usage_compacted"] >= 2
    engine = Engine.open(tmp_path / "combined.yaml")
    try:
        assert engine.usage() == billed
        tools.sql(tmp_path, "INSERT INTO people VALUES (3, 'c');")
        (run,) = engine.capture(["shop.people"])
        assert run.state == "succeeded", run.error
        (usage,) = [u for u in engine.usage() if u["dataset"] == "people"]
        assert usage["inserts"] == 3
    finally:
        engine.close()


def test_a_bad_retention_is_refused(tmp_path: Path, tools: Any) -> None:
    _project(tmp_path, tools, "./lake", top="retention: {publications: soon}")
    out = tools.cli(tmp_path, "maintain")
    assert out.returncode == 2
    assert "retention.publications must be a duration or forever" in out.stderr


def test_a_capture_meeting_a_maintenance_says_so(tmp_path: Path, tools: Any) -> None:
    """It said the dataset "is being captured by run maintain:...", and to run `combined
    repair` if that run died: maintenance is no Run, and repair was the wrong advice."""
    engine = Engine.open(_project(tmp_path, tools, "./lake"))
    try:
        _capture(engine, tools, tmp_path, 1)
        assert engine.catalog.acquire_lease("shop", "people", "maintain:a12674232a6e")
        (run,) = engine.capture(["shop.people"])
        assert run.state == "failed"
        assert run.error is not None and "shop.people is being maintained" in run.error
        assert "repair" not in run.error
    finally:
        engine.close()


def test_a_retention_record_of_the_first_form_is_read(tmp_path: Path) -> None:
    """The first records named the expired files by path; reading them raised KeyError
    in repair, explain and replay (found by review)."""
    from combined.lake import LakeLayout
    from combined.lake._ledger import Ledger

    ledger = Ledger(LakeLayout(tmp_path / "lake"))
    ledger._append("expired", "shop.people", {"key": "shop.people", "paths": ["/x/y/a.parquet"]})
    ledger.expiry("shop", "people", ["b.parquet"], policy="retention.raw: 1s")
    assert ledger.expired("shop", "people") == {"a.parquet", "b.parquet"}
    assert ledger.expired("shop", "clicks") == set()


def test_maintain_exits_1_when_a_datasets_commits_cannot_be_projected(
    tmp_path: Path, tools: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A dataset left unmaintained for an error (its lake commits cannot be projected:
    a Run failed after its commit, its Deliveries then lost) exited 0 like a quiet
    success, a cron's check of the status none the wiser (found by a review)."""
    from typer.testing import CliRunner

    from combined.cli import app

    project = _project(tmp_path, tools, "./lake")
    engine = Engine.open(project)
    try:
        _capture(engine, tools, tmp_path, 1)
        tools.sql(tmp_path, "DELETE FROM people WHERE id = 2;")  # a merge: no table file holds it
        run = _failed_after_commit(engine, "shop.people", monkeypatch)
    finally:
        engine.close()
    staged = tmp_path / "lake" / "_staging" / run.id / "shop" / "people" / "deliveries"
    for lost in staged.iterdir():  # the machine's disk, and the raw layer's copies, lost
        (tmp_path / "lake" / "_deliveries" / "shop" / "people" / lost.name).unlink()
        lost.unlink()
    monkeypatch.chdir(tmp_path)
    for args in (["maintain", "shop"], ["maintain", "shop", "--json"]):
        maintained = CliRunner().invoke(app, args)
        assert maintained.exit_code == 1, maintained.output
        assert "could not be projected first" in " ".join(maintained.output.split())
