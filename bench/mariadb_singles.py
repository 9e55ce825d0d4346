"""A MariaDB binlog backlog of single-row transactions, drained by one ``combined capture``.

``prepare`` makes the backlog once: a fresh database (``--database``) with
``t (id bigint primary key, a int, s varchar(40))`` of 1,000 rows, a cdc
project over it, ``combined cdc setup`` and the stitched first capture, then
N autocommitted single-row statements (a stored procedure: each statement its
own transaction, or with ``--one`` all in one): 60% inserts of new keys, 30%
updates (a third of them moving a row to a new key), 10% deletes. The project
(lake and state) is kept as it was before the backlog's capture.

``run`` copies that project and drains the backlog with one ``combined
capture`` in a fresh child (``PYTHONPATH`` decides whose code): wall,
CPU-seconds, peak RSS, and whether the lake equals the source (rows, sums of
``id``, ``a`` and ``length(s)``). Runs of old and new code alternate on the
same backlog::

    PYTHONPATH=src:. python -m bench.mariadb_singles prepare --database h_x --changes 100000 DIR
    PYTHONPATH=<tree>/src:. python -m bench.mariadb_singles run --database h_x DIR
    python -m bench.mariadb_singles drop --database h_x DIR
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from bench.cdc import _cli_cpu
from bench.mariadb import PROJECT, _connect, _drop, _sql

TABLE = "CREATE TABLE t (id BIGINT PRIMARY KEY, a INT, s VARCHAR(40))"
#: N autocommitted single-row changes: 6 inserts, 3 updates (one a key move), 1 delete in 10.
BACKLOG = """CREATE PROCEDURE backlog(n INT)
BEGIN
  DECLARE i INT DEFAULT 0;
  DECLARE top BIGINT DEFAULT 1000;
  WHILE i < n DO
    CASE i % 10
      WHEN 6 THEN UPDATE t SET a = a + 1, s = CONCAT('u', i) WHERE id = top - 3;
      WHEN 7 THEN UPDATE t SET a = a + 2 WHERE id = top - 5;
      WHEN 8 THEN UPDATE t SET id = top + 1000000000 WHERE id = top - 1;
      WHEN 9 THEN DELETE FROM t WHERE id = top - 2;
      ELSE BEGIN SET top = top + 1; INSERT INTO t VALUES (top, i, CONCAT('n', i)); END;
    END CASE;
    SET i = i + 1;
  END WHILE;
END"""
CHECK = "SELECT count(*), sum(id), sum(a), sum(length(s)) FROM {t}"


def _dsn(server: str, name: str) -> str:
    parts = urlsplit(server)
    return f"{parts.scheme}://{parts.netloc}/{name}"


def prepare(server: str, name: str, changes: int, root: Path, one: bool) -> dict[str, Any]:
    """The database, the project first-captured, then the backlog (kept at ``root/base``);
    ``one``: its statements in one transaction."""
    _sql(server, f"CREATE DATABASE `{name}`")
    dsn = _dsn(server, name)
    _sql(dsn, TABLE, "INSERT INTO t SELECT seq, seq, CONCAT('n', seq) FROM seq_1_to_1000", BACKLOG)
    base = root / "base"
    base.mkdir(parents=True)
    (base / "combined.yaml").write_text(PROJECT.format(dsn=dsn, table="t", strategy="cdc"))
    for step in (("cdc", "setup", "my"), ("capture",)):
        rc, _, _, _, err = _cli_cpu(base, *step)
        if rc != 0:
            raise SystemExit(f"{' '.join(step)} failed: {err}")
    conn = _connect(dsn)
    conn.autocommit(True)
    with conn.cursor() as cur:
        cur.execute("START TRANSACTION" if one else "DO 0")
        cur.execute(f"CALL backlog({int(changes)})")
        cur.execute("COMMIT")
    conn.close()
    return {"changes": changes, "source": _sql(dsn, CHECK.format(t="t"))[0]}


def run(server: str, name: str, root: Path) -> dict[str, Any]:
    """One capture of the backlog, from a copy of the project as ``prepare`` left it."""
    work = Path(tempfile.mkdtemp(prefix="singles-", dir=root))
    try:
        shutil.copytree(root / "base", work, dirs_exist_ok=True)
        rc, wall, rss, cpu, err = _cli_cpu(work, "capture")
        if rc != 0:
            raise SystemExit(f"capture failed: {err}")
        from combined.engine import Engine

        engine = Engine.open(work / "combined.yaml")
        try:
            lake = engine.sql(CHECK.format(t="my.t")).to_pylist()[0]
        finally:
            engine.close()
        source = _sql(_dsn(server, name), CHECK.format(t="t"))[0]
        return {
            "wall_s": round(wall, 2),
            "cpu_s": round(cpu, 2),
            "peak_rss_mb": round(rss),
            "lake_equals_source": [int(v) for v in lake.values()] == [int(v) for v in source],
        }
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("action", choices=["prepare", "run", "drop"])
    p.add_argument("root", type=Path)
    p.add_argument("--database", required=True)
    p.add_argument("--changes", type=int, default=100_000)
    p.add_argument("--one", action="store_true", help="the backlog in one transaction")
    p.add_argument(
        "--mariadb",
        default=os.environ.get("COMBINED_TEST_MARIADB_DSN", "mysql://root@127.0.0.1:3306/test"),
    )
    args = p.parse_args(argv)
    if args.action == "prepare":
        out = prepare(args.mariadb, args.database, args.changes, args.root, args.one)
    elif args.action == "run":
        out = run(args.mariadb, args.database, args.root)
    else:
        _drop(args.mariadb, args.database)
        shutil.rmtree(args.root, ignore_errors=True)
        out = {"dropped": args.database}
    print(json.dumps(out, default=str), flush=True)


if __name__ == "__main__":
    main()
