"""Side-by-side benchmarks: ``python -m bench.run [--rows N] [--cases ...]``.

Against a real PostgreSQL, in one run, on the same data (a dedicated
database, ``combined_bench`` by default, reset at the start), each case in a
fresh process (``python -m bench.case``), this prints a markdown table of
wall time, rows/s, peak RSS of the case's process tree, lake bytes written
and time ratios against the floor and dlt, then where the run stands
against the targets of the benchmark issue.

Cases (names or numbers; default: all):

1. ``floor``: ADBC PostgreSQL -> Arrow -> one Parquet file.
2. ``dlt_replace``: dlt ``sql_table`` (pyarrow backend) -> filesystem Delta, replace.
3. ``snapshot_initial``: Combined's initial snapshot.
4. ``snapshot_unchanged``: Combined re-capture of the unchanged table.
5. ``snapshot_changed``: Combined re-capture after 1% updates, 0.1% deletes, 0.5% inserts.
6. ``dlt_merge``: dlt merge of the same change via an incremental ``updated_at``
   cursor; counts the rows it keeps that the source deleted.
7. ``cursor_append``: Combined cursor capture of 1% appended rows.
8. ``scale``: Combined initial snapshots at ``--scale-rows`` (1M and 4M), peak RSS ratio.
9. ``partitioned``: Combined partitioned snapshot (``Engine.backfill``, ``--partitions``
   workers, 2 by default) of the same table into a fresh lake.
10. ``s3``: Combined's initial snapshot into a local lake, then the same into an S3
    lake on 127.0.0.1 (moto's server; bytes uploaded counted), each checked
    against the source (``bench/objectstore.py``).
11. ``snapshot_rewritten``: Combined re-capture after every row was updated (a
    backfill or migration): the largest transition a snapshot re-capture can meet.

Cases that need earlier state (a baseline, the change) get it from untimed
setup steps when the case that would have produced it is not selected.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench import objectstore, report, workload
from bench.measure import TreeSampler
from bench.report import CaseResult

REPO = Path(__file__).resolve().parents[1]

#: Case name -> (number, title), in run order.
CASES: dict[str, tuple[str, str]] = {
    report.FLOOR: ("1", "floor: ADBC -> Arrow -> one Parquet file"),
    report.DLT_REPLACE: ("2", "dlt sql_table (pyarrow) -> filesystem Delta, replace"),
    report.INITIAL: ("3", "combined initial snapshot"),
    report.UNCHANGED: ("4", "combined unchanged re-capture"),
    report.CHANGED: ("5", "combined re-capture after 1% upd, 0.1% del, 0.5% ins"),
    report.DLT_MERGE: ("6", "dlt merge (incremental updated_at, upsert)"),
    report.CURSOR: ("7", "combined cursor capture of 1% appended rows"),
    "scale": ("8", "combined initial snapshot (memory scaling)"),
    report.PARTITIONED: ("9", "combined partitioned snapshot (backfill)"),
    "s3": ("10", "combined initial snapshot: an S3 lake on 127.0.0.1 next to a local lake"),
    report.REWRITTEN: ("11", "combined re-capture after every row updated"),
}
ALIASES = {number: name for name, (number, _) in CASES.items()}


def select(names: Sequence[str]) -> list[str]:
    """Case names from names, numbers or ``all``, in run order."""
    wanted: set[str] = set()
    for raw in names:
        for name in raw.replace(",", " ").split():
            if name == "all":
                wanted.update(CASES)
                continue
            name = ALIASES.get(name, name)
            if name not in CASES:
                raise SystemExit(f"unknown case {name!r}; choose from {', '.join(CASES)} or 1-11")
            wanted.add(name)
    return [name for name in CASES if name in wanted]


@dataclass(frozen=True)
class Step:
    """One step of a run: ``db`` work in this process, a ``setup`` or a measured ``case``."""

    kind: str  # db | setup | case
    name: str
    arg: int = 0


def plan(cases: Sequence[str], scale_rows: Sequence[int]) -> list[Step]:
    """The ordered steps that run ``cases`` on one database."""
    chosen = set(cases)
    steps: list[Step] = []
    main = chosen - {"scale"}
    if main:
        steps += [Step("db", "create"), Step("setup", "warmup")]
        for name in (report.FLOOR, report.DLT_REPLACE):
            if name in chosen:
                steps.append(Step("case", name))
        baseline_needed = bool(chosen & {report.UNCHANGED, report.CHANGED, report.REWRITTEN})
        if report.INITIAL in chosen:
            steps.append(Step("case", report.INITIAL))
        elif baseline_needed:
            steps.append(Step("setup", report.INITIAL))
        if report.UNCHANGED in chosen:
            steps.append(Step("case", report.UNCHANGED))
        if report.PARTITIONED in chosen:
            steps.append(Step("case", report.PARTITIONED))
        if "s3" in chosen:
            steps.append(Step("case", "s3"))
        if report.DLT_MERGE in chosen:
            steps.append(Step("setup", "dlt_merge_initial"))
        if chosen & {report.CHANGED, report.DLT_MERGE}:
            steps.append(Step("db", "mutate"))
            for name in (report.CHANGED, report.DLT_MERGE):
                if name in chosen:
                    steps.append(Step("case", name))
        if report.REWRITTEN in chosen:
            steps += [Step("db", "update_all"), Step("case", report.REWRITTEN)]
        if report.CURSOR in chosen:
            steps += [Step("setup", "cursor_initial"), Step("db", "append")]
            steps.append(Step("case", report.CURSOR))
    if "scale" in chosen:
        for n in scale_rows:
            steps += [Step("db", "create_scale", n), Step("case", f"{report.SCALE}{n}", n)]
    return steps


PROJECT = """\
version: 1
lake: ./lake
{memory}sources:
  pg:
    connector: postgres
    config:
      dsn: {dsn}
    datasets:
      orders:
        relation: public.{table}
        key: [{key}]
      orders_cursor:
        relation: public.{table}
        key: [id]
        strategy: cursor
        cursor:
          column: id
          trust: "bench: orders.id is the primary key; new rows only ever take larger ids"
