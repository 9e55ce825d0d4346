"""A single 1M-row transaction streams through a capture in bounded memory."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from combined.engine import Engine

PROJECT = """\
version: 1
lake: ./lake
reduction_memory: 256MiB
sources:
  pg:
    connector: postgres
    config:
      dsn: {dsn}
      slot_prefix: {prefix}
    datasets:
      big:
        relation: public.big
        key: [id]
        strategy: cdc
        batch_rows: 20000
"""

#: What one capture of 1M rows (~330 MB of text on the wire) may hold at its peak.
CEILING_MB = 800


def _peak_rss_mb(root: Path, *args: str) -> tuple[int, float]:
    """Run the CLI in a child process and report its exit code and peak RSS."""
    code = (
        "import resource, subprocess, sys;"
        "r = subprocess.run([sys.executable, '-c', 'from combined.cli import main; main()',"
        " *sys.argv[1:]]);"
        "print(r.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, *args], cwd=root, capture_output=True, text=True, timeout=900
    )
    rc, kb = out.stdout.strip().splitlines()[-1].split()
    return int(rc), int(kb) / 1024


@pytest.fixture
def big(tmp_path: Path, cdc_db) -> tuple[Path, str]:
    with psycopg.connect(cdc_db.dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE big (id bigint PRIMARY KEY, v int, pad text)")
    (tmp_path / "combined.yaml").write_text(PROJECT.format(dsn=cdc_db.dsn, prefix=cdc_db.prefix))
    cdc_db.slot("public.big")
    return tmp_path, cdc_db.dsn


@pytest.mark.slow
def test_a_million_row_transaction_in_bounded_memory(big: tuple[Path, str]) -> None:
    root, dsn = big
    rc, _ = _peak_rss_mb(root, "capture")  # the stitched snapshot of the empty table
    assert rc == 0
    with psycopg.connect(dsn) as conn:  # one transaction
        conn.execute(
            "INSERT INTO big SELECT g, g % 1000, repeat('x', 300) "
            "FROM generate_series(1, 1000000) g"
        )
    rc, peak = _peak_rss_mb(root, "capture")
    assert rc == 0
    assert peak < CEILING_MB, f"peak RSS {peak:.0f} MB"
    engine = Engine.open(root / "combined.yaml")
    try:
        got = engine.sql("SELECT count(*) AS n, sum(v) AS s FROM pg.big").to_pylist()[0]
        assert got == {"n": 1_000_000, "s": sum(g % 1000 for g in range(1, 1_000_001))}
    finally:
        engine.close()
