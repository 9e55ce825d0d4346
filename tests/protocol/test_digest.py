"""How a table's digests are stored: identity encoding v1 (hex) and v2 (binary)."""

from __future__ import annotations

import hashlib

import duckdb
import pyarrow as pa

from combined.protocol import _digest as dg


def test_a_tables_schema_tells_its_format_and_a_new_table_is_v2() -> None:
    def schema(t: pa.DataType) -> pa.Schema:
        return pa.schema([("id", pa.int64()), ("_combined_id", t)])

    assert dg.digest_of(None) == "binary" == dg.DEFAULT_DIGEST
    assert dg.digest_of(pa.schema([("id", pa.int64())])) == "binary"
    for t in (pa.string(), pa.large_string(), pa.string_view()):
        assert dg.digest_of(schema(t)) == "hex"
    for t in (pa.binary(), pa.binary(16), pa.large_binary(), pa.binary_view()):
        assert dg.digest_of(schema(t)) == "binary"
    assert dg.ENCODING_VERSION == {"hex": 1, "binary": 2}


def test_converting_between_formats_is_exact_both_ways() -> None:
    texts = ["c1e1:1", "c1s0:", "c1e2:42s7:eu-west"]
    con = duckdb.connect()
    try:
        con.execute("CREATE TABLE t AS SELECT unnest(?) AS x", [texts])
        rows = con.execute(
            f"SELECT {dg.md5_sql('x', 'hex')}, {dg.md5_sql('x', 'binary')}, "
            f"{dg.as_sql(dg.md5_sql('x', 'binary'), 'binary', 'hex')}, "
            f"{dg.as_sql(dg.md5_sql('x', 'hex'), 'hex', 'binary')} FROM t ORDER BY x"
        ).fetchall()
    finally:
        con.close()
    for text, (hexed, raw, to_hex, to_raw) in zip(sorted(texts), rows, strict=True):
        digest = hashlib.md5(text.encode()).digest()
        assert raw == to_raw == digest and hexed == to_hex == digest.hex()
        assert dg.digest_text(raw) == hexed == dg.digest_text(hexed)


def test_the_v1_row_term_is_unchanged_and_v2_hashes_the_32_bytes() -> None:
    # A v1 table's running content digest continues: the term is what it always was.
    assert dg.pair_term_sql("id", "h", "hex") == "md5_number(id || '|' || h || '')"
    con = duckdb.connect()
    try:
        (term,) = con.execute(
            f"SELECT {dg.pair_term_sql('unhex(md5(?))', 'unhex(md5(?))', 'binary')}", ["a", "b"]
        ).fetchall()[0]
    finally:
        con.close()
    expected = hashlib.md5(hashlib.md5(b"a").digest() + hashlib.md5(b"b").digest()).digest()
    assert term == int.from_bytes(expected, "little")
