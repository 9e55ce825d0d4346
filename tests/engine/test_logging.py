"""``--log-format json`` for every command, through ``logging``; secrets never in a line."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest
from tests.engine.test_alerts import KEY, OPS, Receiver, _project


def _lines(stderr: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stderr.splitlines() if line.startswith("{")]


def test_json_logs_carry_run_fields_and_never_a_secret(tmp_path: Path, tools: Any) -> None:
    receiver = Receiver()
    slack = "/services/T000/B000/xyzzy-secret-path"
    try:
        _project(
            tmp_path,
            "notifications:\n"
            "  - {name: chat, type: slack, url: {secret: env:SLACK_URL}}\n"
            "  - {name: ops, type: webhook, url: {secret: env:HOOK_URL},"
            " secret: {secret: env:HOOK_KEY}}\n",
        )
        from tests.conftest import shop_sql

        shop_sql(tmp_path, "DROP TABLE customers")
        env = {
            "SLACK_URL": receiver.url(slack),
            "HOOK_URL": receiver.url("/hook"),
            "HOOK_KEY": KEY,
        }
        failed = tools.cli(
            tmp_path, "--log-format", "json", "--log-level", "INFO", "capture", "shop", env=env
        )
        assert failed.returncode == 1
        sent = tools.cli(
            tmp_path, "--log-format", "json", "--log-level", "DEBUG", "alerts", env=env
        )
        assert sent.returncode == 0, sent.stderr
    finally:
        receiver.close()
    assert receiver.posts(slack)  # the URL was used...
    for result in (failed, sent):
        text = result.stdout + result.stderr
        # ...and never written: httpx logs each request's URL, masked by the handler
        assert "xyzzy" not in text and KEY not in text and "/hook" not in text
    lines = _lines(failed.stderr)
    assert lines and all({"timestamp", "level", "logger", "message"} <= set(x) for x in lines)
    (run_failed,) = [x for x in lines if x.get("event") == "run.failed"]
    assert run_failed["run_id"] and run_failed["source"] == "shop"
    assert run_failed["level"] == "INFO" and run_failed["logger"] == "combined.activity"
    assert "T" in run_failed["timestamp"]
    # (sent by the capture as it ended, or else by `combined alerts`)
    logged = _lines(failed.stderr) + _lines(sent.stderr)
    assert [x for x in logged if x.get("event") == "notification.sent"]
    assert [x for x in logged if x["logger"].startswith("httpx")]  # third-party logs too


def test_the_project_logging_section_and_the_option_choose_the_format(
    tmp_path: Path, tools: Any
) -> None:
    path = _project(tmp_path, "logging: {format: json, level: INFO}\n")
    result = tools.cli(tmp_path, "capture", "shop.orders")
    assert result.returncode == 0, result.stderr
    assert _lines(result.stderr)
    result = tools.cli(tmp_path, "--log-format", "text", "capture", "shop.orders")
    assert result.returncode == 0 and not _lines(result.stderr)
    result = tools.cli(tmp_path, "--log-level", "LOUD", "status")
    assert result.returncode == 2 and "is not one of DEBUG" in result.stderr
    path.write_text(path.read_text().replace("format: json", "format: xml"))
    result = tools.cli(tmp_path, "status")
    assert result.returncode == 2 and "logging.format" in result.stderr


def test_a_resolved_secret_logged_by_any_code_is_masked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from combined._logging import configure
    from combined.config import load_project

    monkeypatch.setenv("HOOK_URL", "https://hooks.example/abc")
    monkeypatch.setenv("HOOK_KEY", KEY)
    path = _project(tmp_path, OPS)
    load_project(path)  # resolves (and so masks) every reference
    configure("json", "INFO")
    try:
        log = logging.getLogger("some.library")
        log.warning("signing with %s", KEY, extra={"run_id": "r1", "body": {"k": KEY}})
        try:
            raise ValueError(f"bad key {KEY}")
        except ValueError:
            log.exception("failed")
    finally:
        configure("text", "WARNING")
    err = capsys.readouterr().err
    assert KEY not in err
    first, second = _lines(err)[:2]
    assert first["run_id"] == "r1" and first["message"].startswith("signing with ")
    assert "bad key" in second["exc_info"]


def test_an_event_is_logged_once_its_transaction_commits_never_when_it_rolls_back(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A scheduler tick that rolled back logged `run.joined` for a Run the feed never had."""
    from combined.catalog import Catalog
    from combined.catalog import data as cat

    catalog = Catalog.open(f"sqlite:///{tmp_path / 'catalog.db'}")
    caplog.set_level(logging.INFO, logger="combined.activity")
    try:
        with pytest.raises(RuntimeError), catalog.begin() as conn:
            cat.emit(conn, "run.joined", source="shop", dataset="orders", run_id="r1")
            assert caplog.records == []  # not before the commit
            raise RuntimeError("the tick failed: its transaction rolls back")
        assert caplog.records == []
        with catalog.begin() as conn:
            cat.emit(conn, "run.joined", source="shop", dataset="orders", run_id="r2")
            assert caplog.records == []
        (record,) = caplog.records
        assert record.getMessage() == "run.joined shop.orders run r2"
        with catalog.begin() as conn:
            assert [e.run_id for e in cat.activity(conn, kind="run.joined")] == ["r2"]
    finally:
        catalog.close()
