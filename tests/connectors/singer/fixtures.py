"""Real taps for the singer connector's tests, their data and what they record."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

TAPS = Path(__file__).parent / "taps"
TOKEN = "tok-9f8e7d6c5b4a-secret"

USERS: list[dict[str, Any]] = [
    {
        "id": 1,
        "name": "ada",
        "updated_at": "2024-05-01T10:00:00Z",
        "balance": 12345678901234567890.12,
        "score": 0.1,
        "active": True,
        "born": "1815-12-10",
        "tags": ["math", "engines"],
        "profile": {"lang": "en", "n": 1.5},
    },
    {
        "id": 2,
        "name": None,
        "updated_at": "2024-05-01T12:30:00.250000+02:00",
        "balance": 0.01,
        "score": 3,
        "active": False,
        "born": None,
        "tags": None,
        "profile": None,
    },
    {"id": 3, "name": "grace", "updated_at": "2024-05-02T09:00:00Z"},
    {"id": 4, "name": "linus", "updated_at": "2024-05-03T09:00:00Z", "balance": 7},
    {"id": 5, "name": "barbara", "updated_at": "2024-05-04T09:00:00Z"},
]
EVENTS: list[dict[str, Any]] = [
    {"id": i, "kind": f"k{i}", "legacy": "dropped"} for i in range(1, 4)
]


def write_data(
    path: Path, users: list[dict[str, Any]], events: list[dict[str, Any]], **extra: Any
) -> None:
    """The good tap's data file (the numbers written as their exact text)."""
    text = json.dumps({"expected_token": TOKEN, "users": users, "events": events, **extra})
    # 12345678901234567890.12 must reach the tap as that text, not as a float's.
    text = text.replace("1.2345678901234567e+19", "12345678901234567890.12")
    path.write_text(text)


def probes(config: dict[str, Any]) -> list[dict[str, Any]]:
    """What the good tap recorded about each of its runs."""
    path = Path(config["config"]["probe_file"])
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]


def dead(pid: int, within: float = 5.0) -> bool:
    """Whether process ``pid`` ended within ``within`` s (a zombie awaiting its new parent too)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rpartition(")")[2].split()[0]
        except FileNotFoundError:
            return True
        if state in ("Z", "X"):
            return True
        time.sleep(0.05)
    return False
