"""Record-at-a-time connectors: a Singer tap, an Airbyte source and an HTTP API, next to a floor.

``python -m bench.taps [--rows 500000] [--cases singer airbyte http] [--page-size 1000]
[--rounds 1]``

The same ``--rows`` records (``id``, ``customer_id``, ``status``, ``total`` a
number with two decimals, ``note`` text, 10% null, ``updated_at`` an RFC 3339
date-time; deterministic) reach Combined three ways, each a project with one
``snapshot`` dataset keyed on ``id``:

* **singer**: a tap (``bench/tap_program.py``) that copies a file of SCHEMA,
  RECORD and STATE lines, written before, to its standard output;
* **airbyte**: the same program as an Airbyte source (``spec``, ``check``,
  ``discover``, ``read``), its lines RECORD, STATE and a STREAM_STATUS;
* **http**: a real HTTP server on 127.0.0.1 in its own process
  (``bench/api_server.py``), ``--page-size`` records a page, ``cursor``
  paging (docs/http.md), the fields declared (``total: decimal(2)``,
  ``updated_at: timestamp``).

Each step runs in a fresh process:

1. **floor**: pyarrow's JSON reader reads the records as plain JSON lines
   straight from the file into one zstd Parquet file: no protocol, no lake,
   no identity, no provenance;
2. **first capture**: ``combined capture`` into an empty lake;
3. **unchanged re-capture**: ``combined capture`` again, nothing changed;
4. **changed re-capture**: the records written again with 1% changed
   (``customer_id`` + 1 where ``id % 100 = 50``; the server reloads them),
   then ``combined capture``.

Reported for each: wall, the process's CPU-seconds (user + system; a tap's
included, as the capture's child; the HTTP server's apart, as server CPU-s),
peak RSS, the rows the step's output holds (the Parquet file's, the lake's
after the capture) and the ratios to the floor's wall and CPU; after the last
capture, whether the lake's rows equal the records, value for value.

Wall times on a shared machine are noisy: compare CPU-seconds, and figures
made side by side (``--rounds`` repeats every step in turn).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from bench.cdc import _cli_cpu
from bench.measure import timed_child
from bench.report import floor_child, print_steps

STEPS = ("floor", "first capture", "unchanged re-capture", "changed re-capture")
CASES = ("singer", "airbyte", "http")
HERE = Path(__file__).resolve().parent

#: The stream's JSON Schema (Singer and Airbyte); the HTTP endpoint declares the same types.
SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "id": {"type": "integer"},
        "customer_id": {"type": "integer"},
        "status": {"type": "string"},
        "total": {"type": "number", "multipleOf": 0.01},
        "note": {"type": ["null", "string"]},
        "updated_at": {"type": "string", "format": "date-time"},
    },
}
FIELDS = {
    "id": "integer",
    "customer_id": "integer",
    "status": "string",
    "total": "decimal(2)",
    "note": "string",
    "updated_at": "timestamp",
}
#: The lake's columns as DuckDB reads the records file, for the comparison.
COLUMNS = (
    "{id: 'BIGINT', customer_id: 'BIGINT', status: 'VARCHAR', total: 'DECIMAL(38,2)', "
    "note: 'VARCHAR', updated_at: 'TIMESTAMPTZ'}"
)
_DAY0 = dt.date(2024, 1, 1).toordinal()


def records(rows: int, changed: bool = False) -> Iterator[str]:
    """The records as JSON text, one a line (1% changed when ``changed``)."""
    days: dict[int, str] = {}
    for i in range(rows):
        day, second = divmod(i, 86400)
        date = days.get(day) or days.setdefault(day, dt.date.fromordinal(_DAY0 + day).isoformat())
        hour, rest = divmod(second, 3600)
        customer = i % 1000 + (1 if changed and i % 100 == 50 else 0)
        cents = i % 100000
        note = "null" if i % 10 == 0 else f'"note {i}"'
        yield (
            f'{{"id":{i},"customer_id":{customer},"status":"status{i % 7}",'
            f'"total":{cents // 100}.{cents % 100:02d},"note":{note},'
            f'"updated_at":"{date}T{hour:02d}:{rest // 60:02d}:{rest % 60:02d}Z"}}'
        )


def _singer_lines(rows: int, changed: bool) -> Iterator[str]:
    schema = {"type": "SCHEMA", "stream": "orders", "schema": SCHEMA, "key_properties": ["id"]}
    yield json.dumps(schema)
    for record in records(rows, changed):
        yield f'{{"type":"RECORD","stream":"orders","record":{record}}}'
    yield json.dumps({"type": "STATE", "value": {"bookmarks": {"orders": {}}}})


def _airbyte_lines(rows: int, changed: bool) -> Iterator[str]:
    for record in records(rows, changed):
        yield (
            '{"type":"RECORD","record":{"stream":"orders","data":' + record + ","
            '"emitted_at":1704067200000}}'
        )
    state = {"stream_descriptor": {"name": "orders"}, "stream_state": {}}
    yield json.dumps({"type": "STATE", "state": {"type": "STREAM", "stream": state}})
    status = {"stream_descriptor": {"name": "orders"}, "status": "COMPLETE"}
    yield json.dumps({"type": "TRACE", "trace": {"type": "STREAM_STATUS", "stream_status": status}})


_LINES: dict[str, Callable[[int, bool], Iterator[str]]] = {
    "singer": _singer_lines,
    "airbyte": _airbyte_lines,
}


def _write(path: Path, lines: Iterator[str]) -> None:
    """Write ``lines`` whole, or not at all: no reader ever sees the file half written."""
    tmp = path.with_name(".writing")
    with open(tmp, "w") as f:
        f.writelines(line + "\n" for line in lines)
    tmp.replace(path)


def write(case: str, rows: int, data: Path, changed: bool = False) -> None:
    """The records file, and the case's own lines (the HTTP server serves the records file)."""
    _write(data / "records.jsonl", records(rows, changed))
    if case in _LINES:
        _write(data / f"{case}.jsonl", _LINES[case](rows, changed))


