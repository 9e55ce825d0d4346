"""The ``combined`` command: a thin layer over :class:`combined.engine.Engine`.

Heavy modules (the engine, pyarrow, deltalake, duckdb) are imported inside
commands so that ``combined --help`` starts instantly.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from combined._status import ERROR, exit_status

if TYPE_CHECKING:
    from combined.catalog import Run
    from combined.engine import Engine

app = typer.Typer(
    name="combined",
    help="Capture data you do not own into a Delta Lake you do own, governed.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
run_app = typer.Typer(help="Inspect and retry one run.", no_args_is_help=True)
app.add_typer(run_app, name="run")
cdc_app = typer.Typer(
    help="Manage change data capture (PostgreSQL logical replication).", no_args_is_help=True
)
app.add_typer(cdc_app, name="cdc")
quarantine_app = typer.Typer(
    help="Review quarantined records: list, show, release or discard them.", no_args_is_help=True
)
app.add_typer(quarantine_app, name="quarantine")

# Nearly everything printed is untrusted text (errors, names, SQL, paths,
# values): neither console reads rich markup or emoji codes in it, so
# ``[/x]`` or ``:cat:`` print as written. Colour is applied with Text styles.
console = Console(markup=False, emoji=False)
err = Console(stderr=True, soft_wrap=True, markup=False, emoji=False)

ProjectOpt = Annotated[
    Path | None,
    typer.Option("--project", "-p", help="the project file (default ./combined.yaml)"),
]


def _red(text: str) -> Text:
    return Text(text, style="red")


def _state(state: str) -> Text:
    """A Run state, green when it succeeded, red otherwise."""
    return Text(state, style="green" if state == "succeeded" else "red")


def _exit_for(states: Iterable[str]) -> None:
    """Exit with :func:`~combined.exit_status` unless every Run succeeded.

    Schedulers tell apart what to do next (README): 1 retry later, 3 review
    the quarantine or drift, 4 fix the credentials; 2 is an error before any Run.
    """
    status = exit_status(states)
    if status:
        raise typer.Exit(status)


def _fail(exc: BaseException) -> NoReturn:
    from combined.errors import CombinedError, redact

    message = exc.message if isinstance(exc, CombinedError) else redact(repr(exc))
    err.print(Text.assemble(_red("error:"), " ", message), highlight=False)
    if isinstance(exc, CombinedError) and exc.hint:
        err.print(f"  hint: {exc.hint}", highlight=False)
    raise typer.Exit(ERROR)


def _engine(project: Path | None, reporter: Any = None) -> Engine:
    from combined.engine import Engine
    from combined.errors import CombinedError

    try:
        return Engine.open(project, reporter)
    except CombinedError as exc:
        _fail(exc)


@contextmanager
def _session(project: Path | None, reporter: Any = None) -> Iterator[Engine]:
    """An engine for one command: errors become a clear message and exit 2; always closed."""
    from combined.errors import CombinedError

    engine = _engine(project, reporter)
    try:
        yield engine
    except CombinedError as exc:
        _fail(exc)
    finally:
        engine.close()


class _Progress:
    """Rich progress bars: rows, bytes and deliveries per dataset."""

    def __init__(self) -> None:
        from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        self.bars = Progress(
            SpinnerColumn(),
            TextColumn("{task.description}", markup=False),
            TextColumn("{task.fields[phase]}", markup=False),
            TextColumn("{task.fields[rows]:>10,} rows", markup=False),
            TextColumn("{task.fields[mb]:>8.1f} MB", markup=False),
            TextColumn("{task.fields[deliveries]} deliveries", markup=False),
            TimeElapsedColumn(),
            console=err,
            transient=False,
        )
        self.tasks: dict[str, Any] = {}

    def _task(self, dataset: str) -> Any:
        if dataset not in self.tasks:
            self.tasks[dataset] = self.bars.add_task(
                dataset, total=None, phase="", rows=0, mb=0.0, deliveries=0
            )
        return self.tasks[dataset]

    def run_started(self, run_id: str, source: str, datasets: list[str]) -> None:
        self.bars.start()
        err.print(f"run {run_id}: capturing {source} ({', '.join(datasets)})")
        for d in datasets:
            self._task(d)

    def progress(self, dataset: str, rows: int, nbytes: int, deliveries: int) -> None:
        fields: dict[str, Any] = {"rows": rows, "deliveries": deliveries}
        if nbytes:
            fields["mb"] = nbytes / 1e6
        self.bars.update(self._task(dataset), **fields)

    def phase(self, dataset: str, phase: str) -> None:
        self.bars.update(self._task(dataset), phase=phase)

    def note(self, message: str) -> None:
        # An engine note quotes errors, paths and values: text, never markup.
        self.bars.console.print(Text(message), highlight=False)

    def run_finished(self, run_id: str, state: str) -> None:
        for task in self.tasks.values():
            self.bars.update(task, phase="done" if state == "succeeded" else state)
        self.bars.stop()
        self.tasks.clear()


def _when(value: datetime | None) -> str:
    return value.strftime("%Y-%m-%d %H:%M:%S") if value else "-"


def _instant_text(value: datetime) -> str:
    """An instant to the microsecond, in UTC, as ``--as-of`` reads it back."""
    return value.astimezone(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


@app.command()
def init(
    path: Annotated[Path, typer.Argument(help="where to write the project file")] = Path(
        "combined.yaml"
    ),
    force: Annotated[bool, typer.Option(help="overwrite an existing file")] = False,
) -> None:
    """Write a commented example project file."""
    from combined.config import write_example
    from combined.errors import CombinedError

    try:
        written = write_example(path, force=force)
    except CombinedError as exc:
        _fail(exc)
    console.print(f"wrote {written}")


@app.command()
def check(project: ProjectOpt = None) -> None:
    """Validate the project file and connect to every source."""
    from combined.errors import CombinedError

    engine = _engine(project)
    failed = False
    for name in engine.project.sources:

        def warn(why: str, name: str = name) -> None:
            console.print(Text.assemble(("warn", "yellow"), f" {name}: {why}"))

        try:
            engine.check(name, warn)
            console.print(Text.assemble(("ok", "green"), f"   {name}"))
        except CombinedError as exc:
            failed = True
            console.print(Text.assemble(_red("fail"), f" {name}: {exc.message}"))
            if exc.hint:
                console.print(f"     hint: {exc.hint}")
    engine.close()
    if failed:
        raise typer.Exit(1)


@app.command()
def discover(
    source: Annotated[str, typer.Argument(help="the source to discover")],
    project: ProjectOpt = None,
) -> None:
    """Report the datasets, fields, keys and cursor candidates of a source."""

    with _session(project) as engine:
        found = engine.discover(source)
    for d in found.datasets:
        rows = "" if d.estimated_rows is None else f", ~{d.estimated_rows} rows"
        t = Table(title=f"{d.name} ({d.kind}{rows})", title_justify="left")
        t.add_column("field")
        t.add_column("type")
        t.add_column("source type")
        t.add_column("key")
        for f in d.fields:
            t.add_row(f.name, f.arrow_type, f.source_type, "pk" if f.name in d.primary_key else "")
        console.print(t)
        console.print(
            f"  strategies: {', '.join(d.strategies)}; sync modes: {', '.join(d.sync_modes)}",
            markup=False,
        )
        for note in d.notes:
            console.print(f"  note: {note}", markup=False)
        for k in d.key_candidates:
            console.print(f"  key candidate {', '.join(k.columns)}: {k.evidence}", markup=False)
        for c in d.cursor_candidates:
            console.print(f"  cursor candidate {c.column}: {c.evidence}")


@app.command()
def capture(
    selectors: Annotated[
        list[str] | None, typer.Argument(help="SOURCE or SOURCE.DATASET (all when omitted)")
    ] = None,
    enqueue: Annotated[
        bool, typer.Option("--enqueue", help="queue the runs for a worker instead of running them")
    ] = False,
    project: ProjectOpt = None,
) -> None:
    """Capture datasets into the lake and publish them (or queue them for `combined worker`)."""
    if enqueue:
        from combined.runtime._scheduler import describe
        from combined.runtime._scheduler import enqueue as enqueue_parts

        with _session(project) as engine:
            parts = enqueue_parts(engine, selectors or [])
        for line in describe(parts):
            console.print(line)
        return
    with _session(project, _Progress()) as engine:
        runs = engine.capture(selectors or [])
    for run in runs:
        console.print(Text.assemble(f"run {run.id} ", _state(run.state)))
        if run.stats:
            for ds, s in run.stats.items():
                console.print(
                    f"  {run.source}.{ds}: {s['captured']} read, +{s['inserts']} "
                    f"~{s['updates']} -{s['deletes']}, {s['deliveries']} deliveries"
                )
        if run.error:
            err.print(f"  {run.error}", highlight=False)
    _say_published(runs)
    _exit_for(run.state for run in runs)


def _say_published(runs: list[Run]) -> None:
    """What a capture of several sources published together, and what it did not."""
    if len(runs) < 2:
        return
    published = [r for r in runs if r.publication_id]
    if published:
        names = ", ".join(f"{r.source} ({', '.join(r.datasets)})" for r in published)
        console.print(f"published {published[0].publication_id}: {names}")
    withheld = [f"{r.source} (run {r.id} {r.state})" for r in runs if not r.publication_id]
    if withheld:
        err.print(f"not published: {', '.join(withheld)}", highlight=False)


@app.command()
def backfill(
    dataset: Annotated[str, typer.Argument(help="SOURCE.DATASET")],
    partitions: Annotated[int, typer.Option(help="partitions read in parallel")] = 4,
    lower: Annotated[
        str | None, typer.Option("--from", help="inclusive lower bound of the range (required)")
    ] = None,
    upper: Annotated[
        str | None, typer.Option("--to", help="exclusive upper bound (required)")
    ] = None,
    column: Annotated[
        str | None, typer.Option(help="the key or time column to partition on (default: key)")
    ] = None,
    sum_column: Annotated[
        str | None, typer.Option(help="a column whose exact sum is a control total")
    ] = None,
    project: ProjectOpt = None,
) -> None:
    """Capture a range of one dataset in parallel partitions under one exported snapshot.

    Bounds and control totals (row count, and the sum of --sum-column) are read
    inside the snapshot, then compared with what landed in the same range: a
    mismatch publishes nothing (exit 3).
    """

    with _session(project, _Progress()) as engine:
        run = engine.backfill(
            dataset,
            partitions=partitions,
            lower=lower,
            upper=upper,
            column=column,
            sum_column=sum_column,
        )
    console.print(Text.assemble(f"run {run.id} ", _state(run.state)))
    for ds, s in (run.stats or {}).items():
        console.print(
            f"  {run.source}.{ds}: {s['captured']} read in {partitions} partitions, "
            f"+{s['inserts']} ~{s['updates']} -{s['deletes']}, control {s['reconciliation']}"
        )
    if run.error:
        err.print(f"  {run.error}", highlight=False)
    _exit_for([run.state])


@app.command()
def runs(
    limit: Annotated[int, typer.Option(help="how many")] = 20, project: ProjectOpt = None
) -> None:
    """List the newest runs."""
    with _session(project) as engine:
        rows = engine.runs(limit)
    t = Table("run", "source", "trigger", "state", "created", "datasets", "error")
    for r in rows:
        t.add_row(
            r.id,
            r.source,
            r.trigger,
            r.state,
            _when(r.created_at),
            ",".join(r.datasets),
            (r.error or "").splitlines()[0][:60] if r.error else "",
        )
    console.print(t)


@run_app.command("show")
def run_show(run_id: str, project: ProjectOpt = None) -> None:
    """Show one run: admission, attempts, deliveries, and its events, oldest first."""

    with _session(project) as engine:
        info = engine.run(run_id)
    r, adm = info["run"], info["admission"]
    console.print(f"run {r.id}  {r.state}  trigger={r.trigger}  source={r.source}")
    console.print(
        f"  created {_when(r.created_at)}  started {_when(r.started_at)}  ended {_when(r.ended_at)}"
    )
    if r.retry_of:
        console.print(f"  retry of {r.retry_of}")
    console.print(
        f"  admission {adm.id}: {adm.connector}@{adm.revision} "
        f"config {adm.config_digest[:12]} billing={adm.billing_policy} venue={adm.venue}"
    )
    if r.error:
        console.print(f"  error: {r.error}")
    for a in info["attempts"]:
        console.print(
            f"  attempt {a.number} on {a.worker}: {a.outcome or 'running'}"
            + (f" ({a.error})" if a.error else "")
        )
    t = Table("delivery", "dataset", "seq", "records", "bytes", "state", "lake version")
    for d in info["deliveries"]:
        t.add_row(
            d.id[:12],
            d.dataset,
            str(d.sequence),
            str(d.record_count),
            str(d.byte_count),
            d.state,
            str(d.lake_version),
        )
    console.print(t)
    from combined.cli._activity import events_table

    console.print(events_table([dict(e._mapping) for e in info["activity"]], runs=False))


@run_app.command("retry")
def run_retry(
    run_id: str,
    enqueue: Annotated[
        bool, typer.Option("--enqueue", help="queue the retry for a worker instead of running it")
    ] = False,
    project: ProjectOpt = None,
) -> None:
    """Retry a failed run as a new run under the original admission."""
    if enqueue:
        with _session(project) as engine:
            run = engine.retry(run_id, enqueue=True)
        console.print(f"run {run.id} queued (retry of {run.retry_of})")
        return
    with _session(project, _Progress()) as engine:
        run = engine.retry(run_id)
    console.print(f"run {run.id} {run.state} (retry of {run.retry_of})")
    if run.error:
        err.print(f"  {run.error}", highlight=False)
    _exit_for([run.state])


@app.command()
def status(project: ProjectOpt = None) -> None:
    """Freshness and last source position per dataset."""
    with _session(project) as engine:
        rows = engine.status()
        waiting = engine.quarantine()
    t = Table(
        "dataset",
        "strategy",
        "mode",
        "version",
        "lake v",
        "position",
        "published",
        "fresh",
        "slot lag",
    )
    for s in rows:
        fresh: str | Text = "-" if s["fresh"] is None else ("yes" if s["fresh"] else _red("stale"))
        slot = s.get("slot") or {}
        lag: str | Text
        if "error" in slot:
            lag = _red(slot["error"])
        elif slot and not slot.get("exists"):
            lag = _red("no slot")
        elif slot:
            secs = slot.get("lag_seconds")
            lag = f"{slot.get('lag_bytes')} B" + (f", {secs:.1f} s" if secs is not None else "")
        else:
            lag = "-"
        lake_v: str | Text = str(s["lake_version"] if s["lake_version"] is not None else "-")
        if s["unpublished"]:
            lake_v = _red(f"{lake_v} ({s['unpublished']['lake_version']} unpublished)")
        t.add_row(
            s["dataset"],
            s["strategy"],
            s["sync_mode"],
            (s["version"] or "-")[:12],
            lake_v,
            (s["position"] or "-")[:30],
            _when(s["published_at"]),
            fresh,
            lag,
        )
    console.print(t)
    for s in rows:
        if s["unpublished"]:
            console.print(
                Text(
                    f"{s['dataset']}: lake version {s['unpublished']['lake_version']} is "
                    "committed, not published (queries read the published one); the next "
                    f"capture of {s['dataset']} publishes it"
                ),
                highlight=False,
            )
    if waiting:
        overdue = sum(1 for q in waiting if q["overdue"])
        line = f"{len(waiting)} quarantine entr{'y' if len(waiting) == 1 else 'ies'} await review"
        console.print(
            _red(f"{line} ({overdue} overdue): combined quarantine list")
            if overdue
            else f"{line}: combined quarantine list"
        )


def _instant(text: str) -> datetime:
    from combined.errors import ConfigError

    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        _fail(
            ConfigError(
                f"--as-of {text!r} is not an ISO-8601 timestamp",
                hint="use e.g. 2026-11-29T08:00:00Z",
            )
        )
    return value if value.tzinfo else value.replace(tzinfo=UTC)


@app.command()
def sql(
    query: Annotated[str, typer.Argument(help="DuckDB SQL; tables are <source>.<dataset>")],
    as_of: Annotated[str | None, typer.Option("--as-of", help="an ISO-8601 instant")] = None,
    publication: Annotated[str | None, typer.Option(help="a publication id")] = None,
    fmt: Annotated[str, typer.Option("--format", help="table, csv or json")] = "table",
    timeout: Annotated[
        float, typer.Option("--timeout", help="seconds before the query is stopped (0: none)")
    ] = 600.0,
    memory_limit: Annotated[
        str, typer.Option("--memory-limit", help="DuckDB's memory limit, e.g. 2GB or 512MB")
    ] = "2GB",
    project: ProjectOpt = None,
) -> None:
    """Query the lake's published files at a published basis with DuckDB.

    It reads only the Parquet files of the basis's published table versions:
    nothing unpublished, no other file. SIGINT or SIGTERM stops the query at once.
    """
    from combined.errors import ConfigError

    if fmt not in ("table", "csv", "json"):
        _fail(ConfigError(f"unknown format {fmt!r}", hint="use table, csv or json"))
    if timeout < 0:
        _fail(ConfigError(f"--timeout must be 0 or more, not {timeout:g}", hint="0: no limit"))
    when = _instant(as_of) if as_of else None
    try:
        with _session(project) as engine:
            result = engine.sql(
                query,
                as_of=when,
                publication=publication,
                timeout_s=timeout or None,
                memory_limit=memory_limit,
            )
    except KeyboardInterrupt:
        err.print("stopped by SIGINT: the query was interrupted", highlight=False)
        raise typer.Exit(INTERRUPTED) from None
    rows = result.to_pylist()
    if fmt == "json":
        sys.stdout.write(json.dumps(rows, default=str) + "\n")
    elif fmt == "csv":
        import csv

        w = csv.writer(sys.stdout, lineterminator="\n")  # as every other line it prints
        w.writerow(result.column_names)
        for row in rows:
            w.writerow(["" if v is None else v for v in row.values()])
    else:
        t = Table(*result.column_names)
        for row in rows:
            t.add_row(*["" if v is None else str(v) for v in row.values()])
        console.print(t)


@app.command()
def history(
    dataset: Annotated[str, typer.Argument(help="SOURCE.DATASET")], project: ProjectOpt = None
) -> None:
    """List a dataset's versions."""
    from combined.errors import ConfigError

    source, _, name = dataset.partition(".")
    if not source or not name:
        _fail(
            ConfigError(f"history takes SOURCE.DATASET, not {dataset!r}", hint="e.g. shop.orders")
        )
    with _session(project) as engine:
        rows = engine.history(dataset)
    t = Table("version", "parent", "+ins", "~upd", "-del", "rows", "run", "lake v", "publications")
    for v in rows:
        t.add_row(
            v["id"][:12],
            (v["parent_id"] or "-")[:12],
            str(v["inserts"]),
            str(v["updates"]),
            str(v["deletes"]),
            str(v["row_count"]),
            v["run_id"],
            str(v["lake_version"]),
            ", ".join(v["publications"]),
        )
    console.print(t)


