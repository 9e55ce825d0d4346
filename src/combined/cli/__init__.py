"""The ``combined`` command: a thin layer over :class:`combined.engine.Engine`.

Heavy modules (the engine, pyarrow, deltalake, duckdb) are imported inside
commands so that ``combined --help`` starts instantly.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer
from rich.console import Console
from rich.text import Text

from combined._status import ERROR, RUN_FAILED, exit_status

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
run_app = typer.Typer(help="Inspect, retry or cancel one run.", no_args_is_help=True)
app.add_typer(run_app, name="run")
cdc_app = typer.Typer(
    help="Manage change data capture (PostgreSQL logical replication, the MariaDB/MySQL binlog).",
    no_args_is_help=True,
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


def _dataset_line(source: str, dataset: str, s: Mapping[str, Any], deliveries: bool = True) -> str:
    """What a Run did to one dataset: rows read and changed, or nothing read when unchanged."""
    if s.get("unchanged") is not None:
        return f"  {source}.{dataset}: unchanged since the last capture ({s['unchanged']} rows)"
    line = (
        f"  {source}.{dataset}: {s['captured']} read, +{s['inserts']} "
        f"~{s['updates']} -{s['deletes']}"
    )
    return line + (f", {s['deliveries']} deliveries" if deliveries else "")


def _exit_for(states: Iterable[str], *, disagrees: bool = False) -> None:
    """Exit with :func:`~combined.exit_status` unless every Run succeeded.

    Schedulers tell apart what to do next (README): 1 retry later, 3 review
    the quarantine or drift, 4 fix the credentials, 5 a published capture's
    reconciliation disagrees with the source; 2 is an error before any Run.
    """
    status = exit_status(states, disagrees=disagrees)
    if status:
        raise typer.Exit(status)


def _fail(exc: BaseException) -> NoReturn:
    """Say the error and exit 2, an error before any Run; or 1 (retry later) when a Run
    this command started is unfinished (the lake's ledger refused its end, say: the next
    capture or `combined repair` ends it)."""
    from combined.cli._reporting import ACTIVE
    from combined.errors import CombinedError, redact

    message = exc.message if isinstance(exc, CombinedError) else redact(repr(exc))
    err.print(Text.assemble(_red("error:"), " ", message), highlight=False)
    if isinstance(exc, CombinedError) and exc.hint:
        err.print(f"  hint: {exc.hint}", highlight=False)
    if ACTIVE:
        runs = ", ".join(sorted(ACTIVE))
        err.print(
            f"  run {runs} is left unfinished: the next capture or `combined repair` ends it",
            highlight=False,
        )
        raise typer.Exit(RUN_FAILED)
    raise typer.Exit(ERROR)


def _engine(project: Path | None, reporter: Any = None) -> Engine:
    from combined._logging import configure
    from combined.engine import Engine
    from combined.errors import CombinedError

    try:
        engine = Engine.open(project, reporter)
        settings = engine.project.logging
        configure(settings.format, settings.level, explicit=False)
        return engine
    except CombinedError as exc:
        _fail(exc)


@contextmanager
def _session(project: Path | None, reporter: Any = None, *, stopped: str = "") -> Iterator[Engine]:
    """An engine for one command: errors become a clear message and exit 2; always closed.

    SIGINT (Ctrl-C) ends it with exit status 130, saying what became of the
    Runs in flight (``stopped`` adds what became of the command's own work).
    """
    from combined.errors import CombinedError

    engine = _engine(project, reporter)
    try:
        yield engine
    except CombinedError as exc:
        _fail(exc)
    except KeyboardInterrupt:
        from combined.cli._reporting import say_interrupted

        say_interrupted("SIGINT", stopped)
        raise typer.Exit(INTERRUPTED) from None
    finally:
        engine.close()


def _progress() -> Any:
    """The reporter of a command that executes Runs: bars on a terminal, lines elsewhere."""
    from combined.cli._reporting import reporter

    return reporter()


def _cell(value: Any) -> str:
    """A query's value in a table: bytes (a v2 identity or payload hash) as hex."""
    if value is None:
        return ""
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).hex()
    if isinstance(value, Decimal):
        from combined.api._json import decimal_text

        return decimal_text(value)
    return str(value)


def _when(value: datetime | None) -> str:
    return value.strftime("%Y-%m-%d %H:%M:%S") if value else "-"


