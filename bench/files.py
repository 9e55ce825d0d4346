"""Files (CSV and JSON lines): a first capture, an unchanged and a changed one, next to a floor.

``python -m bench.files [--rows 2000000] [--formats csv json] [--rounds 1]``

For each format, one file of ``--rows`` rows (``id`` BIGINT, ``customer_id``
BIGINT, ``status`` text, ``total`` a number with two decimals, ``note``
text, 10% null, ``created_at`` timestamp; deterministic) in a directory a
project reads as one ``snapshot`` dataset keyed on ``id``. Each step runs in
a fresh process:

1. **floor**: DuckDB reads the file (its own defaults: types from a sample)
   into one zstd Parquet file: the fastest read into Arrow we know of, with
   no lake, no identity and no provenance;
2. **first capture**: ``combined capture`` into an empty lake;
3. **unchanged re-capture**: ``combined capture`` again, the file untouched;
4. **changed re-capture**: the file written again with 1% of its rows
   changed (``customer_id`` + 1 where ``id % 100 = 50``), then ``combined
   capture``.

Reported for each: wall, the process's CPU-seconds (user + system), peak
RSS, and the ratio to the floor's wall and CPU; after the last capture,
whether the lake equals the file (rows, ``sum(customer_id)``).

Wall times on a shared machine are noisy: compare figures made side by side
(``--rounds`` repeats every step in turn).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.cdc import _cli_cpu
from bench.measure import timed_child
from bench.report import floor_child, print_steps

STEPS = ("floor", "first capture", "unchanged re-capture", "changed re-capture")

ROWS = (
    "SELECT i AS id, i % 1000 + {bump} AS customer_id, 'status' || (i % 7) AS status, "
    "round((i % 100000) / 100.0, 2) AS total, "
    "CASE WHEN i % 10 = 0 THEN NULL ELSE 'note ' || i END AS note, "
    "TIMESTAMP '2024-01-01' + INTERVAL (i) SECOND AS created_at FROM range({rows}) t(i)"
)
#: The rows the changed step changes.
CHANGED = "CASE WHEN i % 100 = 50 THEN 1 ELSE 0 END"


def write(fmt: str, rows: int, path: Path, changed: bool = False) -> None:
    """The deterministic file of ``rows`` rows (1% changed when ``changed``)."""
    import duckdb

    query = ROWS.format(rows=rows, bump=CHANGED if changed else 0)
    option = "HEADER" if fmt == "csv" else "FORMAT JSON"
    tmp = path.with_name(".writing")
    duckdb.connect().execute(f"COPY ({query}) TO '{tmp}' ({option})")
    tmp.replace(path)  # whole, or not at all: a capture never sees it half written


def totals(fmt: str, rows: int, changed: bool) -> tuple[int, int]:
    """(rows, sum(customer_id)) of the file as written."""
    import duckdb

    query = ROWS.format(rows=rows, bump=CHANGED if changed else 0)
    row = duckdb.connect().execute(f"SELECT count(*), sum(customer_id) FROM ({query})").fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def read_floor(path: str, out: str) -> int:
    """The file read by DuckDB's defaults into one zstd Parquet file: rows read."""
    import duckdb

    reader = "read_csv" if path.endswith(".csv") else "read_json"
    con = duckdb.connect()
    con.execute(
        f"COPY (SELECT * FROM {reader}('{path}')) TO '{out}' (FORMAT PARQUET, COMPRESSION ZSTD)"
    )
    row = con.execute(f"SELECT count(*) FROM read_parquet('{out}')").fetchone()
    assert row is not None
    return int(row[0])


def lake_totals(root: Path) -> tuple[int, int]:
    """(rows, sum(customer_id)) of the published dataset."""
    from combined.engine import Engine

    engine = Engine.open(root / "combined.yaml")
    try:
        (row,) = engine.sql("SELECT count(*) AS n, sum(customer_id) AS s FROM f.d").to_pylist()
    finally:
        engine.close()
    return int(row["n"]), int(row["s"])


def _step(run: Any) -> dict[str, Any]:
    rc, wall, rss, cpu, err = run()
    if rc != 0:
        raise SystemExit(f"a step failed: {err}")
    return {"wall_s": round(wall, 2), "cpu_s": round(cpu, 2), "peak_rss_mb": round(rss)}


def measure(fmt: str, rows: int) -> dict[str, Any]:
    """Every step of one format, and whether the lake equals the file."""
    root = Path(tempfile.mkdtemp(prefix="combined-bench-files-"))
    data = root / "data"
    data.mkdir()
    name = f"rows.{'csv' if fmt == 'csv' else 'jsonl'}"
    try:
        write(fmt, rows, data / name)
        (root / "combined.yaml").write_text(
            "version: 1\nlake: ./lake\nsources:\n  f:\n    connector: files\n"
            "    config:\n      path: ./data\n    datasets:\n"
            f"      d:\n        relation: {json.dumps(name)}\n        key: [id]\n"
        )

        def floor() -> tuple[int, float, float, float, str]:
            argv = ["-m", "bench.files", "--floor", str(data / name), str(root / "floor.parquet")]
            rc, wall, rss, cpu, _, err = timed_child(argv)
            return rc, wall, rss, cpu, err

        def capture() -> tuple[int, float, float, float, str]:
            return _cli_cpu(root, "capture")

        steps = {"floor": _step(floor), "first capture": _step(capture)}
        steps["unchanged re-capture"] = _step(capture)
        write(fmt, rows, data / name, changed=True)
        steps["changed re-capture"] = _step(capture)
        equal = lake_totals(root) == totals(fmt, rows, changed=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return {"format": fmt, "rows": rows, "steps": steps, "lake_equals_source": equal}


def _line(r: dict[str, Any], step: str) -> str:
    """One step's row: its figures and its ratios to the floor's."""
    s, floor = r["steps"][step], r["steps"]["floor"]
    wall, cpu = s["wall_s"] / floor["wall_s"], s["cpu_s"] / floor["cpu_s"]
    return (
        f"| {r['format']} {r['rows']:,} rows, {step} | {s['wall_s']:.2f} | {s['cpu_s']:.2f} "
        f"| {s['peak_rss_mb']} MB | {wall:.2f}x | {cpu:.2f}x |"
    )


def table(results: list[dict[str, Any]]) -> list[str]:
    """The markdown table of every format's steps, then whether each lake equals its file."""
    head = [
        "| format, step | wall s | CPU-s | peak RSS | vs floor (wall) | vs floor (CPU) |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    verdicts = [
        f"- {r['format']}: lake equals the file after the last capture: "
        + ("yes" if r["lake_equals_source"] else "**NO**")
        for r in results
    ]
    return [*head, *(_line(r, step) for r in results for step in STEPS), "", *verdicts]


def main(argv: list[str] | None = None) -> None:
    """Run every format's steps and print a markdown table (and the figures as JSON)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if floor_child(args, read_floor):
        return
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--formats", nargs="+", choices=("csv", "json"), default=["csv", "json"])
    parser.add_argument("--rounds", type=int, default=1)
    opts = parser.parse_args(args)
    results = [measure(f, opts.rows) for _ in range(opts.rounds) for f in opts.formats]
    print_steps("Files", "bench.files", args, table(results), results)


if __name__ == "__main__":
    main()
