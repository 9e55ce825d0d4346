"""The sections of a ``combined plan`` document, each from the gathered evidence."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import datetime, timedelta
from statistics import median
from typing import TYPE_CHECKING, Any

from combined.config import format_duration
from combined.evidence._plan import Section, _Evidence

if TYPE_CHECKING:
    from combined.config import DatasetConfig


def _setting(ev: _Evidence, name: str, key: str = "") -> str:
    path = f"sources.{ev.source}.datasets.{name}" + (f".{key}" if key else "")
    return f"combined.yaml: {path}"


def _discovery(ev: _Evidence) -> str:
    when = f"{ev.discovered_at:%Y-%m-%d %H:%M:%S} UTC" if ev.discovered_at else "never"
    stale = "" if ev.live is not None else " (stored; the source was not reachable)"
    return f"discovery of {ev.source} at {when}{stale}"


def _events(ev: _Evidence, kind: str, name: str, limit: int = 20) -> list[Any]:
    from combined.catalog import _data as cat

    with ev.engine.catalog.begin() as conn:
        return cat.activity(
            conn, kind=kind, source=ev.source, dataset=name, limit=limit, exact=True
        )


# -- extraction ---------------------------------------------------------------------------


def _cursor_claims(ev: _Evidence, section: Section, name: str, d: DatasetConfig) -> None:
    assert d.cursor is not None
    column = d.cursor.column
    section.add(
        f"{name}: watermark column {column}; trust basis as declared: {d.cursor.trust!r}",
        "declared",
        _setting(ev, name, "cursor.trust"),
    )
    found = ev.discovered.get(name)
    if found is None:
        ev.unreachable(section, f"what maintains {column}", name)
        return
    candidate = next((c for c in found.get("cursor_candidates", []) if c["column"] == column), None)
    if candidate is None:
        section.add(
            f"{name}: nothing in the source's catalog shows that {column} grows with every "
            "write (no sequence, identity, clock default or trigger)",
            "unproven",
            _discovery(ev),
            f"a sequence or clock default that sets {column} on insert and a trigger that sets "
            "it on update, or `strategy: cdc`",
        )
        return
    section.add(f"{name}: {column}: {candidate['evidence']}", "fact", _discovery(ev))
    on_update = candidate.get("maintained_on_update")
    if on_update is False:
        section.add(
            f"{name}: no trigger or ON UPDATE rule maintains {column}: an UPDATE that does not "
            "set it moves no watermark, and that change is never captured",
            "unproven",
            _discovery(ev),
            f"a BEFORE UPDATE trigger that assigns {column} (discovery then shows it), "
            "or `strategy: cdc`",
        )
    elif on_update is None:
        section.add(
            f"{name}: whether an UPDATE moves {column}: the connector cannot tell",
            "unproven",
            _discovery(ev),
            "the source's own documentation of how it maintains the column",
        )


def _lookback_text(value: Any) -> str:
    return format_duration(value) if isinstance(value, timedelta) else str(value)


def _lookback(ev: _Evidence, section: Section, name: str, d: DatasetConfig) -> None:
    assert d.cursor is not None
    key = ", ".join(d.key or []) or "none"
    if d.cursor.lookback:
        section.add(
            f"{name}: each read starts {_lookback_text(d.cursor.lookback)} before the "
            "watermark; the key "
            f"({key}) makes the re-read overlap harmless: a row read twice merges into one",
            "fact",
            _setting(ev, name, "cursor.lookback"),
        )
    else:
        section.add(
            f"{name}: no lookback: a row that commits after a larger cursor value was "
            "read is missed",
            "unproven",
            _setting(ev, name, "cursor.lookback"),
            "declare a lookback longer than the source's longest write transaction",
        )


BOUNDARIES = {
    "snapshot": "the whole relation, read in one consistent snapshot of the source",
    "cursor": "from the watermark to an explicit upper bound read in the same snapshot "
    "as the rows, so a row written during the read waits for the next Run",
    "cdc": "the change stream up to the source position current when the read began, "
    "after a first snapshot stitched at the slot's (or binlog's) anchor",
}


def _durations(ev: _Evidence, name: str) -> list[float]:
    from combined.catalog import _runs as runs_repo

    with ev.engine.catalog.begin() as conn:
        runs = runs_repo.list_runs(conn, limit=50, states=["succeeded"])
    return [
        (r.ended_at - r.started_at).total_seconds()
        for r in runs
        if r.source == ev.source and name in (r.datasets or []) and r.ended_at and r.started_at
    ]


def _period(schedule: Any) -> timedelta | None:
    """The longest gap between the schedule's next ticks (its interval, for an interval)."""
    if schedule.interval is not None:
        return schedule.interval  # type: ignore[no-any-return]
    from croniter import croniter

    from combined.protocol import utcnow

    ticks = croniter(schedule.cron, utcnow())
    times = [ticks.get_next(datetime) for _ in range(25)]
    return max(b - a for a, b in zip(times, times[1:], strict=False))


