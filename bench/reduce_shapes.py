"""Change streams of wide rows reduced at the default memory: which shapes pass, at what cost.

Synthetic staged parts, no database: ``n`` inserts of ``cols`` columns of one
kind, then ``n`` updates of the same ids, the first ``filled`` columns marked
unchanged (filled from the insert before them, as a TOASTed value is). Each
case runs in a fresh process (its peak RSS is its own) through the change
stream's ``Reducer`` at the default ``reduction_memory``: its reduction and
its output rows. Kinds: ``text`` and ``bytes`` (one value of ``width``
bytes), ``list`` (8 strings of ``width / 8``), ``manylist`` (``width / 4``
strings of 1-4 characters)::

    python -m bench.reduce_shapes                      # every case
    python -m bench.reduce_shapes --kinds list --widths 20000
    python -m bench.reduce_shapes --lake                   # filled from the lake's rows

A case that fails prints DuckDB's error; none is expected to.
"""

from __future__ import annotations

import argparse
import itertools
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pyarrow as pa

from bench.measure import MIB, read_status

#: The staged bytes a case holds, about (its rows follow from its width).
CASE_BYTES = 150_000_000
#: The bytes of each staged batch, about: a change stream gathers its rows so
#: (``combined.connectors.postgres._cdc``).
GATHERED_BYTES = 4 << 20
#: The list elements a ``manylist`` case stages at most (about).
ELEMENTS = 20_000_000
#: The default ``reduction_memory``.
MEMORY = 256 * 2**20
#: Columns of a case and how many of them its updates leave unchanged.
SHAPES = ((1, 0), (3, 0), (3, 1), (3, 3))
KINDS = {
    "text": pa.string(),
    "bytes": pa.binary(),
    "list": pa.list_(pa.string()),
    "manylist": pa.list_(pa.string()),
}


