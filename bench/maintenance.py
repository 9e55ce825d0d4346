"""Maintenance figures (issue 20 item 4): ``sql`` after many small captures, compacted or not.

``python -m bench.maintenance [--captures 300] [--rows 100] [--queries 7]``, on
a SQLite source (no service needed). Two projects take the same captures,
each one inserting a row into an append stream (``events``, cursor capture)
and updating one row of a keyed table of ``--rows`` rows (``items``):

- **off**: ``retention: {compact_files: 1000000}``, no capture compacts;
- **auto**: the default ``compact_files`` (32): captures compact themselves.

Then ``combined maintain`` compacts the *off* project (the **compacted**
reference). Reported: total capture time of each project, data files of each
table, and the median ``sql`` time over both tables (off, auto, compacted),
with the ratios against compacted (target: auto within 1.2x).

Wall times on a shared machine are noisy: compare figures made side by side.
"""

from __future__ import annotations

import argparse
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

PROJECT = """\
version: 1
lake: ./lake
{retention}
sources:
  app:
    connector: sqlite
    config:
      path: ./app.db
    datasets:
      events:
        sync_mode: append
        strategy: cursor
        cursor: {{column: id, trust: "an autoincrement id"}}
      items:
        key: [id]
"""

QUERY = (
    "SELECT (SELECT count(*) FROM app.events) AS events, (SELECT sum(v) FROM app.items) AS total"
)


def _make(root: Path, rows: int, retention: str) -> Path:
    root.mkdir(parents=True)
    con = sqlite3.connect(root / "app.db")
    con.executescript(
        "CREATE TABLE events (id INTEGER PRIMARY KEY, what TEXT);"
        "CREATE TABLE items (id INTEGER PRIMARY KEY, v INTEGER);"
    )
    con.executemany("INSERT INTO items VALUES (?, ?)", [(i, i) for i in range(rows)])
    con.commit()
    con.close()
    (root / "combined.yaml").write_text(PROJECT.format(retention=retention))
    return root / "combined.yaml"


def _change(root: Path, i: int, rows: int) -> None:
    con = sqlite3.connect(root / "app.db")
    con.execute("INSERT INTO events (what) VALUES (?)", (f"e{i}",))
    con.execute("UPDATE items SET v = v + 1 WHERE id = ?", (i % rows,))
    con.commit()
    con.close()


def _files(engine: Any) -> dict[str, int]:
    from combined.lake._maintain import file_count

    return {d: file_count(engine.layout.dataset_table("app", d)) for d in ("events", "items")}


def _timed_sql(engine: Any, queries: int) -> tuple[float, list[Any]]:
    times, result = [], []
    for _ in range(queries):
        start = time.perf_counter()
        result = engine.sql(QUERY).to_pylist()
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def main(argv: list[str] | None = None) -> None:
    """Run the comparison and print a markdown table."""
    from combined.engine import Engine

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--captures", type=int, default=300)
    parser.add_argument("--rows", type=int, default=100)
    parser.add_argument("--queries", type=int, default=7)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="combined-bench-maint-") as tmp:
        projects = {
            "off": _make(Path(tmp, "off"), args.rows, "retention: {compact_files: 1000000}"),
            "auto": _make(Path(tmp, "auto"), args.rows, ""),
        }
        engines = {name: Engine.open(p) for name, p in projects.items()}
        capture_s = dict.fromkeys(engines, 0.0)
        for i in range(args.captures):
            for name, engine in engines.items():
                _change(projects[name].parent, i, args.rows)
                start = time.perf_counter()
                (run,) = engine.capture()
                capture_s[name] += time.perf_counter() - start
                assert run.state == "succeeded", run.error
        rows: list[tuple[str, float, list[Any], dict[str, int]]] = []
        for name in ("off", "auto"):
            median, result = _timed_sql(engines[name], args.queries)
            rows.append((name, median, result, _files(engines[name])))
        start = time.perf_counter()
        engines["off"].maintain()
        maintain_s = time.perf_counter() - start
        median, result = _timed_sql(engines["off"], args.queries)
        rows.append(("compacted (off, after maintain)", median, result, _files(engines["off"])))
        for engine in engines.values():
            engine.close()
    base = rows[-1][1]
    out = sys.stdout
    out.write(
        f"{args.captures} captures, items of {args.rows} rows; `maintain` {maintain_s:.2f} s\n\n"
    )
    out.write("| lake | capture total | files (events / items) | sql median | vs compacted |\n")
    out.write("|---|---:|---:|---:|---:|\n")
    for name, median, _result, files in rows:
        total = capture_s.get(name.split(" ")[0], 0.0)
        out.write(
            f"| {name} | {total:.1f} s | {files['events']} / {files['items']} | "
            f"{median * 1000:.1f} ms | {median / base:.2f}x |\n"
        )
    assert len({str(r[2]) for r in rows}) == 1, "every lake must answer the same"


if __name__ == "__main__":
    main()