@app.command()
def usage(
    month: Annotated[str | None, typer.Option(help="YYYY-MM")] = None, project: ProjectOpt = None
) -> None:
    """Monthly active rows per source and dataset."""
    from combined.errors import ConfigError

    if month is not None and not re.fullmatch(r"\d{4}-(0[1-9]|1[0-2])", month):
        _fail(ConfigError(f"--month {month!r} is not a month", hint="use YYYY-MM, e.g. 2026-11"))
    with _session(project) as engine:
        rows = engine.usage(month)
    t = Table("month", "source", "dataset", "MAR", "inserts", "updates", "deletes")
    for u in rows:
        t.add_row(
            u["month"],
            u["source"],
            u["dataset"],
            str(u["mar"]),
            str(u["inserts"]),
            str(u["updates"]),
            str(u["deletes"]),
        )
    console.print(t)


@app.command()
def repair(project: ProjectOpt = None) -> None:
    """Rebuild the catalog projection from the lake; close runs whose process died."""

    with _session(project) as engine:
        notes = engine.repair()
    for n in notes:
        console.print(n)
    console.print("the catalog matches the lake" if not notes else f"{len(notes)} repair(s)")


@app.command()
def demo(
    directory: Annotated[Path, typer.Option(help="where to build the demo")] = Path("demo"),
) -> None:
    """Build a sample shop, capture it, change it, capture again and query it."""
    from combined.demo import run_demo
    from combined.errors import CombinedError

    try:
        run_demo(directory, console)
    except CombinedError as exc:
        _fail(exc)


