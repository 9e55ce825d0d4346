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


def _md5_number(data: bytes) -> int:
    return int.from_bytes(hashlib.md5(data).digest(), "little")


def test_the_v1_row_term_is_unchanged_and_v2_hashes_the_32_bytes() -> None:
    # A v1 table's running content digest continues: the term is the md5 of
    # `id|hash` (then the ordinal of an event stream's row), as it always was.
    a, b = hashlib.md5(b"a").digest(), hashlib.md5(b"b").digest()
    seven = "'|' || 7::VARCHAR"
    terms = [
        dg.pair_term_sql("md5(?)", "md5(?)", "hex"),
        dg.pair_term_sql("md5(?)", "md5(?)", "hex", seven),
        dg.pair_term_sql("unhex(md5(?))", "unhex(md5(?))", "binary"),
        dg.pair_term_sql("unhex(md5(?))", "unhex(md5(?))", "binary", seven),
    ]
    con = duckdb.connect()
    try:
        row = con.execute(f"SELECT {', '.join(terms)}", ["a", "b"] * 4).fetchall()[0]
    finally:
        con.close()
    v1 = f"{a.hex()}|{b.hex()}".encode()
    assert row == (
        _md5_number(v1),
        _md5_number(v1 + b"|7"),
        _md5_number(a + b),
        _md5_number(a + b + b"|7"),
    )


def test_a_row_term_concatenates_nothing_but_its_digests_outside_an_event_stream() -> None:
    # Every sync mode but append gives the term an empty ordinal: concatenated
    # anyway, it cost each row another copy of its 32 bytes (a tenth of the term).
    con = duckdb.connect()
    try:
        con.execute("CREATE TABLE t (i BLOB, h BLOB, x VARCHAR, y VARCHAR, ord BIGINT)")

        def concatenations(term: str) -> int:
            plan = con.execute(f"EXPLAIN SELECT bit_xor({term}) FROM t").fetchall()[0][1]
            return str(plan).count("||")

        assert concatenations(dg.pair_term_sql("i", "h", "binary")) == 1
        assert concatenations(dg.pair_term_sql("x", "y", "hex")) == 2
        assert concatenations(dg.pair_term_sql("i", "h", "binary", "'|' || ord::VARCHAR")) == 3
    finally:
        con.close()


def test_a_keyless_rows_id_is_its_content_and_number_in_both_formats() -> None:
    from combined.protocol.identity import content_id_python, content_id_sql

    payload = "1381e91965984c20c403a2fcc620c064"  # docs/identity.md, section 3
    expected = hashlib.md5(f"c1r{payload}:2".encode()).hexdigest()
    assert content_id_python(payload, 2) == expected == "d579a331efe382ecf4a977896628884d"
    con = duckdb.connect()
    row = con.execute(
        f"SELECT {content_id_sql('h', 'k', dg.HEX)}, "
        f"{content_id_sql('unhex(h)', 'k', dg.BINARY)}, "
        f"{content_id_sql('h', 'k - 1', dg.HEX)} FROM (SELECT ? AS h, 2 AS k)",
        [payload],
    ).fetchone()
    assert row is not None
    hex_id, raw_id, first = row
    assert hex_id == expected
    assert bytes(raw_id).hex() == expected
    assert first == content_id_python(payload, 1) != expected


def _digests(n: int, seed: int = 0) -> list[bytes]:
    return [hashlib.md5(f"{seed}:{i}".encode()).digest() for i in range(n)]


def _is_in(ids: pa.Array, values: pa.Array) -> list[bool]:
    import pyarrow.compute as pc

    return list(pc.is_in(ids, value_set=values.cast(ids.type)).to_pylist())


