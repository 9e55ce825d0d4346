"""Reads alone (status, sql, publications, a cdc status) against a store that never answers.

A data table's log was loaded with delta-rs' default bounds (a request
retried for 180 s) and its files read through Arrow's 11 tries: `combined
status`, `sql` and `publications` waited 139-147 s before they said anything
(`publications` then as an internal error, exit 70). Reads alone are now
bounded as the ledger's records are; commits keep the long retries that ride
out 503 SlowDown. Real S3 (moto) on 127.0.0.1 for the lake, then a socket that
accepts and never answers in its place.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from combined.engine import Engine
from combined.errors import LakeError

WORKER = "from combined.cli import main; main()"


@pytest.fixture
def silent_lake(
    tmp_path: Path,
    tools: Any,
    s3_bucket: str,
    silent_server: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> Path:
    """The shop captured into an S3 lake, whose store then never answers: its project file."""
    tools.make(tmp_path)
    project = tmp_path / "combined.yaml"
    lake = f"s3://{s3_bucket}/lake"
    project.write_text(project.read_text().replace("lake: ./lake", f"lake: {lake}"))
    done = tools.cli(tmp_path, "capture")
    assert done.returncode == 0, done.stderr
    port = silent_server.dsn.split("port=")[1].split()[0]
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{port}")
    monkeypatch.delenv("AWS_MAX_ATTEMPTS", raising=False)
    return project


def test_a_read_of_a_tables_log_is_told_within_its_bound_not_after_three_minutes(
    silent_lake: Path, silent_server: Any
) -> None:
    # What `combined cdc status` reads of each dataset: its newest commit, from the log.
    engine = Engine.open(silent_lake)
    try:
        began = time.monotonic()
        outcome = silent_server.outcome(lambda: engine.committed_checkpoint("shop", "orders"), 75)
        took = time.monotonic() - began
    finally:
        engine.close()
    assert isinstance(outcome, LakeError), outcome
    assert "shop.orders: the lake at" in outcome.message and "could not be read" in outcome.message
    assert took < 60, took  # (delta-rs' default: 181 s)


def test_status_sql_and_publications_tell_a_store_that_never_answers_in_seconds(
    silent_lake: Path,
) -> None:
    commands = {
        "status": ["status"],
        "sql": ["sql", "select count(*) from shop.orders"],
        "publications": ["publications"],
    }
    began = time.monotonic()
    running = {
        name: subprocess.Popen(
            [sys.executable, "-c", WORKER, *args],
            cwd=silent_lake.parent,
            env=dict(os.environ),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name, args in commands.items()
    }
    ended = {}
    try:
        for name, process in running.items():
            out, err = process.communicate(timeout=max(75 - (time.monotonic() - began), 1))
            ended[name] = (process.returncode, time.monotonic() - began, " ".join(err.split()))
    except subprocess.TimeoutExpired:
        pytest.fail(f"still waiting for the silent store after 75 s: {sorted(ended)} ended")
    finally:
        for process in running.values():
            if process.poll() is None:
                process.kill()
                process.communicate()
    assert ended["status"][0] == 0, ended["status"]  # the catalog's rows, the lake unlisted
    for name in ("sql", "publications"):
        code, _, said = ended[name]
        assert code == 2, (name, ended[name])  # (publications: an internal error, 70)
        assert "the lake at" in said and "could not be read: the store could not be reached" in said
    assert max(took for _, took, _ in ended.values()) < 60, ended  # (139-147 s before)
