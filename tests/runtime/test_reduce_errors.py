"""A reduction that runs out of its memory: what its error says, and what it never says."""

from __future__ import annotations

import duckdb
import pytest

from combined.errors import CaptureError
from combined.runtime._plan import DatasetPlan
from combined.runtime._reduce import _memory_said


def _plan(strategy: str) -> DatasetPlan:
    return DatasetPlan(
        source="pg",
        name="orders",
        relation="public.orders",
        key=("id",),
        strategy=strategy,
        sync_mode="incremental",
        cursor=None,
        columns=None,
        batch_rows=65_536,
        max_rows=1_000_000,
        max_bytes=2**30,
        drift={},
        quarantine_reader="combined",
        review_every_s=3600,
    )


@pytest.mark.parametrize("strategy", ["cdc", "snapshot"])
def test_duckdbs_out_of_memory_becomes_a_capture_error_that_shows_no_secret(
    strategy: str,
) -> None:
    # A real DuckDB out of memory: a join's build side larger than its 1 MB.
    secret = "s3cr3t-pw-4411"
    con = duckdb.connect(config={"memory_limit": "1MB", "threads": "1"})
    with pytest.raises(CaptureError) as caught, _memory_said(_plan(strategy), 256 * 2**20):
        try:
            con.execute(
                "SELECT count(*) FROM range(3000000) a JOIN "
                "(SELECT range AS r, repeat('x', 100) AS v FROM range(3000000)) b ON a.range = b.r"
            ).fetchall()
        except duckdb.OutOfMemoryException as exc:
            # (a message naming a source's DSN, as an error from a read could)
            raise duckdb.OutOfMemoryException(
                f"reading postgresql://reader:{secret}@db/shop: {exc}"
            ) from exc
    said = f"{caught.value}\n{caught.value.hint}"
    assert "pg.orders: the reduction ran out of its memory (reduction_memory: 256 MiB)" in said
    assert "raise reduction_memory in combined.yaml" in said
    assert ("combined cdc follow pg --max-changes" in said) is (strategy == "cdc")
    assert "nothing was committed" in said
    assert "postgresql://reader:***@db/shop" in said and secret not in said
