"""A ``history: true`` dataset's re-captures: 1% of the rows changed, then every row.

``python -m bench.history --rows 2000000 --workdir DIR [--old-src OLD/src] [--rounds 2]``

Two databases get the same ``orders`` table (bench/workload.py's), its
dataset ``history: true`` in bench/run.py's project; a first
capture of each code (this checkout's, and ``--old-src``'s when given: a
``src`` directory put first on ``PYTHONPATH``) makes a lake with its history;
then the first database has 1% of its rows updated, the second every row,
and each code re-captures a fresh copy of its lake, the codes alternating,
``--rounds`` times. Every capture runs in its own process under
``/usr/bin/time``: wall seconds, user and system CPU seconds, peak RSS.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

import psycopg

from bench.run import write_project
from bench.workload import SHAPES, TABLE, create_orders, database_dsn, drop_database, reset_database

CAPTURE = (
    "import sys; from combined.engine import Engine; e = Engine.open(sys.argv[1]); "
    "(r,) = e.capture(['pg.orders']); e.close(); assert r.state == 'succeeded', r.error"
)


def _capture(project: Path, src: str | None) -> str:
    """Capture in a fresh process: ``wall s, user s, sys s, peak KB``."""
    env = dict(os.environ)
    if src:
        env["PYTHONPATH"] = src
    done = subprocess.run(
        ["/usr/bin/time", "-f", "%e s %U user %S sys %M KB", sys.executable, "-c", CAPTURE]
        + [str(project / "combined.yaml")],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stderr.strip().splitlines()[-1]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=2_000_000)
    p.add_argument("--workdir", type=Path, required=True)
    p.add_argument("--old-src", help="the old code's src directory (A/B)")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--dsn", default=os.environ.get("COMBINED_TEST_PG_DSN", ""))
    p.add_argument("--database", default="combined_bench_history")
    args = p.parse_args()
    server = args.dsn or "postgresql://postgres@127.0.0.1:5432/postgres"
    names = {"1%": args.database, "all": f"{args.database}_all"}
    for name in names.values():
        create_orders(reset_database(server, name), args.rows)
    codes = {"new": None, **({"old": args.old_src} if args.old_src else {})}
    try:
        for code, src in codes.items():
            for case, name in names.items():
                base = args.workdir / f"{code}-{case}"
                shutil.rmtree(base, ignore_errors=True)
                path = write_project(base, database_dsn(server, name), TABLE, None)
                key = "        key: [id]\n"
                path.write_text(path.read_text().replace(key, key + "        history: true\n", 1))
                print(f"{code} first capture ({case}): {_capture(base, src)}", flush=True)
        for case, name in names.items():
            with psycopg.connect(database_dsn(server, name), autocommit=True) as conn:
                update = f"UPDATE {TABLE} SET {SHAPES['orders'].update}"
                conn.execute(update + (" WHERE id % 100 = 1" if case == "1%" else ""))
        for case in names:
            for n in range(args.rounds):
                for code, src in codes.items():
                    run = args.workdir / "run"
                    shutil.rmtree(run, ignore_errors=True)
                    shutil.copytree(args.workdir / f"{code}-{case}", run, symlinks=True)
                    print(f"{code} re-capture, {case} changed, round {n + 1}: {_capture(run, src)}")
    finally:
        for name in names.values():
            drop_database(server, name)


if __name__ == "__main__":
    main()
