"""MariaDB figures (issue 24, item 3), side by side in one run, each in a fresh process.

``python -m bench.mariadb [--rows N] [--changes N] [--samples M]`` against a
real MariaDB (``COMBINED_TEST_MARIADB_DSN``, binlog ROW/FULL) and PostgreSQL
(``COMBINED_TEST_PG_DSN``, for the latency next to it):

1. **snapshot** of an ``orders`` table of N rows (the bench's shape:
   ``bench/workload.py``, in MariaDB types): the *floor* (connectorx to Arrow
   to one zstd Parquet file, nothing else), ``combined capture`` (snapshot
   strategy: the bulk path, lake commit included), the same capture again
   with nothing changed, dlt ``sql_table``
   (pyarrow backend) into a Delta table, and the reader alone on both of its
   paths (``rows``: PyMySQL; ``bulk``: connectorx), batches counted, not kept.
2. **cursor**: ``--base`` rows captured by a cursor on ``updated_at``, then
   N more inserted and captured again (``combined capture``), and the
   cursor reader alone over those N rows on both of its paths.
3. **binlog backlog**: a stitched first capture of an empty table, then N
   changes (60% inserts, 30% updates, 10% deletes, 10,000 a transaction)
   while nothing reads; one ``combined capture`` drains them. Reported:
   changes/s, CPU-seconds, peak RSS, and that the lake equals the source;
   then the binlog reader alone over the same changes, decoding rows from the
   events' bytes (``native``) and through ``mysql-replication`` (``library``).
4. **latency**: ``combined cdc follow --every 0.5`` while M single-row
   transactions commit 200 ms apart; commit to publication p50/p95, and
   PostgreSQL's (``bench.cdc.latency``) measured the same way in the same run.

Every figure is wall time with the child's CPU-seconds beside it: on a
shared machine the wall time also holds waits for the CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from bench.cdc import _cli_cpu, latency_summary
from bench.measure import timed_child

ORDERS = """CREATE TABLE orders (id BIGINT PRIMARY KEY, customer_id INT NOT NULL,
  status VARCHAR(16) NOT NULL, total DECIMAL(12,2) NOT NULL, note TEXT NULL,
  created_at TIMESTAMP(6) NOT NULL DEFAULT '2020-01-01',
  updated_at TIMESTAMP(6) NOT NULL DEFAULT '2020-01-01', KEY (updated_at)) ENGINE=InnoDB"""
ORDERS_ROWS = """INSERT INTO orders SELECT seq, seq % 10007,
  ELT(1 + seq % 4, 'new', 'paid', 'shipped', 'cancelled'), (seq % 100000) / 100 + 0.01,
  IF(seq % 10 = 0, NULL, CONCAT('note ', seq)),
  TIMESTAMP'2024-01-01 00:00:00' + INTERVAL seq SECOND,
  TIMESTAMP'2024-01-01 01:00:00' + INTERVAL seq SECOND FROM seq_{lo}_to_{hi}"""
EVENTS = """CREATE TABLE events (id BIGINT PRIMARY KEY, kind VARCHAR(8),
  amount DECIMAL(12,2), at TIMESTAMP(6) DEFAULT CURRENT_TIMESTAMP(6)) ENGINE=InnoDB"""

PROJECT = """\
version: 1
lake: ./lake
sources:
  my:
    connector: mariadb
    config:
      dsn: {dsn}
    datasets:
      {table}:
        relation: {table}
        key: [id]
        strategy: {strategy}
