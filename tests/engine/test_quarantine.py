"""Quarantine review: overdue alerts and the recorded decisions that close an entry."""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
import sqlalchemy as sa

from combined.catalog import _schema as t
from combined.catalog import data as cat
from combined.engine import Engine
from combined.errors import ConfigError, LakeError, NotFoundError, ProtocolViolation
from combined.protocol import utcnow
from combined.runtime._notify import summary


def _with_duplicates(
    tmp_path: Path, tools: Any, reader: str = "data-oncall", catalog: str | None = None
) -> Path:
    if catalog is None:
        tools.make(tmp_path)
    else:
        tools.make(tmp_path, catalog=catalog)
    tools.sql(
        tmp_path,
        "CREATE TABLE people (id INTEGER, name TEXT);"
        "INSERT INTO people VALUES (1, 'a'), (2, 'b'), (2, 'c'), (3, 'd'), (4, 'e'), (4, 'f');",
    )
    project = tmp_path / "combined.yaml"
    project.write_text(
        project.read_text()
        + "      people:\n        key: [id]\n"
        + f"        quarantine: {{reader: {reader}, review_every: 2d}}\n"
    )
    return project


@pytest.fixture(params=["sqlite", "postgresql"])
def quarantined(
    request: pytest.FixtureRequest, tmp_path: Path, tools: Any
) -> Iterator[tuple[Engine, str]]:
    # both catalogs: the review's compare-and-set compares timestamps for equality
    catalog = request.getfixturevalue("pg_database") if request.param == "postgresql" else None
    engine = Engine.open(_with_duplicates(tmp_path, tools, catalog=catalog))
    try:
        (run,) = engine.capture(["shop.people"])
        assert run.state == "needs_review", run.error
        (entry,) = engine.quarantine()
        yield engine, entry["id"]
    finally:
        engine.close()


def _events(engine: Engine, kind: str) -> list[Any]:
    with engine.catalog.begin() as conn:
        return cat.activity(conn, kind=kind)


def test_an_entry_names_its_reader_and_due_date_and_shows_its_records(
    quarantined: tuple[Engine, str],
) -> None:
    engine, qid = quarantined
    (entry,) = engine.quarantine()
    assert entry["reader"] == "data-oncall" and entry["record_count"] == 4
    assert entry["decision"] is None and not entry["overdue"]
    due = entry["review_due_at"] - entry["created_at"]
    assert abs(due - timedelta(days=2)) < timedelta(seconds=5)
    q, rows = engine.quarantine_records(qid, limit=3)
    assert q["id"] == qid and rows.num_rows == 3
    _, every = engine.quarantine_records(qid, limit=0)
    assert sorted(every.column("name").to_pylist()) == ["b", "c", "e", "f"]
    with pytest.raises(ConfigError, match="--limit"):
        engine.quarantine_records(qid, limit=-1)
    # read a row group at a time, never the whole file: the limit holds across groups
    path = Path(q["path"])
    pq.write_table(pq.read_table(path), path, row_group_size=1)
    _, first = engine.quarantine_records(qid, limit=3)
    assert first.num_rows == 3 and first.schema == every.schema


def test_release_keeps_the_records_and_a_later_discard_deletes_them_both_recorded(
    quarantined: tuple[Engine, str],
) -> None:
    engine, qid = quarantined
    path = Path(engine.quarantine()[0]["path"])
    released = engine.decide_quarantine(qid, "released", by="ana", reason="source fixed")
    assert (released["decision"], released["decided_by"]) == ("released", "ana")
    assert path.exists()  # evidence kept
    assert engine.quarantine() == []  # nothing awaits review
    assert [q["id"] for q in engine.quarantine(include_decided=True)] == [qid]
    with pytest.raises(ProtocolViolation, match="already released by ana"):
        engine.decide_quarantine(qid, "released", by="bo", reason="again")

    discarded = engine.decide_quarantine(qid, "discarded", by="bo", reason="not needed")
    assert discarded["decision"] == "discarded" and not path.exists()
    (rel,) = _events(engine, "quarantine.released")
    (dis,) = _events(engine, "quarantine.discarded")
    assert rel.body["reason"] == "source fixed" and rel.body["previous"] is None
    assert (dis.body["by"], dis.body["reason"], dis.body["previous"]) == (
        "bo",
        "not needed",
        "released",
    )
    assert dis.body["records"] == 4 and dis.dataset == "people"
    with pytest.raises(ProtocolViolation, match="already discarded by bo"):
        engine.decide_quarantine(qid, "discarded", by="bo", reason="twice")
    with pytest.raises(ProtocolViolation, match="records are gone"):
        engine.quarantine_records(qid)


