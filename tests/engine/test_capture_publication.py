"""A capture of several sources is one publication: no reader sees half of it."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

from combined.catalog import data as cat
from combined.engine import Engine

SECOND = """\
  depot:
    connector: sqlite
    config:
      path: ./depot.db
    datasets:
      orders:
        key: [id]
"""


def _two_sources(root: Path, tools) -> Path:
    project: Path = tools.make(root)
    shutil.copy(root / "shop.db", root / "depot.db")
    project.write_text(project.read_text() + SECOND)
    return project


def test_a_capture_of_two_sources_publishes_them_in_one_publication(tmp_path: Path, tools) -> None:
    """Reproduction: `combined capture` of sources shop and depot made two publications,
    one per Run; `combined sql --as-of` an instant between them saw shop's new rows
    beside depot's old ones."""
    project = _two_sources(tmp_path, tools)
    engine = Engine.open(project)
    try:
        runs = engine.capture()
        assert [r.state for r in runs] == ["succeeded", "succeeded"], [r.error for r in runs]
        (pub,) = engine.publications(10)
        assert {r.publication_id for r in runs} == {pub["id"]}
        members = {(m["source"], m["dataset"]) for m in pub["member_rows"]}
        assert members == {("shop", "customers"), ("shop", "orders"), ("depot", "orders")}
        tools.sql(tmp_path, "UPDATE orders SET status = 'paid' WHERE id <= 10")
        shutil.copy(tmp_path / "shop.db", tmp_path / "depot.db")
        runs = engine.capture()
        assert len(engine.publications(10)) == 2
        paid = engine.sql(
            "SELECT (SELECT count(*) FROM shop.orders WHERE status = 'paid') AS shop, "
            "(SELECT count(*) FROM depot.orders WHERE status = 'paid') AS depot"
        ).to_pylist()
        assert paid == [{"shop": 10, "depot": 10}]
        with engine.catalog.begin() as conn:
            event = cat.activity(conn, kind="publication", limit=1)[0]
            changed = cat.activity(conn, kind="dataset.changed", limit=10)
        assert event.body["sources"] == ["depot", "shop"]
        assert event.body["runs"] == [r.id for r in runs] and event.body["withheld"] == []
        assert {(e.source, e.dataset) for e in changed[:2]} == {
            ("shop", "orders"),
            ("depot", "orders"),
        }
    finally:
        engine.close()


def test_a_capture_whose_one_source_fails_says_what_it_published(tmp_path: Path, tools) -> None:
    """Reproduction: with depot's table gone, `combined capture` published shop and ended
    exit 1 without saying that shop's rows were published and depot's were not."""
    _two_sources(tmp_path, tools)
    con = sqlite3.connect(tmp_path / "depot.db")
    con.execute("DROP TABLE orders")
    con.commit()
    con.close()
    result = tools.cli(tmp_path, "capture")
    assert result.returncode == 1, result.stderr
    engine = Engine.open(tmp_path / "combined.yaml")
    try:
        (pub,) = engine.publications(10)
        runs = {r.source: r for r in engine.runs()}
        assert runs["shop"].publication_id == pub["id"] and runs["depot"].publication_id is None
        assert {m["source"] for m in pub["member_rows"]} == {"shop"}
    finally:
        engine.close()
    assert f"published {pub['id']}: shop (customers, orders)" in result.stdout
    assert f"not published: depot (run {runs['depot'].id} failed)" in result.stderr
