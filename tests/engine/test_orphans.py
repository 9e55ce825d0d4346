"""Orphans: files a writer killed before its commit left, found and removed by decision only.

Before ``combined maintain`` looked for them, a capture killed between its
data files and its log entry left them in the lake for ever (vacuum removes
only the files a commit removed), and nobody saw them: on an object store
they were paid for, month after month.
"""

from __future__ import annotations

import json
import os
import signal
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from tests.engine.test_maintenance import _capture, _project

from combined.engine import Engine
from combined.lake import LakeLayout

#: The lake on disk, on the S3 server, on Azurite and on the GCS emulator.
ON_STORES = pytest.mark.parametrize("lake_url", ["local", "s3", "az", "gs"], indirect=True)
#: What a maintenance judges as of: every file written by the test is 8 days old then.
LATER = timedelta(days=8, hours=1)


def _place(layout: LakeLayout, *parts: str, data: bytes = b"PAR1 not committed") -> str:
    """A file put in the lake by hand (as a writer that died before its commit would)."""
    store = layout.store
    location = store.join(*parts)
    if store.remote:
        with store.fs.open_output_stream(store.path(location)) as out:
            out.write(data)
    else:
        Path(location).parent.mkdir(parents=True, exist_ok=True)
        Path(location).write_bytes(data)
    return location


def _names(layout: LakeLayout, *parts: str) -> set[str]:
    """The names of the files directly in a lake directory."""
    import pyarrow.fs as pafs

    store = layout.store
    where = store.join(*parts)
    if not store.remote:
        return {p.name for p in Path(where).iterdir() if p.is_file()}
    found = store.fs.get_file_info(pafs.FileSelector(store.path(where), allow_not_found=True))
    return {f.base_name for f in found if f.type == pafs.FileType.File}


def _everything(layout: LakeLayout) -> set[str]:
    """Every file of people's table, raw layer and MAR table, by its place in the lake."""
    folders = [("shop",), ("_deliveries", "shop"), ("_usage", "shop")]
    return {f"{'/'.join(p)}/people/{n}" for p in folders for n in _names(layout, *p, "people")}


def _people(engine: Engine) -> Any:
    return engine.sql("SELECT id, name FROM shop.people ORDER BY id").to_pylist()


