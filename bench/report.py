"""Results of a benchmark run: the markdown table, the ratios and the issue's targets."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from bench.measure import MIB

FLOOR = "floor"
DLT_REPLACE = "dlt_replace"
DLT_MERGE = "dlt_merge"
INITIAL = "snapshot_initial"
UNCHANGED = "snapshot_unchanged"
CHANGED = "snapshot_changed"
REWRITTEN = "snapshot_rewritten"
CURSOR = "cursor_append"
PARTITIONED = "partitioned"
SCALE = "scale_"  # prefix: scale_<rows>

#: The case whose time a case is compared with in the "speed-up vs dlt" column.
DLT_PEER = {INITIAL: DLT_REPLACE, CHANGED: DLT_MERGE}
RSS_LIMIT = 400 * MIB


@dataclass
class CaseResult:
    """One measured case, as the table shows it."""

    key: str
    label: str
    title: str
    status: str = "ok"  # ok | failed: ... | unavailable: ... | not measured: ...
    seconds: float | None = None
    cpu_seconds: float | None = None
    #: CPU of the database server's processes meanwhile (same host).
    server_cpu_seconds: float | None = None
    #: The cores the case process could run on.
    cores: int | None = None
    process_seconds: float | None = None
    rows: int | None = None
    peak_rss: int | None = None
    lake_bytes: int | None = None
    data_files: int | None = None
    notes: list[str] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """Whether the case produced figures."""
        return self.status == "ok"

    @property
    def combined(self) -> bool:
        """Whether the case measures Combined."""
        return self.key in (
            INITIAL,
            UNCHANGED,
            CHANGED,
            REWRITTEN,
            CURSOR,
            PARTITIONED,
        ) or self.key.startswith(SCALE)

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready copy."""
        return asdict(self)


def from_child(
    key: str,
    label: str,
    title: str,
    child: dict[str, Any] | None,
    *,
    peak_rss: int,
    process_seconds: float,
    failure: str = "",
) -> CaseResult:
    """A :class:`CaseResult` from a case process's JSON result and the sampler's peak."""
    res = CaseResult(key=key, label=label, title=title, process_seconds=process_seconds)
    if child is None:
        res.status = f"failed: {failure or 'no result'}"
        return res
    if "unavailable" in child:
        res.status = f"unavailable: {child['unavailable']}"
        return res
    if not child.get("ok"):
        res.status = f"failed: {child.get('error') or failure or 'unknown error'}"
        return res
    rss = child.get("rss") or {}
    res.seconds = float(child["seconds"])
    if child.get("cpu_seconds") is not None:
        res.cpu_seconds = float(child["cpu_seconds"])
    if child.get("server_cpu_seconds") is not None:
        res.server_cpu_seconds = float(child["server_cpu_seconds"])
    if child.get("cores"):
        res.cores = int(child["cores"])
    res.rows = int(child["rows"])
    res.peak_rss = max(peak_rss, int(rss.get("self_hwm", 0)), int(rss.get("children_maxrss", 0)))
    lake = child.get("lake") or {}
    res.lake_bytes = int(lake.get("bytes", 0))
    res.data_files = int(lake.get("data_files", 0))
    res.extra = {
        "details": child.get("details"),
        "lake": lake,
        "lake_areas": child.get("lake_areas"),
        "rss": rss,
        "rss_ready": child.get("rss_ready"),
        "load": [child.get("load_before"), child.get("load_after")],
    }
    if child.get("rss_ready"):
        res.notes.append(f"RSS before the operation {fmt_bytes(int(child['rss_ready']))}")
    if child.get("load_before") is not None and child.get("load_after") is not None:
        res.notes.append(f"load {child['load_before']:.1f}->{child['load_after']:.1f}")
    return res


# -- formatting -----------------------------------------------------------------------------


def fmt_bytes(n: int | None) -> str:
    """``12.3 MB`` (MiB, shown as MB), ``0 B``."""
    if n is None:
        return "-"
    if n < 1024:
        return f"{n} B"
    if n < MIB:
        return f"{n / 1024:.1f} KB"
    if n < 1024 * MIB:
        return f"{n / MIB:.1f} MB"
    return f"{n / (1024 * MIB):.2f} GB"


def fmt_ratio(x: float | None) -> str:
    """``1.23x``."""
    return "-" if x is None else f"{x:.2f}x"


