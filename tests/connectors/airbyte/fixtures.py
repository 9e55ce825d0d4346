"""Real Airbyte sources for the airbyte connector's tests, their data and what they record."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

SOURCES = Path(__file__).parent / "sources"
TOKEN = "tok-ab12cd34ef56-secret"

USERS: list[dict[str, Any]] = [
    {
        "id": 1,
        "name": "ada",
        "updated_at": "2024-05-01T10:00:00Z",
        "balance": 12345678901234567890.12,
        "seen": "2024-05-01T10:00:00",
        "visits": 3.0,
        "tags": ["math"],
    },
    {"id": 2, "name": None, "updated_at": "2024-05-02T09:00:00Z", "balance": 0.01},
    {"id": 3, "name": "grace", "updated_at": "2024-05-03T09:00:00Z"},
]
EVENTS: list[dict[str, Any]] = [{"id": i, "kind": f"k{i}"} for i in range(1, 4)]


def write_data(
    path: Path, users: list[dict[str, Any]], events: list[dict[str, Any]], **extra: Any
) -> None:
    """The good source's data file (the numbers written as their exact text)."""
    text = json.dumps({"expected_token": TOKEN, "users": users, "events": events, **extra})
    text = text.replace("1.2345678901234567e+19", "12345678901234567890.12")
    path.write_text(text)


def good_command() -> list[str]:
    """The argv of the well-behaved source."""
    return [sys.executable, str(SOURCES / "good_source.py")]


def probes(probe_file: Path) -> list[dict[str, Any]]:
    """What the good source recorded about each of its runs."""
    if not probe_file.exists():
        return []
    return [json.loads(line) for line in probe_file.read_text().splitlines()]