def project(case: str, root: Path, base_url: str = "") -> None:
    """The case's combined.yaml: source ``s``, dataset ``orders`` keyed on ``id``."""
    data = root / "data"
    if case == "http":
        endpoint = {
            "path": "/orders",
            "records": "data",
            "paginate": {"style": "cursor", "param": "cursor", "next": "next"},
            "fields": FIELDS,
        }
        config: dict[str, Any] = {
            "base_url": base_url,
            "max_pages": 1_000_000,
            "endpoints": {"orders": endpoint},
        }
    else:
        command = [sys.executable, str(HERE / "tap_program.py"), case]
        program = {"lines": str(data / f"{case}.jsonl"), "schema": SCHEMA}
        config = {"command": command, "config": program}
    source = {"connector": case, "config": config, "datasets": {"orders": {"key": ["id"]}}}
    text = json.dumps({"version": 1, "lake": "./lake", "sources": {"s": source}}, indent=2)
    (root / "combined.yaml").write_text(text)  # (JSON is YAML)


class Server:
    """The HTTP API in its own process: started, asked to reload, its CPU read, stopped."""

    def __init__(self, records_file: Path, page_size: int) -> None:
        argv = [sys.executable, str(HERE / "api_server.py"), str(records_file), str(page_size)]
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        self.port = int(self.proc.stdout.readline())
        self.base_url = f"http://127.0.0.1:{self.port}"

    def reload(self) -> None:
        """Serve the records file as it is now."""
        import httpx

        httpx.get(f"{self.base_url}/reload", timeout=120).raise_for_status()

    def cpu(self) -> float:
        """The server's CPU-seconds so far (user + system)."""
        stat = Path(f"/proc/{self.proc.pid}/stat").read_text()
        fields = stat.rsplit(")", 1)[-1].split()  # after "pid (comm)": utime 11, stime 12
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self) -> None:
        """End the server process."""
        self.proc.terminate()
        self.proc.wait(timeout=30)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


def read_floor(path: str, out: str) -> int:
    """The records read by pyarrow's JSON reader into one zstd Parquet file: rows read."""
    import pyarrow.json as pj
    import pyarrow.parquet as pq

    table = pj.read_json(path)
    pq.write_table(table, out, compression="zstd")
    return int(pq.ParquetFile(out).metadata.num_rows)


def lake_rows(root: Path) -> int:
    """The rows of the published dataset."""
    return int(_lake(root, "SELECT count(*) AS n FROM s.orders").column("n")[0].as_py())


def _lake(root: Path, query: str) -> Any:
    from combined.engine import Engine

    engine = Engine.open(root / "combined.yaml")
    try:
        return engine.sql(query)
    finally:
        engine.close()


def differences(root: Path, records_file: Path) -> int:
    """Rows of the lake not among the records, plus records not in the lake (with repeats)."""
    import duckdb

    lake = _lake(root, "SELECT id, customer_id, status, total, note, updated_at FROM s.orders")
    con = duckdb.connect()
    con.register("lake", lake)
    src = f"read_json('{records_file}', format = 'newline_delimited', columns = {COLUMNS})"
    row = con.execute(
        f"SELECT (SELECT count(*) FROM (FROM lake EXCEPT ALL FROM {src})) "
        f"+ (SELECT count(*) FROM (FROM {src} EXCEPT ALL FROM lake))"
    ).fetchone()
    assert row is not None
    return int(row[0])


