"""The commands that list what Combined holds: runs, one run, status, publications, history, usage.

Each takes ``--format table|json|csv`` (:mod:`combined.cli._output`); a
table shows every id whole.
"""

from __future__ import annotations

import re
from typing import Annotated, Any

import typer
from rich.text import Text

from combined.cli import (
    ProjectOpt,
    _fail,
    _instant_text,
    _red,
    _session,
    _when,
    app,
    console,
    err,
    run_app,
)
from combined.cli._output import (
    FormatOpt,
    JsonFormatOpt,
    check_format,
    emit_csv,
    emit_json,
    emit_records,
    print_table,
    table,
)

_RUN_FIELDS = ("id", "source", "trigger", "state", "created_at", "started_at", "ended_at")


_RUN_HEADER = (*_RUN_FIELDS, "datasets", "error", "retry_of", "publication_id")


def _run_record(r: Any, gone: dict[str, Any] | None = None) -> dict[str, Any]:
    gone = gone or {}
    record: dict[str, Any] = {k: getattr(r, k) for k in _RUN_FIELDS}
    record.update(
        datasets=list(r.datasets),
        error=r.error,
        retry_of=r.retry_of,
        publication_id=r.publication_id,
        canceled_by=r.canceled_by,
        cancel_reason=r.cancel_reason,
        cancel_requested_at=r.cancel_requested_at,
        not_before=r.not_before,
        worker_gone=({"last_heard_at": gone[r.id]} if r.id in gone else None),
    )
    return record


def _state_text(r: Any, gone: dict[str, Any]) -> str:
    """A Run's state; for one whose process is gone, that it is and what ends it."""
    if r.id not in gone:
        return str(r.state)
    return (
        f"{r.state} (worker gone, last heard from {_when(gone[r.id])}; "
        "`combined repair` or the next worker ends it)"
    )


@app.command()
def runs(
    limit: Annotated[int, typer.Option(help="how many")] = 20,
    fmt: FormatOpt = "table",
    project: ProjectOpt = None,
) -> None:
    """List the newest runs."""
    check_format(fmt)
    with _session(project) as engine:
        rows = engine.runs(limit)
        gone = engine.gone()
    if emit_records(fmt, [_run_record(r, gone) for r in rows], header=_RUN_HEADER):
        return
    t = table("run", "source", "trigger", "state", "created", "datasets", "error")
    cut = None
    for r in rows:
        error = _error_start(r.error)
        if r.error and error != r.error.rstrip("\n"):
            cut = cut or r.id
        state = _state_text(r, gone)
        t.add_row(
            r.id, r.source, r.trigger, state, _when(r.created_at), ",".join(r.datasets), error
        )
    print_table(t)
    if cut is not None:
        console.print(
            f"(errors ending in … are cut short: `combined run show {cut}` shows one whole)",
            highlight=False,
        )


#: Characters of a run's error the runs table shows.
ERROR_WIDTH = 60


def _error_start(error: str | None) -> str:
    """The start of ``error`` for a table cell: its first line, ending in … where cut."""
    if not error:
        return ""
    first = error.splitlines()[0]
    if len(first) <= ERROR_WIDTH and first == error.rstrip("\n"):
        return first
    return first[: ERROR_WIDTH - 1].rstrip() + "…"


@run_app.command("show")
def run_show(
    run_id: str,
    fmt: JsonFormatOpt = "table",
    project: ProjectOpt = None,
) -> None:
    """Show one run: admission, attempts, deliveries, and its events, oldest first."""
    check_format(fmt, ("table", "json"))
    with _session(project) as engine:
        info = engine.run(run_id)
        info["gone"] = {} if info["run"].terminal else engine.gone()
    r, adm = info["run"], info["admission"]
    if fmt == "json":
        emit_json(
            {
                "run": {**_run_record(r, info["gone"]), "stats": r.stats},
                "admission": {k: getattr(adm, k) for k in _ADMISSION_FIELDS},
                "attempts": info["attempts"],
                "deliveries": info["deliveries"],
                "activity": info["activity"],
            }
        )
        return
    _print_run(r, adm, info)


_ADMISSION_FIELDS = ("id", "connector", "revision", "config_digest", "billing_policy", "venue")