def _freshness(ev: _Evidence, section: Section, name: str, d: DatasetConfig) -> None:
    schedule = d.schedule or ev.engine.project.source(ev.source).schedule
    target = d.freshness
    durations = _durations(ev, name)
    took = median(durations) if durations else None
    if schedule is None:
        section.add(
            f"{name}: no schedule: how fresh it stays depends on who runs captures"
            + (f" (target {format_duration(target)})" if target else ""),
            "unproven",
            _setting(ev, name, "schedule"),
            "declare `schedule:` (docs/schedules.md)",
        )
        return
    every = _period(schedule)
    basis = f"{_setting(ev, name, 'schedule')}; median of {len(durations)} succeeded Runs"
    if every is None or took is None:
        section.add(
            f"{name}: scheduled ({schedule}); the freshness it delivers is not measured yet",
            "unproven",
            basis,
            "a few scheduled Runs: their durations measure it",
        )
        return
    worst = every.total_seconds() + took
    text = (
        f"{name}: at worst about {worst:.0f} s behind (every {format_duration(every)}, "
        f"Runs take {took:.0f} s)"
    )
    if target is None:
        section.add(text + "; no freshness target is declared", "fact", basis)
    elif worst <= target.total_seconds():
        section.add(text + f", within the target {format_duration(target)}", "fact", basis)
    else:
        section.add(
            text + f", beyond the target {format_duration(target)}",
            "refuted",
            basis,
            "schedule it more often, or relax `freshness:`",
        )


def extraction(ev: _Evidence) -> Section:
    """Extraction pattern per dataset: watermark, trust, lookback, boundary, freshness."""
    section = Section("Extraction pattern")
    for name, d in ev.datasets.items():
        section.add(
            f"{name}: {d.strategy} capture of {d.relation}, sync mode {d.sync_mode}",
            "fact",
            _setting(ev, name),
        )
        if d.cursor is not None:
            _cursor_claims(ev, section, name, d)
            _lookback(ev, section, name, d)
        section.add(
            f"{name}: run boundary: {BOUNDARIES[d.strategy]}", "fact", "docs/architecture.md"
        )
        _freshness(ev, section, name, d)
    return section


# -- change feed --------------------------------------------------------------------------


def _retention_claim(ev: _Evidence, section: Section) -> None:
    r = ev.retention
    if r is None:
        ev.unreachable(section, "how long the source keeps its change feed")
        return
    basis = f"query `{r['query']}` at {ev.discovered_at:%Y-%m-%d %H:%M:%S} UTC"
    if r["kind"] == "binlog":
        seconds = r.get("retention_seconds")
        text = (
            "the server keeps binlog files for ever: a stopped consumer loses nothing, "
            "while the binlog grows"
            if seconds is None
            else f"the server purges a closed binlog file after {seconds / 3600:.1f} h: a "
            "consumer stopped longer than that needs a new snapshot"
        )
        section.add(text, "fact", basis)
        return
    rate = r.get("wal_bytes_per_second")
    per_hour = f"{rate * 3600 / 2**20:.1f} MiB of WAL an hour" if rate else "an unmeasured WAL rate"
    keep = str(r["max_slot_wal_keep_size"])
    if keep in ("-1", "-1MB"):
        text = (
            "max_slot_wal_keep_size = -1: the server keeps WAL for a stopped slot without "
            f"limit; at {per_hour} (average since {r['rate_since']}) a stopped consumer "
            "retains that much disk per hour down until the server's disk fills"
        )
        section.add(text, "fact", basis)
        return
    section.add(
        f"max_slot_wal_keep_size = {keep}: at {per_hour} (average since {r['rate_since']}) "
        "a stopped consumer may stay down until that much WAL accumulates; after that the "
        "slot is lost and the dataset needs a new snapshot",
        "fact",
        basis,
    )


