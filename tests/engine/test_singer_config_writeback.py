"""A Singer tap that writes its rotated refresh token back into its --config file.

The file is Combined's private copy, removed when the tap ends: what the tap
wrote into it must be kept for the next run, as an Airbyte source's
CONTROL CONNECTOR_CONFIG is (``test_airbyte_config_update.py``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from tests.connectors.singer.fixtures import TAPS

from combined.engine import Engine

FIRST_TOKEN = "rt-first-0123456789abcdef"

PROJECT = """\
version: 1
lake: ./lake
sources:
  crm:
    connector: singer
    config:
      command: {command}
      config:
        provider: {provider}
        refresh_token: {{secret: "env:COMBINED_TEST_TAP_REFRESH_TOKEN"}}
    datasets:
      items:
        key: [id]
"""


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("COMBINED_TEST_TAP_REFRESH_TOKEN", FIRST_TOKEN)
    (tmp_path / "provider.json").write_text(json.dumps({"valid": FIRST_TOKEN}))
    (tmp_path / "combined.yaml").write_text(
        PROJECT.format(
            command=json.dumps([sys.executable, str(TAPS / "rotating_tap.py")]),
            provider=json.dumps(str(tmp_path / "provider.json")),
        )
    )
    return tmp_path / "combined.yaml"


def test_a_token_the_tap_wrote_back_is_kept_for_the_next_run(project: Path) -> None:
    tmp_path, provider = project.parent, project.parent / "provider.json"
    engine = Engine.open(project)
    try:
        for _ in range(2):  # each run rotates twice (discovery, read)
            (run,) = engine.capture(["crm.items"])
            assert run.state == "succeeded", run.error
        events = engine.activity(kind="source.config_updated")
        assert len(events) == 4 and events[0]["body"]["keys"] == ["config.refresh_token"]
    finally:
        engine.close()
    latest = json.loads(provider.read_text())["valid"]
    kept = tmp_path / ".combined" / "config-updates" / "crm.json"
    assert [e["value"] for e in json.loads(kept.read_text())["updates"]] == [latest]
    for path in (tmp_path / "lake").rglob("*"):
        assert not path.is_file() or latest.encode() not in path.read_bytes()
    assert latest.encode() not in (tmp_path / ".combined" / "catalog.db").read_bytes()


def test_a_token_written_back_by_a_tap_that_then_fails_is_kept_and_masked(project: Path) -> None:
    provider = project.parent / "provider.json"
    engine = Engine.open(project)
    try:
        provider.write_text(json.dumps({"valid": FIRST_TOKEN, "fail_after_rotation": True}))
        (run,) = engine.capture(["crm.items"])
        assert run.state == "failed" and run.error is not None
        rotated = json.loads(provider.read_text())["valid"]
        assert "rotated to ***, then the provider went away" in run.error
        assert rotated not in run.error
        provider.write_text(json.dumps({"valid": rotated}))
        (run,) = engine.capture(["crm.items"])
        assert run.state == "succeeded", run.error
    finally:
        engine.close()


def test_a_tap_that_writes_back_only_what_changed_keeps_the_rest(project: Path) -> None:
    provider = project.parent / "provider.json"
    engine = Engine.open(project)
    try:
        provider.write_text(json.dumps({"valid": FIRST_TOKEN, "write_back_changes_only": True}))
        for _ in range(2):
            (run,) = engine.capture(["crm.items"])
            assert run.state == "succeeded", run.error
    finally:
        engine.close()
    kept = json.loads((project.parent / ".combined" / "config-updates" / "crm.json").read_text())
    assert [e["path"] for e in kept["updates"]] == [["config", "refresh_token"]]
