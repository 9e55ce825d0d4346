"""Captures logging to a file write progress lines; SIGINT says what became of the Run.

Reproduction: under cron or CI (stderr a file), a long capture wrote only
its final line; Ctrl-C printed "Aborted!" and exit status 1, nothing about
the Run it left unfinished.
"""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path
from typing import Any

from tests.connectors.singer.fixtures import dead
from tests.engine.test_singer_capture import capture_until_the_tap_hangs, hanging_tap

from combined.engine import Engine

LINE = re.compile(
    r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ shop\.orders (\w+): ([\d,]+) rows, [\d.]+ MB, "
    r"\d+ deliveries, \d+:\d\d:\d\d elapsed$"
)


def test_a_capture_logging_to_a_file_writes_progress_lines(shop: Path, tools: Any) -> None:
    tools.make(shop / "big", orders=150_000)
    (shop / "big" / "combined.yaml").write_text(
        (shop / "big" / "combined.yaml")
        .read_text()
        .replace(
            "orders:\n        key: [id]", "orders:\n        key: [id]\n        batch_rows: 10000"
        )
    )
    # Every progress report makes a line: the interval's clock is not what is tested.
    result = tools.cli(shop / "big", "capture", env={"COMBINED_PROGRESS_EVERY_S": "0"})
    assert result.returncode == 0, result.stderr
    lines = [m for m in map(LINE.match, result.stderr.splitlines()) if m]
    phases = [m.group(1) for m in lines]
    assert {"extracting", "reducing", "committing", "done"} <= set(phases), result.stderr
    counts = [int(m.group(2).replace(",", "")) for m in lines if m.group(1) == "extracting"]
    assert len({c for c in counts if 0 < c < 150_000}) >= 3, counts  # lines while it reads
    assert int(lines[-1].group(2).replace(",", "")) == 150_000
    # With the default interval (10 s), a short capture writes its phases, not every batch.
    quiet = tools.cli(shop / "big", "capture")
    assert quiet.returncode == 0, quiet.stderr
    assert len([m for m in map(LINE.match, quiet.stderr.splitlines()) if m]) < len(lines)


def test_sigint_stops_a_capture_with_130_and_says_what_became_of_the_run(
    tmp_path: Path, tools: Any
) -> None:
    hanging_tap(tmp_path)
    cli, tap = capture_until_the_tap_hangs(tmp_path, dict(os.environ))
    try:
        cli.send_signal(signal.SIGINT)
        _, stderr = cli.communicate(timeout=60)
    finally:
        cli.kill()
        cli.wait()
    assert cli.returncode == 130, stderr
    engine = Engine.open(tmp_path / "combined.yaml")
    try:
        (run,) = engine.runs()
    finally:
        engine.close()
    said = " ".join(stderr.split())
    assert "stopped by SIGINT" in said and "Aborted!" not in said
    assert f"run {run.id} (t) was interrupted: it stays unfinished" in said
    assert "marks it failed" in said
    assert dead(tap)
    assert run.state not in ("succeeded", "failed")  # unfinished, as it says
