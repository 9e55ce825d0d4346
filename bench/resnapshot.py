"""A snapshot re-capture after the table was dropped and loaded again (``pgbench -i``).

A table of ``pgbench_accounts``' shape (``aid`` key, ``bid``, ``abalance``,
``filler char(84)``) is loaded, captured once, then dropped, created and
loaded again as ``pgbench -i`` does it, and re-captured in a fresh process,
measured (wall, CPU-seconds, peak RSS) at the default settings. What the
reload changes, against the lake:

* ``same``: nothing (``pgbench -i`` loads the same rows again);
* ``changed``: every row's ``abalance`` (the lake held other balances);
* ``new``: every id (the lake held other ids): as many inserts and deletes.

The database must exist and be empty of such a table::

    python -m bench.resnapshot --dsn postgresql://postgres@127.0.0.1:5432/scratch --rows 2000000
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import psycopg

from bench.measure import timed_child
from bench.run import write_project

MODES = ("same", "changed", "new")

_CLI = ["-c", "from combined.cli import main; main()"]


def load(dsn: str, rows: int, first_id: int = 1, balance: str = "0") -> None:
    """Drop, create and load the table as ``pgbench -i`` does (ids from ``first_id``)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS pgbench_accounts")
        conn.execute(
            "CREATE TABLE pgbench_accounts (aid int NOT NULL, bid int, abalance int, "
            "filler char(84)) WITH (fillfactor = 100)"
        )
        conn.execute(
            "INSERT INTO pgbench_accounts SELECT aid, (aid - 1) / 100000 + 1, "  # noqa: S608
            f"{balance}, '' FROM generate_series({first_id}, {first_id + rows - 1}) AS aid"
        )
        conn.execute("ALTER TABLE pgbench_accounts ADD PRIMARY KEY (aid)")
        conn.execute("VACUUM ANALYZE pgbench_accounts")


def run(dsn: str, mode: str, rows: int) -> dict[str, Any]:
    """Load, capture, reload (``mode``) and re-capture measured; the re-capture's figures."""
    root = Path(tempfile.mkdtemp(prefix=f"resnapshot-{mode}-"))
    try:
        # (bench.run's project: its ``orders`` dataset over this table, keyed by aid)
        write_project(root, dsn, "pgbench_accounts", None, key="aid")
        load(
            dsn,
            rows,
            first_id=rows + 1 if mode == "new" else 1,
            balance="aid % 1000 + 1" if mode == "changed" else "0",
        )
        first = subprocess.run(
            [sys.executable, *_CLI, "capture", "pg.orders"],
            cwd=root,
            capture_output=True,
            text=True,
        )
        if first.returncode:
            return {"mode": mode, "rows": rows, "error": "first capture: " + first.stderr[-2000:]}
        load(dsn, rows)
        rc, wall, rss, cpu, last, err = timed_child([*_CLI, "capture", "pg.orders"], cwd=root)
        out = {"mode": mode, "rows": rows, "wall_s": round(wall, 2), "cpu_s": round(cpu, 2)}
        out |= {"peak_rss_mb": round(rss), "said": last.strip()}
        if rc:
            out["error"] = err[-2000:]
        return out
    finally:
        shutil.rmtree(root, ignore_errors=True)
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("DROP TABLE IF EXISTS pgbench_accounts")


def main(argv: list[str] | None = None) -> None:
    """Run each mode; print a JSON line for each."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dsn", required=True, help="a database of the server, to hold the table")
    p.add_argument("--rows", type=int, default=2_000_000)
    p.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    args = p.parse_args(argv)
    for mode in args.modes:
        print(json.dumps(run(args.dsn, mode, args.rows)), flush=True)


if __name__ == "__main__":
    main()
