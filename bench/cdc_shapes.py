"""A CDC backlog drained at the default settings, on every table shape of bench/shapes.py.

For each shape: a fresh database holding the shape's table, a ``strategy: cdc``
project over it, ``combined cdc setup`` and the stitched snapshot; then every
row updated (the shape's update, in transactions of 100,000 rows), 1% of the
rows deleted and 1% inserted; then one ``combined capture`` drains the
backlog in a fresh process, measured (wall, CPU-seconds, peak RSS), and the
lake is checked against the source (rows, sum of ids). ``bench.cdc`` measures
the headline narrow and wide backlogs; this one hunts cliffs on the others
(300 columns, 1 MB JSON, 10 MB byte strings, long text keys, arrays...).

    python -m bench.cdc_shapes                              # every shape, at its default size
    python -m bench.cdc_shapes --shapes jsonbig byteabig wide300 --rows 0.5

``--rows`` scales each shape's size (``CDC_ROWS``: its table at full size is
often larger than a backlog needs).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from bench.cdc import PROJECT
from bench.measure import timed_child
from bench.workload import DEFAULT_SERVER_DSN, SHAPES, _insert_above_max, create_orders

#: Rows of each shape's table (and so updates of the backlog) at ``--rows 1``.
CDC_ROWS = {
    "wide300": 100_000,
    "jsonbig": 1_000,
    "byteabig": 40,
    "uuidkey": 1_000_000,
    "longkey": 1_000_000,
    "compkey": 1_000_000,
    "tiny": 2_000_000,
    "intarray": 50_000,
    "numeric38": 1_000_000,
    "timestamps": 1_000_000,
    "parted": 1_000_000,
    "sparse300": 50_000,
}


#: Rows each backlog transaction updates.
UPDATE_STEP = 100_000

_CLI = ["-c", "from combined.cli import main; main()"]


def _cli(root: Path, *args: str) -> None:
    """Run the CLI in ``root``; fail with its error."""
    done = subprocess.run([sys.executable, *_CLI, *args], cwd=root, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"combined {' '.join(args)} failed: {done.stderr[-2000:]}")


def _backlog(dsn: str, name: str, rows: int) -> int:
    """Every row updated, 1% deleted, 1% inserted: the changes made."""
    shape = SHAPES[name]
    t = sql.Identifier(shape.table)
    with psycopg.connect(dsn, autocommit=True) as conn:
        for lo in range(0, rows, UPDATE_STEP):
            conn.execute(
                sql.SQL("UPDATE {} SET " + shape.update + " WHERE id > {} AND id <= {}").format(
                    t, sql.Literal(lo), sql.Literal(lo + UPDATE_STEP)
                )
            )
        deleted = conn.execute(sql.SQL("DELETE FROM {} WHERE id % 100 = 7").format(t)).rowcount
        inserted = _insert_above_max(conn, t, max(rows // 100, 1), name)
    return rows + deleted + inserted


def _check(root: Path, dsn: str, table: str) -> bool:
    """Whether the lake holds the source's rows (count, sum of ids)."""
    from combined.engine import Engine

    engine = Engine.open(root / "combined.yaml")
    try:
        lake = engine.sql("SELECT count(*) AS n, sum(id) AS s FROM pg.events").to_pylist()[0]
    finally:
        engine.close()
    with psycopg.connect(dsn) as conn:
        query = sql.SQL("SELECT count(*), sum(id) FROM {}").format(sql.Identifier(table))
        source = conn.execute(query).fetchone()
    assert source is not None
    return (lake["n"], lake["s"]) == (int(source[0]), int(source[1] or 0))


def drain(
    server: str, name: str, rows: int, prefix: str = "combined_cdc_shapes_"
) -> dict[str, Any]:
    """Make ``name``'s backlog over ``rows`` rows in a database of its own (``prefix`` and
    the shape's name), drain and check it."""
    shape = SHAPES[name]
    database = f"{prefix}{name}"
    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{database}"')
    dsn = server.rsplit("/", 1)[0] + f"/{database}"
    root = Path(tempfile.mkdtemp(prefix=f"cdc-shape-{name}-"))
    try:
        create_orders(dsn, rows, table=shape.table, shape=name)
        # (bench.cdc's project: its one dataset over this shape's table and key)
        project = (
            PROJECT.format(dsn=dsn, prefix=f"cs{name}")
            .replace("public.events", f"public.{shape.table}")
            .replace("key: [id]", f"key: [{', '.join(shape.key)}]")
        )
        (root / "combined.yaml").write_text(project)
        _cli(root, "cdc", "setup", "pg")
        try:
            _cli(root, "capture")  # the stitched snapshot
            changes = _backlog(dsn, name, rows)
            rc, wall, rss, cpu, _, err = timed_child([*_CLI, "capture"], cwd=root)
            if rc:
                return {"shape": name, "rows": rows, "error": err[-2000:]}
            return {
                "shape": name,
                "changes": changes,
                "wall_s": round(wall, 2),
                "cpu_s": round(cpu, 2),
                "changes_per_s": round(changes / wall),
                "peak_rss_mb": round(rss),
                "lake_equals_source": _check(root, dsn, shape.table),
            }
        finally:
            _cli(root, "cdc", "teardown", "pg", "--yes")
    finally:
        shutil.rmtree(root, ignore_errors=True)
        with psycopg.connect(server, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')


def main(argv: list[str] | None = None) -> None:
    """Drain each shape's backlog; print a JSON line per shape, then a table."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", nargs="+", default=list(CDC_ROWS), choices=list(CDC_ROWS))
    p.add_argument("--rows", type=float, default=1.0, help="scale of each shape's rows")
    p.add_argument(
        "--dsn",
        default=os.environ.get("COMBINED_TEST_PG_DSN", DEFAULT_SERVER_DSN),
        help="a superuser DSN of the server",
    )
    p.add_argument(
        "--database-prefix",
        default="combined_cdc_shapes_",
        help="each shape's scratch database is named this and the shape's name",
    )
    args = p.parse_args(argv)
    results = []
    for name in args.shapes:
        result = drain(
            args.dsn, name, max(int(CDC_ROWS[name] * args.rows), 1), args.database_prefix
        )
        print(json.dumps(result), flush=True)
        results.append(result)
    print("\n| shape | changes | wall s | CPU-s | changes/s | peak RSS | lake = source |")
    print("|---|---:|---:|---:|---:|---:|---|")
    for r in results:
        if "error" in r:
            print(f"| {r['shape']} | failed: {r['error'].splitlines()[-1]} | | | | | |")
            continue
        print(
            f"| {r['shape']} | {r['changes']:,} | {r['wall_s']} | {r['cpu_s']} | "
            f"{r['changes_per_s']:,} | {r['peak_rss_mb']} MB | {r['lake_equals_source']} |"
        )


if __name__ == "__main__":
    main()
