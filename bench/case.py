"""One benchmark case in its own process: ``python -m bench.case OP --result FILE ...``.

Operations:

* ``floor``: ADBC PostgreSQL -> Arrow -> one Parquet file (zstd). The
  ``numeric`` column arrives as text and is cast to ``decimal128(p, s)``, as
  every other case types it; nothing else is done.
* ``dlt_replace`` / ``dlt_merge``: dlt ``sql_table`` (pyarrow backend) into a
  filesystem Delta table, ``replace`` or ``merge`` (``upsert``) over an
  incremental ``updated_at`` cursor. The merge pipeline keeps its state in
  ``--workdir``, so a second ``dlt_merge`` is the incremental one.
* ``combined``: ``Engine.open(project).capture(selectors)``.
* ``combined_backfill``: ``Engine.open(project).backfill(dataset, partitions=N)``,
  the partitioned snapshot (reported unavailable on an engine without it).

Heavy modules are imported before the clock starts. The timed section is
the operation alone; the lake directory is listed before and after it (not
timed). The result, written as JSON to ``--result``, holds the seconds, the
rows read, what was written under the lake, this process's ``VmHWM`` and
its children's max RSS, and operation details. A missing dlt is reported as
``unavailable`` (exit status 0), any other failure as an error (status 1).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bench.measure import (
    own_peak_rss,
    postmaster_of,
    read_status,
    server_cpu,
    snapshot_dir,
    written,
)

Outcome = tuple[int, dict[str, Any]]  # rows read, details


class Unavailable(Exception):
    """The case cannot run here (a missing optional tool); not a failure."""


def dlt_unavailable() -> str | None:
    """Why dlt cannot run here, or None when it can."""
    for module in (
        "dlt",
        "dlt.sources.sql_database",
        "dlt.destinations",
        "deltalake",
        "sqlalchemy",
    ):
        try:
            importlib.import_module(module)
        except Exception as exc:  # ImportError, or a broken install
            return f"{module} cannot be imported ({type(exc).__name__}: {exc})".strip()
    return None


# -- floor ------------------------------------------------------------------------------------


def _numeric_type(field: Any) -> Any:
    """``decimal128(p, s)`` for a PostgreSQL ``numeric(p, s)`` column read as text, else None."""
    import pyarrow as pa

    meta = field.metadata or {}
    if meta.get(b"POSTGRESQL:type") != b"numeric":
        return None
    typmod = int(meta.get(b"POSTGRESQL:typmod", b"-1"))
    if typmod < 4:
        return None
    precision, scale = ((typmod - 4) >> 16) & 0xFFFF, (typmod - 4) & 0xFFFF
    return pa.decimal128(precision, scale) if precision <= 38 else pa.decimal256(precision, scale)


def _typed(batch: Any) -> Any:
    import pyarrow as pa
    import pyarrow.compute as pc

    arrays, fields = [], []
    for field, col in zip(batch.schema, batch.columns, strict=True):
        target = _numeric_type(field)
        if target is not None:
            storage = col.storage if isinstance(col, pa.ExtensionArray) else col
            col = pc.cast(storage, target)
            field = pa.field(field.name, target, field.nullable)
        elif isinstance(col, pa.ExtensionArray):
            col = col.storage
            field = pa.field(field.name, col.type, field.nullable)
        arrays.append(col)
        fields.append(field.remove_metadata())
    return pa.RecordBatch.from_arrays(arrays, schema=pa.schema(fields))


def prepare_floor(args: argparse.Namespace) -> Callable[[], Outcome]:
    """ADBC -> Arrow -> one Parquet file under ``--lake``.

    Through ADBC's DB-API, which loads polars when it is installed (a larger
    RSS before the read): read through the low-level API as Combined reads,
    the floor took 10-15% more CPU here (2026-12-02), and the floor is the
    fastest read.
    """
    import adbc_driver_postgresql.dbapi as adbc_pg
    import pyarrow.parquet as pq

    out = Path(args.lake) / "floor.parquet"

    def run() -> Outcome:
        out.parent.mkdir(parents=True, exist_ok=True)
        rows = 0
        with adbc_pg.connect(args.dsn) as conn, conn.cursor() as cur:
            cur.execute(f'SELECT * FROM "{args.table}"')  # noqa: S608 (a bench-owned name)
            reader = cur.fetch_record_batch()
            writer = None
            try:
                for raw in reader:
                    batch = _typed(raw)
                    if writer is None:
                        writer = pq.ParquetWriter(str(out), batch.schema, compression="zstd")
                    writer.write_batch(batch)
                    rows += batch.num_rows
            finally:
                if writer is not None:
                    writer.close()
            conn.commit()
        return rows, {"file": str(out)}

    return run


# -- dlt --------------------------------------------------------------------------------------


def prepare_dlt(args: argparse.Namespace, disposition: str) -> Callable[[], Outcome]:
    """dlt ``sql_table`` (pyarrow backend) into a filesystem Delta table."""
    reason = dlt_unavailable()
    if reason is not None:
        raise Unavailable(reason)
    os.environ.setdefault("RUNTIME__DLTHUB_TELEMETRY", "false")
    os.environ.setdefault("RUNTIME__LOG_LEVEL", "WARNING")
    import deltalake  # noqa: F401  (imported before the clock: dlt loads through it)
    import dlt
    from dlt.destinations import filesystem
    from dlt.sources.sql_database import sql_table

    from bench.workload import sqlalchemy_url

    work = Path(args.workdir)
    lake = Path(args.lake)
    url = sqlalchemy_url(args.dsn)

    def run() -> Outcome:
        lake.mkdir(parents=True, exist_ok=True)
        pipeline = dlt.pipeline(
            pipeline_name=f"bench_{disposition}",
            destination=filesystem(bucket_url=lake.resolve().as_uri()),
            dataset_name="bench",
            pipelines_dir=str(work / "dlt_pipelines"),
        )
        if disposition == "replace":
            resource = sql_table(credentials=url, table=args.table, backend="pyarrow")
            info = pipeline.run(resource, write_disposition="replace", table_format="delta")
        else:
            resource = sql_table(
                credentials=url,
                table=args.table,
                backend="pyarrow",
                incremental=dlt.sources.incremental("updated_at"),
            )
            info = pipeline.run(
                resource,
                write_disposition={"disposition": "merge", "strategy": "upsert"},
                table_format="delta",
            )
        trace = pipeline.last_trace
        normalized = trace.last_normalize_info if trace is not None else None
        counts = dict(normalized.row_counts) if normalized is not None else {}
        rows = int(counts.get(args.table, 0))
        details = {
            "row_counts": counts,
            "table_path": str(lake / "bench" / args.table),
            "loads": len(info.loads_ids),
        }
        return rows, details

    return run


# -- combined ---------------------------------------------------------------------------------


class PhaseRecorder:
    """A Combined reporter recording each phase's wall time, CPU time and peak RSS.

    CPU time is this process's (every thread's), not the database server's.

    Segments run from one mark to the next: ``open`` (project and catalog),
    ``start`` (run admitted -> extraction), ``extracting`` (read and stage),
    ``reducing`` (reduce in DuckDB and write the Deliveries), ``delivered``
    (the change list), ``committing`` (lake commit, projection, MAR,
    publication).
    """

    def __init__(self, interval_s: float = 0.02) -> None:
        import threading

        self.segments: list[dict[str, Any]] = []
        self._name = "open"
        self._since = time.perf_counter()
        self._cpu = time.process_time()
        self._peak = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._interval = interval_s
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        while not self._stop.is_set():
            rss = read_status("self").get("VmRSS", 0)
            with self._lock:
                self._peak = max(self._peak, rss)
            self._stop.wait(self._interval)

    def mark(self, name: str) -> None:
        """End the current segment and start ``name``."""
        now, cpu = time.perf_counter(), time.process_time()
        rss = read_status("self").get("VmRSS", 0)
        with self._lock:
            self.segments.append(
                {
                    "phase": self._name,
                    "seconds": round(now - self._since, 3),
                    "cpu_seconds": round(cpu - self._cpu, 3),
                    "peak_rss": max(self._peak, rss),
                    "rss_at_end": rss,
                }
            )
            self._name, self._since, self._cpu, self._peak = name, now, cpu, rss

    def close(self) -> list[dict[str, Any]]:
        """Stop polling; return the segments."""
        self.mark("end")
        self._stop.set()
        self._thread.join()
        return self.segments

    # the Reporter protocol
    def run_started(self, run_id: str, source: str, datasets: list[str]) -> None:
        """Mark."""
        self.mark("start")

    def progress(self, dataset: str, rows: int, nbytes: int, deliveries: int) -> None:
        """Mark the Deliveries written (the reduction's output) once."""
        if deliveries and self._name == "reducing":
            self.mark("delivered")

    def phase(self, dataset: str, phase: str) -> None:
        """Mark."""
        self.mark(phase)

    def note(self, message: str) -> None:
        """Ignore."""

    def run_finished(self, run_id: str, state: str) -> None:
        """Mark."""
        self.mark("finished")


def prepare_combined(args: argparse.Namespace) -> Callable[[], Outcome]:
    """``Engine.open(project).capture(selectors)``; every Run must succeed."""
    # First, as the `combined` command imports it: the package picks Arrow's
    # allocator before pyarrow loads (combined._alloc).
    import combined  # noqa: F401, I001
    import adbc_driver_postgresql  # noqa: F401
    import deltalake  # noqa: F401
    import duckdb  # noqa: F401
    import pyarrow.parquet  # noqa: F401

    import combined.connectors.postgres  # noqa: F401  (the connector, as the floor's driver)
    from combined.engine import Engine

    project = Path(args.project)
    selectors = list(args.select or [])

    def run() -> Outcome:
        phases = PhaseRecorder()
        try:
            engine = Engine.open(project, reporter=phases)
            try:
                runs = engine.capture(selectors)
            finally:
                engine.close()
        finally:
            segments = phases.close()
        stats: dict[str, Any] = {}
        rows = 0
        for r in runs:
            if r.state != "succeeded":
                raise RuntimeError(f"run {r.id} ended {r.state}: {r.error}")
            for name, s in (r.stats or {}).items():
                stats[name] = dict(s)
                rows += int(s.get("captured", 0))
        return rows, {"stats": stats, "runs": [r.id for r in runs], "phases": segments}

    return run


def prepare_backfill(args: argparse.Namespace) -> Callable[[], Outcome]:
    """``Engine.open(project).backfill(dataset, partitions=N)``: a partitioned snapshot."""
    # First, as the `combined` command imports it: the package picks Arrow's
    # allocator before pyarrow loads (combined._alloc).
    import combined  # noqa: F401, I001
    import adbc_driver_postgresql  # noqa: F401
    import deltalake  # noqa: F401
    import duckdb  # noqa: F401
    import pyarrow.parquet  # noqa: F401

    import combined.connectors.postgres  # noqa: F401
    from combined.engine import Engine

    if not hasattr(Engine, "backfill"):
        raise Unavailable("this build of the engine has no backfill (partitioned snapshot)")
    project = Path(args.project)
    (dataset,) = args.select or ["pg.orders"]

    def run() -> Outcome:
        phases = PhaseRecorder()
        try:
            engine = Engine.open(project, reporter=phases)
            try:
                # The whole key range: a backfill reads a declared range, and
                # these bounds hold every id the workload writes.
                r = engine.backfill(
                    dataset, partitions=args.partitions, lower=str(-(2**63)), upper=str(2**63 - 1)
                )
            finally:
                engine.close()
        finally:
            segments = phases.close()
        if r.state != "succeeded":
            raise RuntimeError(f"run {r.id} ended {r.state}: {r.error}")
        stats = {name: dict(s) for name, s in (r.stats or {}).items()}
        rows = sum(int(s.get("captured", 0)) for s in stats.values())
        details = {"stats": stats, "runs": [r.id], "phases": segments}
        return rows, details | {"partitions": args.partitions}

    return run


PREPARE: dict[str, Callable[[argparse.Namespace], Callable[[], Outcome]]] = {
    "floor": prepare_floor,
    "dlt_replace": lambda a: prepare_dlt(a, "replace"),
    "dlt_merge": lambda a: prepare_dlt(a, "merge"),
    "combined": prepare_combined,
    "combined_backfill": prepare_backfill,
}


def _profiled(run: Callable[[], Outcome], path: str | None) -> Callable[[], Outcome]:
    """``run`` under pyinstrument (installed ad hoc; not a dependency) when asked."""
    if not path:
        return run
    pyinstrument = importlib.import_module("pyinstrument")

    def wrapped() -> Outcome:
        profiler = pyinstrument.Profiler(interval=0.005)
        profiler.start()
        try:
            return run()
        finally:
            profiler.stop()
            Path(path).write_text(
                profiler.output_text(unicode=False, color=False, show_all=False, timeline=False)
            )
            Path(path).with_suffix(".html").write_text(profiler.output_html())

    return wrapped


def cpu_seconds() -> float:
    """User + system CPU time of this process (all its threads) and its waited-for children."""
    import resource

    total = 0.0
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        usage = resource.getrusage(who)
        total += usage.ru_utime + usage.ru_stime
    return total


def execute(args: argparse.Namespace) -> dict[str, Any]:
    """Run one operation and return its JSON-ready result."""
    result: dict[str, Any] = {"op": args.op, "ok": False, "pid": os.getpid()}
    # Only the server of the DSN counts (a cluster another program starts or
    # stops beside it would leave no comparable figure).
    postmaster = postmaster_of(args.dsn)
    try:
        run = _profiled(PREPARE[args.op](args), args.profile)
    except Unavailable as exc:
        result["unavailable"] = str(exc)
        return result
    result["rss_ready"] = read_status("self").get("VmRSS", 0)  # imports done, nothing read
    lake = Path(args.lake)
    before = snapshot_dir(lake)
    result["load_before"] = os.getloadavg()[0]
    # The server is read outside the case's own CPU figure (a reading scans /proc).
    server = server_cpu(postmaster=postmaster)
    cpu = cpu_seconds()
    started = time.perf_counter()
    try:
        rows, details = run()
    except Exception as exc:
        result["seconds"] = time.perf_counter() - started
        result["error"] = f"{type(exc).__name__}: {exc}".splitlines()[0][:500]
        result["traceback"] = traceback.format_exc()
        return result
    seconds = time.perf_counter() - started
    used = cpu_seconds() - cpu
    end = server_cpu(postmaster=postmaster)
    result.update(
        ok=True,
        seconds=seconds,
        cpu_seconds=used,
        server_cpu_seconds=None if end is None else end.since(server),
        # The case's cores: the server is taken to share them (same host).
        cores=len(os.sched_getaffinity(0)),
        load_after=os.getloadavg()[0],
        rows=rows,
        details=details,
        lake=written(before, snapshot_dir(lake)).as_dict(),
        lake_areas=_areas(before, snapshot_dir(lake)),
    )
    return result


def _areas(
    before: dict[str, tuple[int, int, int]], after: dict[str, tuple[int, int, int]]
) -> dict[str, int]:
    """Bytes written per top-level directory of the lake; a hard link counts once.

    A linked path's bytes go to ``<area> linked`` (the table's files that are
    the raw layer's Delivery files, linked, not written again).
    """
    out: dict[str, int] = {}
    seen = {entry[2] for rel, entry in after.items() if before.get(rel) == entry}
    for rel, entry in sorted(after.items()):
        if before.get(rel) != entry:
            top = rel.split(os.sep, 1)[0] if os.sep in rel else "."
            if entry[2] in seen:
                top += " linked"
            seen.add(entry[2])
            out[top] = out.get(top, 0) + entry[0]
    return out


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line of one case."""
    p = argparse.ArgumentParser(prog="python -m bench.case", description=__doc__)
    p.add_argument("op", choices=sorted(PREPARE))
    p.add_argument("--result", required=True, help="where to write the JSON result")
    p.add_argument("--dsn", default="", help="libpq DSN of the benchmark database")
    p.add_argument("--table", default="orders")
    p.add_argument("--lake", required=True, help="the directory whose writes are measured")
    p.add_argument("--workdir", default=".", help="state kept between runs (dlt pipelines)")
    p.add_argument("--project", default="combined.yaml", help="combined project file")
    p.add_argument("--select", nargs="*", help="combined selectors (SOURCE.DATASET)")
    p.add_argument("--partitions", type=int, default=2, help="partitions of a backfill")
    p.add_argument("--profile", default=None, help="write a pyinstrument profile here")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: run, add peak memory, write the result."""
    args = parse(argv)
    result = execute(args)
    result["rss"] = own_peak_rss()
    Path(args.result).parent.mkdir(parents=True, exist_ok=True)
    Path(args.result).write_text(json.dumps(result, indent=2, default=str))
    return 0 if result["ok"] or "unavailable" in result else 1


if __name__ == "__main__":
    sys.exit(main())