#: Exit status of an error Combined did not anticipate (sysexits' EX_SOFTWARE).
INTERNAL_ERROR = 70
#: Exit status after SIGTERM: what a shell reports for a process SIGTERM ended (128 + 15).
TERMINATED = 143
#: Exit status after SIGINT (Ctrl-C): 128 + 2.
INTERRUPTED = 130


class Terminated(SystemExit):
    """Raised in the main thread by SIGTERM: the command unwinds as after Ctrl-C.

    A ``SystemExit``, so no ``except Exception`` takes it for a failure.
    """


def _stop_on_sigterm() -> None:
    """Make SIGTERM unwind the command, so every ``finally`` and terminal outcome runs.

    Killed by the default action instead, Combined would leave its program's
    private files (secrets) behind and the program running. A Run so stopped
    stays unfinished with its leases released, and the next capture (or
    ``combined repair``) marks it failed at once, as after Ctrl-C: its lake
    commits, if any, are projected from the lake. A second SIGTERM during
    that clean-up is ignored (SIGKILL still ends it at once). A SIGTERM that
    whoever started Combined ignores or handles stays theirs.
    """
    import signal

    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return

    def handler(signum: int, frame: object) -> None:
        # A handler, not SIG_IGN: an ignored signal would be inherited by the
        # programs started meanwhile, which SIGTERM must still stop.
        signal.signal(signal.SIGTERM, lambda signum, frame: None)
        raise Terminated(TERMINATED)

    signal.signal(signal.SIGTERM, handler)


