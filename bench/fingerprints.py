"""A snapshot re-capture's reduction steps in process, at several sizes: is each linear?

Synthetic staged parts (Arrow IPC) and lake files (Parquet) of random 16-byte
digests, no database: the re-capture holds every lake row but 0.1%
(deleted), 1% with another payload hash, and 0.5% new rows. Each step runs
in a fresh process (its peak RSS is its own): ``prints``, the re-capture's
fingerprint step (``Reducer.by_fingerprints``), and ``baseline``, a first
baseline's digest terms (``Reducer.reduce``, ``_stats_all_new``)::

    python -m bench.fingerprints --rows 5000000 20000000 --workdir /tmp/fp

The data stays in ``--workdir`` (a directory per size) for the next run.
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

PART_ROWS = 1_000_000
LAKE_FILE_ROWS = 2_500_000
SCHEMA = pa.schema(
    [
        ("id", pa.int64()),
        ("s", pa.int16()),
        ("_combined_ordinal", pa.int64()),
        ("_combined_id", pa.binary()),
        ("_combined_payload_hash", pa.binary()),
    ]
)


def _binary(rows: np.ndarray) -> pa.Array:
    """A binary array of the (n, 16) bytes ``rows``."""
    n = len(rows)
    offsets = np.arange(0, 16 * n + 1, 16, dtype=np.int32)
    return pa.Array.from_buffers(
        pa.binary(), n, [None, pa.py_buffer(offsets), pa.py_buffer(rows.tobytes())]
    )


def _write_parts(root: Path, tag: str, ids: np.ndarray, hashes: np.ndarray) -> None:
    for k, start in enumerate(range(0, len(ids), PART_ROWS)):
        n = min(PART_ROWS, len(ids) - start)
        numbers = pa.array(np.arange(start, start + n))
        columns = [numbers, pa.array(np.zeros(n, np.int16)), numbers]
        columns += [_binary(ids[start : start + n]), _binary(hashes[start : start + n])]
        with pa.ipc.new_file(str(root / f"{tag}{k:04d}.arrow"), SCHEMA) as writer:
            writer.write_table(pa.Table.from_arrays(columns, schema=SCHEMA))


def make(root: Path, rows: int) -> None:
    """The lake's files, a first baseline's parts and a re-capture's parts, once."""
    if (root / "done").exists():
        return
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(25)
    ids = rng.integers(0, 256, (rows, 16), dtype=np.uint8)
    hashes = rng.integers(0, 256, (rows, 16), dtype=np.uint8)
    for k, start in enumerate(range(0, rows, LAKE_FILE_ROWS)):
        end = min(start + LAKE_FILE_ROWS, rows)
        table = pa.table(
            {
                "_combined_id": _binary(ids[start:end]),
                "_combined_payload_hash": _binary(hashes[start:end]),
                "id": pa.array(np.arange(start, end)),
            }
        )
        pq.write_table(table, root / f"lake{k}.parquet", row_group_size=1_000_000)
    _write_parts(root, "base", ids, hashes)
    n = np.arange(rows)
    changed = hashes.copy()
    changed[n % 100 == 50, 0] ^= 1
    kept = n % 1000 != 7
    new = rows // 200
    again_ids = np.concatenate([ids[kept], rng.integers(0, 256, (new, 16), dtype=np.uint8)])
    again_hashes = np.concatenate([changed[kept], rng.integers(0, 256, (new, 16), np.uint8)])
    _write_parts(root, "again", again_ids, again_hashes)
    (root / "done").touch()


def _peak_mb() -> float:
    """This process's peak RSS (``VmHWM``: ``ru_maxrss`` keeps the parent's across exec)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def step(root: Path, what: str) -> None:
    """Time one step in this process and print it."""
    from combined.capture._reduce import Reducer

    lake = sorted(str(p) for p in root.glob("lake*.parquet"))
    spill = root / "spill"
    spill.mkdir(exist_ok=True)
    again = what == "prints"
    r = Reducer(
        capture_files=sorted(root.glob("again*.arrow" if again else "base*.arrow")),
        capture_schema=SCHEMA,
        current_files=lake if again else [],
        key=["id"],
        strategy="snapshot",
        sync_mode="incremental",
        memory_limit=256 * 2**20,
        spill_dir=spill,
        baseline=not again,
    )
    cpu, wall = time.process_time(), time.perf_counter()
    found = r.by_fingerprints() if again else r.reduce()
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    peak = _peak_mb()
    r.close()
    print(f"{what:8} {root.name:>10}: {cpu:6.2f} CPU-s {wall:6.2f} s wall, peak {peak:.0f} MB")
    print(f"{'':8} {found}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[5_000_000, 20_000_000])
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--steps", nargs="+", default=["prints", "baseline"])
    parser.add_argument("--step", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.step:
        step(args.workdir, args.step)
        return
    for rows in args.rows:
        root = args.workdir / f"rows{rows}"
        make(root, rows)
        for what in args.steps:
            command = [sys.executable, "-m", "bench.fingerprints", "--workdir", str(root)]
            subprocess.run([*command, "--step", what], check=True)


if __name__ == "__main__":
    main()