def test_a_reviewer_name_holding_a_credential_is_kept_masked(
    quarantined: tuple[Engine, str],
) -> None:
    """The Activity event masked a credential pasted into ``--by``, but the entry's
    ``decided_by`` (the catalog, the lake's ledger, `quarantine list`) kept it as typed."""
    engine, qid = quarantined
    by = "ana password=Qu4r-S3cret-77"
    released = engine.decide_quarantine(qid, "released", by=by, reason="source fixed")
    lake = Path(engine.layout.store.root)
    kept = [p for p in lake.rglob("*") if p.is_file() and b"Qu4r-S3cret" in p.read_bytes()]
    assert kept == []  # (the lake's ledger holds the entry's decision)
    assert released["decided_by"] == "ana password=***"
    (event,) = _events(engine, "quarantine.released")
    assert event.body["by"] == "ana password=***"


def test_a_decision_needs_a_known_entry_a_name_and_a_reason(
    quarantined: tuple[Engine, str],
) -> None:
    engine, qid = quarantined
    with pytest.raises(NotFoundError, match="no quarantine entry"):
        engine.decide_quarantine("q-nope", "discarded", by="ana", reason="x")
    for by, reason in (("", "x"), ("ana", "  ")):
        with pytest.raises(ConfigError, match="who took it and why"):
            engine.decide_quarantine(qid, "discarded", by=by, reason=reason)
    with pytest.raises(ConfigError, match="released, discarded"):
        engine.decide_quarantine(qid, "deleted", by="ana", reason="x")
    assert Path(engine.quarantine()[0]["path"]).exists()  # nothing was decided
    assert _events(engine, "quarantine.discarded") == []


def test_an_entry_naming_a_file_outside_its_area_is_never_deleted(
    quarantined: tuple[Engine, str], tmp_path: Path
) -> None:
    engine, qid = quarantined
    victim = tmp_path / "combined.yaml"
    with engine.catalog.begin() as conn:
        conn.execute(
            sa.update(t.quarantine).where(t.quarantine.c.id == qid).values(path=str(victim))
        )
    with pytest.raises(LakeError, match="outside its quarantine area"):
        engine.decide_quarantine(qid, "discarded", by="ana", reason="x")
    assert victim.exists()
    assert engine.quarantine()[0]["decision"] is None


def test_an_overdue_entry_alerts_once_a_review_period(quarantined: tuple[Engine, str]) -> None:
    engine, qid = quarantined
    assert engine.remind_quarantine() == []  # not due yet
    later = utcnow() + timedelta(days=3)
    (note,) = engine.remind_quarantine(later)
    assert qid in note and "data-oncall" in note
    assert engine.remind_quarantine(later) == []  # once per period
    assert engine.remind_quarantine(later + timedelta(days=1)) == []
    assert len(engine.remind_quarantine(later + timedelta(days=2))) == 1  # the next period
    alerts = _events(engine, "alert.quarantine_overdue")
    assert len(alerts) == 2 and alerts[0].body["quarantine"] == qid
    # the one line a Slack target reads names who is to review what, since when
    told = summary(alerts[0])
    assert f"quarantine {qid} (4 records) awaits review by data-oncall since" in told, told
    engine.decide_quarantine(qid, "released", by="ana", reason="reviewed")
    assert engine.remind_quarantine(later + timedelta(days=30)) == []  # decided: quiet