def _instant_text(value: datetime) -> str:
    """An instant to the microsecond, in UTC, as ``--as-of`` reads it back."""
    return value.astimezone(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


@app.command()
def init(
    path: Annotated[
        Path, typer.Argument(help="the project file, or a directory to write combined.yaml in")
    ] = Path("combined.yaml"),
    force: Annotated[bool, typer.Option(help="overwrite an existing file")] = False,
) -> None:
    """Write a commented example project file."""
    from combined.config import write_example
    from combined.errors import CombinedError

    try:
        written = write_example(path, force=force)
    except CombinedError as exc:
        _fail(exc)
    console.print(f"wrote {written} and, for editors, its JSON Schema combined.schema.json")
    # The example's source, so the project runs as written before it is edited.
    shop = written.parent / "shop.db"
    if not shop.exists():
        from combined.demo import build_shop

        build_shop(shop)
        console.print(
            f"and {shop}, a sample SQLite shop its source `shop` reads: "
            "`combined check` and `combined capture` run as written; "
            "then point sources.shop (or a source of your own) at your data",
            highlight=False,
        )


@app.command()
def check(project: ProjectOpt = None) -> None:
    """Validate the project file, connect to every source and check each dataset there.

    The lake first: an object store is written and deleted a probe object, as a
    capture does; a local lake is asked without creating anything. Then each
    table the catalog records: missing from the lake, or at an older version
    than recorded (restored from an older copy), its captures are refused.
    Exit 2 when the lake cannot be written or a dataset cannot be read as
    declared (a relation or column the source lacks, a type it cannot take),
    else 1 when a source failed.
    """
    from combined.errors import CombinedError, ConfigError

    engine = _engine(project)
    status = 0
    try:
        engine.layout.check_writable()
        console.print(Text.assemble(("ok", "green"), f"   lake {engine.layout.store.root}"))
    except CombinedError as exc:
        status = ERROR
        console.print(Text.assemble(_red("fail"), f" lake: {exc.message}"))
        console.print(f"     hint: {exc.hint}")
    lost = None if status else engine.lost_tables()  # (a log load per table)
    if lost is not None:
        status = ERROR
        # (whole lines: a location wrapped at the terminal's width is not one to copy)
        console.print(Text.assemble(_red("fail"), f" lake tables: {lost.message}"), soft_wrap=True)
        console.print(f"     hint: {lost.hint}", soft_wrap=True, highlight=False)
    for name in engine.project.sources:

        def warn(why: str, name: str = name) -> None:
            console.print(Text.assemble(("warn", "yellow"), f" {name}: {why}"))

        try:
            engine.check(name, warn)
            console.print(Text.assemble(("ok", "green"), f"   {name}"))
        except CombinedError as exc:
            status = max(status, ERROR if isinstance(exc, ConfigError) else 1)
            console.print(Text.assemble(_red("fail"), f" {name}: {exc.message}"))
            if exc.hint:
                console.print(f"     hint: {exc.hint}")
    engine.close()
    if status:
        raise typer.Exit(status)


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
    with _session(project, _progress()) as engine:
        runs = engine.capture(selectors or [])
    for run in runs:
        console.print(Text.assemble(f"run {run.id} ", _state(run.state)))
        if run.stats:
            for ds, s in run.stats.items():
                console.print(_dataset_line(run.source, ds, s))
        if run.error:
            err.print(f"  {run.error}", highlight=False)
    disagree = [_say_disagrees(run) for run in runs]
    _say_published(runs)
    _exit_for((run.state for run in runs), disagrees=any(disagree))


def _say_disagrees(run: Run) -> bool:
    """Tell each dataset of a Run whose reconciliation disagrees with the source; any?"""
    from combined._status import disagreements

    found = disagreements(run.stats)
    for ds in found:
        s = (run.stats or {})[ds]
        gap = s.get("expected_variance")
        why = (
            f"{gap} rows the source deleted are still in the lake (a cursor cannot see deletes)"
            if gap is not None
            else "published, but the counts differ"
        )
        err.print(
            Text.assemble(
                _red("reconciliation disagrees:"),
                f" {run.source}.{ds}: the lake holds {s.get('lake_rows')} rows, the source "
                f"{s.get('source_rows')}; {why}",
            ),
            highlight=False,
        )
        err.print(
            f"  hint: `combined activity --kind alert.reconciliation_failed --dataset "
            f"{run.source}.{ds}` shows the remedy",
            highlight=False,
        )
    return bool(found)


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

    with _session(project, _progress()) as engine:
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
    with _session(project, _progress()) as engine:
        run = engine.retry(run_id)
    console.print(f"run {run.id} {run.state} (retry of {run.retry_of})")
    if run.error:
        err.print(f"  {run.error}", highlight=False)
    _exit_for([run.state])


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
    with _session(project, stopped=": the query was interrupted") as engine:
        result = engine.sql(
            query,
            as_of=when,
            publication=publication,
            timeout_s=timeout or None,
            memory_limit=memory_limit,
        )
    _print_result(result, fmt)


def _print_result(result: Any, fmt: str) -> None:
    """A query's rows as a table, strict JSON or CSV (``_output.plain`` says how values read)."""
    from combined._pyrows import python_rows
    from combined.cli._output import emit_csv, emit_json, print_table, table

    rows = python_rows(result)
    if fmt == "json":
        emit_json(rows)
    elif fmt == "csv":
        emit_csv(result.column_names, (list(row.values()) for row in rows))
    else:
        t = table(*result.column_names)
        for row in rows:
            t.add_row(*[_cell(v) for v in row.values()])
        print_table(t)


@app.command()
def repair(project: ProjectOpt = None) -> None:
    """Rebuild the catalog projection from the lake; close runs whose process died."""

    from combined.runtime._recover import NOT_PROJECTED

    with _session(project) as engine:
        notes = engine.repair()
    for n in notes:
        console.print(n)
    console.print("the catalog matches the lake" if not notes else f"{len(notes)} repair(s)")
    if any(NOT_PROJECTED in n for n in notes):
        raise typer.Exit(1)  # the catalog is still behind the lake for those datasets


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
    commits, if any, are projected from the lake. A read blocked in its
    source's statement is stopped for it (``combined._interrupts``). A second
    SIGTERM during that clean-up is ignored (SIGKILL still ends it at once).
    A SIGTERM that whoever started Combined ignores or handles stays theirs.
    """
    import signal

    from combined._interrupts import watch

    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return
    # A handler, not SIG_IGN, after the first: an ignored signal would be
    # inherited by the programs started meanwhile, which SIGTERM must still stop.
    watch(signal.SIGTERM, lambda: Terminated(TERMINATED))


def _leave_the_heap_at_exit() -> None:
    """Have the interpreter's exit leave the process's objects to the system.

    Python ends by tearing its heap down object by object (modules, classes,
    the libraries' caches and cycles): 0.15-0.35 CPU-seconds after a capture,
    ~10% of a 300,000-change CDC drain's, for memory the system takes back at
    once. ``gc.freeze()``, an exit handler, keeps the collector away from
    every object then alive; every exit handler still runs (logging's flush,
    executors' joins, finalizers). Nothing the command writes waits on the
    teardown: the catalog, the lake's writers and the source's sessions are
    closed before the command returns, as they must be for a killed process.
    """
    import atexit
    import gc

    atexit.unregister(gc.freeze)  # (once, however often main is called in a process)
    atexit.register(gc.freeze)


def main() -> None:
    """Entry point of the ``combined`` script.

    An exception Combined did not anticipate is a bug: it is told in one
    line, redacted like every error, with exit status 70. Its traceback,
    which can quote values (secrets among them), only with COMBINED_DEBUG=1.
    SIGTERM stops the command in order (:func:`_stop_on_sigterm`), exit status 143.
    """
    import os

    from combined._interrupts import watch_sigint

    _stop_on_sigterm()
    watch_sigint()
    _leave_the_heap_at_exit()
    try:
        app()
    except Terminated:
        from combined.cli._reporting import say_interrupted

        say_interrupted("SIGTERM")
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
from combined.cli import _evidence as _evidence  # noqa: E402
from combined.cli import _listing as _listing  # noqa: E402
from combined.cli import _maintain as _maintain  # noqa: E402
from combined.cli import _meta as _meta  # noqa: E402
from combined.cli import _options as _options  # noqa: E402
from combined.cli import _quarantine as _quarantine  # noqa: E402
from combined.cli import _reset as _reset  # noqa: E402
from combined.cli import _run as _run  # noqa: E402
from combined.cli import _schedule as _schedule  # noqa: E402
from combined.cli import _serve as _serve  # noqa: E402