def fmt_rate(rows: int | None, seconds: float | None) -> str:
    """Rows per second, grouped."""
    if rows is None or not seconds:
        return "-"
    return f"{rows / seconds:,.0f}"


def by_key(results: Sequence[CaseResult]) -> dict[str, CaseResult]:
    """Results keyed by case key (the last one wins)."""
    return {r.key: r for r in results}


def ratio(a: CaseResult | None, b: CaseResult | None) -> float | None:
    """``a.seconds / b.seconds`` when both were measured."""
    if a is None or b is None or not a.ok or not b.ok or not a.seconds or not b.seconds:
        return None
    return a.seconds / b.seconds


def _order(r: CaseResult) -> int:
    """Table order: by case number (``8 (1M)`` is 8), whatever the run order."""
    head = r.label.split()[0] if r.label else ""
    return int(head) if head.isdigit() else 99


def cpu_ratio(a: CaseResult | None, b: CaseResult | None) -> float | None:
    """``a.cpu_seconds / b.cpu_seconds`` (client CPU: less sensitive to a noisy machine)."""
    if a is None or b is None or not a.ok or not b.ok or not a.cpu_seconds or not b.cpu_seconds:
        return None
    return a.cpu_seconds / b.cpu_seconds


HEADER = (
    "| # | case | rows read | wall s | cpu s | server cpu s | rows/s | peak RSS | "
    "lake bytes written | new data files | vs floor | speed-up vs dlt | notes |"
)
SEPARATOR = "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"


def table(results: Sequence[CaseResult]) -> str:
    """The markdown table of a run (time ratios against the floor and dlt)."""
    keyed = by_key(results)
    floor = keyed.get(FLOOR)
    lines = [HEADER, SEPARATOR]
    for r in sorted(results, key=_order):
        if not r.ok:
            cells = [r.label, r.title, *["-"] * 10, r.status]
        else:
            peer = DLT_PEER.get(r.key)
            speedup = ratio(keyed.get(peer), r) if peer else None
            # Scale cases read other tables: a ratio to the floor would mislead.
            vs_floor = None if r.key.startswith(SCALE) else ratio(r, floor)
            cells = [
                r.label,
                r.title,
                f"{r.rows:,}" if r.rows is not None else "-",
                f"{r.seconds:.2f}" if r.seconds is not None else "-",
                f"{r.cpu_seconds:.2f}" if r.cpu_seconds is not None else "-",
                f"{r.server_cpu_seconds:.2f}" if r.server_cpu_seconds is not None else "-",
                fmt_rate(r.rows, r.seconds),
                fmt_bytes(r.peak_rss),
                fmt_bytes(r.lake_bytes),
                str(r.data_files) if r.data_files is not None else "-",
                fmt_ratio(vs_floor),
                fmt_ratio(speedup),
                "; ".join(r.notes),
            ]
        lines.append("| " + " | ".join(c.replace("|", "/") for c in cells) + " |")
    return "\n".join(lines)


# -- targets --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    """One of the issue's targets and where the run stands against it."""

    goal: str
    status: str  # met | missed | not measured
    evidence: str


def _scale(results: Sequence[CaseResult]) -> list[CaseResult]:
    out = [r for r in results if r.key.startswith(SCALE) and r.ok]
    return sorted(out, key=lambda r: int(r.key[len(SCALE) :]))


