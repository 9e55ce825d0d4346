"""``combined plan``: each source's ingestion design, built from evidence.

Every claim names where it comes from: a query against the source (with the
query and when it ran), the project's configuration (the key it sets), a Run
or Activity event of the catalog, or the lake's commit metadata. A claim
Combined cannot support is **unproven**, with what would prove it; one the
evidence contradicts is **refuted**. Declarations (a cursor's trust basis)
are shown as what the project declares, never as measured facts.

The source is asked three things: a fresh discovery (keys, cursor evidence),
a count of each declared key's distinct values, and how long its change feed
is kept. When it cannot be reached, the document says so first and names
every claim that depends on it; the rest still comes from the catalog and
the lake.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime
from functools import partial
from typing import TYPE_CHECKING, Any, Literal

from combined._credentials import redact
from combined.errors import CombinedError
from combined.protocol import utcnow

if TYPE_CHECKING:
    from combined.config import DatasetConfig
    from combined.connectors.abc import KeyMeasure, Source
    from combined.engine import Engine

Status = Literal["fact", "declared", "unproven", "refuted"]


@dataclass(frozen=True)
class Claim:
    """One statement of the design, and what it rests on."""

    text: str
    status: Status
    basis: str
    prove: str | None = None  # for an unproven or refuted claim: what would prove it


@dataclass
class Section:
    """One section of a source's document."""

    title: str
    claims: list[Claim] = field(default_factory=list)

    def add(self, text: str, status: Status, basis: str, prove: str | None = None) -> None:
        self.claims.append(Claim(text, status, basis, prove))


@dataclass
class SourcePlan:
    """The ingestion design of one source."""

    source: str
    connector: str
    generated_at: datetime
    reachable: bool
    unreachable: str | None
    sections: list[Section]

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dictionary of the whole document."""
        from combined.api._json import jsonable

        return dict(jsonable(asdict(self)))


@dataclass
class _Evidence:
    """What was gathered about one source before the sections are written."""

    engine: Engine
    source: str
    datasets: dict[str, DatasetConfig]
    discovered: dict[str, dict[str, Any]]  # each dataset's discovery, as stored
    discovered_at: datetime | None
    live: Source | None
    failure: str | None
    keys: dict[str, KeyMeasure | str | None] = field(default_factory=dict)
    retention: Mapping[str, Any] | None = None
    slots: dict[str, Mapping[str, Any]] = field(default_factory=dict)

    def unreachable(self, section: Section, what: str, dataset: str | None = None) -> None:
        """An unproven claim that only the source could support."""
        where = f"{dataset}: " if dataset else ""
        section.add(
            f"{where}{what}",
            "unproven",
            f"the source could not be reached: {self.failure}",
            "run `combined plan` again once the source answers (`combined check` tells why not)",
        )


# -- gathering --------------------------------------------------------------------------


def _ask(call: Any) -> tuple[Any, str | None]:
    """``call()``, or the redacted reason it failed (a source error, never a bug)."""
    try:
        return call(), None
    except CombinedError as exc:
        return None, redact(str(exc))


def _discovered(
    engine: Engine, source: str, live: Source | None
) -> tuple[dict[str, Any] | None, datetime | None, str | None]:
    """A fresh discovery (as stored), or the newest stored one when the source is unreachable."""
    from dataclasses import asdict

    from combined.api._json import jsonable
    from combined.catalog import _data as cat

    failure = None
    if live is not None:
        found, failure = _ask(live.discover)
        if found is not None:
            return dict(jsonable(asdict(found))), found.discovered_at, None
    with engine.catalog.begin() as conn:
        row = cat.latest_discovery(conn, source)
    if row is None:
        return None, None, failure
    return dict(row.body), row.discovered_at, failure


def gather(engine: Engine, source: str) -> _Evidence:
    """Ask the source, the catalog and the lake what the document needs."""
    datasets = dict(engine.project.source(source).datasets)
    live, failure = _ask(lambda: engine.open_source(source))
    if live is not None:
        _, failure = _ask(live.check)
        if failure is not None:
            live.close()
            live = None
    found, at, discovery_failure = _discovered(engine, source, live)
    failure = failure or discovery_failure
    discovered: dict[str, dict[str, Any]] = {}
    reported = {str(d["relation"]): d for d in (found or {}).get("datasets", [])}
    reported.update({str(d["name"]): d for d in (found or {}).get("datasets", [])})
    for name, d in datasets.items():
        if (one := reported.get(d.relation) or reported.get(name)) is not None:
            discovered[name] = one
    ev = _Evidence(engine, source, datasets, discovered, at, live, failure)
    if live is not None:
        _measure(ev, live)
    return ev


def _measure(ev: _Evidence, live: Source) -> None:
    """Each declared key's uniqueness, the change feed's retention, each slot's state."""
    measure = getattr(live, "measure_key", None)
    for name, d in ev.datasets.items():
        if d.key and measure is not None:
            found, failure = _ask(partial(measure, d.relation, list(d.key)))
            ev.keys[name] = found if failure is None else failure
    if any(d.strategy == "cdc" for d in ev.datasets.values()):
        retention = getattr(live, "feed_retention", None)
        ev.retention, _ = _ask(retention) if retention is not None else (None, None)
        status_of = getattr(live, "cdc_status", None)
        for name, d in ev.datasets.items():
            if d.strategy == "cdc" and status_of is not None:
                committed = ev.engine.committed_checkpoint(ev.source, name)
                status, _ = _ask(partial(status_of, d.relation, committed))
                if status is not None:
                    ev.slots[name] = status


