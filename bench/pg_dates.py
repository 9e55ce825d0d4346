"""The PostgreSQL snapshot's date conversion (``Layout.convert``), old against new.

Usage: ``git show REV:src/combined/connectors/postgres/_types.py > /tmp/old_types.py``,
then ``PYTHONPATH=src:. python -m bench.pg_dates /tmp/old_types.py``. A 1M-row
batch of a ``date`` and a two-element ``date[]`` column is converted 20 times
per round, the two versions alternating for 6 rounds; ``--infinite`` puts
``infinity`` in 1% of the values (only the new version takes them).
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import time
from types import ModuleType

import numpy as np
import pyarrow as pa

from combined.connectors.postgres import _types as new

_ROWS, _REPEAT, _ROUNDS = 1_000_000, 20, 6
_DRIVER_INFINITY = -2_147_472_692  # what the driver makes of 'infinity'


def _module(path: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_old_pg_types", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def _batch(infinite: bool) -> pa.RecordBatch:
    rng = np.random.default_rng(1)
    days = rng.integers(-700_000, 2_900_000, _ROWS).astype(np.int32)
    items = rng.integers(0, 20_000, 2 * _ROWS).astype(np.int32)
    if infinite:
        days[::100] = _DRIVER_INFINITY
        items[::100] = _DRIVER_INFINITY
    offsets = pa.array(np.arange(0, 2 * _ROWS + 1, 2, dtype=np.int32))
    lists = pa.ListArray.from_arrays(offsets, pa.array(items).view(pa.date32()))
    return pa.RecordBatch.from_arrays([pa.array(days).view(pa.date32()), lists], ["d", "da"])


def _layout(module: ModuleType) -> object:
    plan = module.ColumnPlan
    return module.Layout.of(
        [
            plan("d", "date", "native", pa.date32(), None, check="date", base_oid=1082),
            plan(
                "da", "date[]", "native", pa.list_(pa.date32()), None,
                is_list=True, check="date", base_oid=1082,
            ),
        ]
    )  # fmt: skip


def main() -> None:
    """Print the median wall and CPU seconds of each version."""
    parser = argparse.ArgumentParser()
    parser.add_argument("old", help="the old _types.py, from git show")
    parser.add_argument("--infinite", action="store_true")
    args = parser.parse_args()
    versions = {"old": _module(args.old), "new": new}
    if args.infinite:
        versions.pop("old")
    raw = _batch(args.infinite)
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in versions}
    for round_ in range(_ROUNDS):
        order = list(versions) if round_ % 2 == 0 else list(reversed(versions))
        for name in order:
            layout = _layout(versions[name])
            cpu, wall = time.process_time(), time.perf_counter()
            for _ in range(_REPEAT):
                layout.convert(raw)  # type: ignore[attr-defined]
            times[name].append((time.perf_counter() - wall, time.process_time() - cpu))
    for name, runs in times.items():
        walls, cpus = sorted(r[0] for r in runs), sorted(r[1] for r in runs)
        print(
            f"{name}: {_REPEAT} x convert, wall median {walls[_ROUNDS // 2]:.4f} s "
            f"(min {walls[0]:.4f}), CPU median {cpus[_ROUNDS // 2]:.4f} s"
        )


if __name__ == "__main__":
    main()