def targets(results: Sequence[CaseResult], *, table_rows: int | None = None) -> list[Target]:
    """Evaluate the issue's targets against a run's results."""
    k = by_key(results)
    floor, initial = k.get(FLOOR), k.get(INITIAL)
    out: list[Target] = []

    def timed(goal: str, case: CaseResult | None, limit: float) -> None:
        x = ratio(case, floor)
        if x is None:
            out.append(Target(goal, "not measured", "needs the floor and the case in one run"))
        else:
            out.append(
                Target(
                    goal,
                    "met" if x <= limit else "missed",
                    f"{x:.2f}x the floor ({case.seconds:.2f} s vs {floor.seconds:.2f} s)"  # type: ignore[union-attr]
                    f" (limit {limit}x)" + _cpu(case, floor) + _bound(case, floor),
                )
            )

    timed("initial snapshot within 1.3x of the floor", initial, 1.3)
    speed = ratio(k.get(DLT_REPLACE), initial)
    if speed is None:
        dlt = k.get(DLT_REPLACE)
        why = dlt.status if dlt is not None and not dlt.ok else "needs dlt and the initial snapshot"
        out.append(Target("initial snapshot at least 3x faster than dlt", "not measured", why))
    else:
        out.append(
            Target(
                "initial snapshot at least 3x faster than dlt",
                "met" if speed >= 3 else "missed",
                (
                    f"{speed:.2f}x faster than dlt replace"
                    if speed >= 1
                    else f"{1 / speed:.2f}x slower than dlt replace (speed-up {speed:.2f}x)"
                )
                + _cpu(k.get(DLT_REPLACE), initial, "dlt's CPU / Combined's"),
            )
        )
    mine = [r for r in results if r.combined and r.ok and r.peak_rss is not None]
    if mine:
        worst = max(mine, key=lambda r: r.peak_rss or 0)
        out.append(
            Target(
                "peak RSS under 400 MB",
                "met" if (worst.peak_rss or 0) < RSS_LIMIT else "missed",
                f"highest Combined peak {fmt_bytes(worst.peak_rss)} ({worst.title}); "
                + ", ".join(f"{r.label}: {fmt_bytes(r.peak_rss)}" for r in mine),
            )
        )
    else:
        out.append(Target("peak RSS under 400 MB", "not measured", "no Combined case ran"))
    scale = _scale(results)
    if len(scale) >= 2 and scale[0].peak_rss and scale[-1].peak_rss:
        lo, hi = scale[0], scale[-1]
        flat = hi.peak_rss / lo.peak_rss  # type: ignore[operator]
        out.append(
            Target(
                f"peak RSS flat: {hi.rows:,}-row peak / {lo.rows:,}-row peak <= 1.2",
                "met" if flat <= 1.2 else "missed",
                f"{fmt_bytes(hi.peak_rss)} / {fmt_bytes(lo.peak_rss)} = {flat:.2f}",
            )
        )
    else:
        out.append(
            Target("peak RSS flat (4M / 1M <= 1.2)", "not measured", "needs two scale cases")
        )
    unchanged = k.get(UNCHANGED)
    timed("unchanged re-capture within 1.5x of the floor", unchanged, 1.5)
    if unchanged is not None and unchanged.ok:
        out.append(
            Target(
                "unchanged re-capture writes no lake data files",
                "met" if unchanged.data_files == 0 else "missed",
                f"{unchanged.data_files} data files, {fmt_bytes(unchanged.lake_bytes)} written",
            )
        )
    else:
        out.append(Target("unchanged re-capture writes no lake data files", "not measured", "-"))
    changed = k.get(CHANGED)
    timed("1%-changed re-capture within 1.6x of the floor", changed, 1.6)
    out.append(_proportional(changed, initial, table_rows))
    out.append(_partitioned(k.get(PARTITIONED), floor))
    return out


def _cpu(a: CaseResult | None, b: CaseResult | None, what: str = "client CPU") -> str:
    x = cpu_ratio(a, b)
    return "" if x is None else f"; {what}: {x:.2f}x"


def cpu_bound(case: CaseResult | None, cores: int | None = None) -> float | None:
    """The least wall time the case's CPU allows: (client + server CPU) / cores.

    The database server runs on the same machine: its CPU shares the cores.
    None when either CPU figure is missing.
    """
    if case is None or not case.ok or case.cpu_seconds is None or case.server_cpu_seconds is None:
        return None
    return (case.cpu_seconds + case.server_cpu_seconds) / (cores or _cores(case))


def _cores(case: CaseResult) -> int:
    """The case's cores as it recorded them (else this machine's)."""
    return case.cores or os.cpu_count() or 1


def _bound(case: CaseResult | None, floor: CaseResult | None) -> str:
    least = cpu_bound(case)
    if least is None or case is None or floor is None or not floor.seconds:
        return ""
    cores = _cores(case)
    return (
        f"; CPU bound: (client {case.cpu_seconds:.2f} + server {case.server_cpu_seconds:.2f}"
        f" CPU-s) / {cores} cores = {least:.2f} s = {least / floor.seconds:.2f}x the floor"
    )