def _print_run(r: Any, adm: Any, info: dict[str, Any]) -> None:
    console.print(
        f"run {r.id}  {_state_text(r, info['gone'])}  trigger={r.trigger}  source={r.source}",
        highlight=False,
    )
    console.print(
        f"  created {_when(r.created_at)}  started {_when(r.started_at)}  ended {_when(r.ended_at)}"
    )
    if r.retry_of:
        console.print(f"  retry of {r.retry_of}")
    console.print(
        f"  admission {adm.id}: {adm.connector}@{adm.revision} "
        f"config {adm.config_digest} billing={adm.billing_policy} venue={adm.venue}"
    )
    if r.canceled_by:
        why = f": {r.cancel_reason}" if r.cancel_reason else ""
        console.print(f"  cancel asked by {r.canceled_by} {_when(r.cancel_requested_at)}{why}")
    if r.not_before:
        console.print(f"  waits until {_when(r.not_before)} (the source's Retry-After)")
    if r.error:
        console.print(f"  error: {r.error}")
    for a in info["attempts"]:
        console.print(
            f"  attempt {a.number} on {a.worker}: {a.outcome or 'running'}"
            + (f" ({a.error})" if a.error else "")
        )
    t = table("delivery", "dataset", "seq", "records", "bytes", "state", "lake version")
    for d in info["deliveries"]:
        t.add_row(
            d.id,
            d.dataset,
            str(d.sequence),
            str(d.record_count),
            str(d.byte_count),
            d.state,
            str(d.lake_version),
        )
    print_table(t)
    from combined.cli._activity import events_table

    print_table(events_table([dict(e._mapping) for e in info["activity"]], runs=False))


_STATUS_FIELDS = (
    "dataset",
    "strategy",
    "sync_mode",
    "version",
    "lake_version",
    "position",
    "position_at",
    "published_at",
    "fresh",
)
#: The status CSV's columns of the dataset's newest ended Run.
_LAST_RUN_FIELDS = ("id", "state", "ended_at")


def _slot_lag(slot: dict[str, Any]) -> str | Text:
    if "error" in slot:
        return _red(slot["error"])
    if slot and not slot.get("exists"):
        return _red("no slot")
    if slot:
        secs = slot.get("lag_seconds")
        return f"{slot.get('lag_bytes')} B" + (f", {secs:.1f} s" if secs is not None else "")
    return "-"


@app.command()
def status(fmt: FormatOpt = "table", project: ProjectOpt = None) -> None:
    """Freshness and last source position per dataset.

    ``read at`` is when the source was at the published position, which
    freshness is measured from (not the publication's time).
    """
    check_format(fmt)
    from combined.runtime._lake_wait import last_word

    with _session(project) as engine:
        _say_unreachable(last_word(engine.catalog))
        rows = engine.status()
        waiting = engine.quarantine()
    if fmt == "json":
        emit_json(rows)
        return
    if fmt == "csv":
        emit_csv(
            [
                *_STATUS_FIELDS,
                "unpublished_lake_version",
                *(f"last_run_{k}" for k in _LAST_RUN_FIELDS),
            ],
            (
                [s.get(k) for k in _STATUS_FIELDS]
                + [(s["unpublished"] or {}).get("lake_version")]
                + [(s["last_run"] or {}).get(k) for k in _LAST_RUN_FIELDS]
                for s in rows
            ),
        )
        return
    _status_table(rows)
    _say_waiting(waiting)


def _status_table(rows: list[dict[str, Any]]) -> None:
    t = table(
        "dataset",
        "strategy",
        "mode",
        "version",
        "lake v",
        "position",
        "read at",
        "fresh",
        "slot lag",
        "last run",
    )
    for s in rows:
        fresh: str | Text = "-" if s["fresh"] is None else ("yes" if s["fresh"] else _red("stale"))
        lake_v: str | Text = str(s["lake_version"] if s["lake_version"] is not None else "-")
        if s["unpublished"]:
            lake_v = _red(f"{lake_v} ({s['unpublished']['lake_version']} unpublished)")
        t.add_row(
            s["dataset"],
            s["strategy"],
            s["sync_mode"],
            s["version"] or "-",
            lake_v,
            s["position"] or "-",
            _when(s["position_at"]),
            fresh,
            _slot_lag(s.get("slot") or {}),
            _last_run(s["last_run"]),
        )
    print_table(t)
    _say_unsettled(rows)
    for s in rows:
        if s.get("table_missing"):
            console.print(
                _red(
                    f"{s['dataset']}: its table at {s['table_missing']} is missing from the "
                    "lake, though the catalog records it: its captures are refused until the "
                    f"lake is restored, or `combined reset {s['dataset']}` records a reset"
                ),
                highlight=False,
            )
        if s["unpublished"]:
            console.print(
                Text(
                    f"{s['dataset']}: lake version {s['unpublished']['lake_version']} is "
                    "committed, not published (queries read the published one); the next "
                    f"capture of {s['dataset']} publishes it"
                ),
                highlight=False,
            )