def _figures(rc: int, wall: float, rss: float, cpu: float, err: str) -> dict[str, Any]:
    if rc != 0:
        raise SystemExit(f"a step failed: {err}")
    return {"wall_s": round(wall, 2), "cpu_s": round(cpu, 2), "peak_rss_mb": round(rss)}


def _floor(root: Path) -> dict[str, Any]:
    """The floor, in a fresh process: its figures and the rows its Parquet file holds."""
    records, out = root / "data" / "records.jsonl", root / "floor.parquet"
    argv = ["-m", "bench.taps", "--floor", str(records), str(out)]
    rc, wall, rss, cpu, last, err = timed_child(argv, cwd=HERE.parent)
    return _figures(rc, wall, rss, cpu, err) | {"rows": json.loads(last)["rows"]}


def _capture(root: Path, server: Server | None) -> dict[str, Any]:
    """``combined capture``, in a fresh process: its figures, the lake's rows, the server's CPU."""
    before = server.cpu() if server is not None else 0.0
    step = _figures(*_cli_cpu(root, "capture")) | {"rows": lake_rows(root)}
    if server is not None:
        step["server_cpu_s"] = round(server.cpu() - before, 2)
    return step


def measure(case: str, rows: int, page_size: int = 1000) -> dict[str, Any]:
    """Every step of one case, and whether the lake equals the records."""
    root = Path(tempfile.mkdtemp(prefix=f"combined-bench-{case}-"))
    data = root / "data"
    data.mkdir()
    server: Server | None = None
    try:
        write(case, rows, data)
        if case == "http":
            server = Server(data / "records.jsonl", page_size)
        project(case, root, server.base_url if server else "")
        steps = {"floor": _floor(root), "first capture": _capture(root, server)}
        steps["unchanged re-capture"] = _capture(root, server)
        write(case, rows, data, changed=True)
        if server is not None:
            server.reload()
        steps["changed re-capture"] = _capture(root, server)
        left = differences(root, data / "records.jsonl")
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(root, ignore_errors=True)
    return {"case": case, "rows": rows, "steps": steps, "differences": left}


def _line(r: dict[str, Any], step: str) -> str:
    """One step's row: its figures and its ratios to the floor's."""
    s, floor = r["steps"][step], r["steps"]["floor"]
    wall, cpu = s["wall_s"] / floor["wall_s"], s["cpu_s"] / floor["cpu_s"]
    server = f"{s['server_cpu_s']:.2f}" if "server_cpu_s" in s else "-"
    return (
        f"| {r['case']} {r['rows']:,} records, {step} | {s['wall_s']:.2f} | {s['cpu_s']:.2f} "
        f"| {server} | {s['peak_rss_mb']} MB | {s['rows']:,} | {wall:.2f}x | {cpu:.2f}x |"
    )


#: The table's head: wall and client CPU (a tap's included), the HTTP server's CPU apart.
HEAD = (
    "| case, step | wall s | CPU-s | server CPU-s | peak RSS | rows | vs floor (wall) "
    "| vs floor (CPU) |",
    "|---|---:|---:|---:|---:|---:|---:|---:|",
)


def _verdict(r: dict[str, Any]) -> str:
    same = r["differences"] == 0
    return f"- {r['case']}: lake equals the records after the last capture: " + (
        "yes" if same else f"**NO** ({r['differences']} rows differ)"
    )


def table(results: list[dict[str, Any]]) -> list[str]:
    """The markdown table of every case's steps, then whether each lake equals its records."""
    rows = [_line(r, step) for r in results for step in STEPS]
    return [*HEAD, *rows, "", *map(_verdict, results)]


def main(argv: list[str] | None = None) -> None:
    """Run every case's steps and print a markdown table (and the figures as JSON)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if floor_child(args, read_floor):
        return
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=500_000)
    parser.add_argument("--cases", nargs="+", choices=CASES, default=list(CASES))
    parser.add_argument("--page-size", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=1)
    opts = parser.parse_args(args)
    results = [
        measure(case, opts.rows, opts.page_size) for _ in range(opts.rounds) for case in opts.cases
    ]
    print_steps("Taps and APIs", "bench.taps", args, table(results), results)


if __name__ == "__main__":
    main()
