"""Captures logging to a file write progress lines; SIGINT says what became of the Run.

Reproduction: under cron or CI (stderr a file), a long capture wrote only
its final line; Ctrl-C printed "Aborted!" and exit status 1, nothing about
the Run it left unfinished.
"""

from __future__ import annotations

import os
import re
import signal
import sqlite3
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
    assert {m.group(1) for m in lines} == {"extracting", "done"}, result.stderr
    # Where the shop's two datasets stand, phase by phase.
    standing = " ".join(re.findall(r"shop: 2 datasets \(([^)]*)\)", result.stderr))
    for phase in ("waiting", "extracting", "reducing", "2 committing"):
        assert phase in standing, result.stderr
    counts = [int(m.group(2).replace(",", "")) for m in lines if m.group(1) == "extracting"]
    assert len({c for c in counts if 0 < c < 150_000}) >= 3, counts  # lines while it reads
    assert int(lines[-1].group(2).replace(",", "")) == 150_000
    # With the default interval (10 s), a short capture writes its phases, not every batch.
    quiet = tools.cli(shop / "big", "capture")
    assert quiet.returncode == 0, quiet.stderr
    assert len([m for m in map(LINE.match, quiet.stderr.splitlines()) if m]) < len(lines)


def _many_tables(root: Path, tables: int) -> None:
    """A project whose one source holds ``tables`` small SQLite tables."""
    root.mkdir()
    con = sqlite3.connect(root / "many.db")
    for i in range(tables):
        con.execute(f"CREATE TABLE t{i} (id INTEGER PRIMARY KEY, v TEXT)")
        con.executemany(f"INSERT INTO t{i} VALUES (?, ?)", [(j, f"v{j}") for j in range(50)])
    con.commit()
    con.close()
    datasets = "".join(
        f"      t{i}:\n        key: [id]\n        strategy: snapshot\n" for i in range(tables)
    )
    (root / "combined.yaml").write_text(
        "version: 1\nlake: ./lake\ncatalog: sqlite:///.combined/catalog.db\n"
        "sources:\n  many:\n    connector: sqlite\n    config:\n      path: ./many.db\n"
        f"    datasets:\n{datasets}"
    )


def test_a_source_of_many_tables_logs_where_they_stand_not_a_line_per_phase(
    tmp_path: Path, tools: Any
) -> None:
    """Reproduction: 200 small tables logged 800 lines (4 phases each) before the summary."""
    _many_tables(tmp_path / "p", 24)
    quiet = tools.cli(tmp_path / "p", "capture")
    assert quiet.returncode == 0, quiet.stderr
    stamped = [ln for ln in quiet.stderr.splitlines() if re.match(r"^\d{4}-\d\d-\d\dT", ln)]
    assert len(stamped) < 8, quiet.stderr  # the start, and a round or two if the machine is slow
    assert sum(f"  many.t{i}: 50 read" in quiet.stdout for i in range(24)) == 24, quiet.stdout
    # Every event makes a round: each says where the 24 datasets stand.
    busy = tools.cli(tmp_path / "p", "capture", env={"COMBINED_PROGRESS_EVERY_S": "0"})
    assert busy.returncode == 0, busy.stderr
    standing = re.findall(r"many: 24 datasets \(([^)]*)\), \d+:\d\d:\d\d elapsed", busy.stderr)
    assert standing and "24 committing" in standing[-1], busy.stderr
    assert any("waiting" in s and "extracting" in s for s in standing), standing
    assert not re.search(r"many\.t\d+ (reducing|committing):", busy.stderr), busy.stderr


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
