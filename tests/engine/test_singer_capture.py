"""The engine over a real Singer tap (a Python script run as a subprocess) into a real lake."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from tests.connectors.singer.fixtures import EVENTS, TAPS, TOKEN, USERS, dead, write_data

from combined.connectors import known_connectors
from combined.connectors._subprocess._state import program_state
from combined.engine import Engine
from combined.errors import ConfigError

pytestmark = pytest.mark.skipif(
    "singer" not in known_connectors(),
    reason="the installed metadata predates the singer entry point: `pip install -e .` again",
)

PROJECT = """\
version: 1
lake: ./lake
sources:
  gh:
    connector: singer
    config:
      command: [{python}, {tap}]
      config:
        data_file: {data}
        probe_file: {probe}
        api_token: {{secret: "env:COMBINED_TEST_SINGER_TOKEN"}}
        state_every: 2
      env: {{TAP_REGION: eu}}
    datasets:
      users:
        key: [id]
        strategy: cursor
        cursor: {{column: updated_at, trust: "the tap's bookmark"}}
      events:
        key: [id]
"""


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("COMBINED_TEST_SINGER_TOKEN", TOKEN)
    write_data(tmp_path / "data.json", USERS, EVENTS)
    (tmp_path / "combined.yaml").write_text(
        PROJECT.format(
            python=json.dumps(sys.executable),
            tap=json.dumps(str(TAPS / "good_tap.py")),
            data=json.dumps(str(tmp_path / "data.json")),
            probe=json.dumps(str(tmp_path / "probe.jsonl")),
        )
    )
    return tmp_path


def _probes(project: Path) -> list[dict[str, Any]]:
    lines = (project / "probe.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def _ids(engine: Engine, table: str) -> list[int]:
    result = engine.sql(f"SELECT id FROM {table} ORDER BY id")
    return [int(r["id"]) for r in result.to_pylist()]


def test_capture_then_recapture_resumes_from_the_committed_state(project: Path) -> None:
    engine = Engine.open(project / "combined.yaml")
    try:
        (run,) = engine.capture(["gh.users", "gh.events"])
        assert run.state == "succeeded", run.error
        assert _ids(engine, "gh.users") == [1, 2, 3, 4, 5]
        assert _ids(engine, "gh.events") == [1, 2, 3]
        ada = engine.sql("SELECT * FROM gh.users WHERE id = 1").to_pylist()[0]
        assert str(ada["balance"]) == "12345678901234567890.12"
        assert ada["_combined_producer"].startswith("singer@1")
        assert len(ada["_combined_id"]) == 16 and ada["_combined_run_id"] == run.id  # (v2 bytes)
        assert ada["_combined_source_position"] == "2024-05-04T09:00:00Z"
        checkpoint = engine.committed_checkpoint("gh", "users")
        assert checkpoint is not None
        marks = program_state(checkpoint, "singer")["bookmarks"]
        assert marks["users"]["replication_key_value"] == "2024-05-04T09:00:00Z"
        assert engine.committed_checkpoint("gh", "events") == {}
        mar = {r["dataset"]: r["mar"] for r in engine.usage()}
        assert mar == {"users": 5, "events": 3}

        users = [dict(u) for u in USERS]
        users[4]["name"] = "barbara l."
        users[4]["updated_at"] = "2024-05-05T09:00:00Z"
        users.append({"id": 6, "name": "edsger", "updated_at": "2024-05-06T09:00:00Z"})
        write_data(project / "data.json", users, EVENTS[:2])
        (run,) = engine.capture(["gh.users", "gh.events"])
        assert run.state == "succeeded", run.error
        # the tap got the committed STATE and sent only what changed since
        last_users = [p for p in _probes(project) if "--state" in p["argv"]][-1]
        assert last_users["state"] == program_state(checkpoint, "singer")
        assert run.stats is not None
        assert run.stats["users"]["captured"] == 2
        assert (run.stats["users"]["inserts"], run.stats["users"]["updates"]) == (1, 1)
        assert run.stats["users"]["deletes"] == 0  # a cursor read never sees deletes
        # the snapshot of events is complete: the missing event is an explicit delete
        assert run.stats["events"]["deletes"] == 1
        assert _ids(engine, "gh.users") == [1, 2, 3, 4, 5, 6]
        assert _ids(engine, "gh.events") == [1, 2]
        name = engine.sql("SELECT name FROM gh.users WHERE id = 5").to_pylist()[0]["name"]
        assert name == "barbara l."
        mar = {r["dataset"]: r["mar"] for r in engine.usage()}
        assert mar == {"users": 6, "events": 3}  # ids 5 and 6 this month already counted 5
    finally:
        engine.close()


def test_a_failed_tap_commits_nothing_and_keeps_the_checkpoint(project: Path) -> None:
    engine = Engine.open(project / "combined.yaml")
    try:
        (run,) = engine.capture(["gh.users"])
        assert run.state == "succeeded", run.error
        before = engine.committed_checkpoint("gh", "users")
        history = engine.history("gh.users")
        lake_log = sorted((project / "lake" / "gh" / "users" / "_delta_log").iterdir())

        users = [
            *USERS,
            *({"id": i, "updated_at": f"2024-06-0{i - 5}T00:00:00Z"} for i in (6, 7, 8)),
        ]
        # the tap sends the record at its bookmark, two new ones and a STATE, then dies
        write_data(project / "data.json", users, EVENTS, fail_after=3)
        (run,) = engine.capture(["gh.users"])
        assert run.state == "failed"
        assert run.error is not None and "exited with status 1" in run.error
        assert "the provider went away mid-stream" in run.error
        assert TOKEN not in run.error
        assert engine.committed_checkpoint("gh", "users") == before
        assert engine.history("gh.users") == history
        assert sorted((project / "lake" / "gh" / "users" / "_delta_log").iterdir()) == lake_log
        assert _ids(engine, "gh.users") == [1, 2, 3, 4, 5]

        write_data(project / "data.json", users, EVENTS)
        (run,) = engine.capture(["gh.users"])
        assert run.state == "succeeded", run.error
        assert _ids(engine, "gh.users") == [1, 2, 3, 4, 5, 6, 7, 8]
        assert _probes(project)[-1]["state"] == program_state(before, "singer")
    finally:
        engine.close()


def test_appending_a_cursor_stream_is_refused_before_the_tap_runs(project: Path) -> None:
    # The tap re-sends the record at its bookmark on every run: appended, it
    # would be stored once per run.
    text = (project / "combined.yaml").read_text()
    (project / "combined.yaml").write_text(
        text.replace(
            "        strategy: cursor\n", "        strategy: cursor\n        sync_mode: append\n"
        )
    )
    engine = Engine.open(project / "combined.yaml")
    try:
        (run,) = engine.capture(["gh.users"])
        assert run.state != "succeeded"
        assert "stored twice" in (run.error or "") and "sync_mode: incremental" in (run.error or "")
        probes = _probes(project) if (project / "probe.jsonl").exists() else []
        assert all("--discover" in p["argv"] for p in probes)  # the tap never read
    finally:
        engine.close()


def test_the_tap_sees_no_credential_from_the_environment_only_what_env_gives_it(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Combined's environment holds other sources' secrets (the token this
    # project reads by reference, a DSN with a password): the tap gets its
    # token through its config file, inherits only an allow-list (a variable
    # outside it is not passed either) and only `env:` adds variables.
    monkeypatch.setenv("WAREHOUSE_URL", "postgresql://loader:hunter2@db/warehouse")
    monkeypatch.setenv("COMBINED_TEST_PLAIN", "kept")
    engine = Engine.open(project / "combined.yaml")
    try:
        (run,) = engine.capture(["gh.users"])
        assert run.state == "succeeded", run.error
    finally:
        engine.close()
    for probe in _probes(project):
        assert "COMBINED_TEST_SINGER_TOKEN" not in probe["env"]
        assert "WAREHOUSE_URL" not in probe["env"]
        assert "COMBINED_TEST_PLAIN" not in probe["env"] and "PATH" in probe["env"]
        assert probe["tap_region"] == "eu"


def _token_on_the_command_line(project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COMBINED_TEST_ARGV_TOKEN", "argv-token-4b3c2d1e")
    text = (project / "combined.yaml").read_text()
    command = next(line for line in text.splitlines() if "command:" in line)
    argv = command.rstrip("]") + ', --token, {secret: "env:COMBINED_TEST_ARGV_TOKEN"}]'
    (project / "combined.yaml").write_text(text.replace(command, argv))


def test_a_secret_reference_in_the_command_is_refused_before_any_secret_is_resolved(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # On the command line the token would be readable by every user of the machine (ps).
    _token_on_the_command_line(project, monkeypatch)
    engine = Engine.open(project / "combined.yaml")
    try:
        with pytest.raises(ConfigError) as info:
            engine.capture(["gh.users"])
        assert info.value.message.startswith(
            "sources.gh.config.command[3] holds a secret reference"
        )
        assert "argv-token-4b3c2d1e" not in info.value.describe()
        assert engine.runs(10) == []
    finally:
        engine.close()
    assert not (project / "probe.jsonl").exists()  # the tap never ran


def test_a_run_admitted_with_a_secret_reference_in_the_command_never_runs_the_tap(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # An admission frozen before the check existed (a retry runs under it):
    # the runner checks again before it resolves the secret.
    import combined.engine

    _token_on_the_command_line(project, monkeypatch)
    monkeypatch.setattr(combined.engine, "check_config", lambda *args, **kwargs: None)
    engine = Engine.open(project / "combined.yaml")
    try:
        (run,) = engine.capture(["gh.users"])
        assert run.state == "failed"
        assert "sources.gh.config.command[3] holds a secret reference" in (run.error or "")
        assert "argv-token-4b3c2d1e" not in (run.error or "")
    finally:
        engine.close()
    assert not (project / "probe.jsonl").exists()


SCRIPTED_PROJECT = """\
version: 1
lake: ./lake
sources:
  t:
    connector: singer
    config:
      command: [{python}, {tap}]
      config: {{script: {script}}}
    datasets:
      s:
        key: [id]
