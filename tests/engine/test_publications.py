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
