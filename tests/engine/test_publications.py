"""Selecting a publication by the instant `combined publications` shows."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from combined.engine import Engine

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