"""


def write_project(
    directory: Path, dsn: str, table: str, reduction_memory: str | None, key: str = "id"
) -> Path:
    """A Combined project over the benchmark table; returns the project file."""
    directory.mkdir(parents=True, exist_ok=True)
    memory = f"reduction_memory: {reduction_memory}\n" if reduction_memory else ""
    path = directory / "combined.yaml"
    path.write_text(
        PROJECT.format(dsn=json.dumps(dsn), table=table, memory=memory, key=key), encoding="utf-8"
    )
    return path


def scale_table(rows: int) -> str:
    """The table of one memory-scaling case."""
    return f"orders_s{rows}"


def human_rows(rows: int) -> str:
    """``1M``, ``4M``, ``500k``, ``2000``."""
    if rows % 1_000_000 == 0:
        return f"{rows // 1_000_000}M"
    if rows % 1000 == 0:
        return f"{rows // 1000}k"
    return str(rows)


@dataclass
class Context:
    """What the steps of one run share."""

    args: argparse.Namespace
    workdir: Path
    dsn: str
    env: dict[str, str]
    results: list[CaseResult] = field(default_factory=list)
    setups: list[CaseResult] = field(default_factory=list)
    changes: dict[str, dict[str, int]] = field(default_factory=dict)
    log: Any = None

    @property
    def table(self) -> str:
        """The benchmark table of the run's shape (``orders``, ``narrow``, ``wide``)."""
        return workload.SHAPES[self.args.shape].table

    def say(self, text: str) -> None:
        """Progress on stderr (stdout carries the report)."""
        print(text, file=sys.stderr, flush=True)


#: What a run creates in its workdir (cleared at the start: every run starts from nothing).
WORK_ENTRIES = (
    "combined",
    "partitioned",
    objectstore.LOCAL,
    objectstore.REMOTE,
    "floor",
    "warmup",
    "dlt_replace",
    "dlt_merge",
    "dlt_pipelines",
    "results",
    "logs",
    "profiles",
    "results.json",
    "report.md",
)


