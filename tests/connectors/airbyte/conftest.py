"""Fixtures for the airbyte connector: real sources (Python scripts) run as subprocesses."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from tests.connectors.airbyte.fixtures import (
    EVENTS,
    SOURCES,
    TOKEN,
    USERS,
    good_command,
    write_data,
)


@pytest.fixture
def good_config(tmp_path: Path) -> dict[str, Any]:
    """A source configuration of the good source over a fresh data file."""
    data = tmp_path / "data.json"
    write_data(data, USERS, EVENTS)
    return {
        "command": good_command(),
        "config": {
            "data_file": str(data),
            "api_token": TOKEN,
            "probe_file": str(tmp_path / "probe.jsonl"),
        },
    }


#: The one stream of the scripted source: ``s`` with ``id`` and ``u`` integers.
SCRIPT_STREAM: dict[str, Any] = {
    "name": "s",
    "json_schema": {
        "type": "object",
        "properties": {"id": {"type": "integer"}, "u": {"type": ["null", "integer"]}},
    },
    "supported_sync_modes": ["full_refresh", "incremental"],
    "source_defined_cursor": True,
    "default_cursor_field": ["u"],
    "source_defined_primary_key": [["id"]],
}


@pytest.fixture
def scripted(tmp_path: Path) -> Callable[..., dict[str, Any]]:
    """A source configuration of the scripted source playing ``read`` (and other) steps."""

    def make(
        read: list[dict[str, Any]] | None = None,
        *,
        check: list[dict[str, Any]] | None = None,
        discover: list[dict[str, Any]] | None = None,
        streams: list[dict[str, Any]] | None = None,
        **options: Any,
    ) -> dict[str, Any]:
        script = tmp_path / "script.json"
        body = {
            "catalog": {"streams": streams or [SCRIPT_STREAM]},
            "steps": {"read": read or [], "check": check or [], "discover": discover or []},
        }
        script.write_text(json.dumps(body))
        return {
            "command": [sys.executable, str(SOURCES / "script_source.py")],
            "config": {"script": str(script), "api_token": TOKEN},
            **options,
        }

    return make
