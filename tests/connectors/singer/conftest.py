"""Fixtures for the singer connector: real taps (Python scripts) run as subprocesses."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from tests.connectors.singer.fixtures import EVENTS, TAPS, TOKEN, USERS, write_data


@pytest.fixture
def good_config(tmp_path: Path) -> dict[str, Any]:
    """A source configuration of the good tap over a fresh data file."""
    data = tmp_path / "data.json"
    write_data(data, USERS, EVENTS)
    return {
        "command": [sys.executable, str(TAPS / "good_tap.py")],
        "config": {
            "data_file": str(data),
            "api_token": TOKEN,
            "probe_file": str(tmp_path / "probe.jsonl"),
        },
    }


@pytest.fixture
def bad_config(tmp_path: Path) -> Callable[..., dict[str, Any]]:
    """A source configuration of the misbehaving tap in ``mode``."""

    def make(mode: str, **options: Any) -> dict[str, Any]:
        return {
            "command": [sys.executable, str(TAPS / "bad_tap.py")],
            "config": {"mode": mode, "api_token": TOKEN, "pid_file": str(tmp_path / "pids")},
            **options,
        }

    return make