@pytest.mark.slow
@ON_STORES
@pytest.mark.parametrize("boundary", ["before_log", "after_commit"])
def test_a_killed_writers_files_are_reported_then_removed_by_decision_only(
    tmp_path: Path, tools: Any, lake_url: str, boundary: str
) -> None:
    project = _project(tmp_path, tools, lake_url)
    engine = Engine.open(project)
    try:
        _capture(engine, tools, tmp_path, 1)
        layout = engine.layout
        before = _names(layout, "shop", "people")
        raw_before = _names(layout, "_deliveries", "shop", "people")
    finally:
        engine.close()
    # a capture killed once its data files are in the table (before_log: its log entry
    # is not; after_commit: it is, the catalog has not heard of it)
    tools.sql(tmp_path, "UPDATE people SET name = 'killed' WHERE id = 2;")
    killed = tools.cli(tmp_path, "capture", "shop.people", env={"COMBINED_FAULT": boundary})
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    left = _names(layout, "shop", "people") - before
    assert left, "the killed capture wrote no data file"
    # a merge's Deliveries are put into the raw layer before its commit
    raw_left = _names(layout, "_deliveries", "shop", "people") - raw_before
    assert raw_left, "the killed merge put no Delivery into the raw layer"
    # and files that look like orphans, put by hand: raw layer, MAR table, quarantine
    raw = _place(layout, "_deliveries", "shop", "people", "000000099-lost.parquet")
    usage = _place(layout, "_usage", "shop", "people", "part-lost-c000.zstd.parquet")
    held = _place(layout, "_quarantine", "shop", "people", "q-held.parquet")
    later = datetime.now(UTC) + LATER

    engine = Engine.open(project)
    try:
        # the killed run has not ended: recovery may still need its files, the dataset is
        # not maintained at all (nor its orphans judged)
        (report,) = engine.maintain(["shop.people"], now=later)
        assert "orphans" not in report and "compacted" not in report, report
        assert "has not ended" in report["skipped"] and "combined repair" in report["skipped"]
        engine.repair()  # closes the killed run (after_commit: projects its commit)
        # before_log: the killed capture's files are orphans; after_commit: its commit names them
        killed_files = {layout.store.join("shop", "people", n) for n in left} | {
            layout.store.join("_deliveries", "shop", "people", n) for n in raw_left
        }
        expected = {raw, usage} | (killed_files if boundary == "before_log" else set())

        # without retention.orphans: reported and told, nothing removed
        (report,) = engine.maintain(["shop.people"], now=later)
        found = report["orphans"]
        assert (found["found"], found["removed"]) == (len(expected), 0), found
        assert found["setting"] == "retention.orphans: 8d"
        assert found["bytes"] > 0 and found["oldest"] is not None
        assert all(layout.store.exists(x) for x in expected)
        (told,) = engine.activity(kind="maintenance.orphans_found")
        assert told["dataset"] == "people" and told["body"]["count"] == found["found"]
        assert set(told["body"]["files"]) == {_short(layout, x) for x in expected}
        assert told["body"]["would_remove_with"] == "retention.orphans: 8d"
        assert told["body"]["policy"] == "retention.orphans: forever (default)"
        engine.maintain(["shop.people"], now=later)  # told once, not at every maintenance
        assert len(engine.activity(kind="maintenance.orphans_found")) == 1
        answer = _people(engine)
        kept = _everything(layout) - {_short(layout, x) for x in expected}
    finally:
        engine.close()

    # declared: the decision is recorded, then the files go
    project.write_text(project.read_text().replace("lake:", "retention: {orphans: 7d}\nlake:"))
    engine = Engine.open(project)
    try:
        (report,) = engine.maintain(["shop.people"], now=later)
        assert report["orphans"]["removed"] == found["found"], report
        (removed,) = engine.activity(kind="maintenance.orphans_removed")
        assert removed["body"]["policy"] == "retention.orphans: 7d (retention)"
        assert removed["body"]["count"] == found["found"]
        assert set(removed["body"]["files"]) == set(told["body"]["files"])
        assert not any(layout.store.exists(x) for x in expected)
        # never touched: quarantine, any other file, every recorded Delivery
        assert layout.store.exists(held)
        assert _everything(layout) == kept
        assert all(layout.store.exists(d.path) for d in _deliveries(engine))
        assert _people(engine) == answer
        # nothing left to decide; a capture goes on
        (report,) = engine.maintain(["shop.people"], now=later)
        assert (report["orphans"]["found"], report["orphans"]["removed"]) == (0, 0)
        _capture(engine, tools, tmp_path, 3)
        assert {"id": 2, "name": "killed"} in _people(engine)
    finally:
        engine.close()


def _short(layout: LakeLayout, location: str) -> str:
    return location[len(str(layout.store.root).rstrip("/")) + 1 :]


def _deliveries(engine: Engine) -> list[Any]:
    from combined.catalog import data as cat

    with engine.catalog.begin() as conn:
        return cat.deliveries(conn, source="shop", dataset="people")


def _age(path: Path, days: float) -> None:
    when = time.time() - days * 86_400
    os.utime(path, (when, when))


