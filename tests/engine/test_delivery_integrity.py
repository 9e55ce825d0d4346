"""A Delivery altered after staging never enters the lake (issue 20, item 5).

Reproduction on the code before the check: rewrite a staged Delivery of a
Run between its staging and its commit (one row added), and the Run
committed and published the altered file: the commit never compared the
Delivery with its recorded content hash and record count.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from combined.engine import Engine


def _tamper_at_staging(
    monkeypatch: pytest.MonkeyPatch, engine: Engine, change: Callable[[Path], None]
) -> None:
    """Apply ``change`` to the orders' staged Deliveries when the Run reaches its commit."""
    from combined.runtime import _runner
    from combined.runtime._faults import fault as real

    def fault(point: str) -> None:
        if point == "after_staging":
            staged = sorted(engine.layout.staging_area().glob("*/shop/orders/deliveries/*"))
            assert staged
            change(staged[0])
        real(point)

    monkeypatch.setattr(_runner, "fault", fault)


def _one_row_more(path: Path) -> None:
    table = pq.read_table(path)
    pq.write_table(pa.concat_tables([table, table.slice(0, 1)]), path)


def _one_byte_flipped(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("change", [_one_row_more, _one_byte_flipped])
def test_a_delivery_altered_after_staging_fails_the_run_for_review_and_commits_nothing(
    tmp_path: Path, tools: Any, monkeypatch: pytest.MonkeyPatch, change: Callable[[Path], None]
) -> None:
    tools.make(tmp_path)
    engine = Engine.open(tmp_path / "combined.yaml")
    try:
        (first,) = engine.capture()
        assert first.state == "succeeded", first.error
        tools.sql(tmp_path, "UPDATE orders SET status = 'shipped' WHERE id <= 5;")
        before = {
            n: engine.layout.dataset_table("shop", n).version() for n in ("orders", "customers")
        }
        publications = len(engine.publications(100))
        _tamper_at_staging(monkeypatch, engine, change)
        (run,) = engine.capture()
        assert run.state == "needs_review", run.error
        error = run.error or ""
        assert "shop.orders: Delivery " in error and "(sequence " in error, error
        assert "committed nothing" in error
        after = {
            n: engine.layout.dataset_table("shop", n).version() for n in ("orders", "customers")
        }
        assert after == before
        assert len(engine.publications(100)) == publications
        monkeypatch.undo()
        (again,) = engine.capture()
        assert again.state == "succeeded", again.error
        shipped = engine.sql("SELECT count(*) AS n FROM shop.orders WHERE status = 'shipped'")
        assert shipped.to_pylist() == [{"n": 5}]
        assert engine.sql("SELECT count(*) AS n FROM shop.orders").to_pylist() == [{"n": 200}]
    finally:
        engine.close()
