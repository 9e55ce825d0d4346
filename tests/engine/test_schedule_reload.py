"""A running scheduler takes a changed project file at its next round, and keeps the
one it has when the new one does not load (a real ``combined schedule`` process)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from combined.engine import Engine

ADDED = """\
      orders_copy:
        relation: orders
        key: [id]
        schedule: {interval: 1s}
"""


def _until(what: Callable[[], bool], seconds: float, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + seconds
    while not what():
        assert proc.poll() is None, "the scheduler ended"
        assert time.monotonic() < deadline, "not in time"
        time.sleep(0.2)


def test_a_running_scheduler_takes_a_changed_project_file_and_keeps_one_that_does_not_load(
    tmp_path: Path, tools: Any
) -> None:
    """Reproduction: a scheduler read the project file once, when it started.
    A dataset added later was never scheduled, and a source's changed dsn
    was never used: every Run it queued was admitted under the file as it
    had been, and nothing said so. It now reads the file again each round
    once it changed; a file that does not load is told, and the previous
    one kept."""
    project = tools.make(tmp_path, orders=5)
    text = project.read_text().replace(
        "    datasets:\n", "    schedule: {interval: 1h}\n    datasets:\n", 1
    )
    project.write_text(text)
    log = tmp_path / "scheduler.err"
    with log.open("wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-c", "from combined.cli import main; main()", "schedule"],
            cwd=tmp_path,
            env=dict(os.environ),
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
    try:
        _until(lambda: "queued: shop (customers, orders)" in log.read_text(), 60, proc)
        project.write_text(text + "  broken: [\n")
        _until(lambda: "does not load" in log.read_text(), 30, proc)
        project.write_text(text + ADDED)
        _until(lambda: "queued: shop (orders_copy)" in log.read_text(), 30, proc)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
    assert proc.returncode == 143, log.read_text()
    told = log.read_text()
    assert "changed: the scheduler reloaded it" in told, told
    engine = Engine.open(project)
    try:
        runs = {tuple(r.datasets) for r in engine.runs(100)}
    finally:
        engine.close()
    assert ("orders_copy",) in runs, runs