def main() -> None:
    """Entry point of the ``combined`` script.

    An exception Combined did not anticipate is a bug: it is told in one
    line, redacted like every error, with exit status 70. Its traceback,
    which can quote values (secrets among them), only with COMBINED_DEBUG=1.
    SIGTERM stops the command in order (:func:`_stop_on_sigterm`), exit status 143.
    """
    import os

    _stop_on_sigterm()
    try:
        app()
    except Terminated:
        err.print("stopped by SIGTERM", highlight=False)
        raise
    except Exception as exc:
        if os.environ.get("COMBINED_DEBUG"):
            raise
        from combined.errors import redact

        err.print(
            Text.assemble(
                _red("error:"), f" internal error ({type(exc).__name__}): ", redact(str(exc))
            ),
            highlight=False,
        )
        err.print(
            "  hint: this is a bug in Combined: run again with COMBINED_DEBUG=1 "
            "for the traceback, and report it",
            highlight=False,
        )
        raise SystemExit(INTERNAL_ERROR) from None


# The long-running commands (worker, serve) live in their own module; importing
# it registers them on ``app``.
from combined.cli import _activity as _activity  # noqa: E402
from combined.cli import _cdc as _cdc  # noqa: E402
from combined.cli import _maintain as _maintain  # noqa: E402
from combined.cli import _publications as _publications  # noqa: E402
from combined.cli import _quarantine as _quarantine  # noqa: E402
from combined.cli import _schedule as _schedule  # noqa: E402
from combined.cli import _serve as _serve  # noqa: E402
