"""Fixtures of the engine tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.engine._binlog import Binlog, binlog_table


@pytest.fixture
def captured(shop: Path, tools: Any) -> Path:
    """A shop project captured once through the CLI."""
    result = tools.cli(shop, "capture")
    assert result.returncode == 0, result.stderr
    return shop


@pytest.fixture
def binlog(mariadb_database: str, tmp_path: Path) -> Iterator[Binlog]:
    """A table of 500 rows on a server writing a row-based binlog (``_binlog.py``)."""
    with binlog_table(mariadb_database, tmp_path) as table:
        yield table