def test_a_digest_set_answers_as_a_set_lookup_does() -> None:
    held = _digests(50)
    others = _digests(20, seed=1)
    ends = [b"\x00" * 16, b"\x00" * 15 + b"\x01", b"\x01" + b"\x00" * 15]  # zero bytes at ends
    values = pa.array(held[::2] + ends[:2], pa.binary())
    asked = pa.array(held + others + ends, pa.binary())
    cases = [
        (values, asked),
        (values, asked.slice(7, 40)),  # a batch sliced out of a larger one (an offset)
        (pa.chunked_array([values.slice(0, 10), values.slice(10)]), asked),
        (
            pa.array([d.hex() for d in held[::3]]),  # v1: 32 hex digits
            pa.array([d.hex() for d in held + others]),
        ),
        (pa.array([b"ab", b"abc", None], pa.binary()), pa.array([b"ab", b"abc", b"x", None])),
        (pa.array([], pa.binary()), asked),
        (values, pa.array([], pa.binary())),
        (values, pa.array([held[0], None], pa.binary())),  # a null asked: as is_in answers
    ]
    for values_, asked_ in cases:
        flat = values_.combine_chunks() if isinstance(values_, pa.ChunkedArray) else values_
        got = dg.DigestSet(values_)(asked_).to_pylist()
        assert got == _is_in(asked_, flat), (values_, asked_)
    # Digests sharing their first 8 bytes (the key searched): stepped through, up to
    # SHARED_KEY of one key; past that, searched as byte strings.
    shared = [b"\x07" * 8 + d[8:] for d in _digests(dg.SHARED_KEY + 2, seed=3)]
    asked = pa.array(held + shared + ends, pa.binary())
    for n, by_key in ((dg.SHARED_KEY, True), (dg.SHARED_KEY + 1, False)):
        values = pa.array(held[::2] + shared[:n] + ends[:1], pa.binary())
        member = dg.DigestSet(values)
        assert (member._keys is not None) == by_key
        assert member(asked).to_pylist() == _is_in(asked, values)


def test_a_digest_set_of_words_answers_as_a_set_lookup_does() -> None:
    """Built from 16-byte digests' words alone, sorted where they lie (a commit's
    many ids): the same answers, whether digests share their first bytes (searched
    by prefix, then step by step) or so many do that the set searches byte strings."""
    import numpy as np

    held = _digests(50)
    ends = [b"\x00" * 16, b"\x00" * 15 + b"\x01", b"\x01" + b"\x00" * 15, b"\xff" * 16]
    run = dg.SHARED_KEY
    shared = [b"\x07" * 4 + d[4:] for d in _digests(run + 2, seed=2)]  # one prefix
    asked_ = held + _digests(20, seed=1) + ends + shared
    asked = pa.array(asked_, pa.binary())
    for kept, by_prefix in (
        (held[::2] + ends[1:4], True),
        (held[1::3] + shared[:run] + ends[:2], True),  # a key held SHARED_KEY times
        (held[1::3] + shared[: run + 1] + ends[:2], False),  # once more: byte strings
    ):
        words = np.frombuffer(b"".join(kept), np.uint64).reshape(-1, 2).copy()
        member = dg.DigestSet.of_words(words)
        assert (member._keys is not None) == by_prefix
        values = pa.array(kept, pa.binary())
        # (a null asked: is_in over the words, as a set of any other digests does)
        for batch in (asked, asked.slice(7, 40), pa.array([kept[0], None], pa.binary())):
            assert member(batch).to_pylist() == _is_in(batch, values)
        assert dg.DigestSet(values)(asked).to_pylist() == [d in kept for d in asked_]


def test_a_digest_set_is_built_once_for_every_batch_asked() -> None:
    """1M held digests, asked back in batches of 65,536: one sort, then binary searches,
    against a set built at each batch (``is_in``: ~0.2-0.4 CPU-s a batch)."""
    import time

    import pyarrow.compute as pc

    held = pa.array(_digests(1_000_000), pa.binary())
    batches = [held.slice(i * 65_536, 65_536) for i in range(16)]
    began = time.process_time()
    for b in batches:
        pc.is_in(b, value_set=held)
    per_batch = time.process_time() - began
    began = time.process_time()
    member = dg.DigestSet(held)
    found = sum(pc.sum(member(b)).as_py() for b in batches)
    once = time.process_time() - began
    assert found == len(held)
    assert once < per_batch / 3, (once, per_batch)


def test_fixed_width_views_every_binary_layout_in_place_and_refuses_mixed_widths() -> None:
    digests = [hashlib.md5(str(i).encode()).digest() for i in range(6)]
    for kind in (pa.binary(), pa.large_binary(), pa.binary_view()):
        sliced = pa.array(digests, kind).slice(2)
        fixed = dg.fixed_width(sliced, 16)
        assert fixed is not None and [bytes(v) for v in fixed] == digests[2:], kind
        assert dg.fixed_width(sliced, 8) is None  # not the width asked
    texts = dg.fixed_width(pa.array(["ab", "cd"], pa.large_string()))
    assert texts is not None and list(texts) == [b"ab", b"cd"]
    assert dg.fixed_width(pa.array([b"ab", b"cde"])) is None
    assert dg.fixed_width(pa.array([b"ab", None])) is None
    assert dg.fixed_width(pa.array([b"", b""])) is None  # no width to view
    assert dg.fixed_width(pa.array([], pa.binary()), 16) is not None