def _last_run(last: dict[str, Any] | None) -> str | Text:
    """The state of a dataset's newest ended Run, red when it needs someone."""
    if last is None:
        return "-"
    return _red(last["state"]) if last["state"] != "succeeded" else last["state"]


def _say_unsettled(rows: list[dict[str, Any]]) -> None:
    """One line per Run that ended a dataset's last capture badly: what to run next."""
    told: dict[tuple[str, str], list[str]] = {}
    for s in rows:
        last = s["last_run"]
        if last is not None and last["state"] != "succeeded":
            told.setdefault((last["id"], last["state"]), []).append(s["dataset"])
    for (run_id, state), names in told.items():
        console.print(
            _red(
                f"{', '.join(names)}: last run {run_id} ended {state} "
                f"(`combined run show {run_id}` tells why)"
            ),
            highlight=False,
            soft_wrap=True,
        )


def _say_unreachable(word: dict[str, Any] | None) -> None:
    """Tell (on stderr, before the rows the lake may slow) a lake's store a worker waits for."""
    if word is not None:
        err.print(
            _red(
                f"the lake's store has not answered since {_when(word['at'])} (worker "
                f"{word.get('worker')} waits for it, unless it ended): {word.get('error')}"
            ),
            highlight=False,
        )
        err.print(f"  hint: {word.get('hint')}", highlight=False)


def _say_waiting(waiting: list[dict[str, Any]]) -> None:
    if waiting:
        overdue = sum(1 for q in waiting if q["overdue"])
        line = f"{len(waiting)} quarantine entr{'y' if len(waiting) == 1 else 'ies'} await review"
        console.print(
            _red(f"{line} ({overdue} overdue): combined quarantine list")
            if overdue
            else f"{line}: combined quarantine list"
        )


@app.command()
def publications(
    dataset: Annotated[
        str | None, typer.Argument(help="SOURCE.DATASET: only the publications holding it")
    ] = None,
    limit: Annotated[int, typer.Option(help="how many")] = 20,
    fmt: FormatOpt = "table",
    as_json: Annotated[bool, typer.Option("--json", help="the same as --format json")] = False,
    project: ProjectOpt = None,
) -> None:
    """List publications and their members, newest first.

    Its JSON maps each publication to each dataset's Delta version and
    table URI, for readers outside Combined (docs/readers.md): a table's
    Delta head may be ahead of the newest publication.
    """
    fmt = check_format("json" if as_json else fmt)
    with _session(project) as engine:
        rows = {p["id"]: p for p in engine.publications(limit)}
        mapping = engine.publication_map(limit, dataset)
    shown = [rows[m["publication"]] for m in mapping if m["publication"] in rows]
    if fmt == "json":
        emit_json([_publication_record(rows[m["publication"]], m, dataset) for m in mapping])
        return
    members = [_members_text(p, dataset) for p in shown]
    if fmt == "csv":
        emit_csv(
            ["id", "published_at", "run_id", "members"],
            (
                [p["id"], p["published_at"], p["run_id"], m]
                for p, m in zip(shown, members, strict=True)
            ),
        )
        return
    t = table("publication", "published", "run", "members")
    for p, m in zip(shown, members, strict=True):
        # The exact instant, as --as-of takes it: a publication made within
        # the second a shorter form shows would lie after that form's instant.
        t.add_row(p["id"], _instant_text(p["published_at"]), p["run_id"] or "-", m)
    print_table(t)


def _in(member: dict[str, Any], dataset: str | None) -> bool:
    return dataset is None or f"{member['source']}.{member['dataset']}" == dataset


def _members_text(p: dict[str, Any], dataset: str | None) -> str:
    return ", ".join(
        f"{m['source']}.{m['dataset']}@{m['lake_version']}" + ("*" if m["changed"] else "")
        for m in p["member_rows"]
        if _in(m, dataset)
    )


