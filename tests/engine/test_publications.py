"""Selecting a publication: by the instant `combined publications` shows, by id, by prefix."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from combined.engine import Engine
from combined.errors import ConfigError, NotFoundError

ORDERS_COUNT = "SELECT count(*) AS n FROM shop.orders"


def _table_rows(stdout: str) -> list[list[str]]:
    return [
        [c.strip() for c in line.strip("│").split("│")]
        for line in stdout.splitlines()
        if line.startswith("│")
    ]


def _two_publications(shop: Path, tools: Any) -> tuple[str, str]:
    engine = Engine.open(shop / "combined.yaml")
    try:
        (first,) = engine.capture()
        tools.sql(shop, "DELETE FROM orders WHERE id <= 50;")
        (second,) = engine.capture()
        assert first.publication_id and second.publication_id
        return first.publication_id, second.publication_id
    finally:
        engine.close()


def test_as_of_the_instant_publications_shows_selects_that_publication(
    shop: Path, tools: Any
) -> None:
    first, second = _two_publications(shop, tools)
    shown = tools.cli(shop, "publications", env={"COLUMNS": "250"})
    assert shown.returncode == 0, shown.stderr
    published = {row[0]: row[1] for row in _table_rows(shown.stdout)}
    assert set(published) == {first, second}
    # what the listing shows, pasted into --as-of, is that publication's instant
    for pub, rows in ((first, 200), (second, 150)):
        got = tools.cli(shop, "sql", "--format", "json", "--as-of", published[pub], ORDERS_COUNT)
        assert got.returncode == 0, got.stderr
        assert json.loads(got.stdout) == [{"n": rows}]


def test_as_of_before_the_first_publication_names_it(shop: Path, tools: Any) -> None:
    first, _ = _two_publications(shop, tools)
    engine = Engine.open(shop / "combined.yaml")
    try:
        at = engine.publications(10)[-1]["published_at"]
    finally:
        engine.close()
    early = tools.cli(shop, "sql", "--as-of", "2000-01-01T00:00:00Z", ORDERS_COUNT)
    assert early.returncode == 2 and early.stdout == ""
    assert "nothing was published at or before 2000-01-01" in early.stderr
    # the way out: the first publication's id and instant
    assert first in early.stderr and at.isoformat() in early.stderr


def test_a_publication_prefix_must_name_one_publication(shop: Path, tools: Any) -> None:
    first, second = _two_publications(shop, tools)
    engine = Engine.open(shop / "combined.yaml")
    try:
        assert engine.sql(ORDERS_COUNT, publication=first[:7]).to_pylist() == [{"n": 200}]
        # "p00000" is the start of both ids: which one was meant is unknown
        with pytest.raises(NotFoundError, match="matches 2 publications") as ambiguous:
            engine.sql(ORDERS_COUNT, publication="p00000")
        assert first in str(ambiguous.value) and second in str(ambiguous.value)
        # a LIKE wildcard is a character of an id, never a pattern
        for pattern in ("%", "_", "p_00001"):
            with pytest.raises(NotFoundError, match="no publication"):
                engine.sql(ORDERS_COUNT, publication=pattern)
        # an instant and a publication together: one of them would be ignored
        at = engine.publications(1)[0]["published_at"]
        with pytest.raises(ConfigError, match="not both"):
            engine.sql(ORDERS_COUNT, publication=first, as_of=at)
    finally:
        engine.close()


def test_status_reports_the_published_position_not_one_committed_after_it(
    shop: Path, tools: Any
) -> None:
    tools.sql(
        shop,
        "CREATE TABLE log (id INTEGER PRIMARY KEY, v TEXT);"
        "INSERT INTO log (v) VALUES ('a'), ('b');",
    )
    project = shop / "combined.yaml"
    project.write_text(
        project.read_text()
        + "      log:\n        key: [id]\n        strategy: cursor\n"
        + "        cursor: {column: id, trust: 'rowid alias'}\n"
    )
    assert tools.cli(shop, "capture", "shop.log").returncode == 0
    tools.sql(shop, "INSERT INTO log (v) VALUES ('c'), ('d');")
    # the capture commits and projects rows 3 and 4, and dies before publishing them
    killed = tools.cli(shop, "capture", "shop.log", env={"COMBINED_FAULT": "after_projection"})
    assert killed.returncode != 0
    engine = Engine.open(project)
    try:
        (published,) = engine.publications(1)
        (member,) = published["member_rows"]
        (row,) = [s for s in engine.status() if s["dataset"] == "shop.log"]
        # what a query reads is what status says is published
        assert engine.sql("SELECT count(*) AS n FROM shop.log").to_pylist() == [{"n": 2}]
        assert (row["position"], row["version"], row["lake_version"]) == (
            "2",
            member["dataset_version"],
            member["lake_version"],
        )
        # and the commit not published yet is told as such
        assert row["unpublished"] == {
            "position": "4",
            "version": row["unpublished"]["version"],
            "lake_version": member["lake_version"] + 1,
        }
        assert row["unpublished"]["version"] != member["dataset_version"]
    finally:
        engine.close()
    shown = tools.cli(shop, "status", env={"COLUMNS": "250"})
    assert shown.returncode == 0, shown.stderr
    (line,) = [r for r in _table_rows(shown.stdout) if r[0] == "shop.log"]
    assert line[5] == "2" and "unpublished" in " ".join(line)
    # the next capture publishes it
    engine = Engine.open(project)
    try:
        (run,) = engine.capture(["shop.log"])
        assert run.state == "succeeded", run.error
        (row,) = [s for s in engine.status() if s["dataset"] == "shop.log"]
        assert row["position"] == "4" and row["unpublished"] is None
    finally:
        engine.close()