def build(engine: Engine, source: str) -> SourcePlan:
    """The ingestion design of ``source``, from the evidence gathered now."""
    from combined.evidence._plan_sections import SECTIONS

    ev = gather(engine, source)
    try:
        sections = [write(ev) for write in SECTIONS]
    finally:
        if ev.live is not None:
            ev.live.close()
    return SourcePlan(
        source=source,
        connector=engine.project.source(source).connector,
        generated_at=utcnow(),
        reachable=ev.live is not None,
        unreachable=ev.failure if ev.live is None else None,
        sections=sections,
    )


# -- the document -------------------------------------------------------------------------

_MARKS: dict[str, str] = {
    "fact": "",
    "declared": "**declared** (not verified): ",
    "unproven": "**unproven**: ",
    "refuted": "**refuted**: ",
}


def _claim_lines(claim: Claim) -> list[str]:
    lines = [f"- {_MARKS[claim.status]}{claim.text}", f"  - from: {claim.basis}"]
    if claim.prove:
        lines.append(f"  - what would prove it: {claim.prove}")
    return lines


def render(plan: SourcePlan) -> str:
    """The plan as one Markdown document."""
    lines = [
        f"# Ingestion plan: {plan.source} ({plan.connector})",
        "",
        f"Written by `combined plan` at {plan.generated_at:%Y-%m-%d %H:%M:%S} UTC. Each claim "
        "names its evidence; **unproven** claims say what would prove them.",
        "",
    ]
    if not plan.reachable:
        depends = sum(
            1 for s in plan.sections for c in s.claims if c.basis.startswith("the source could not")
        )
        lines += [
            f"> **The source could not be reached**: {plan.unreachable}",
            f"> {depends} claims below depend on it and are unproven; the rest comes from the "
            "catalog, the lake and combined.yaml.",
            "",
        ]
    unproven = sum(1 for s in plan.sections for c in s.claims if c.status != "fact")
    lines += [f"{unproven} claims are not facts (declared, unproven or refuted).", ""]
    for section in plan.sections:
        lines += [f"## {section.title}", ""]
        for claim in section.claims:
            lines += _claim_lines(claim)
        lines.append("")
    return "\n".join(lines)


def plans(engine: Engine, sources: Sequence[str]) -> list[SourcePlan]:
    """The plan of each of ``sources`` (every source of the project when empty)."""
    names = list(sources) or list(engine.project.sources)
    for name in names:
        engine.project.source(name)  # an unknown source: a clear error before any work
    return [build(engine, name) for name in names]
