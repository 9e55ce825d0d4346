"""Fixtures for the singer connector: real taps (Python scripts) run as subprocesses."""

from __future__ import annotations

import json
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


#: The one stream of the scripted tap's default catalog: ``s``, ``id`` and ``u`` integers.
SCRIPT_PROPERTIES: dict[str, Any] = {"id": {"type": "integer"}, "u": {"type": ["null", "integer"]}}


@pytest.fixture
def scripted(tmp_path: Path) -> Callable[..., dict[str, Any]]:
    """A source configuration of the scripted tap playing ``steps`` (see script_tap.py).

    The catalog has one stream ``s`` of ``properties`` (default
    :data:`SCRIPT_PROPERTIES`), keyed by ``id``, incremental by ``u``.
    """

    def make(
        steps: list[dict[str, Any]],
        properties: dict[str, Any] | None = None,
        discover_steps: list[dict[str, Any]] | None = None,
        **options: Any,
    ) -> dict[str, Any]:
        entry = {
            "tap_stream_id": "s",
            "schema": {"type": "object", "properties": properties or SCRIPT_PROPERTIES},
            "key_properties": ["id"],
            "replication_key": "u",
        }
        script = tmp_path / "script.json"
        body = {"catalog": {"streams": [entry]}, "steps": steps}
        script.write_text(json.dumps({**body, "discover_steps": discover_steps or []}))
        return {
            "command": [sys.executable, str(TAPS / "script_tap.py")],
            "config": {"script": str(script)},
            **options,
        }

    return make
