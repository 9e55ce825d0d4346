"""The console's pages: what a browser reads (every one needs a session)."""

from __future__ import annotations

from collections import defaultdict
from typing import TYPE_CHECKING, Annotated, Any

from fastapi import APIRouter, Query, Request, Response

from combined._pyrows import python_rows
from combined.api._console import _charts
from combined.catalog import RUN_STATES, RunState

if TYPE_CHECKING:
    from combined.api._console import Console

#: How many Runs, events and versions a page lists.
RUNS_SHOWN = 50
EVENTS_SHOWN = 100
RECORDS_SHOWN = 50


def router(console: Console) -> APIRouter:
    """The pages over ``console``'s engine."""
    r = APIRouter(include_in_schema=False)
    _dataset_pages(r, console)
    _run_pages(r, console)
    _feed_pages(r, console)
    return r


def _dataset_pages(r: APIRouter, console: Console) -> None:
    engine = console.engine

    @r.get("/")
    def datasets(request: Request) -> Response:
        console.require(request)
        rows = engine.status(slots=False)
        waiting: dict[str, list[str]] = defaultdict(list)
        for run in engine.queued():
            for name in run.datasets:
                waiting[f"{run.source}.{name}"].append(run.id)
        return console.page(request, "datasets.html", datasets=rows, waiting=waiting)

    @r.get("/console/datasets/{source}/{dataset}")
    def history(request: Request, source: str, dataset: str) -> Response:
        console.require(request)
        name = f"{source}.{dataset}"
        versions = engine.history(name)
        (current,) = [s for s in engine.status(slots=False) if s["dataset"] == name]
        chart = _charts.line_chart([(v["created_at"], v["row_count"]) for v in versions], "rows")
        runs = [run for run in engine.runs(RUNS_SHOWN) if _covers(run, source, dataset)]
        return console.page(
            request,
            "dataset.html",
            name=name,
            source=source,
            dataset=dataset,
            current=current,
            versions=list(reversed(versions)),
            chart=chart,
            runs=runs,
        )


def _run_pages(r: APIRouter, console: Console) -> None:
    engine = console.engine

    @r.get("/console/runs")
    def runs(request: Request, state: Annotated[list[RunState] | None, Query()] = None) -> Response:
        console.require(request)
        listed = engine.runs(RUNS_SHOWN, states=state)
        progress = {run.id: _progress(engine.run(run.id)) for run in listed if not run.terminal}
        return console.page(
            request,
            "runs.html",
            runs=listed,
            gone=engine.gone(),
            progress=progress,
            states=RUN_STATES,
            chosen=state or [],
        )

    @r.get("/console/runs/{run_id}")
    def run(request: Request, run_id: str) -> Response:
        console.require(request)
        shown = engine.run(run_id)
        gone = engine.gone()
        return console.page(request, "run.html", **shown, gone=gone, progress=_progress(shown))


def _feed_pages(r: APIRouter, console: Console) -> None:
    engine = console.engine

    @r.get("/console/quarantine")
    def quarantine(
        request: Request,
        all: Annotated[bool, Query()] = False,  # noqa: A002
    ) -> Response:
        console.require(request)
        entries = engine.quarantine(include_decided=all)
        return console.page(request, "quarantine.html", entries=entries, all=all)

    @r.get("/console/quarantine/{entry}")
    def quarantine_entry(request: Request, entry: str) -> Response:
        console.require(request)
        shown, table = engine.quarantine_records(entry, RECORDS_SHOWN)
        records = python_rows(table)
        columns = list(records[0]) if records else []
        return console.page(
            request, "entry.html", q=shown, columns=columns, records=records, shown=RECORDS_SHOWN
        )

    @r.get("/console/activity")
    def activity(
        request: Request,
        kind: str | None = None,
        source: str | None = None,
        dataset: str | None = None,
    ) -> Response:
        console.require(request)
        filters = {"kind": kind or None, "source": source or None, "dataset": dataset or None}
        events = engine.activity(
            EVENTS_SHOWN, kind=filters["kind"], source=filters["source"], dataset=filters["dataset"]
        )
        return console.page(request, "activity.html", events=events, filters=filters)

    @r.get("/console/usage")
    def usage(request: Request) -> Response:
        console.require(request)
        rows = engine.usage()
        months: dict[str, int] = defaultdict(int)
        for row in rows:
            months[row["month"]] += row["mar"]
        chart = _charts.bar_chart(sorted(months.items()), "monthly active rows")
        newest_first = sorted(rows, key=lambda r: (r["month"], r["source"], r["dataset"]))[::-1]
        return console.page(request, "usage.html", rows=newest_first, chart=chart, months=months)


def _covers(run: Any, source: str, dataset: str) -> bool:
    return bool(run.source == source and dataset in run.datasets)


def _progress(shown: dict[str, Any]) -> dict[str, int]:
    """What a Run did so far, from the catalog: its Deliveries and their records."""
    deliveries = shown["deliveries"]
    return {
        "deliveries": len(deliveries),
        "committed": sum(1 for d in deliveries if d.state == "committed"),
        "records": sum(d.record_count or 0 for d in deliveries),
        "attempts": len(shown["attempts"]),
    }
