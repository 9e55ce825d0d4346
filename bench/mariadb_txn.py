"""One cdc capture's peak RSS after N row changes in one transaction or in many small ones.

Each case: a fresh MariaDB database and lake, a first (stitched) capture of
10 rows, then N inserted rows, in one ``INSERT ... SELECT`` (one transaction)
or in 1,000-row autocommitted statements, then one ``combined capture`` in a
child process: its wall, CPU-seconds and peak RSS (``bench.measure.timed_child``).

``narrow``: ``(id bigint primary key, a int, b int, note varchar(40), c int)``;
``wide``: ``(id bigint primary key, a int, b int, note text)`` with ~1.5 KB notes.

    PYTHONPATH=src:. python -m bench.mariadb_txn --rows 100000 300000 1000000 --shapes narrow wide
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from bench.mariadb import PROJECT, _connect, _database, _drop, _sql
from bench.measure import timed_child

TABLES = {
    "narrow": (
        "CREATE TABLE items (id BIGINT PRIMARY KEY, a INT, b INT, note VARCHAR(40), c INT)",
        "seq, seq, seq * 2, CONCAT('n', seq), seq % 7",
    ),
    "wide": (
        "CREATE TABLE items (id BIGINT PRIMARY KEY, a INT, b INT, note TEXT)",
        "seq, seq, seq * 2, REPEAT(CONCAT('x', seq), 1500 DIV (LENGTH(seq) + 1))",
    ),
}


def _capture(root: Path) -> tuple[float, float, float]:
    """One ``combined capture``: wall, CPU-seconds, peak RSS in MB."""
    argv = ["-c", "from combined.cli import main; main()", "capture"]
    rc, wall, rss, cpu, _, err = timed_child(argv, cwd=root)
    if rc != 0:
        raise SystemExit(f"capture failed: {err[-2000:]}")
    return wall, cpu, rss


def case(server: str, rows: int, shape: str, one: bool) -> dict[str, Any]:
    """The capture of ``rows`` inserts in one transaction (``one``) or in many."""
    name, dsn = _database(server)
    root = Path(tempfile.mkdtemp(prefix="my-txn-"))
    create, values = TABLES[shape]
    try:
        _sql(dsn, create, f"INSERT INTO items SELECT {values} FROM seq_1_to_10")
        (root / "combined.yaml").write_text(PROJECT.format(dsn=dsn, table="items", strategy="cdc"))
        _capture(root)
        _sql(dsn, "DELETE FROM items")
        step = rows if one else 1_000
        conn = _connect(dsn)
        with conn.cursor() as cur:
            for lo in range(0, rows, step):
                hi = min(lo + step, rows)
                cur.execute(f"INSERT INTO items SELECT {values} FROM seq_{lo + 1}_to_{hi}")
        conn.close()
        wall, cpu, rss = _capture(root)
        return {
            "rows": rows,
            "shape": shape,
            "transactions": "one" if one else f"{-(-rows // step)}",
            "wall_s": round(wall, 2),
            "cpu_s": round(cpu, 2),
            "changes_per_s": round(rows / wall),
            "peak_rss_mb": round(rss),
        }
    finally:
        _drop(server, name)
        shutil.rmtree(root, ignore_errors=True)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--rows", type=int, nargs="+", default=[100_000, 300_000, 1_000_000])
    p.add_argument("--shapes", nargs="+", choices=sorted(TABLES), default=["narrow", "wide"])
    p.add_argument("--many", action="store_true", help="also in 1,000-row transactions")
    p.add_argument(
        "--mariadb",
        default=os.environ.get("COMBINED_TEST_MARIADB_DSN", "mysql://root@127.0.0.1:3306/test"),
    )
    args = p.parse_args(argv)
    for shape in args.shapes:
        for rows in args.rows:
            for one in (True, False) if args.many else (True,):
                print(json.dumps(case(args.mariadb, rows, shape, one)), flush=True)


if __name__ == "__main__":
    main()