"""


def _connect(dsn: str) -> Any:
    from combined.connectors.mariadb._connect import Settings

    kwargs = Settings.from_config({"dsn": dsn}).connect_kwargs()
    for key in ("conv", "cursorclass", "read_timeout", "write_timeout"):
        kwargs.pop(key)
    import pymysql

    return pymysql.connect(**kwargs)


def _server_cpu() -> float | None:
    """CPU-seconds (user + system) of the MariaDB server on this host so far; None if none runs.

    The server runs on the same cores as the bench, so its CPU counts next
    to the client's. Every ``mariadbd``/``mysqld`` process on the host
    counts (another server's too).
    """
    total, found = 0.0, False
    tick = os.sysconf("SC_CLK_TCK")
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            raw = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        name, rest = raw[raw.index("(") + 1 : raw.rindex(")")], raw[raw.rindex(")") + 2 :]
        if name in ("mariadbd", "mysqld"):
            fields = rest.split()
            total += (int(fields[11]) + int(fields[12])) / tick
            found = True
    return total if found else None


def _with_server(run: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """``run()``'s figures with the server's CPU-seconds during it (``server_cpu_s``)."""
    before = _server_cpu()
    out = run()
    after = _server_cpu()
    if before is not None and after is not None:
        out["server_cpu_s"] = round(after - before, 2)
    return out


def _database(server: str) -> tuple[str, str]:
    suffix = os.environ.get("BENCH_DATABASE_SUFFIX", "")
    name = f"combined_my_bench_{uuid.uuid4().hex[:6]}{suffix}"
    conn = _connect(server)
    with conn.cursor() as cur:
        cur.execute(f"CREATE DATABASE `{name}`")
    conn.close()
    parts = urlsplit(server)
    return name, f"{parts.scheme}://{parts.netloc}/{name}"


def _drop(server: str, name: str) -> None:
    conn = _connect(server)
    with conn.cursor() as cur:
        cur.execute(f"DROP DATABASE IF EXISTS `{name}`")
    conn.close()


def _sql(dsn: str, *statements: str) -> list[Any]:
    conn = _connect(dsn)
    try:
        with conn.cursor() as cur:
            for statement in statements:
                cur.execute(statement)
            return list(cur.fetchall())
    finally:
        conn.close()


def _child(*args: str) -> dict[str, Any]:
    """Run ``python -m bench.mariadb ARGS`` fresh: its JSON, wall, CPU-seconds, peak RSS."""
    rc, wall, rss, cpu, last, err = timed_child(["-m", "bench.mariadb", *args])
    if rc != 0:
        raise SystemExit(f"{args[0]} failed: {err}")
    return {
        **json.loads(last or "{}"),
        "wall_s": round(wall, 2),
        "cpu_s": round(cpu, 2),
        "peak_rss_mb": round(rss),
    }


# -- what the children run ---------------------------------------------------------------------


def run_floor(dsn: str, out: str) -> dict[str, Any]:
    """connectorx -> Arrow -> one Parquet file: the fastest read of the rows we know of."""
    import connectorx as cx
    import pyarrow.parquet as pq

    reader = cx.read_sql(dsn, "SELECT * FROM orders", return_type="arrow_stream", batch_size=65_536)
    rows, writer = 0, None
    try:
        for batch in reader:
            if writer is None:
                writer = pq.ParquetWriter(out, batch.schema, compression="zstd")
            writer.write_batch(batch)
            rows += batch.num_rows
    finally:
        if writer is not None:
            writer.close()
    return {"rows": rows}


def run_reader(dsn: str, path: str) -> dict[str, Any]:
    """The MariaDB reader alone on one of its paths: every batch counted, none kept."""
    from combined.connectors.abc import ReadRequest

    request = ReadRequest(dataset="orders", relation="orders", key=("id",), strategy="snapshot")
    return _read_alone(dsn, request, path)


def _read_alone(dsn: str, request: Any, path: str) -> dict[str, Any]:
    """One read of ``request`` on ``path`` (``bulk`` or ``rows``): its rows counted, none kept."""
    from combined.connectors.mariadb import MariaDBExtraction, MariaDBSource
    from combined.protocol import RecordBatchMessage

    src = MariaDBSource({"dsn": dsn})
    try:
        ext = src.read(request)
        assert isinstance(ext, MariaDBExtraction)
        ext.bulk = path == "bulk"
        rows = sum(m.batch.num_rows for m in ext if isinstance(m, RecordBatchMessage))
        ext.finish("success")
        return {"rows": rows, "path": ext.path}
    finally:
        src.close()


def run_binlog(dsn: str, position: str, decoder: str) -> dict[str, Any]:
    """The binlog reader alone from ``position`` to the log's end: batches counted, none kept.

    ``decoder`` is ``native`` (rows decoded from the events' bytes) or
    ``library`` (every row through ``mysql-replication``, as before).
    """
    from combined.connectors.abc import ReadRequest
    from combined.connectors.mariadb._binlog import BinlogExtraction
    from combined.connectors.mariadb._binlog_setup import parse_position
    from combined.connectors.mariadb._connect import Settings
    from combined.protocol import RecordBatchMessage

    request = ReadRequest(
        dataset="events", relation="events", key=("id",), strategy="cdc", state={"binlog": position}
    )
    read = BinlogExtraction(
        Settings.from_config({"dsn": dsn}),
        request,
        start=parse_position(position),
        library_rows=decoder == "library",
    )
    rows = sum(m.batch.num_rows for m in read if isinstance(m, RecordBatchMessage))
    return {"rows": rows, "library_events": read.library_events}


def run_cursor_reader(dsn: str, path: str, last: str) -> dict[str, Any]:
    """A cursor read of ``orders`` after ``last`` (``updated_at``) on one path, batches counted."""
    from combined.connectors.abc import CursorSpec, ReadRequest

    request = ReadRequest(
        dataset="orders",
        relation="orders",
        key=("id",),
        strategy="cursor",
        cursor=CursorSpec("updated_at"),
        state={"cursor": last},
    )
    return _read_alone(dsn, request, path)


def run_phases(project: str) -> dict[str, Any]:
    """One capture of ``project`` through the engine, its phases marked (``bench.case``)."""
    import combined  # noqa: F401, I001  (first: it picks Arrow's allocator)
    from bench.case import PhaseRecorder
    from combined.engine import Engine

    phases = PhaseRecorder()
    try:
        engine = Engine.open(Path(project) / "combined.yaml", reporter=phases)
        try:
            runs = engine.capture([])
        finally:
            engine.close()
    finally:
        segments = phases.close()
    failed = [r.error for r in runs if r.state != "succeeded"]
    if failed:
        raise SystemExit(f"capture failed: {failed}")
    return {"phases": [(s["phase"], s["seconds"], s["cpu_seconds"]) for s in segments]}


def run_dlt(dsn: str, work: str) -> dict[str, Any]:
    """dlt ``sql_table`` (pyarrow backend) into a filesystem Delta table."""
    os.environ.setdefault("RUNTIME__DLTHUB_TELEMETRY", "false")
    os.environ.setdefault("RUNTIME__LOG_LEVEL", "WARNING")
    import deltalake  # noqa: F401
    import dlt
    from dlt.destinations import filesystem
    from dlt.sources.sql_database import sql_table

    url = dsn.replace("mysql://", "mysql+pymysql://", 1)
    lake = Path(work) / "dlt_lake"
    pipeline = dlt.pipeline(
        pipeline_name="bench_mariadb",
        destination=filesystem(bucket_url=lake.resolve().as_uri()),
        dataset_name="bench",
        pipelines_dir=str(Path(work) / "dlt_pipelines"),
    )
    resource_ = sql_table(credentials=url, table="orders", backend="pyarrow")
    pipeline.run(resource_, write_disposition="replace", table_format="delta")
    trace = pipeline.last_trace
    info = trace.last_normalize_info if trace is not None else None
    return {"rows": int(dict(info.row_counts).get("orders", 0)) if info else 0}


# -- the measurements --------------------------------------------------------------------------


def snapshot(server: str, rows: int) -> dict[str, Any]:
    """Floor, Combined, dlt and the reader's two paths over the same ``orders`` rows."""
    name, dsn = _database(server)
    root = Path(tempfile.mkdtemp(prefix="my-bench-"))
    try:
        _sql(dsn, ORDERS)
        for lo in range(1, rows + 1, 250_000):
            _sql(dsn, ORDERS_ROWS.format(lo=lo, hi=min(lo + 249_999, rows)))
        _sql(dsn, "ANALYZE TABLE orders")
        (root / "combined.yaml").write_text(
            PROJECT.format(dsn=dsn, table="orders", strategy="snapshot")
        )
        out: dict[str, Any] = {"rows": rows}
        out["floor"] = _with_server(lambda: _child("floor", dsn, str(root / "floor.parquet")))
        out["combined"] = _with_server(lambda: _capture(root))
        # The same capture again, nothing changed (the table's last write time
        # has not moved: its rows are folded, not hashed; runtime._fold).
        out["combined_unchanged"] = _with_server(lambda: _capture(root))
        again = root / "phases"  # the same capture into a fresh lake, its phases marked
        again.mkdir()
        shutil.copy(root / "combined.yaml", again / "combined.yaml")
        out["combined_phases"] = _with_server(lambda: _child("phases", str(again)))
        out["reader_bulk"] = _with_server(lambda: _child("reader", dsn, "bulk"))
        out["reader_rows"] = _with_server(lambda: _child("reader", dsn, "rows"))
        try:
            out["dlt"] = _child("dlt", dsn, str(root))
        except SystemExit as exc:
            out["dlt"] = {"unavailable": str(exc)[:300]}
        return out
    finally:
        _drop(server, name)
        shutil.rmtree(root, ignore_errors=True)


def _capture(root: Path) -> dict[str, Any]:
    """One ``combined capture`` of the project at ``root``: wall, CPU-seconds, peak RSS."""
    rc, wall, rss, cpu, err = _cli_cpu(root, "capture")
    if rc != 0:
        raise SystemExit(f"capture failed: {err}")
    return {"wall_s": round(wall, 2), "cpu_s": round(cpu, 2), "peak_rss_mb": round(rss)}


def cursor(server: str, rows: int, base: int) -> dict[str, Any]:
    """A cursor re-capture of ``rows`` new rows over ``base`` captured ones; the reader's paths."""
    name, dsn = _database(server)
    root = Path(tempfile.mkdtemp(prefix="my-bench-"))
    try:
        _sql(dsn, ORDERS, ORDERS_ROWS.format(lo=1, hi=base))
        strategy = (
            'cursor\n        cursor: {column: updated_at, trust: "bench: rows only inserted"}'
        )
        (root / "combined.yaml").write_text(
            PROJECT.format(dsn=dsn, table="orders", strategy=strategy)
        )
        rc, _, _, _, err = _cli_cpu(root, "capture")
        if rc != 0:
            raise SystemExit(f"first capture failed: {err}")
        for lo in range(base + 1, base + rows + 1, 250_000):
            _sql(dsn, ORDERS_ROWS.format(lo=lo, hi=min(lo + 249_999, base + rows)))
        _sql(dsn, "ANALYZE TABLE orders")
        out: dict[str, Any] = {"rows": rows, "base": base}
        rc, wall, rss, cpu, err = _cli_cpu(root, "capture")
        if rc != 0:
            raise SystemExit(f"re-capture failed: {err}")
        out["combined"] = {
            "wall_s": round(wall, 2),
            "cpu_s": round(cpu, 2),
            "peak_rss_mb": round(rss),
        }
        last = (datetime(2024, 1, 1, 1, tzinfo=UTC) + timedelta(seconds=base)).isoformat()
        out["reader_bulk"] = _child("cursor-reader", dsn, "bulk", last)
        out["reader_rows"] = _child("cursor-reader", dsn, "rows", last)
        return out
    finally:
        _drop(server, name)
        shutil.rmtree(root, ignore_errors=True)


def _cdc_project(server: str) -> tuple[str, str, Path]:
    name, dsn = _database(server)
    root = Path(tempfile.mkdtemp(prefix="my-cdc-"))
    _sql(dsn, EVENTS)
    (root / "combined.yaml").write_text(PROJECT.format(dsn=dsn, table="events", strategy="cdc"))
    for step in (("cdc", "setup", "my"), ("capture",)):  # the stitched first capture
        rc, _, _, _, err = _cli_cpu(root, *step)
        if rc != 0:
            raise SystemExit(f"{' '.join(step)} failed: {err}")
    return name, dsn, root


def backlog(server: str, changes: int) -> dict[str, Any]:
    """Drain a binlog backlog of ``changes`` changes with one capture."""
    name, dsn, root = _cdc_project(server)
    try:
        ((log, offset, *_),) = _sql(dsn, "SHOW MASTER STATUS")
        inserts, updates, deletes = int(changes * 0.6), int(changes * 0.3), int(changes * 0.1)
        conn = _connect(dsn)
        with conn.cursor() as cur:
            for lo in range(0, inserts, 10_000):
                cur.execute(
                    "INSERT INTO events (id, kind, amount) SELECT seq, CONCAT('k', seq % 7), "
                    f"seq * 0.5 FROM seq_{lo + 1}_to_{min(lo + 10_000, inserts)}"
                )
            for lo in range(0, updates, 10_000):
                cur.execute(
                    "UPDATE events SET amount = amount + 1 "
                    f"WHERE id > {lo} AND id <= {min(lo + 10_000, updates)}"
                )
            for lo in range(inserts - deletes, inserts, 10_000):
                cur.execute(f"DELETE FROM events WHERE id > {lo} AND id <= {lo + 10_000}")
        conn.close()
        rc, wall, rss, cpu, err = _cli_cpu(root, "capture")
        if rc != 0:
            raise SystemExit(f"capture failed: {err}")
        from combined.engine import Engine

        engine = Engine.open(root / "combined.yaml")
        try:
            lake = engine.sql("SELECT count(*) AS n, sum(amount) AS s FROM my.events").to_pylist()
        finally:
            engine.close()
        ((n, s),) = _sql(dsn, "SELECT COUNT(*), SUM(amount) FROM events")
        total = inserts + updates + deletes
        readers = {d: _child("binlog", dsn, f"{log}:{offset}", d) for d in ("native", "library")}
        return {
            "changes": total,
            "wall_s": round(wall, 2),
            "cpu_s": round(cpu, 2),
            "changes_per_s": round(total / wall),
            "peak_rss_mb": round(rss),
            "lake_equals_source": lake[0]["n"] == n and lake[0]["s"] == s,
            **{f"reader_{d}": r for d, r in readers.items()},
        }
    finally:
        _drop(server, name)
        shutil.rmtree(root, ignore_errors=True)


def latency(server: str, samples: int) -> dict[str, Any]:
    """Source commit to publication, in follow mode."""
    from combined.engine import Engine

    name, dsn, root = _cdc_project(server)
    try:
        follow = subprocess.Popen(
            [
                sys.executable,
                "-c",
                "from combined.cli import main; main()",
                "cdc",
                "follow",
                "my",
                "--every",
                "0.5",
                "--iterations",
                str(int(samples * 0.2 / 0.5) + 40),
            ],
            cwd=root,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        committed: dict[int, datetime] = {}
        time.sleep(2.0)
        conn = _connect(dsn)
        with conn.cursor() as cur:
            for i in range(1, samples + 1):
                cur.execute(f"INSERT INTO events (id, kind, amount) VALUES ({i}, 'x', 1)")
                committed[i] = datetime.now(UTC)
                time.sleep(0.2)
        conn.close()
        follow.wait(timeout=900)
        engine = Engine.open(root / "combined.yaml")
        seen: dict[int, datetime] = {}
        try:
            for pub in reversed(engine.publications(limit=100_000)):
                ids = engine.sql("SELECT id FROM my.events", publication=pub["id"]).column("id")
                for i in ids.to_pylist():
                    seen.setdefault(int(i), pub["published_at"])
        finally:
            engine.close()
        return latency_summary(seen, committed, samples)
    finally:
        _drop(server, name)
        shutil.rmtree(root, ignore_errors=True)


def _table(r: dict[str, Any]) -> list[str]:
    s = r.get("snapshot", {})
    lines = [
        "| measure | wall | CPU-s | server CPU-s | peak RSS |",
        "|---|---:|---:|---:|---:|",
    ]
    for key, label in (
        ("floor", "floor: connectorx -> one Parquet file"),
        ("combined", "combined capture (snapshot, bulk path)"),
        ("combined_unchanged", "combined re-capture, nothing changed"),
        ("dlt", "dlt sql_table (pyarrow) -> Delta"),
        ("reader_bulk", "reader alone, bulk path"),
        ("reader_rows", "reader alone, row path (PyMySQL)"),
    ):
        f = s.get(key)
        if f and "wall_s" in f:
            lines.append(
                f"| {label}, {s['rows']:,} rows | {f['wall_s']} s | {f['cpu_s']} "
                f"| {f.get('server_cpu_s', '-')} | {f['peak_rss_mb']} MB |"
            )
    p = s.get("combined_phases")
    if p and "phases" in p:
        marked = ", ".join(f"{n} {w:.2f} s / {c:.2f} CPU-s" for n, w, c in p["phases"] if w)
        lines.append(
            f"| combined capture, phases marked: {marked} | {p['wall_s']} s | {p['cpu_s']} "
            f"| {p.get('server_cpu_s', '-')} | {p['peak_rss_mb']} MB |"
        )
    c = r.get("cursor")
    for key, label in (
        ("combined", "combined capture (cursor re-capture)"),
        ("reader_bulk", "cursor reader alone, bulk path"),
        ("reader_rows", "cursor reader alone, row path (PyMySQL)"),
    ):
        f = (c or {}).get(key)
        if c and f and "wall_s" in f:
            lines.append(
                f"| {label}, {c['rows']:,} new rows over {c['base']:,} | {f['wall_s']} s "
                f"| {f['cpu_s']} | - | {f['peak_rss_mb']} MB |"
            )
    b = r.get("backlog")
    if b:
        lines.append(
            f"| binlog backlog of {b['changes']:,} changes, one capture | {b['wall_s']} s "
            f"({b['changes_per_s']:,}/s) | {b['cpu_s']} | - | {b['peak_rss_mb']} MB |"
        )
        lines.append(f"| lake equals source after the backlog | {b['lake_equals_source']} | | | |")
        for d in ("native", "library"):
            f = b.get(f"reader_{d}")
            if f:
                lines.append(
                    f"| binlog reader alone, {d} decoding, {f['rows']:,} rows | {f['wall_s']} s "
                    f"| {f['cpu_s']} | - | {f['peak_rss_mb']} MB |"
                )
    for key in ("latency_mariadb", "latency_postgres"):
        lat = r.get(key)
        if lat:
            lines.append(
                f"| {key}: commit to publication p50 / p95 ({lat['samples']} rows) "
                f"| {lat['p50_s']} s / {lat['p95_s']} s | | | |"
            )
    return lines


def main(argv: list[str] | None = None) -> None:
    """Run the children's subcommands, or every measurement (JSON and a markdown table)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    children: dict[str, Callable[..., dict[str, Any]]] = {
        "floor": run_floor,
        "reader": run_reader,
        "cursor-reader": run_cursor_reader,
        "dlt": run_dlt,
        "binlog": run_binlog,
        "phases": run_phases,
    }
    if argv and argv[0] in children:
        print(json.dumps(children[argv[0]](*argv[1:])))
        return
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=2_000_000)
    p.add_argument("--changes", type=int, default=500_000)
    p.add_argument("--base", type=int, default=50_000, help="rows before a cursor re-capture")
    p.add_argument("--samples", type=int, default=100)
    p.add_argument("--only", nargs="*", default=["snapshot", "backlog", "latency"])
    p.add_argument(
        "--mariadb",
        default=os.environ.get("COMBINED_TEST_MARIADB_DSN", "mysql://root@127.0.0.1:3306/test"),
    )
    p.add_argument(
        "--pg",
        default=os.environ.get(
            "COMBINED_TEST_PG_DSN", "postgresql://postgres@127.0.0.1:5432/postgres"
        ),
    )
    args = p.parse_args(argv)
    out: dict[str, Any] = {
        "started": datetime.now(UTC).isoformat(timespec="seconds"),
        "load_avg": os.getloadavg(),
    }
    if "snapshot" in args.only:
        out["snapshot"] = snapshot(args.mariadb, args.rows)
    if "cursor" in args.only:
        out["cursor"] = cursor(args.mariadb, args.rows, args.base)
    if "backlog" in args.only:
        out["backlog"] = backlog(args.mariadb, args.changes)
    if "latency" in args.only:
        out["latency_mariadb"] = latency(args.mariadb, args.samples)
        from bench.cdc import latency as pg_latency

        out["latency_postgres"] = pg_latency(args.pg, args.samples)
    out["self_rusage_cpu_s"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_utime, 2)
    print(json.dumps(out, indent=2))
    print()
    print("\n".join(_table(out)))


if __name__ == "__main__":
    main()