def _value(kind: str, width: int, i: int, column: str) -> Any:
    head = f"{column}{i}"
    if kind == "text":
        return head + "x" * width
    if kind == "bytes":
        return (head + "x" * width).encode()
    if kind == "list":
        return [f"{head}-{j}" + "x" * (width // 8) for j in range(8)]
    return [str(j) for j in range(width // 4)]


def _stage(
    root: Path, kind: str, width: int, cols: int, filled: int, repeats: int = 1, lake: bool = False
) -> None:
    """Stage the change stream's parts under ``root``: each id's update ``repeats`` times.

    ``lake``: the inserts are the lake's current rows instead (``root/lake``,
    in row groups as its writer closes them), and only the updates are staged.
    """
    from combined.delivery import Limits, PartWriter, StagingArea

    n = max(200, min(3000, CASE_BYTES // (width * cols * (1 + repeats))))
    if kind == "manylist" and repeats > 1:  # (Python strings bounded: 165M took 10 GB)
        n = min(n, max(1, ELEMENTS // (width // 4 * cols * (1 + repeats))))
    names = [f"c{i}" for i in range(cols)]
    marked = names[:filled] or None
    schema = pa.schema(
        [("id", pa.int64()), ("n", pa.int64())]
        + [(c, KINDS[kind]) for c in names]
        + [
            ("_combined_op", pa.string()),
            ("_combined_ordinal", pa.int64()),
            ("_combined_unchanged", pa.list_(pa.string())),
        ]
    )
    updates = [i for i in range(n) for _ in range(repeats)]  # (an id's repeats in a row)
    rows = n + len(updates)
    data: dict[str, list[Any]] = {"id": [*range(n), *updates], "n": list(range(rows))}
    for c in names:
        later = [
            None if marked and c in marked else _value(kind, width, i + 7 + j % repeats, c)
            for j, i in enumerate(updates)
        ]
        data[c] = [_value(kind, width, i, c) for i in range(n)] + later
    data["_combined_op"] = ["insert"] * n + ["update"] * len(updates)
    data["_combined_ordinal"] = list(range(rows))
    data["_combined_unchanged"] = [None] * n + [marked] * len(updates)
    batch = pa.RecordBatch.from_pydict(data, schema=schema)
    if lake:
        _lake(root / "lake", batch.slice(0, n), names)
        batch = batch.slice(n)
    writer = PartWriter(StagingArea(root / "staging", Limits()), "s/d/capture", rows, 2**40)
    step = max(1, batch.num_rows * GATHERED_BYTES // batch.nbytes)
    for offset in range(0, batch.num_rows, step):  # (batches of ~4 MB, as a change stream's)
        writer.write(batch.slice(offset, step))
    writer.close()


def _lake(root: Path, inserts: pa.RecordBatch, names: list[str]) -> None:
    """The ``inserts`` as a lake file (ids, hashes; row groups of its writer's bytes)."""
    import pyarrow.parquet as pq

    from combined.lake import ROW_GROUP_ROWS
    from combined.lake._files import ROW_GROUP_BYTES
    from combined.protocol.identity import compute_identity

    table = pa.Table.from_batches([inserts]).select(["id", "n", *names])
    ids, hashes = compute_identity(table, ["id"], ["id", "n", *names])
    table = table.append_column("_combined_id", ids).append_column("_combined_payload_hash", hashes)
    rows = max(1, min(ROW_GROUP_ROWS, ROW_GROUP_BYTES * table.num_rows // table.nbytes))
    root.mkdir()
    pq.write_table(table, root / "part-0.parquet", row_group_size=rows, compression="zstd")


def case(root: Path) -> dict[str, Any]:
    """Reduce the change stream staged under ``root`` in this process: its outcome and costs."""
    from combined.capture._reduce import Reducer
    from combined.delivery import part_schema

    parts = sorted((root / "staging").rglob("*.arrow"), key=lambda p: p.stat().st_mtime_ns)
    schema = part_schema(parts[-1])
    constants = {"observed_at": "2026-12-05T00:00:00+00:00", "run_id": "r", "position": None}
    constants |= {"ingested_at": "2026-12-05T00:00:01+00:00", "producer": "bench"}
    started, cpu = time.perf_counter(), time.process_time()
    outcome, rows, r = "ok", 0, None
    try:
        r = Reducer(
            capture_files=parts,
            capture_schema=schema,
            current_files=[str(f) for f in sorted((root / "lake").glob("*.parquet"))],
            key=["id"],
            strategy="cdc",
            sync_mode="incremental",
            memory_limit=MEMORY,
            spill_dir=root,
            baseline=False,
        )
        r.reduce()
        r.release()
        rows = sum(b.num_rows for b in r.output(constants, 1000))
    except Exception as exc:  # (the outcome of the case, printed)
        outcome = f"{type(exc).__name__}: {str(exc).splitlines()[0][:90]}"
    finally:
        if r is not None:
            r.close()
    return {
        "rows": rows,
        "wall_s": round(time.perf_counter() - started, 2),
        "cpu_s": round(time.process_time() - cpu, 2),
        # (VmHWM: ru_maxrss keeps a bigger parent's across exec, a pytest worker's)
        "peak_rss_mb": read_status("self")["VmHWM"] // MIB,
        "outcome": outcome,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--kinds", nargs="+", default=list(KINDS), choices=list(KINDS))
    p.add_argument("--widths", nargs="+", type=int, default=[2_000, 20_000, 100_000])
    p.add_argument("--repeats", nargs="+", type=int, default=[1], help="updates of each id")
    p.add_argument("--lake", action="store_true", help="the inserts are the lake's rows")
    p.add_argument("--stage", nargs=7, help=argparse.SUPPRESS)  # (a child: root kind w c f r l)
    p.add_argument("--case", help=argparse.SUPPRESS)  # (a child: the root it reduces)
    args = p.parse_args()
    if args.stage:
        root, kind, width, cols, filled, repeats, lake = args.stage
        _stage(Path(root), kind, int(width), int(cols), int(filled), int(repeats), lake == "1")
        return
    if args.case:
        print(json.dumps(case(Path(args.case))))
        return
    print("| shape | rows out | wall s | CPU s | peak RSS MB | outcome |")
    print("| --- | --- | --- | --- | --- | --- |")
    cases = [(k, w, c, f) for k in args.kinds for w in args.widths for c, f in SHAPES]
    for (kind, width, cols, filled), repeats in itertools.product(cases, args.repeats):
        c = _child(kind, width, cols, filled, repeats, args.lake)
        again = f", {repeats} updates an id" if repeats > 1 else ""
        again += ", inserted in the lake" if args.lake else ""
        print(
            f"| {kind} {width:,} B x {cols} ({filled} filled{again}) | {c['rows']:,} "
            f"| {c['wall_s']} | {c['cpu_s']} | {c['peak_rss_mb']} | {c['outcome']} |",
            flush=True,
        )


def _child(
    kind: str, width: int, cols: int, filled: int, repeats: int = 1, lake: bool = False
) -> dict[str, Any]:
    """One case: staged by a process, reduced by another (its peak its own), then erased."""
    root = Path(tempfile.mkdtemp(prefix="reduce-shapes-"))
    try:
        me = [sys.executable, "-m", "bench.reduce_shapes"]
        stage = [str(root), kind, str(width), str(cols), str(filled), str(repeats), str(int(lake))]
        subprocess.run([*me, "--stage", *stage], check=True)
        out = subprocess.run([*me, "--case", str(root)], capture_output=True, text=True, check=True)
        result: dict[str, Any] = json.loads(out.stdout.splitlines()[-1])
        return result
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
