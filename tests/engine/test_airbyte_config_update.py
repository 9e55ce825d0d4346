"""An Airbyte source rotating its refresh token (CONTROL CONNECTOR_CONFIG), captured unattended.

The source (a real program, ``rotating_source.py``) exchanges its refresh
token with its "provider" (a file) on every command: the provider revokes the
old token at once, and the source sends its new configuration. Each next run
must be given the new token, and no new token may reach the catalog, the lake,
an error or a log.
"""

from __future__ import annotations

import json
import logging
import stat
import sys
from pathlib import Path
from typing import Any

import pytest
from tests.connectors.airbyte.fixtures import SOURCES

from combined.engine import Engine

FIRST_TOKEN = "rt-first-0123456789abcdef"

PROJECT = """\
version: 1
lake: ./lake
sources:
  crm:
    connector: airbyte
    config:
      command: {command}
      config:
        provider: {provider}
        credentials:
          client_id: combined-tests
          refresh_token: {{secret: "{reference}"}}
    datasets:
      items:
        key: [id]
"""


def _project(tmp_path: Path, reference: str) -> Path:
    (tmp_path / "provider.json").write_text(json.dumps({"valid": FIRST_TOKEN}))
    (tmp_path / "combined.yaml").write_text(
        PROJECT.format(
            command=json.dumps([sys.executable, str(SOURCES / "rotating_source.py")]),
            provider=json.dumps(str(tmp_path / "provider.json")),
            reference=reference,
        )
    )
    return tmp_path / "combined.yaml"


@pytest.fixture
def env_project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("COMBINED_TEST_REFRESH_TOKEN", FIRST_TOKEN)
    return _project(tmp_path, "env:COMBINED_TEST_REFRESH_TOKEN")


def _provider(project: Path) -> dict[str, Any]:
    return json.loads((project.parent / "provider.json").read_text())  # type: ignore[no-any-return]


def _updates_file(project: Path) -> Path:
    return project.parent / ".combined" / "config-updates" / "crm.json"


def test_a_rotated_refresh_token_is_kept_for_the_next_run(
    env_project: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    engine = Engine.open(env_project)
    try:
        for _ in range(3):  # each run rotates twice (discover, read): each uses the last token
            (run,) = engine.capture(["crm.items"])
            assert run.state == "succeeded", run.error
        assert engine.sql("SELECT count(*) AS n FROM crm.items").to_pylist() == [{"n": 3}]
        events = engine.activity(kind="source.config_updated")
        assert len(events) == 6
        assert events[0]["body"]["keys"] == [
            "config.credentials.refresh_token",
            "config.credentials.access_token",
        ]
    finally:
        engine.close()
    kept = _updates_file(env_project)
    assert stat.S_IMODE(kept.stat().st_mode) == 0o600
    assert stat.S_IMODE(kept.parent.stat().st_mode) == 0o700
    latest = _provider(env_project)["valid"]
    entries = {tuple(e["path"]): e for e in json.loads(kept.read_text())["updates"]}
    assert entries[("config", "credentials", "refresh_token")]["value"] == latest
    assert set(entries) == {
        ("config", "credentials", "refresh_token"),
        ("config", "credentials", "access_token"),
    }  # only the keys that changed: not the provider, not the client id
    # the token is in the update file alone: not in the catalog, the lake, a log
    root = env_project.parent
    assert (root / ".combined" / "catalog.db").is_file()
    for place in (root / "lake", root / ".combined"):
        for path in place.rglob("*"):
            if path.is_file() and path != kept:
                assert latest.encode() not in path.read_bytes(), path
    logged = [r for r in caplog.records if getattr(r, "event", None) == "source.config_updated"]
    assert logged and logged[0].__dict__["body"]["keys"][0] == "config.credentials.refresh_token"
    assert latest not in caplog.text and all(latest not in str(r.__dict__) for r in logged)


def test_the_new_token_is_kept_even_when_the_run_fails_after_the_exchange(
    env_project: Path,
) -> None:
    provider = env_project.parent / "provider.json"
    engine = Engine.open(env_project)
    try:
        provider.write_text(json.dumps({"valid": FIRST_TOKEN, "fail_after_rotation": True}))
        (run,) = engine.capture(["crm.items"])
        assert run.state == "failed"
        assert run.error is not None and "went away after the token exchange" in run.error
        rotated = _provider(env_project)["valid"]
        assert rotated != FIRST_TOKEN and rotated not in run.error  # echoed on stderr: masked
        assert "rotated: new refresh token ***" in run.error

        provider.write_text(json.dumps({"valid": rotated}))
        (run,) = engine.capture(["crm.items"])
        assert run.state == "succeeded", run.error
    finally:
        engine.close()


def test_a_token_declared_anew_by_hand_wins_over_the_kept_one(
    env_project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = Engine.open(env_project)
    try:
        (run,) = engine.capture(["crm.items"])
        assert run.state == "succeeded", run.error
        # someone authorises the connector again and sets the new token in the environment
        (env_project.parent / "provider.json").write_text(json.dumps({"valid": "rt-by-hand-42"}))
        monkeypatch.setenv("COMBINED_TEST_REFRESH_TOKEN", "rt-by-hand-42")
        (run,) = engine.capture(["crm.items"])
        assert run.state == "succeeded", run.error
    finally:
        engine.close()


def test_a_file_reference_is_rewritten_in_place(tmp_path: Path) -> None:
    secret = tmp_path / "secrets" / "crm_refresh_token"
    secret.parent.mkdir()
    secret.write_text(FIRST_TOKEN + "\n")
    secret.chmod(0o600)
    project = _project(tmp_path, "file:secrets/crm_refresh_token")
    engine = Engine.open(project)
    try:
        engine.check("crm")  # check exchanges the token too
        assert secret.read_text() == _provider(project)["valid"] + "\n"
        (run,) = engine.capture(["crm.items"])
        assert run.state == "succeeded", run.error
        assert secret.read_text() == _provider(project)["valid"] + "\n"
        assert stat.S_IMODE(secret.stat().st_mode) == 0o600
        assert [p.name for p in secret.parent.iterdir()] == ["crm_refresh_token"]
        # the access token the connector added has no declaration to rewrite: kept apart
        kept = json.loads(_updates_file(project).read_text())["updates"]
        assert [e["path"] for e in kept] == [["config", "credentials", "access_token"]]
    finally:
        engine.close()