def _partitioned(case: CaseResult | None, floor: CaseResult | None) -> Target:
    goal = "partitioned snapshot with 2 workers faster than the single-stream floor"
    if case is None:
        return Target(goal, "not measured", "the partitioned case did not run")
    if not case.ok:
        return Target(goal, "not measured", case.status)
    x = ratio(case, floor)
    if x is None:
        return Target(goal, "not measured", "needs the floor in the same run")
    parts = (case.extra.get("details") or {}).get("partitions")
    extract = next(
        (
            s["seconds"]
            for s in (case.extra.get("details") or {}).get("phases") or []
            if s.get("phase") == "extracting"
        ),
        None,
    )
    evidence = f"{x:.2f}x the floor ({case.seconds:.2f} s vs {floor.seconds:.2f} s"  # type: ignore[union-attr]
    evidence += f", {parts} partitions)" if parts else ")"
    if extract is not None:
        evidence += f"; its parallel read and staging alone took {extract:.2f} s"
    evidence += _cpu(case, floor) + _bound(case, floor)
    return Target(goal, "met" if x < 1.0 else "missed", evidence)


def _proportional(
    changed: CaseResult | None, initial: CaseResult | None, table_rows: int | None
) -> Target:
    goal = "1%-changed re-capture writes lake bytes proportional to the change"
    if changed is None or initial is None or not changed.ok or not initial.ok:
        return Target(goal, "not measured", "needs the initial and the changed captures")
    stats = ((changed.extra.get("details") or {}).get("stats") or {}).get("orders") or {}
    n_changed = (
        int(stats.get("inserts", 0)) + int(stats.get("updates", 0)) + int(stats.get("deletes", 0))
    )
    rows = table_rows or initial.rows or 0
    if not rows or not initial.lake_bytes:
        return Target(goal, "not measured", "no initial bytes")
    share = n_changed / rows
    bytes_share = (changed.lake_bytes or 0) / initial.lake_bytes
    # Proportional: within 3x of the changed rows' share of the initial snapshot's bytes.
    return Target(
        goal,
        "met" if bytes_share <= 3 * share else "missed",
        f"{fmt_bytes(changed.lake_bytes)} written = {bytes_share:.1%} of the initial "
        f"snapshot's {fmt_bytes(initial.lake_bytes)} for {n_changed:,} changed rows "
        f"({share:.1%} of {rows:,}); criterion: <= 3x the changed share",
    )


def targets_table(items: Sequence[Target]) -> str:
    """The targets as a markdown table."""
    lines = ["| target | status | evidence |", "|---|---|---|"]
    for t in items:
        lines.append(f"| {t.goal} | **{t.status}** | {t.evidence.replace('|', '/')} |")
    return "\n".join(lines)


#: Combined phase marks (see ``bench.case.PhaseRecorder``) and how the report names them.
PHASES = {
    "open": "open",
    "start": "admit",
    "extracting": "extract+stage",
    "reducing": "reduce+deliveries",
    "delivered": "change list",
    "committing": "commit+MAR+publish",
    "finished": "cleanup",
}


def phases_table(results: Sequence[CaseResult]) -> str:
    """Seconds and peak RSS per phase of each Combined case ("" when none recorded)."""
    rows = []
    for r in sorted(results, key=_order):
        segments = (r.extra.get("details") or {}).get("phases") if r.ok else None
        if not segments:
            continue
        cells = {name: "-" for name in PHASES}
        for seg in segments:
            name = seg.get("phase")
            if name in cells:
                cpu = seg.get("cpu_seconds")
                used = f" ({cpu:.1f} cpu)" if cpu is not None else ""
                cells[name] = f"{seg['seconds']:.1f} s{used} / {fmt_bytes(int(seg['peak_rss']))}"
        rows.append("| " + " | ".join([r.label, *cells.values()]) + " |")
    if not rows:
        return ""
    header = "| # | " + " | ".join(PHASES.values()) + " |"
    sep = "|---|" + "---:|" * len(PHASES)
    return "\n".join([header, sep, *rows])


def print_steps(
    title: str, module: str, args: Sequence[str], lines: Sequence[str], raw: Any
) -> None:
    """A step bench's report: its heading with the time, its command, its table, its JSON."""
    import json
    import time

    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    print(f"### {title}, {started}\n")
    print(f"`python -m {module} {' '.join(args)}`\n")
    print("\n".join(lines))
    print("\n" + json.dumps(raw))


def floor_child(args: Sequence[str], read: Callable[[str, str], int]) -> bool:
    """``--floor PATH OUT``: the floor's own process reads PATH into OUT, prints its rows."""
    import json

    if args[:1] != ["--floor"]:
        return False
    print(json.dumps({"rows": read(args[1], args[2])}))
    return True
