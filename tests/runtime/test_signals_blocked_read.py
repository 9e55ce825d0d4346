"""SIGTERM and SIGINT reach a command whose main thread is blocked in a database driver.

Real ``combined`` processes reading a PostgreSQL view whose statement sleeps
far longer than the test waits: each signal must be acted on at once.
"""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
import pytest
from tests.engine.test_attempt_deadline_postgres import PROJECT  # (pg.stuck, key id)

from combined.catalog import runs as runs_repo
from combined.engine import Engine

pytestmark = pytest.mark.beside  # (mostly waits on the processes it starts)

#: What the view's statement sleeps: far past anything the test waits for.
SLEEP_S = 300
#: How soon a signal must be acted on (a cancel request, a poll: well under it).
PROMPT_S = 8.0


@pytest.fixture
def stuck(tmp_path: Path, pg_database: str) -> Path:
    """A project whose one dataset is a view that sleeps on the server."""
    with psycopg.connect(pg_database, autocommit=True) as conn:
        conn.execute(
            "CREATE VIEW stuck AS SELECT g AS id FROM generate_series(1, 3) g, "
            f"(SELECT pg_sleep({SLEEP_S})) s"
        )
    (tmp_path / "combined.yaml").write_text(PROJECT.format(dsn=pg_database))
    return tmp_path


class _Lines:
    """A process's stderr, line by line, as it comes."""

    def __init__(self, child: subprocess.Popen[str]) -> None:
        self.seen: list[str] = []
        self._lines: queue.Queue[str | None] = queue.Queue()

        def pump() -> None:
            assert child.stderr is not None
            with child.stderr:  # (closed at its end)
                for line in child.stderr:
                    self._lines.put(line)
            self._lines.put(None)

        threading.Thread(target=pump, daemon=True).start()

    def wait_for(self, text: str, within: float) -> float:
        """Seconds until a line with ``text`` came; fails after ``within``."""
        started = time.monotonic()
        while (left := started + within - time.monotonic()) > 0:
            try:
                line = self._lines.get(timeout=left)
            except queue.Empty:
                break
            if line is None:
                break
            self.seen.append(line)
            if text in line:
                return time.monotonic() - started
        pytest.fail(f"no line with {text!r} within {within} s; stderr: {''.join(self.seen)}")

    def rest(self) -> str:
        while (line := self._lines.get(timeout=30)) is not None:
            self.seen.append(line)
        return "".join(self.seen)


@contextmanager
def _combined(root: Path, *args: str) -> Iterator[tuple[subprocess.Popen[str], _Lines]]:
    child = subprocess.Popen(
        [sys.executable, "-c", "from combined.cli import main; main()", *args],
        cwd=root,
        env={**os.environ, "COMBINED_RETRY_BACKOFF_S": "0"},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        yield child, _Lines(child)
    finally:
        if child.poll() is None:
            child.kill()
        child.wait()


def _exit(child: subprocess.Popen[str], within: float) -> float:
    """Seconds until ``child`` exited; fails after ``within``."""
    started = time.monotonic()
    try:
        child.wait(timeout=within)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the command still runs {within} s after the signal")
    return time.monotonic() - started


def _left_unfinished(root: Path, dsn: str) -> str:
    """The one Run's id, checked stopped as a signal leaves it: unfinished, leases released,
    its statement no longer on the server, one Attempt."""
    engine = Engine.open(root / "combined.yaml")
    try:
        (run,) = engine.runs()
        assert run.state == "extracting"
        assert engine.catalog.lease_holder("pg", "stuck") is None
        with engine.catalog.begin() as conn:
            assert len(runs_repo.list_attempts(conn, run.id)) == 1  # (never retried)
    finally:
        engine.close()
    with psycopg.connect(dsn, autocommit=True) as conn:
        left = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND query LIKE %s"
            " AND pid <> pg_backend_pid()",
            (dsn.rsplit("/", 1)[1], "%stuck%"),
        ).fetchone()
    assert left == (0,), "the stopped read's statement still runs on the server"
    return run.id


def test_a_worker_blocked_in_a_read_hears_each_sigterm_and_the_second_stops_the_run(
    stuck: Path, pg_database: str, tools: Any
) -> None:
    """Reproduction: with the Run's read waiting on a statement that sleeps, a
    worker sent SIGTERM twice, 5 s apart, said nothing; ~90 s later (the
    statement's end) the Run succeeded and the worker exited 143. Python runs
    a handler only in the main thread, which the driver held; the two
    SIGTERMs were taken for one. Now the first is acknowledged at once, and
    the second stops the Run as it stops `combined capture`: its statement
    canceled on the server, the Run unfinished with its leases released,
    exit 143; the next repair marks it failed and queues its retry."""
    assert tools.cli(stuck, "capture", "--enqueue", "pg.stuck").returncode == 0
    with _combined(stuck, "worker", "--once") as (child, lines):
        lines.wait_for("capturing pg (stuck)", within=60)
        time.sleep(1)  # (in the statement)
        child.send_signal(signal.SIGTERM)
        assert lines.wait_for("send SIGTERM again to stop it now", within=PROMPT_S) < 3
        time.sleep(5)
        assert child.poll() is None  # the Run goes on
        child.send_signal(signal.SIGTERM)
        assert lines.wait_for("stopping the current Run now", within=PROMPT_S) < 3
        assert _exit(child, within=PROMPT_S) < PROMPT_S
        err = lines.rest()
    assert child.returncode == 143, err
    assert "stopped by SIGTERM" in err and "was interrupted" in err, err
    run_id = _left_unfinished(stuck, pg_database)
    repaired = tools.cli(stuck, "repair")
    assert f"run {run_id} was interrupted: marked failed" in repaired.stdout + repaired.stderr, (
        repaired
    )
    engine = Engine.open(stuck / "combined.yaml")
    try:
        states = {(r.id == run_id, r.trigger): r.state for r in engine.runs()}
    finally:
        engine.close()
    assert states == {(True, "first_sync"): "failed", (False, "recovery"): "queued"}


@pytest.mark.parametrize(("sig", "status"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_capture_blocked_in_a_read_stops_at_once_on_sigint_or_sigterm(
    stuck: Path, pg_database: str, sig: signal.Signals, status: int
) -> None:
    """Reproduction: Ctrl-C of a capture whose read waited on a sleeping
    statement was taken by the ADBC driver's own SIGINT handler, which
    canceled the statement and never told Python: the Attempt failed as a
    lost connection and was retried, and the capture went on (exit 0 ~90 s
    later). SIGTERM waited for the statement. Both now stop the command at
    once, the Run left for the next capture to close."""
    with _combined(stuck, "capture", "pg.stuck") as (child, lines):
        lines.wait_for("capturing pg (stuck)", within=60)
        time.sleep(1)  # (in the statement)
        child.send_signal(sig)
        assert _exit(child, within=PROMPT_S) < PROMPT_S
        err = lines.rest()
    assert child.returncode == status, err
    assert f"stopped by {sig.name}" in err and "retrying" not in err, err
    _left_unfinished(stuck, pg_database)
