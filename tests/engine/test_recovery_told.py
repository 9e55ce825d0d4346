"""A capture that recovers what a killed one left tells the person running it.

Every capture first repairs: it projects into the catalog the lake commits a
killed Run made (its Deliveries, dataset version and MAR) and ends that Run
``failed``. Before, the capture did so silently: the person saw a capture
that changed nothing (``+0 ~0 -0``, the killed Run's changes already in the
lake) and no word of the Run it had just ended, nor of the commit projected.
"""

from __future__ import annotations

import re
import signal
from pathlib import Path
from typing import Any


def test_a_capture_after_a_killed_commit_says_what_it_recovered(
    tmp_path: Path, tools: Any, lake_url: str
) -> None:
    tools.make(tmp_path)
    project = tmp_path / "combined.yaml"
    project.write_text(project.read_text().replace("lake: ./lake", f"lake: {lake_url}"))
    assert tools.cli(tmp_path, "capture").returncode == 0
    tools.sql(tmp_path, "UPDATE orders SET status = 'shipped' WHERE id <= 10;")
    killed = tools.cli(tmp_path, "capture", env={"COMBINED_FAULT": "after_commit"})
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    (dead,) = re.findall(r"run (r\S+): capturing", killed.stdout + killed.stderr)
    again = tools.cli(tmp_path, "capture")
    assert again.returncode == 0, again.stderr
    said = " ".join((again.stdout + again.stderr).split())
    assert f"shop.orders: projected lake version 1 (run {dead}) into the catalog" in said
    assert f"run {dead} was interrupted: marked failed" in said
    # the Activity says the Run was interrupted, never that it recovered (targets were
    # sent `run.recovered`, the end of an alert, right after the Run's alert.run_failed)
    from combined.engine import Engine

    engine = Engine.open(project)
    try:
        kinds = {(e["kind"], e["run_id"]) for e in engine.activity()}
        assert ("run.interrupted", dead) in kinds and ("alert.run_failed", dead) in kinds
        assert ("run.recovered", dead) not in kinds
    finally:
        engine.close()