def _anchor(ev: _Evidence, name: str) -> Mapping[str, Any] | None:
    """The first lake commit of a dataset: where its stream was stitched to its snapshot."""
    commits = ev.engine.layout.dataset_table(ev.source, name).commits()
    return commits[-1] if commits else None


def change_feed(ev: _Evidence) -> Section:
    """Slot, publication, retention, stitching anchor, ordering (CDC datasets)."""
    section = Section("Change feed")
    cdc = [n for n, d in ev.datasets.items() if d.strategy == "cdc"]
    if not cdc:
        section.add(
            "no dataset of this source is captured by change data capture", "fact", "combined.yaml"
        )
        return section
    for name in cdc:
        slot = ev.slots.get(name)
        if slot is None:
            ev.unreachable(section, "the state of its replication slot or binlog stream", name)
        else:
            shown = ", ".join(f"{k} {v}" for k, v in slot.items() if v is not None)
            section.add(f"{name}: {shown}", "fact", f"`combined cdc status {ev.source}`")
        first = _anchor(ev, name)
        if first is None:
            section.add(
                f"{name}: not captured yet: no stitching anchor",
                "unproven",
                "the lake",
                "a first capture",
            )
        else:
            section.add(
                f"{name}: the first capture was stitched at {first.get('checkpoint')} (Run "
                f"{first['run_id']}, receipt {first.get('extraction_receipt')})",
                "fact",
                f"lake commit {first['lake_version']} of {ev.source}.{name}",
            )
    _retention_claim(ev, section)
    section.add(
        "changes apply in the source's commit order (LSN or binlog position); several "
        "changes of one key in a capture resolve to the last, and the slot or position is "
        "confirmed only after the lake commit that covers it",
        "fact",
        "docs/cdc.md",
    )
    return section


# -- deletes and idempotency --------------------------------------------------------------

DELETES = {
    "cdc": "change-stream tombstones: each DELETE (and TRUNCATE) arrives as a delete",
    "snapshot": "absence from the whole snapshot: a key the source no longer holds is deleted",
}


def deletes(ev: _Evidence) -> Section:
    """How each dataset learns of deletes, stated."""
    section = Section("Deletes")
    for name, d in ev.datasets.items():
        if d.sync_mode == "append":
            text = (
                "an event stream: rows are kept as delivered; a delete is an event only "
                "where the source emits one"
            )
        elif d.sync_mode == "full_refresh":
            text = (
                "each capture replaces the projection: a row the source deleted is gone "
                "after the next capture"
            )
        elif d.strategy == "cursor":
            text = (
                "this source hard-deletes and a cursor cannot see it: deletes will not arrive; "
                "reconciliation reports the drift"
            )
        else:
            text = DELETES[d.strategy]
        if d.deletes is not None:
            _soft_deletes(ev, section, name, d)
            if d.strategy == "cursor":
                text = "a row the source hard-deletes is not seen by the cursor, only flagged ones"
        section.add(f"{name}: {text}", "fact", _setting(ev, name, "strategy"))
    return section


def _soft_deletes(ev: _Evidence, section: Section, name: str, d: DatasetConfig) -> None:
    """The declared soft-delete flag: a flagged row is a delete of its key."""
    from combined.capture._soft import describe, spec_of

    section.add(
        f"{name}: {describe(spec_of(d.deletes))}: a row carrying it leaves the "
        "projection as a delete of its key (billed as one); the raw layer keeps it as read; "
        "a later row of the key without it inserts the key again",
        "declared",
        _setting(ev, name, "deletes"),
    )


