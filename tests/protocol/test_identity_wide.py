"""A payload of hundreds of nullable columns: its text built in stages, the same digests.

DuckDB holds a 2,048-row vector for every node of an expression: one
statement concatenating 1,200 nullable columns' texts held ~240 MB whatever
the rows (a 300-column table of mostly NULL values took a capture to 402-424
MB). ``compute_identity`` builds such a text ``STAGE_COLUMNS`` columns a
statement.
"""

from __future__ import annotations

import datetime as dt
import decimal
import hashlib
import subprocess
import sys
import textwrap

import duckdb
import pyarrow as pa

from combined.protocol import identity
from combined.protocol.identity import (
    compute_identity,
    compute_payload_hash,
    duckdb_compatible,
    identity_text_sql,
    payload_text_sql,
)

_KINDS = (
    (pa.int32(), lambda r: r * 7),
    (pa.string(), lambda r: f"v{r}-é"),
    (pa.decimal128(12, 2), lambda r: decimal.Decimal(r) / 4),
    (pa.timestamp("us", tz="UTC"), lambda r: dt.datetime(2021, 3, 28, tzinfo=dt.UTC)),
    (pa.list_(pa.string()), lambda r: ["a", None, str(r)]),
    (pa.bool_(), lambda r: r % 3 == 0),
)


def _wide(columns: int, rows: int) -> pa.Table:
    """``id`` and ``columns`` columns of mixed types, most values NULL, one column never."""
    data: dict[str, pa.Array] = {"id": pa.array(range(rows), pa.int64())}
    for i in range(columns):
        t, value = _KINDS[i % len(_KINDS)]
        data[f"c{i}"] = pa.array(
            [value(r) if (r + i) % 4 == 0 or i == 5 else None for r in range(rows)], t
        )
    return pa.table(data)


def _md5(text: str) -> bytes:
    return hashlib.md5(text.encode("utf-8")).digest()


def test_a_wide_payload_is_hashed_as_its_reference_text() -> None:
    table = _wide(3 * identity.STAGE_COLUMNS + 17, 50)
    names = table.column_names
    con = duckdb.connect()
    con.register("data", duckdb_compatible(table))
    for key in (["id"], ["c1", "id"]):
        texts = f"{identity_text_sql(key, table.schema)}, {payload_text_sql(names, table.schema)}"
        sql = f"SELECT {texts} FROM data"
        reference = con.sql(sql).fetchall()
        for digest in ("binary", "hex"):
            ids, hashes = compute_identity(table, key, names, digest=digest)
            raw = [(_md5(a), _md5(b)) for a, b in reference]
            want = [(a.hex(), b.hex()) for a, b in raw] if digest == "hex" else raw
            assert list(zip(ids.to_pylist(), hashes.to_pylist(), strict=True)) == want
    alone = compute_payload_hash(table, names, digest="binary")
    assert alone.to_pylist() == [_md5(b) for _, b in reference]


def test_a_source_column_named_like_the_staged_text() -> None:
    table = _wide(identity.STAGE_COLUMNS + 2, 5).append_column(
        "__combined_acc", pa.array(["x"] * 5)
    )
    names = table.column_names
    con = duckdb.connect()
    con.register("data", duckdb_compatible(table))
    sql = f"SELECT {payload_text_sql(names, table.schema)} FROM data LIMIT 1"
    ((text,),) = con.sql(sql).fetchall()
    assert compute_payload_hash(table, names, digest="binary")[0].as_py() == _md5(text)


_PROBE = textwrap.dedent(
    """
    import sys
    import duckdb, pyarrow as pa
    from combined.protocol.identity import compute_identity
    def hwm():
        for line in open("/proc/self/status"):
            if line.startswith("VmHWM"):
                return int(line.split()[1])
    n, rows = int(sys.argv[1]), 4096
    cols = {"id": pa.array(range(rows), pa.int64())}
    for i in range(n):
        cols[f"c{i}"] = pa.array([None if r % 20 else r for r in range(rows)], pa.int32())
    t = pa.table(cols)
    con = duckdb.connect(":memory:", config={"threads": 1})
    compute_identity(t.select(["id", "c0"]), ["id"], con=con, digest="binary")
    before = hwm()
    compute_identity(t, ["id"], con=con, digest="binary")
    print(hwm() - before)
    """
)


def _hashing_growth(columns: int) -> int:
    """KB the resident set's high-water mark grows by hashing 4,096 rows of ``columns`` columns."""
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, str(columns)],
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    )
    return int(done.stdout.strip())


def test_hashing_memory_does_not_grow_with_the_columns() -> None:
    # One statement over every column: 44 MB at 200 nullable columns, 319 MB
    # at 1,600 (7x). In stages: 27-33 and 57-85 MB (2-3x), the text so far
    # its growth.
    few, many = _hashing_growth(200), _hashing_growth(1600)
    assert many < 4.5 * few, (few, many)
