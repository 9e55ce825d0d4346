"""MAR of a first capture by reference to its Deliveries, copied before a retention removes them."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from tests.conftest import make_shop, shop_sql

from combined.catalog import data as cat
from combined.engine import Engine
from combined.usage import month_counts
from combined.usage._refs import keep_billed

ROWS = 30_000


def _usage_rows(engine: Engine) -> pa.Table:
    table = engine.layout.usage_table("shop", "orders")
    return engine.layout.store.dataset(table.files(), table.schema()).to_table()


def _delivery_names(engine: Engine) -> list[str]:
    with engine.catalog.begin() as conn:
        found = cat.deliveries(conn, source="shop", dataset="orders")
    return sorted(d.path.rsplit("/", 1)[-1] for d in found)


def _billed(engine: Engine) -> dict[str, Any]:
    (row,) = [u for u in engine.usage() if u["dataset"] == "orders"]
    counts = {k: row[k] for k in ("mar", "inserts", "updates", "deletes")}
    assert counts == month_counts(engine.layout, "shop", "orders", row["month"])  # recounted
    return counts


def _capture(engine: Engine) -> None:
    (run,) = engine.capture(["shop.orders"])
    assert run.state == "succeeded", run.error


@pytest.fixture
def engine(tmp_path: Path) -> Any:
    project = make_shop(tmp_path, orders=ROWS)
    declared = "      orders:\n        key: [id]\n"
    project.write_text(
        project.read_text().replace(declared, declared + "        retention: {raw: 1s}\n")
    )
    opened = Engine.open(project)
    yield opened
    opened.close()


def test_a_first_capture_bills_its_deliveries_by_reference(engine: Engine, tmp_path: Path) -> None:
    _capture(engine)
    first = len(_delivery_names(engine))
    rows = _usage_rows(engine)
    # one row a Delivery, naming it; not a copy of each of its 30,000 ids
    assert rows.num_rows == rows.column("_combined_id").null_count
    assert sorted(rows.column("delivery").to_pylist()) == _delivery_names(engine)
    assert _billed(engine) == {"mar": ROWS, "inserts": ROWS, "updates": 0, "deletes": 0}

    shop_sql(
        tmp_path,
        "UPDATE orders SET status = 'shipped' WHERE id <= 10;"
        f"DELETE FROM orders WHERE id > {ROWS - 5};"
        "INSERT INTO orders VALUES (99999, 1, 'placed', 1.0);",
    )
    _capture(engine)
    # the second capture's pairs are compared with the referenced ids: only
    # its 16 new pairs are written, and none of its ids is a new identity
    copies = _usage_rows(engine).filter(pc.is_valid(pc.field("_combined_id")))
    assert copies.num_rows == 16
    assert _billed(engine) == {"mar": ROWS + 1, "inserts": ROWS + 1, "updates": 10, "deletes": 5}
    _capture(engine)  # unchanged: nothing more
    assert _usage_rows(engine).num_rows == first + 16


def test_a_retention_copies_the_referenced_ids_before_their_deliveries_go(
    engine: Engine, tmp_path: Path
) -> None:
    _capture(engine)
    shop_sql(tmp_path, "UPDATE orders SET status = 'shipped' WHERE id <= 10;")
    _capture(engine)
    names = _delivery_names(engine)
    before = _billed(engine)
    later = datetime.now(UTC) + timedelta(seconds=1.2)
    (report,) = engine.maintain(["shop.orders"], now=later)
    assert report["raw_removed"] == len(names)
    assert not any(engine.layout.store.exists(d) for d in _paths(engine))
    rows = _usage_rows(engine)
    # every referenced id is now a row of the usage table, named after its Delivery
    assert rows.column("_combined_id").null_count == 0
    assert rows.num_rows == ROWS + 10
    assert set(rows.column("delivery").drop_null().to_pylist()) < set(names)
    assert _billed(engine) == before
    # the first capture's rows are still known: updating them bills no new identity
    shop_sql(tmp_path, "UPDATE orders SET status = 'late' WHERE id BETWEEN 100 AND 109;")
    _capture(engine)
    assert _billed(engine) == {**before, "updates": 20}
    # done once: nothing references the removed Deliveries any more
    assert keep_billed(engine.layout, ("shop", "orders"), names) == 0


def _paths(engine: Engine) -> list[str]:
    with engine.catalog.begin() as conn:
        return [d.path for d in cat.deliveries(conn, source="shop", dataset="orders")]