def _uniqueness(ev: _Evidence, section: Section, name: str, key: list[str]) -> None:
    found = ev.discovered.get(name) or {}
    if list(found.get("primary_key") or []) == key:
        section.add(
            f"{name}: the key ({', '.join(key)}) is the source's primary key",
            "fact",
            _discovery(ev),
        )
        return
    if key in [list(u) for u in found.get("unique_keys") or []]:
        section.add(
            f"{name}: a unique constraint of the source enforces the key", "fact", _discovery(ev)
        )
        return
    measured = ev.keys.get(name)
    if measured is None or isinstance(measured, str):
        why = measured or (
            "the source could not be reached"
            if ev.live is None
            else "the connector cannot count keys"
        )
        section.add(
            f"{name}: the key ({', '.join(key)}) is unique",
            "unproven",
            why,
            "a primary key or unique constraint on it, or a source that can count it",
        )
        return
    counted = (
        f"{measured.rows} rows, {measured.distinct} distinct keys, "
        f"{measured.null_keys} with a null part"
    )
    basis = f"query `{measured.query}` at {measured.measured_at:%Y-%m-%d %H:%M:%S} UTC"
    if measured.unique:
        section.add(
            f"{name}: the key is unique today ({counted}), though the source does not enforce it",
            "fact",
            basis,
        )
    else:
        section.add(
            f"{name}: the key ({', '.join(key)}) is NOT unique: {counted}. Rows sharing a key go "
            "to quarantine and their Run needs review",
            "refuted",
            basis,
            "declare a key the source enforces (its primary key or a unique constraint)",
        )


def idempotency(ev: _Evidence) -> Section:
    """The merge key and its evidence, the version rule, a partial run re-run."""
    section = Section("Idempotency")
    for name, d in ev.datasets.items():
        key = list(d.key or [])
        if not key and d.sync_mode != "append":
            section.add(
                f"{name}: no key (key: []): each row is identified by its whole content and its "
                "number among equal rows; a changed row is a delete and an insert",
                "fact",
                _setting(ev, name, "key"),
            )
        elif not key:
            section.add(
                f"{name}: no key: rows are events, never merged", "fact", _setting(ev, name, "key")
            )
        else:
            section.add(f"{name}: merge key ({', '.join(key)})", "fact", _setting(ev, name, "key"))
            _uniqueness(ev, section, name, key)
        table = ev.engine.layout.dataset_table(ev.source, name)
        section.add(
            f"{name}: a Run commits once per dataset under Delta transaction "
            f"combined:{ev.source}/{name} (committed sequence now "
            f"{table.committed_sequence()}): a re-run after a partial run skips what was "
            "committed, reads from the committed checkpoint, and bills nothing twice",
            "fact",
            "the lake table's transaction version; docs/architecture.md section 4",
        )
    section.add(
        "several versions of one key in a capture: a snapshot holds one (more go to "
        "quarantine); a change stream keeps the last in source order",
        "fact",
        "docs/architecture.md section 5",
    )
    return section


# -- landing, drift, quarantine ---------------------------------------------------------------


def landing(ev: _Evidence) -> Section:
    """Raw Deliveries, their metadata columns, immutability, replay."""
    from combined.catalog import _data as cat
    from combined.protocol._provenance import PROVENANCE_COLUMNS

    section = Section("Landing layout")
    layout = ev.engine.layout
    for name in ev.datasets:
        with ev.engine.catalog.begin() as conn:
            held = cat.deliveries(conn, source=ev.source, dataset=name, states=["committed"])
        section.add(
            f"{name}: {len(held)} committed Deliveries in the raw layer at "
            f"{layout.deliveries(ev.source, name)}, the projection at "
            f"{layout.table(ev.source, name)}",
            "fact",
            "the catalog's Deliveries; the lake layout",
        )
    section.add(
        "every row carries " + ", ".join(PROVENANCE_COLUMNS),
        "fact",
        "docs/architecture.md section 4",
    )
    section.add(
        "a Delivery is immutable once committed: its content hash and record count are "
        "checked before the commit, and nothing deletes it except a declared, recorded decision",
        "fact",
        "docs/architecture.md section 3",
    )
    section.add(
        f"replay: `combined replay {ev.source}.DATASET` rebuilds a projection from the raw "
        "layer alone and compares it row by row",
        "fact",
        "docs/explain.md",
    )
    return section