def test_a_capture_raises_the_overdue_alert(quarantined: tuple[Engine, str]) -> None:
    engine, qid = quarantined
    with engine.catalog.begin() as conn:
        conn.execute(
            sa.update(t.quarantine)
            .where(t.quarantine.c.id == qid)
            .values(review_due_at=utcnow() - timedelta(hours=1))
        )
    assert engine.quarantine()[0]["overdue"]
    (run,) = engine.capture(["shop.orders"])
    assert run.state == "succeeded", run.error
    (alert,) = _events(engine, "alert.quarantine_overdue")
    assert alert.body["quarantine"] == qid and alert.body["reader"] == "data-oncall"


def test_the_cli_lists_shows_and_decides(tmp_path: Path, tools: Any) -> None:
    _with_duplicates(tmp_path, tools)

    def cli(*args: str) -> Any:
        return tools.cli(tmp_path, *args, env={"COLUMNS": "250"})  # rich must not truncate

    assert cli("capture", "shop.people").returncode != 0
    listed = cli("quarantine", "list")
    assert listed.returncode == 0, listed.stderr
    assert "shop.people" in listed.stdout and "data-oncall" in listed.stdout
    engine = Engine.open(tmp_path / "combined.yaml")
    try:
        ((qid, path),) = [(q["id"], q["path"]) for q in engine.quarantine()]
    finally:
        engine.close()
    status = cli("status")
    assert "1 quarantine entry await review" in status.stdout, status.stdout
    shown = cli("quarantine", "show", qid, "--limit", "2")
    assert shown.returncode == 0, shown.stderr
    assert "first 2 of 4 records" in shown.stdout and "awaiting a decision" in shown.stdout
    # _combined_id as the 32 lowercase hex digits written everywhere, never b'...'
    assert "b'" not in shown.stdout and re.search(r"\b[0-9a-f]{32}\b", shown.stdout), shown.stdout
    refused = cli("quarantine", "discard", qid, "--reason", " ", "--by", "ana")
    assert refused.returncode == 2 and "who took it and why" in refused.stderr
    assert Path(path).exists()
    done = cli("quarantine", "discard", qid, "--reason", "dupes fixed")
    assert done.returncode == 0, done.stderr
    assert "discarded by" in done.stdout and not Path(path).exists()
    assert "nothing awaits review" in cli("quarantine", "list").stdout
    every = cli("quarantine", "list", "--all")
    assert "discarded by" in every.stdout
    missing = cli("quarantine", "show", "q-nope")
    assert missing.returncode == 2 and "no quarantine entry" in missing.stderr


def test_the_same_duplicates_are_held_once_while_their_entry_awaits_review(
    tmp_path: Path, tools: Any
) -> None:
    engine = Engine.open(_with_duplicates(tmp_path, tools))
    try:
        (first,) = engine.capture(["shop.people"])
        (entry,) = engine.quarantine()
        assert first.state == "needs_review"
        assert f"quarantine entry {entry['id']}" in (first.error or "")  # named where to look
        # the source still holds the same duplicates: a scheduled capture must not
        # add an entry (and a file, and a reminder) per run
        for _ in range(2):
            (again,) = engine.capture(["shop.people"])
            assert again.state == "needs_review"
            assert f"await review in quarantine entry {entry['id']}" in (again.error or "")
        assert [q["id"] for q in engine.quarantine()] == [entry["id"]]
        area = Path(engine.layout.quarantine("shop", "people"))
        assert [p.name for p in area.iterdir()] == [Path(entry["path"]).name]
        # other duplicates are other evidence: held in an entry of their own
        tools.sql(tmp_path, "INSERT INTO people VALUES (5, 'g'), (5, 'h');")
        (other,) = engine.capture(["shop.people"])
        assert other.state == "needs_review"
        assert len(engine.quarantine()) == 2
        # once reviewed, the same rows seen again are new evidence for a new review
        for q in engine.quarantine():
            engine.decide_quarantine(q["id"], "released", by="ana", reason="seen")
        (later,) = engine.capture(["shop.people"])
        assert later.state == "needs_review"
        assert len(engine.quarantine()) == 1
    finally:
        engine.close()
