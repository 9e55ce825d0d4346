"""bench.history: a history dataset's first capture and its two re-captures, each measured."""

from __future__ import annotations

import re
import subprocess
import sys
import uuid
from pathlib import Path


def test_the_captures_are_measured_and_the_databases_dropped(
    pg_server_dsn: str, tmp_path: Path
) -> None:
    import psycopg

    database = f"bench_history_{uuid.uuid4().hex[:8]}"
    done = subprocess.run(
        [sys.executable, "-m", "bench.history", "--rows", "300", "--workdir", str(tmp_path)]
        + ["--rounds", "1", "--dsn", pg_server_dsn, "--database", database],
        capture_output=True,
        text=True,
        cwd=Path(__file__).parents[2],
    )
    assert done.returncode == 0, done.stderr
    measured = r": [\d.]+ s [\d.]+ user [\d.]+ sys \d+ KB$"
    lines = done.stdout.splitlines()
    assert [re.sub(measured, "", line) for line in lines] == [
        "new first capture (1%)",
        "new first capture (all)",
        "new re-capture, 1% changed, round 1",
        "new re-capture, all changed, round 1",
    ]
    assert all(re.search(measured, line) for line in lines)
    # the re-captures mirrored the changed rows into each lake's history
    history = tmp_path / "run" / "lake" / "_history" / "pg" / "orders" / "_delta_log"
    assert len(list(history.glob("*.json"))) == 2
    with psycopg.connect(pg_server_dsn) as conn:
        left = conn.execute(
            "SELECT count(*) FROM pg_database WHERE datname LIKE %s", (database + "%",)
        ).fetchone()
    assert left == (0,)