def test_younger_files_and_quarantine_are_never_removed(tmp_path: Path, tools: Any) -> None:
    """By the CLI, on disk: the grace is the files' own modification time."""
    extra = "        history: true\n"  # on people
    project = _project(tmp_path, tools, "./lake", extra, top="retention: {orphans: 2d}")
    engine = Engine.open(project)
    try:
        _capture(engine, tools, tmp_path, 1)
        layout = engine.layout
    finally:
        engine.close()
    committed = list((tmp_path / "lake" / "shop" / "people").glob("*.parquet"))
    for path in committed:
        _age(path, 30)  # a month-old committed file is no orphan
    old = Path(_place(layout, "shop", "people", "part-old-c000.zstd.parquet"))
    young = Path(_place(layout, "shop", "people", "part-young-c000.zstd.parquet"))
    history = Path(_place(layout, "_history", "shop", "people", "part-h-c000.zstd.parquet"))
    held = Path(_place(layout, "_quarantine", "shop", "people", "q.parquet"))
    hidden = Path(_place(layout, "shop", "people", ".DS_Store"))
    vector = Path(_place(layout, "shop", "people", "deletion_vector_0b9c.bin"))
    nested = Path(_place(layout, "shop", "people", "sub", "part-n-c000.zstd.parquet"))
    for path in (old, history, held, hidden, vector, nested):
        _age(path, 3)
    _age(young, 1.5)  # younger than the 2d grace

    out = tools.cli(tmp_path, "maintain", "shop.people", "--json")
    assert out.returncode == 0, out.stderr
    (report,) = json.loads(out.stdout)
    assert (report["orphans"]["found"], report["orphans"]["removed"]) == (2, 2), report
    assert not old.exists() and not history.exists()
    assert all(p.exists() for p in (young, held, hidden, vector, nested))
    assert committed and all(p.exists() for p in committed)
    out = tools.cli(tmp_path, "activity", "--kind", "maintenance", "--format", "json")
    (event,) = [e for e in json.loads(out.stdout) if e["kind"] == "maintenance.orphans_removed"]
    assert sorted(event["body"]["files"]) == [
        "_history/shop/people/part-h-c000.zstd.parquet",
        "shop/people/part-old-c000.zstd.parquet",
    ]
    assert event["body"]["policy"] == "retention.orphans: 2d (retention)"


def test_a_grace_under_a_day_is_refused(tmp_path: Path, tools: Any) -> None:
    _project(tmp_path, tools, "./lake", top="retention: {orphans: 1h}")
    out = tools.cli(tmp_path, "maintain")
    assert out.returncode == 2, out.stderr
    assert "retention.orphans must be at least 1d or forever" in out.stderr


def test_a_table_whose_log_lost_its_first_entries_is_not_judged(tmp_path: Path, tools: Any) -> None:
    """Another engine's log cleanup: what the lost entries named cannot be told."""
    project = _project(tmp_path, tools, "./lake", top="retention: {orphans: 1d}")
    engine = Engine.open(project)
    try:
        for i in range(1, 11):  # ten versions: a checkpoint at 9 the table loads from
            _capture(engine, tools, tmp_path, i)
        layout = engine.layout
        log = tmp_path / "lake" / "shop" / "people" / "_delta_log"
        assert (log / "00000000000000000009.checkpoint.parquet").exists()
        (log / f"{0:020d}.json").unlink()
        table = _place(layout, "shop", "people", "part-lost-c000.zstd.parquet")
        raw = _place(layout, "_deliveries", "shop", "people", "000000099-lost.parquet")
        # (the step alone: vacuum cannot load the versions publications keep either)
        from combined._orphans import orphans

        retention = engine.project.retention_of("shop", "people")
        later = datetime.now(UTC) + LATER
        found = orphans(engine.catalog, layout, "shop", "people", retention, later)
        assert (found["found"], found["removed"]) == (0, 0), found
        (note,) = found["not_judged"]
        assert note == (
            "shop/people: its Delta log starts at version 1; what it once named cannot be told"
        )
        assert Path(table).exists() and Path(raw).exists()
        assert not engine.activity(kind="maintenance.orphans_removed")
    finally:
        engine.close()


def test_files_of_a_table_whose_log_moved_on_while_judged_wait_for_the_next_maintain(
    tmp_path: Path, tools: Any
) -> None:
    """A writer outside the lease committed between the judgement and the removal."""
    from combined._orphans import _Judged, _remove, find

    project = _project(tmp_path, tools, "./lake", top="retention: {orphans: 1d}")
    engine = Engine.open(project)
    try:
        _capture(engine, tools, tmp_path, 1)
        layout = engine.layout
        lost = Path(_place(layout, "shop", "people", "part-lost-c000.zstd.parquet"))
        _age(lost, 2)
        retention = engine.project.retention_of("shop", "people")
        now = datetime.now(UTC)
        judged = _Judged(engine.catalog, layout, "shop", "people", retention, now - timedelta(1))
        finding = find(judged)
        assert [f.location for f, _, _ in finding.files] == [str(lost)]
        _capture(engine, tools, tmp_path, 2)  # the table's log moves on
        assert _remove(judged, finding) == 0 and lost.exists()
        assert not engine.activity(kind="maintenance.orphans_removed")
        (report,) = engine.maintain(["shop.people"])
        assert report["orphans"]["removed"] == 1 and not lost.exists()
    finally:
        engine.close()