def drift(ev: _Evidence) -> Section:
    """The outcome of each drift class per dataset, and where it is checked."""
    section = Section("Schema drift")
    for name, d in ev.datasets.items():
        outcomes = ", ".join(f"{k.replace('_', ' ')}: {v}" for k, v in d.drift.model_dump().items())
        seen = len(_events(ev, "drift", name))
        section.add(
            f"{name}: {outcomes}; {seen} drift event(s) recorded",
            "fact",
            f"{_setting(ev, name, 'drift')}; the Activity feed",
        )
    section.add(
        "drift is checked while staging, before any Delivery is written: a `fail` commits nothing",
        "fact",
        "runtime/_schema_check.py",
    )
    return section


def quarantine(ev: _Evidence) -> Section:
    """Who reads the quarantine, how often, and what awaits review."""
    from combined.quality import quarantine as q

    section = Section("Quarantine")
    waiting = q.entries(ev.engine.catalog, source=ev.source)
    for name, d in ev.datasets.items():
        mine = [e for e in waiting if e["dataset"] == name]
        overdue = sum(1 for e in mine if e["overdue"])
        section.add(
            f"{name}: read by {d.quarantine.reader} every "
            f"{format_duration(d.quarantine.review_every)}; "
            f"{len(mine)} entries await review ({overdue} overdue)",
            "fact",
            f"{_setting(ev, name, 'quarantine')}; `combined quarantine list {ev.source}`",
        )
    return section


# -- backfill and reconciliation --------------------------------------------------------------


def backfill(ev: _Evidence) -> Section:
    """Past backfills' bounds and control totals; what a backfill can reach."""
    section = Section("Backfill")
    for name in ev.datasets:
        controls = _events(ev, "reconciliation.control", name, limit=5)
        for e in controls:
            b = e.body
            section.add(
                f"{name}: Run {e.run_id} at {e.at:%Y-%m-%d %H:%M:%S}: source {b.get('control')}, "
                f"landed {b.get('landed')}: {'equal' if b.get('ok') else 'DIFFERENT'}",
                "fact" if b.get("ok") else "refuted",
                "the Activity feed (reconciliation.control)",
            )
        if not controls:
            section.add(
                f"{name}: no backfill or control total recorded", "fact", "the Activity feed"
            )
    section.add(
        "a backfill reads the rows the source holds now, in ranges read in parallel under one "
        "exported snapshot (`--partitions`, PostgreSQL); rows it no longer holds cannot come back",
        "fact",
        "docs/postgres.md",
    )
    return section


def reconciliation(ev: _Evidence) -> Section:
    """The latest landed-count and control-total results, or "not reconciled"."""
    section = Section("Reconciliation")
    for name in ev.datasets:
        latest = _events(ev, "reconciliation", name, limit=1)
        if not latest:
            section.add(
                f"{name}: not reconciled", "unproven", "the Activity feed", "a capture of it"
            )
            continue
        e = latest[0]
        b = e.body
        counted = (
            f"source {b['source_rows']} rows counted in the read's own snapshot"
            if b.get("source_rows") is not None
            else "the source was not counted (a delta read counts only its range)"
        )
        ok = b.get("lake_status") == "reconciled" and b.get("source_status") in (
            "reconciled",
            "expected_variance",
        )
        section.add(
            f"{name}: Run {e.run_id} at {e.at:%Y-%m-%d %H:%M:%S}: lake {b.get('lake_rows')} rows "
            f"({b.get('lake_status')}), {counted} ({b.get('source_status')})",
            "fact"
            if ok
            else ("unproven" if b.get("source_status") == "not_reconciled" else "refuted"),
            "the Activity feed (reconciliation)",
            None if ok else "a whole capture, or `strategy: cdc` for a cursor that misses deletes",
        )
    return section


SECTIONS: tuple[Callable[[_Evidence], Section], ...] = (
    extraction,
    change_feed,
    deletes,
    idempotency,
    landing,
    drift,
    quarantine,
    backfill,
    reconciliation,
)