"""


def hanging_tap(root: Path) -> dict[str, Any]:
    """A Singer project under ``root`` whose tap writes one record, then hangs for 120 s.

    Returns the tap's script; the tap writes its pid to ``root/tap.pid`` before it hangs.
    """
    schema = {"type": "object", "properties": {"id": {"type": "integer"}}}
    lines = [
        {"type": "SCHEMA", "stream": "s", "schema": schema, "key_properties": ["id"]},
        {"type": "RECORD", "stream": "s", "record": {"id": 1}},
    ]
    script: dict[str, Any] = {
        "catalog": {
            "streams": [{"tap_stream_id": "s", "schema": schema, "key_properties": ["id"]}]
        },
        "steps": [
            *({"out": json.dumps(line)} for line in lines),
            {"pid_file": str(root / "tap.pid")},
            {"sleep": 120},
        ],
    }
    (root / "script.json").write_text(json.dumps(script))
    (root / "combined.yaml").write_text(
        SCRIPTED_PROJECT.format(
            python=json.dumps(sys.executable),
            tap=json.dumps(str(TAPS / "script_tap.py")),
            script=json.dumps(str(root / "script.json")),
        )
    )
    return script


def capture_until_the_tap_hangs(
    root: Path, env: dict[str, str]
) -> tuple[subprocess.Popen[str], int]:
    """``combined capture`` of :func:`hanging_tap`'s project, once the tap hangs; its pid."""
    pid_file = root / "tap.pid"
    cli = subprocess.Popen(
        [sys.executable, "-c", "from combined.cli import main; main()", "capture"],
        cwd=root,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 60
    while not (pid_file.exists() and pid_file.read_text().strip()):
        if time.monotonic() > deadline or cli.poll() is not None:
            cli.kill()
            raise AssertionError(cli.communicate()[1])
        time.sleep(0.05)
    return cli, int(pid_file.read_text())


def test_sigterm_stops_a_capture_in_order_and_the_next_capture_closes_its_run(
    tmp_path: Path, tools: Any
) -> None:
    script = hanging_tap(tmp_path)
    private = tmp_path / "tmp"
    private.mkdir()
    cli, tap = capture_until_the_tap_hangs(tmp_path, {**os.environ, "TMPDIR": str(private)})
    try:
        assert len(list(private.iterdir())) == 1  # the tap's config, read mid-capture
        cli.send_signal(signal.SIGTERM)
        _, stderr = cli.communicate(timeout=60)
    finally:
        cli.kill()
        cli.wait()
    # finally blocks ran: the tap was stopped, its files (secrets) removed
    assert cli.returncode == 143, stderr
    assert "stopped by SIGTERM" in stderr
    assert dead(tap)
    assert list(private.iterdir()) == []

    # The Run released its leases: the next capture closes it at once, then succeeds.
    script["steps"] = script["steps"][:2]
    (tmp_path / "script.json").write_text(json.dumps(script))
    again = tools.cli(tmp_path, "capture")
    assert again.returncode == 0, again.stderr
    engine = Engine.open(tmp_path / "combined.yaml")
    try:
        latest, stopped = engine.runs(2)
        assert latest.state == "succeeded"
        assert stopped.state == "failed" and "interrupted" in (stopped.error or "")
        assert _ids(engine, "t.s") == [1]
    finally:
        engine.close()
