"""Fixtures of the engine tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest


@pytest.fixture
def captured(shop: Path, tools: Any) -> Path:
    """A shop project captured once through the CLI."""
    result = tools.cli(shop, "capture")
    assert result.returncode == 0, result.stderr
    return shop
