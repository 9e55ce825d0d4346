"""Many small tables (issue 25): what a table costs besides its rows.

``python -m bench.many [--tables 200] [--rows 100] [--connectors postgres mariadb]``

An application database is often hundreds of small tables, where a capture's
cost is what it spends a table (connections, catalog transactions, the
lake's logs, the checks), not a row. For each connector, a new database of
``--tables`` tables of ``--rows`` rows (``id bigint PRIMARY KEY, v int, s
text, updated_at timestamp``) and a project with one ``snapshot`` dataset a
table; each step runs in a fresh process:

1. **floor**: one process reads every table with the fastest Arrow read we
   know of (ADBC for PostgreSQL, connectorx for MariaDB) into one Parquet
   file a table;
2. **first capture**: ``combined capture`` into an empty lake;
3. **unchanged re-capture**: ``combined capture`` again, nothing changed;
4. **changed re-capture**: one row of each table updated, then ``combined
   capture``.

Reported for each: wall, the process's CPU-seconds (user + system), the
server's CPU-seconds on the same host, peak RSS, CPU milliseconds a table,
and the ratio to the floor (a process's CPU includes its start-up, about a
second of imports: hence the default of 200 tables); after the last
capture, that the lake equals the source (rows and ``sum(v)`` of every
table).

Wall times on a shared machine are noisy: compare figures made side by side.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from bench.cdc import _cli_cpu
from bench.mariadb import _server_cpu as _maria_server_cpu
from bench.mariadb import _sql as _maria_sql
from bench.measure import ServerCpu, postmaster_of, server_cpu, timed_child
from bench.report import print_steps

PG_SERVER = "postgresql://postgres@127.0.0.1:5432/postgres"
MARIADB_SERVER = "mysql://root@127.0.0.1:3306/test"
STEPS = ("floor", "first capture", "unchanged re-capture", "changed re-capture")

CREATE = "CREATE TABLE t{i} (id bigint PRIMARY KEY, v int, s text, updated_at timestamp)"
PG_FILL = (
    "INSERT INTO t{i} SELECT g, g, 's' || g, timestamp '2026-01-01' + g * interval '1 minute' "
    "FROM generate_series(1, {rows}) g"
)
MARIA_FILL = (
    "INSERT INTO t{i} SELECT seq, seq, CONCAT('s', seq), "
    "TIMESTAMP '2026-01-01 00:00:00' + INTERVAL seq MINUTE FROM seq_1_to_{rows}"
)


class Source:
    """One connector's database of many tables: made, changed, compared, dropped."""

    def __init__(self, connector: str, server: str, tables: int, rows: int) -> None:
        self.connector, self.server, self.tables, self.rows = connector, server, tables, rows
        self.name = f"combined_many_bench_{uuid.uuid4().hex[:6]}"
        parts = urlsplit(server)
        self.dsn = f"{parts.scheme}://{parts.netloc}/{self.name}"

    def execute(self, statements: list[str], dsn: str | None = None) -> list[Any]:
        """Run ``statements`` in autocommit; the last one's rows."""
        if self.connector == "postgres":
            import psycopg

            rows: list[Any] = []
            with psycopg.connect(dsn or self.dsn, autocommit=True) as conn:
                for statement in statements:
                    cur = conn.execute(statement)
                    rows = cur.fetchall() if cur.description else []
            return rows
        return _maria_sql(dsn or self.dsn, *statements)

    def create(self) -> None:
        quote = '"' if self.connector == "postgres" else "`"
        self.execute([f"CREATE DATABASE {quote}{self.name}{quote}"], self.server)
        fill = PG_FILL if self.connector == "postgres" else MARIA_FILL
        statements: list[str] = []
        for i in range(1, self.tables + 1):
            statements += [CREATE.format(i=i), fill.format(i=i, rows=self.rows)]
        self.execute(statements)

    def change(self) -> None:
        """One row of each table updated (its ``v`` by one)."""
        self.execute([f"UPDATE t{i} SET v = v + 1 WHERE id = 1" for i in range(1, self.tables + 1)])

    def totals(self) -> list[tuple[int, int]]:
        """(rows, sum(v)) of every table, in table order."""
        union = " UNION ALL ".join(
            f"SELECT {i} AS i, count(*) AS n, sum(v) AS v FROM t{i}"
            for i in range(1, self.tables + 1)
        )
        rows = self.execute([f"SELECT n, v FROM ({union}) u ORDER BY i"])
        return [(int(n), int(v or 0)) for n, v in rows]

    def drop(self) -> None:
        if self.connector == "postgres":
            self.execute([f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)'], self.server)
        else:
            self.execute([f"DROP DATABASE IF EXISTS `{self.name}`"], self.server)

    def project(self) -> str:
        """combined.yaml: one snapshot dataset a table."""
        lines = ["version: 1", "lake: ./lake", "sources:", "  src:"]
        lines += [f"    connector: {self.connector}", "    config:", f"      dsn: {self.dsn}"]
        lines.append("    datasets:")
        for i in range(1, self.tables + 1):
            lines += [f"      t{i}:", f"        relation: t{i}", "        key: [id]"]
        return "\n".join(lines) + "\n"

    def server_reading(self) -> ServerCpu | float | None:
        """The server's CPU so far: PostgreSQL's of this DSN's server, MariaDB's seconds."""
        if self.connector == "postgres":
            return server_cpu(postmaster=postmaster_of(self.server))
        return _maria_server_cpu()


def _between(before: ServerCpu | float | None, after: ServerCpu | float | None) -> float | None:
    """The server's CPU-seconds from ``before`` to ``after`` (None: not comparable)."""
    if isinstance(after, ServerCpu):
        spent = after.since(before if isinstance(before, ServerCpu) else None)
    elif isinstance(after, float) and isinstance(before, float):
        spent = after - before
    else:
        spent = None
    return None if spent is None else round(spent, 2)


def lake_totals(root: Path, tables: int) -> list[tuple[int, int]]:
    """(rows, sum(v)) of every table's published dataset, in table order."""
    from combined.engine import Engine

    engine = Engine.open(root / "combined.yaml")
    union = " UNION ALL ".join(
        f"SELECT {i} AS i, count(*) AS n, sum(v) AS v FROM src.t{i}" for i in range(1, tables + 1)
    )
    rows = engine.sql(f"SELECT n, v FROM ({union}) u ORDER BY i").to_pylist()
    return [(int(r["n"]), int(r["v"] or 0)) for r in rows]


def read_floor(connector: str, dsn: str, tables: int, out: str) -> int:
    """Every table read into one Parquet file a table, on one connection: rows read."""
    import pyarrow.parquet as pq

    total = 0
    if connector == "postgres":
        import adbc_driver_postgresql.dbapi as adbc

        with adbc.connect(dsn) as conn, conn.cursor() as cur:
            for i in range(1, tables + 1):
                cur.execute(f"SELECT * FROM t{i}")
                table = cur.fetch_arrow_table()
                pq.write_table(table, f"{out}/t{i}.parquet", compression="zstd")
                total += table.num_rows
        return total
    import connectorx as cx

    for i in range(1, tables + 1):
        table = cx.read_sql(dsn, f"SELECT * FROM t{i}", return_type="arrow")
        pq.write_table(table, f"{out}/t{i}.parquet", compression="zstd")
        total += table.num_rows
    return total


def _floor(source: Source, root: Path) -> tuple[int, float, float, float, str]:
    """The floor in a fresh process: exit code, wall, peak RSS MB, CPU-s, stderr tail."""
    out = root / "floor"
    out.mkdir()
    argv = ["-m", "bench.many", "--floor", source.connector, source.dsn, str(source.tables)]
    rc, wall, rss, cpu, _, err = timed_child([*argv, str(out)])
    return rc, wall, rss, cpu, err


def _measured(source: Source, run: Callable[[], tuple[int, float, float, float, str]]) -> Any:
    before = source.server_reading()
    rc, wall, rss, cpu, err = run()
    after = source.server_reading()
    if rc != 0:
        raise SystemExit(f"{source.connector}: a step failed: {err}")
    server = _between(before, after)
    return {
        "wall_s": round(wall, 2),
        "cpu_s": round(cpu, 2),
        "server_cpu_s": server,
        "peak_rss_mb": round(rss),
        "cpu_ms_a_table": round(cpu * 1000 / source.tables),
    }


def measure(connector: str, server: str, tables: int, rows: int) -> dict[str, Any]:
    """Every step of one connector's database, and whether the lake equals the source."""
    source = Source(connector, server, tables, rows)
    root = Path(tempfile.mkdtemp(prefix="combined-bench-many-"))
    source.create()
    try:
        (root / "combined.yaml").write_text(source.project())

        def capture() -> tuple[int, float, float, float, str]:
            return _cli_cpu(root, "capture")

        steps = {"floor": _measured(source, lambda: _floor(source, root))}
        steps["first capture"] = _measured(source, capture)
        steps["unchanged re-capture"] = _measured(source, capture)
        source.change()
        steps["changed re-capture"] = _measured(source, capture)
        equal = lake_totals(root, tables) == source.totals()
    finally:
        source.drop()
        shutil.rmtree(root, ignore_errors=True)
    return {
        "connector": connector,
        "tables": tables,
        "rows": rows,
        "steps": steps,
        "lake_equals_source": equal,
    }


def table(results: list[dict[str, Any]]) -> list[str]:
    """The markdown table of every connector's steps."""
    lines = [
        "| connector, step | wall s | CPU-s | server CPU-s | peak RSS | CPU ms a table "
        "| vs floor (CPU) |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        floor = r["steps"]["floor"]["cpu_s"] or None
        for step in STEPS:
            s = r["steps"][step]
            ratio = f"{s['cpu_s'] / floor:.1f}x" if floor else "-"
            server = "-" if s["server_cpu_s"] is None else f"{s['server_cpu_s']:.2f}"
            lines.append(
                f"| {r['connector']} {r['tables']} tables x {r['rows']} rows, {step} "
                f"| {s['wall_s']:.2f} | {s['cpu_s']:.2f} | {server} | {s['peak_rss_mb']} MB "
                f"| {s['cpu_ms_a_table']} | {ratio} |"
            )
    lines.append("")
    for r in results:
        verdict = "yes" if r["lake_equals_source"] else "**NO**"
        lines.append(f"- {r['connector']}: lake equals source after the last capture: {verdict}")
    return lines


def main(argv: list[str] | None = None) -> None:
    """Run every connector's steps and print a markdown table (and the figures as JSON)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["--floor"]:
        connector, dsn, tables, out = args[1:]
        print(json.dumps({"rows": read_floor(connector, dsn, int(tables), out)}))
        return
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tables", type=int, default=200)
    parser.add_argument("--rows", type=int, default=100)
    parser.add_argument("--connectors", nargs="+", default=["postgres", "mariadb"])
    parser.add_argument("--postgres", default=PG_SERVER, help="a PostgreSQL server's DSN")
    parser.add_argument("--mariadb", default=MARIADB_SERVER, help="a MariaDB server's DSN")
    opts = parser.parse_args(args)
    servers = {"postgres": opts.postgres, "mariadb": opts.mariadb}
    results = [measure(c, servers[c], opts.tables, opts.rows) for c in opts.connectors]
    print_steps("Many small tables", "bench.many", args, table(results), results)


if __name__ == "__main__":
    main()
