"""Rows of large byte strings hashed in pieces: the same digests as the SQL and the reference."""

from __future__ import annotations

import gc
import os
from typing import Any

import duckdb
import pyarrow as pa
import pytest
from tests._memory import anonymous_growth

from combined.protocol import _identity_streamed
from combined.protocol._digest import BINARY, HEX, Digest
from combined.protocol.identity import (
    compute_identity,
    identity_python,
    payload_hash_python,
    payload_hash_sql,
    streamed_payload_hash_sql,
)

MB = 1 << 20


def _table() -> pa.Table:
    """Byte strings large and small, empty and null, among other members, in several types."""
    return pa.table(
        {
            "id": pa.array([1, 2, 3, 4, 5], pa.int64()),
            "blob": pa.array([os.urandom(3 * MB), b"ab", None, b"", os.urandom(MB + 1)]),
            "é wide": pa.array(
                [None, os.urandom(2 * MB), b"\x00", os.urandom(10), b"z"], pa.large_binary()
            ),
            "fixed": pa.array([b"abcd", None, b"\xff\x00\x01\x02", b"    ", b"wxyz"], pa.binary(4)),
            "note": pa.array(["ünï", None, "", "a'b", "x" * 100]),
            "s": pa.array(
                [{"a": 1}, None, {"a": None}, {"a": 3}, {"a": 4}], pa.struct([("a", pa.int32())])
            ),
            "zz": pa.array([b"last", b"", None, os.urandom(MB), b"q"]),
        }
    )


@pytest.fixture
def hashed(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The rows of each call of the function that hashes in pieces."""
    rows: list[int] = []
    digests = _identity_streamed._digests

    def counted(*pieces: pa.Array, **kwargs: Any) -> pa.Array:
        rows.append(len(pieces[0]))
        return digests(*pieces, **kwargs)

    monkeypatch.setattr(_identity_streamed, "_digests", counted)
    monkeypatch.setattr(_identity_streamed, "_FUNCTIONS", {})  # (each made anew, counted)
    return rows


@pytest.mark.parametrize("digest", [HEX, BINARY])
@pytest.mark.parametrize("large", [0, MB, 1 << 40])
def test_streamed_digests_equal_the_sqls_and_the_references(digest: Digest, large: int) -> None:
    # (0: every row in pieces; a megabyte: some; 2**40: none)
    table = _table()
    con = duckdb.connect()
    con.register("t", table)
    columns = table.column_names
    streamed = streamed_payload_hash_sql(con, columns, table.schema, digest, large=large)
    whole = payload_hash_sql(columns, table.schema, digest)
    got = [r[0] for r in con.execute(f"SELECT {streamed} FROM t ORDER BY id").fetchall()]
    assert got == [r[0] for r in con.execute(f"SELECT {whole} FROM t ORDER BY id").fetchall()]
    reference = [payload_hash_python(row, table.schema) for row in table.to_pylist()]
    assert [g if digest == HEX else g.hex() for g in got] == reference


def test_only_rows_over_the_bound_are_hashed_in_pieces(hashed: list[int]) -> None:
    values = [os.urandom(MB + 1) if i % 1000 == 0 else b"x" for i in range(5000)]
    table = pa.table({"id": pa.array(range(5000), pa.int64()), "blob": pa.array(values)})
    con = duckdb.connect()
    con.register("t", table)
    streamed = streamed_payload_hash_sql(con, table.column_names, table.schema, BINARY)
    whole = payload_hash_sql(table.column_names, table.schema, BINARY)
    differ = con.execute(f"SELECT count(*) FROM t WHERE {streamed} IS DISTINCT FROM {whole}")
    assert differ.fetchall() == [(0,)]
    assert sum(hashed) == 5


def test_a_payload_without_byte_strings_keeps_the_sql() -> None:
    schema = pa.schema([("id", pa.int64()), ("note", pa.string())])
    con = duckdb.connect()
    assert streamed_payload_hash_sql(con, schema.names, schema, BINARY) == payload_hash_sql(
        schema.names, schema, BINARY
    )


def test_a_large_byte_string_is_hashed_without_its_hex_in_memory() -> None:
    # The SQL builds the hex, its lowercase copy and the row's text before md5
    # reads them: ~6 times the value's bytes (192 MB for 32). In pieces: the
    # value as DuckDB reads it and hands it over, a megabyte of hex at a time
    # (66 MB).
    size = 32 * MB
    table = pa.table({"id": pa.array([1], pa.int64()), "blob": pa.array([os.urandom(size)])})
    con = duckdb.connect()
    con.execute("SET threads = 1")
    con.register("t", table)
    streamed = streamed_payload_hash_sql(con, table.column_names, table.schema, BINARY)
    whole = payload_hash_sql(table.column_names, table.schema, BINARY)
    grown = {}
    for name, sql in (("streamed", streamed), ("whole", whole)):
        with anonymous_growth() as held:
            (digest,) = con.execute(f"SELECT {sql} FROM t").fetchall()[0]
        grown[name] = held[0]
        assert digest == bytes.fromhex(payload_hash_python(table.to_pylist()[0], table.schema))
    assert grown["streamed"] < 3 * size, {k: v >> 20 for k, v in grown.items()}
    assert grown["whole"] > 4 * size, {k: v >> 20 for k, v in grown.items()}


@pytest.mark.parametrize("digest", [HEX, BINARY])
def test_staging_hashes_a_batch_of_large_byte_strings_in_pieces_with_the_same_digests(
    digest: Digest, hashed: list[int]
) -> None:
    table = _table()
    con = duckdb.connect()
    for _ in range(3):  # (batch after batch on one connection: one function)
        ids, hashes = compute_identity(table, ["id"], con=con, digest=digest)
        got = [h if digest == HEX else h.hex() for h in hashes.to_pylist()]
        assert got == [payload_hash_python(row, table.schema) for row in table.to_pylist()]
        expected_ids = [identity_python([i], [pa.int64()]) for i in table.column("id").to_pylist()]
        assert [i if digest == HEX else i.hex() for i in ids.to_pylist()] == expected_ids
    assert hashed == [4, 4, 4]  # (the rows of over 64 kB: 1, 2, 4 and 5)
    functions = "SELECT count(*) FROM duckdb_functions() WHERE function_name LIKE '_combined%'"
    assert con.execute(functions).fetchall() == [(1,)]


def test_the_function_outlives_the_cursor_it_was_created_on() -> None:
    # A reduction's database may stay open for the next one (a small
    # capture's), each reduction on a cursor of its own: the function created
    # on the first cursor stays in the database's catalog when the cursor
    # closes, and the next reduction calls it (a freed callable crashed it).
    table = _table()
    expected = [payload_hash_python(row, table.schema) for row in table.to_pylist()]
    database = duckdb.connect()
    for _ in range(3):
        cursor = database.cursor()
        _, hashes = compute_identity(table, ["id"], con=cursor, digest=BINARY)
        cursor.close()
        gc.collect()
        assert [h.hex() for h in hashes.to_pylist()] == expected
    database.close()