def clean_workdir(workdir: Path) -> None:
    """Remove what an earlier run left in ``workdir`` (only the harness's own entries)."""
    for entry in workdir.iterdir():
        if entry.name in WORK_ENTRIES or entry.name.startswith("scale_"):
            if entry.is_dir():
                shutil.rmtree(entry)
            else:
                entry.unlink()


def child_env() -> dict[str, str]:
    """The environment of case processes: ``bench`` importable from the repository."""
    env = dict(os.environ)
    extra = env.get("PYTHONPATH", "")
    env["PYTHONPATH"] = str(REPO) + (os.pathsep + extra if extra else "")
    env.setdefault("COMBINED_RETRY_BACKOFF_S", "0.5")
    return env


def spawn(
    ctx: Context, name: str, op: str, case_args: Sequence[str], lake: Path
) -> tuple[dict[str, Any] | None, int, float, str]:
    """Run ``python -m bench.case op`` in a fresh process, sampling its tree's memory."""
    result = ctx.workdir / "results" / f"{name}.json"
    log = ctx.workdir / "logs" / f"{name}.log"
    result.parent.mkdir(parents=True, exist_ok=True)
    log.parent.mkdir(parents=True, exist_ok=True)
    result.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "bench.case", op, "--result", str(result), "--lake", str(lake)]
    cmd += list(case_args)
    if name in (ctx.args.profile or []):
        cmd += ["--profile", str(ctx.workdir / "profiles" / f"{name}.txt")]
        (ctx.workdir / "profiles").mkdir(parents=True, exist_ok=True)
    # Earlier cases' files are still being written back from the page cache:
    # flushed now, their writeback does not share this case's cores.
    os.sync()
    started = time.perf_counter()
    failure = ""
    with log.open("wb") as out:
        proc = subprocess.Popen(
            cmd, stdout=out, stderr=subprocess.STDOUT, env=ctx.env, cwd=REPO, start_new_session=True
        )
        sampler = TreeSampler(proc.pid, interval_s=ctx.args.sample_interval).start()
        try:
            code = proc.wait(timeout=ctx.args.case_timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            code = -9
            failure = f"timed out after {ctx.args.case_timeout} s"
        peak = sampler.stop()
    elapsed = time.perf_counter() - started
    child: dict[str, Any] | None = None
    if result.exists():
        child = json.loads(result.read_text())
    elif not failure:
        tail = log.read_text(errors="replace").strip().splitlines()[-1:] or [f"exit {code}"]
        failure = f"exit {code}: {tail[0][:300]}"
    if child is not None and child.get("traceback"):
        ctx.say(child["traceback"])
    return child, peak.peak, elapsed, failure


def run_op(
    ctx: Context, key: str, label: str, title: str, op: str, case_args: Sequence[str], lake: Path
) -> CaseResult:
    """Spawn one case and turn what it reported into a :class:`CaseResult`."""
    ctx.say(f"-- {label} {key}: {title}")
    child, peak, elapsed, failure = spawn(ctx, key, op, case_args, lake)
    res = report.from_child(
        key, label, title, child, peak_rss=peak, process_seconds=elapsed, failure=failure
    )
    ctx.say(
        f"   {res.status}"
        + (
            f": {res.seconds:.2f} s, {res.rows:,} rows, peak {report.fmt_bytes(res.peak_rss)}"
            if res.ok
            else ""
        )
    )
    return res


# -- the steps --------------------------------------------------------------------------------


def combined_args(ctx: Context, project: Path, dataset: str, table: str) -> list[str]:
    """Arguments of a ``combined`` case."""
    return [
        "--project",
        str(project),
        "--select",
        f"pg.{dataset}",
        "--dsn",
        ctx.dsn,
        "--table",
        table,
    ]


def project_path(ctx: Context) -> Path:
    """The project of the main table (created on first use)."""
    directory = ctx.workdir / "combined"
    path = directory / "combined.yaml"
    if not path.exists():
        key = ", ".join(workload.SHAPES[ctx.args.shape].key)
        write_project(directory, ctx.dsn, ctx.table, ctx.args.reduction_memory, key)
    return path


def lake_notes(res: CaseResult) -> list[str]:
    """Where a Combined case's lake bytes went: table, raw layer, usage."""
    areas = res.extra.get("lake_areas") or {}
    if not areas:
        return []
    names = {"pg": "table", "_deliveries": "raw", "_usage": "usage", "_combined": "ledger"}

    def name(area: str) -> str:
        top, _, linked = area.partition(" ")
        return names.get(top, top) + (
            " (hard links of raw files, not written again)" if linked else ""
        )

    parts = [f"{name(k)} {report.fmt_bytes(v)}" for k, v in sorted(areas.items())]
    return ["written: " + ", ".join(parts)]


def stats_note(res: CaseResult, dataset: str) -> list[str]:
    """``+inserts ~updates -deletes`` of a Combined case."""
    stats = ((res.extra.get("details") or {}).get("stats") or {}).get(dataset)
    if not stats:
        return []
    return [
        f"+{stats.get('inserts', 0):,} ~{stats.get('updates', 0):,} -{stats.get('deletes', 0):,}"
    ]


def lake_count(path: Path) -> int | None:
    """Rows of the Delta table at ``path`` (None when it cannot be read)."""
    try:
        from deltalake import DeltaTable

        return int(DeltaTable(str(path)).to_pyarrow_dataset().count_rows())
    except Exception:
        return None


def kept_deleted(ctx: Context, table_path: Path) -> int | None:
    """Rows of a destination Delta table whose id the source no longer has."""
    try:
        import pyarrow as pa
        import pyarrow.compute as pc
        from deltalake import DeltaTable

        ids = DeltaTable(str(table_path)).to_pyarrow_table(columns=["id"]).column("id")
        source = pa.array(workload.source_ids(ctx.dsn, ctx.table), pa.int64())
        missing = pc.invert(pc.is_in(ids, value_set=source))
        return int(pc.sum(missing).as_py() or 0)
    except Exception as exc:
        ctx.say(f"   cannot count kept deleted rows: {exc}")
        return None


def do_db(ctx: Context, step: Step) -> None:
    """Database work in this process (not measured)."""
    rows, shape, table = ctx.args.rows, ctx.args.shape, ctx.table
    started = time.perf_counter()
    if step.name == "create":
        ctx.dsn = workload.reset_database(ctx.args.dsn, ctx.args.database)
        ctx.env["BENCH_DSN"] = ctx.dsn
        workload.create_orders(ctx.dsn, rows, table, shape)
        what = f"created {table} with {rows:,} rows"
    elif step.name == "mutate":
        change = workload.mutate(ctx.dsn, rows, table, shape)
        ctx.changes["mutate"] = change.as_dict()
        what = f"changed {table}: {change.as_dict()}"
    elif step.name == "update_all":
        change = workload.update_all(ctx.dsn, table, shape)
        ctx.changes["update_all"] = change.as_dict()
        what = f"updated every row of {table}: {change.updated:,}"
    elif step.name == "append":
        change = workload.append(ctx.dsn, rows, table, shape)
        ctx.changes["append"] = change.as_dict()
        what = f"appended {change.inserted:,} rows"
    elif step.name == "create_scale":
        if not ctx.dsn:
            ctx.dsn = workload.reset_database(ctx.args.dsn, ctx.args.database)
        workload.create_orders(ctx.dsn, step.arg, scale_table(step.arg), shape)
        what = f"created {scale_table(step.arg)} with {step.arg:,} rows"
    else:
        raise ValueError(step.name)
    ctx.say(f"-- db: {what} ({time.perf_counter() - started:.1f} s)")


def do_setup(ctx: Context, step: Step) -> None:
    """An untimed step that gives a later case its starting state."""
    title = {
        "warmup": "warm-up read (floor, not reported)",
        report.INITIAL: "combined initial snapshot (baseline for 4/5)",
        "dlt_merge_initial": "dlt merge initial load (baseline for 6)",
        "cursor_initial": "combined cursor baseline (whole table, for 7)",
    }[step.name]
    res = _measured(ctx, step.name, "setup", title)
    ctx.setups.append(res)


def do_case(ctx: Context, step: Step) -> None:
    """A measured case."""
    if step.name.startswith(report.SCALE):
        n = step.arg
        directory = ctx.workdir / f"scale_{n}"
        project = write_project(directory, ctx.dsn, scale_table(n), ctx.args.reduction_memory)
        label = f"8 ({human_rows(n)})"
        res = run_op(
            ctx,
            step.name,
            label,
            f"combined initial snapshot, {human_rows(n)} rows",
            "combined",
            combined_args(ctx, project, "orders", scale_table(n)),
            directory / "lake",
        )
        res.notes += lake_notes(res) if res.ok else []
        ctx.results.append(res)
        return
    if step.name == "s3":
        ctx.results += objectstore.run_pair(ctx)
        return
    number, title = CASES[step.name]
    if step.name == report.PARTITIONED:
        title = f"combined partitioned snapshot (backfill, {ctx.args.partitions} workers)"
    ctx.results.append(_measured(ctx, step.name, number, title))


def _measured(ctx: Context, name: str, label: str, title: str) -> CaseResult:
    work = ctx.workdir
    table = ["--dsn", ctx.dsn, "--table", ctx.table]
    if name in (report.FLOOR, "warmup"):
        return run_op(ctx, name, label, title, "floor", table, work / name)
    if name == report.DLT_REPLACE:
        res = run_op(
            ctx,
            name,
            label,
            title,
            "dlt_replace",
            [*table, "--workdir", str(work)],
            work / "dlt_replace",
        )
        return res
    if name in ("dlt_merge_initial", report.DLT_MERGE):
        res = run_op(
            ctx,
            name,
            label,
            title,
            "dlt_merge",
            [*table, "--workdir", str(work)],
            work / "dlt_merge",
        )
        if res.ok and name == report.DLT_MERGE:
            path = Path((res.extra.get("details") or {}).get("table_path", ""))
            kept = kept_deleted(ctx, path)
            res.extra["kept_deleted"] = kept
            deleted = ctx.changes.get("mutate", {}).get("deleted")
            res.notes.append(
                f"keeps {kept:,} rows the source deleted"
                + (f" (of {deleted:,} deleted)" if deleted is not None else "")
                if kept is not None
                else "kept deleted rows: not counted"
            )
        return res
    if name == report.PARTITIONED:
        directory = work / "partitioned"
        project = write_project(directory, ctx.dsn, ctx.table, ctx.args.reduction_memory)
        extra = ["--partitions", str(ctx.args.partitions)]
        args = [*combined_args(ctx, project, "orders", ctx.table), *extra]
        res = run_op(ctx, name, label, title, "combined_backfill", args, directory / "lake")
        if res.ok:
            res.notes += stats_note(res, "orders") + lake_notes(res)
        return res
    project = project_path(ctx)
    lake = project.parent / "lake"
    if name in (report.INITIAL, report.UNCHANGED, report.CHANGED, report.REWRITTEN):
        res = run_op(
            ctx,
            name,
            label,
            title,
            "combined",
            combined_args(ctx, project, "orders", ctx.table),
            lake,
        )
        if res.ok:
            res.notes += stats_note(res, "orders") + lake_notes(res)
            if name in (report.CHANGED, report.REWRITTEN):
                projected = lake_count(lake / "pg" / "orders")
                source = workload.count_rows(ctx.dsn, ctx.table)
                res.extra["projection_rows"] = projected
                res.notes.append(
                    f"projection {projected:,} rows = source {source:,}"
                    if projected == source
                    else f"projection {projected} rows != source {source:,}"
                )
        return res
    if name in ("cursor_initial", report.CURSOR):
        res = run_op(
            ctx,
            name,
            label,
            title,
            "combined",
            combined_args(ctx, project, "orders_cursor", ctx.table),
            lake,
        )
        if res.ok:
            res.notes += stats_note(res, "orders_cursor") + lake_notes(res)
        return res
    raise ValueError(name)


# -- the report -------------------------------------------------------------------------------


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


def _git(*args: str) -> str:
    """A read-only git query (empty when git is unavailable)."""
    try:
        out = subprocess.run(
            ["git", *args], cwd=REPO, capture_output=True, text=True, timeout=10, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return ""
    return out.stdout.strip()


def source_tree(env: dict[str, str]) -> str:
    """Which ``combined`` the cases imported: this checkout (HEAD, dirty or not) or another."""
    try:
        out = subprocess.run(
            [sys.executable, "-c", "import combined; print(combined.__file__)"],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "? (combined cannot be imported)"
    location = Path(out).resolve().parent
    if (REPO / "src") not in location.parents:
        return f"combined imported from {location} (not this checkout)"
    head = _git("rev-parse", "--short", "HEAD") or "?"
    dirty = _git("status", "--porcelain", "--", "src")
    if dirty:
        return f"HEAD {head} + uncommitted changes to {len(dirty.splitlines())} path(s) in src/"
    return f"HEAD {head}"


def machine(ctx: Context) -> list[str]:
    """Notes on the machine, the versions and the source tree measured."""
    from importlib import metadata

    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in _read("/proc/cpuinfo").splitlines()
            if line.startswith("model name")
        ),
        platform.processor() or "?",
    )
    mem = next(
        (
            line.split(":", 1)[1].strip()
            for line in _read("/proc/meminfo").splitlines()
            if line.startswith("MemTotal")
        ),
        "?",
    )
    versions = []
    for dist in ("combined", "pyarrow", "deltalake", "duckdb", "adbc-driver-postgresql", "dlt"):
        try:
            versions.append(f"{dist} {metadata.version(dist)}")
        except metadata.PackageNotFoundError:
            versions.append(f"{dist} (not installed)")
    server = "?"
    if ctx.dsn:
        try:
            import psycopg

            with psycopg.connect(ctx.dsn) as conn:
                row = conn.execute("SHOW server_version").fetchone()
                server = str(row[0]) if row else "?"
        except Exception:
            pass
    return [
        f"machine: {cpu}, {os.cpu_count()} cores, {mem} RAM, Linux {platform.release()}",
        f"PostgreSQL {server} (same host); Python {platform.python_version()}",
        "versions: " + ", ".join(versions),
        "source tree: " + source_tree(ctx.env),
        "reduction_memory: " + (ctx.args.reduction_memory or "project default"),
        f"table shape: {ctx.args.shape} ({ctx.table}: {workload.SHAPES[ctx.args.shape].columns})",
    ]


def render(ctx: Context, command: str) -> str:
    """The whole report in markdown."""
    now = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [f"### Run of {now}", "", f"`{command}`", ""]
    lines += [f"- {m}" for m in machine(ctx)]
    if ctx.changes:
        lines.append("- source changes: " + json.dumps(ctx.changes, sort_keys=True))
    lines += ["", report.table(ctx.results), ""]
    scale = [r for r in ctx.results if r.key.startswith(report.SCALE) and r.ok and r.peak_rss]
    if len(scale) >= 2:
        scale.sort(key=lambda r: r.rows or 0)
        lo, hi = scale[0], scale[-1]
        lines += [
            f"Memory scaling: peak RSS {report.fmt_bytes(hi.peak_rss)} at {hi.rows:,} rows / "
            f"{report.fmt_bytes(lo.peak_rss)} at {lo.rows:,} rows = "
            f"**{(hi.peak_rss or 0) / (lo.peak_rss or 1):.2f}**",
            "",
        ]
    phases = report.phases_table(ctx.results)
    if phases:
        lines += [
            "Combined phases (wall time (CPU time of the capture process) / its peak RSS):",
            "",
            phases,
            "",
        ]
    if ctx.setups:
        lines += ["Setup steps (untimed against the targets):", ""]
        for s in ctx.setups:
            figures = (
                f"{s.seconds:.2f} s, {s.rows:,} rows, peak {report.fmt_bytes(s.peak_rss)}"
                if s.ok
                else s.status
            )
            lines.append(f"- {s.title}: {figures}")
        lines.append("")
    lines += [
        "Targets:",
        "",
        report.targets_table(report.targets(ctx.results, table_rows=ctx.args.rows)),
        "",
    ]
    return "\n".join(lines)


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line."""
    p = argparse.ArgumentParser(
        prog="python -m bench.run",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--shape",
        choices=sorted(workload.SHAPES),
        default="orders",
        help="the table: orders (7 columns), narrow (4), wide (jsonb, arrays, out-of-line text)",
    )
    p.add_argument(
        "--rows", type=int, default=None, help="rows of the table (default: the shape's full size)"
    )
    p.add_argument(
        "--cases", nargs="*", default=["all"], help="case names or numbers (default: all)"
    )
    p.add_argument(
        "--scale-rows", default="1000000,4000000", help="rows of the memory-scaling cases"
    )
    p.add_argument(
        "--dsn",
        default=os.environ.get("COMBINED_TEST_PG_DSN", workload.DEFAULT_SERVER_DSN),
        help="a PostgreSQL server DSN (a superuser: the benchmark database is dropped and created)",
    )
    p.add_argument("--database", default=workload.DEFAULT_DATABASE, help="the benchmark database")
    p.add_argument("--drop-database", action="store_true", help="drop the database at the end")
    p.add_argument(
        "--workdir",
        default=None,
        help="where lakes, logs and results go (default: a temporary directory)",
    )
    p.add_argument("--keep", action="store_true", help="keep the workdir (always kept when given)")
    p.add_argument("--partitions", type=int, default=2, help="workers of the partitioned case")
    p.add_argument(
        "--reduction-memory",
        default=None,
        help="reduction_memory of the Combined projects (e.g. 256MiB)",
    )
    p.add_argument(
        "--profile",
        nargs="*",
        default=[],
        help="cases to run under pyinstrument (installed ad hoc)",
    )
    p.add_argument(
        "--case-timeout", type=float, default=3600.0, help="seconds before a case is killed"
    )
    p.add_argument(
        "--sample-interval", type=float, default=0.05, help="seconds between memory samples"
    )
    p.add_argument("--markdown", default=None, help="also write the report to this file")
    p.add_argument("--json", default=None, help="also write the raw results to this file")
    args = p.parse_args(argv)
    args.case_names = select(args.cases)
    if args.rows is None:
        args.rows = workload.SHAPES[args.shape].rows
    args.scale = [int(x) for x in str(args.scale_rows).replace(",", " ").split()]
    return args


def main(argv: Sequence[str] | None = None) -> str:
    """Run the benchmark; print and return the markdown report."""
    args = parse(argv)
    command = "python -m bench.run " + shlex.join(list(argv if argv is not None else sys.argv[1:]))
    temporary = args.workdir is None
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="combined-bench-")).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    clean_workdir(workdir)
    ctx = Context(args=args, workdir=workdir, dsn="", env=child_env())
    ctx.say(f"-- workdir {workdir}")
    try:
        for step in plan(args.case_names, args.scale):
            if step.kind == "db":
                do_db(ctx, step)
            elif step.kind == "setup":
                do_setup(ctx, step)
            else:
                do_case(ctx, step)
        text = render(ctx, command.strip())
    finally:
        if args.drop_database:
            workload.drop_database(args.dsn, args.database)
        if temporary and not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    raw = {
        "results": [r.as_dict() for r in ctx.results],
        "setups": [r.as_dict() for r in ctx.setups],
        "changes": ctx.changes,
    }
    if args.json:
        Path(args.json).write_text(json.dumps(raw, indent=2, default=str))
    if not temporary or args.keep:
        (workdir / "results.json").write_text(json.dumps(raw, indent=2, default=str))
        (workdir / "report.md").write_text(text)
    if args.markdown:
        Path(args.markdown).write_text(text)
    print(text)
    return text


if __name__ == "__main__":
    main()