def _publication_record(
    p: dict[str, Any], mapped: dict[str, Any], dataset: str | None
) -> dict[str, Any]:
    """A publication, its members and (``datasets``) each dataset's Delta version and URI."""
    record = {k: v for k, v in p.items() if k != "member_rows"}
    members = [m for m in p["member_rows"] if _in(m, dataset)]
    return record | {"members": members} | mapped


_HISTORY_FIELDS = (
    "id",
    "parent_id",
    "inserts",
    "updates",
    "deletes",
    "row_count",
    "run_id",
    "lake_version",
    "created_at",
    "publications",
)


@app.command()
def history(
    dataset: Annotated[str, typer.Argument(help="SOURCE.DATASET")],
    fmt: FormatOpt = "table",
    project: ProjectOpt = None,
) -> None:
    """List a dataset's versions."""
    from combined.errors import ConfigError

    check_format(fmt)
    source, _, name = dataset.partition(".")
    if not source or not name:
        _fail(
            ConfigError(f"history takes SOURCE.DATASET, not {dataset!r}", hint="e.g. shop.orders")
        )
    with _session(project) as engine:
        rows = engine.history(dataset)
    records = [{k: v.get(k) for k in _HISTORY_FIELDS} for v in rows]
    if emit_records(fmt, records, header=_HISTORY_FIELDS):
        return
    t = table("version", "parent", "+ins", "~upd", "-del", "rows", "run", "lake v", "publications")
    for v in rows:
        t.add_row(
            v["id"],
            v["parent_id"] or "-",
            str(v["inserts"]),
            str(v["updates"]),
            str(v["deletes"]),
            str(v["row_count"]),
            v["run_id"],
            str(v["lake_version"]),
            ", ".join(v["publications"]),
        )
    print_table(t)


_USAGE_FIELDS = ("month", "source", "dataset", "mar", "inserts", "updates", "deletes")


@app.command()
def usage(
    month: Annotated[str | None, typer.Option(help="YYYY-MM")] = None,
    fmt: FormatOpt = "table",
    project: ProjectOpt = None,
) -> None:
    """Monthly active rows per source and dataset."""
    from combined.errors import ConfigError

    check_format(fmt)
    if month is not None and not re.fullmatch(r"\d{4}-(0[1-9]|1[0-2])", month):
        _fail(ConfigError(f"--month {month!r} is not a month", hint="use YYYY-MM, e.g. 2026-11"))
    with _session(project) as engine:
        rows = engine.usage(month)
    records = [{k: u[k] for k in _USAGE_FIELDS} for u in rows]
    if emit_records(fmt, records, header=_USAGE_FIELDS):
        return
    t = table("month", "source", "dataset", "MAR", "inserts", "updates", "deletes")
    for u in records:
        t.add_row(*(str(v) for v in u.values()))
    print_table(t)


@app.command()
def discover(
    source: Annotated[str, typer.Argument(help="the source to discover")],
    fmt: JsonFormatOpt = "table",
    project: ProjectOpt = None,
) -> None:
    """Report the datasets, fields, keys and cursor candidates of a source."""
    from dataclasses import asdict

    check_format(fmt, ("table", "json"))
    with _session(project) as engine:
        found = engine.discover(source)
    if fmt == "json":
        emit_json(asdict(found))
        return
    for d in found.datasets:
        rows = "" if d.estimated_rows is None else f", ~{d.estimated_rows} rows"
        t = table("field", "type", "source type", "key", title=f"{d.name} ({d.kind}{rows})")
        for f in d.fields:
            t.add_row(f.name, f.arrow_type, f.source_type, "pk" if f.name in d.primary_key else "")
        print_table(t)
        console.print(
            f"  strategies: {', '.join(d.strategies)}; sync modes: {', '.join(d.sync_modes)}",
            markup=False,
        )
        for note in d.notes:
            console.print(f"  note: {note}", markup=False)
        if not (d.primary_key or d.unique_keys or d.key_candidates):
            console.print(
                "  no key: `key: []` mirrors it, each row identified by its content "
                "(docs/identity.md, section 9)",
                markup=False,
            )
        for k in d.key_candidates:
            console.print(f"  key candidate {', '.join(k.columns)}: {k.evidence}", markup=False)
        for c in d.cursor_candidates:
            console.print(f"  cursor candidate {c.column}: {c.evidence}")
