"""Row changes parsed a batch at a time (``_tuples``) equal the one-message decoder's rows.

The messages are the ones captured from a real PostgreSQL
(``data/pgoutput_v1.hex``, see ``test_pgoutput.py``): every row change of
them, kept as bytes and parsed at once, must give each column's kinds and
values exactly as :func:`decode_message` gives them, and refuse what it
refuses.
"""

from __future__ import annotations

import pyarrow as pa
import pytest
from tests.connectors.postgres.test_pgoutput import V1, read_fixture

from combined.connectors.postgres._pgoutput import (
    Delete,
    Insert,
    TupleData,
    Update,
    arrow_type,
    decode_message,
    text_to_arrow,
)
from combined.connectors.postgres._tuples import encode_tuple, parse_tuples
from combined.errors import SchemaMismatch, SourceError


def _rows() -> dict[tuple[int, int], list[tuple[bytes, TupleData]]]:
    """Row changes whose tuple starts at byte 6, with the decoded tuple, by relation and width."""
    out: dict[tuple[int, int], list[tuple[bytes, TupleData]]] = {}
    for _, data in read_fixture(V1):
        msg = decode_message(data)
        if isinstance(msg, Insert) or (isinstance(msg, Update) and msg.old is None):
            out.setdefault((msg.relation_oid, len(msg.new)), []).append((data, msg.new))
        elif isinstance(msg, Delete):
            out.setdefault((msg.relation_oid, len(msg.old)), []).append((data, msg.old))
    return out


def test_a_batch_parses_as_every_message_decodes() -> None:
    rows = _rows()
    assert sum(map(len, rows.values())) >= 5
    for batch in rows.values():
        width = len(batch[0][1])
        parsed = parse_tuples([d for d, _ in batch], [6] * len(batch), width, "t")
        for i, (_, row) in enumerate(batch):
            assert bytes(parsed.kinds[i]).decode() == row.kinds
        for j in range(width):
            assert parsed.columns[j].to_pylist() == [row.values[j] for _, row in batch]


def test_encoded_rows_parse_back_beside_wire_rows() -> None:
    data, row = next(r for b in _rows().values() for r in b if len(r[1]) > 1)
    made = TupleData("u" + row.kinds[1:], (None, *row.values[1:]))
    parsed = parse_tuples([data, encode_tuple(made), data], [6, 0, 6], len(row), "t")
    assert [bytes(k).decode() for k in parsed.kinds] == [row.kinds, made.kinds, row.kinds]
    assert parsed.columns[0].to_pylist() == [row.values[0], None, row.values[0]]


def test_broken_rows_are_refused_as_the_decoder_refuses_them() -> None:
    good = b"I\0\0\0\x01N\0\x02t\0\0\0\x012n"
    assert parse_tuples([good], [6], 2, "t").columns[0].to_pylist() == [b"2"]
    for cut in range(7, len(good)):
        with pytest.raises(SourceError, match="truncated|trailing"):
            parse_tuples([good, good[:cut], good], [6, 6, 6], 2, "t")
    with pytest.raises(SourceError, match="trailing"):
        parse_tuples([good + b"n"], [6], 2, "t")
    with pytest.raises(SourceError, match="unknown tuple column kind 'x'"):
        parse_tuples([good[:-1] + b"x"], [6], 2, "t")
    with pytest.raises(SourceError, match="truncated"):
        parse_tuples([b"I\0\0\0\x01N\0\x01t\xff\xff\xff\xff"], [6], 1, "t")  # length -1
    with pytest.raises(SchemaMismatch, match="has 2 columns, its relation message 3"):
        parse_tuples([good], [6], 3, "t")


def test_arrays_split_by_arrow_equal_the_per_value_parse() -> None:
    plain = [b"{a,NULL,b}", None, b"{}", b"{x}", b"{1.5,-2}"]
    quoted = [*plain, b'{"a b","c,d",NULL,"NULL"}']
    texts = arrow_type(1009)
    # Without a quoted element the column is split by Arrow, else value by value.
    assert text_to_arrow(plain, texts, "c").to_pylist() == [
        ["a", None, "b"],
        None,
        [],
        ["x"],
        ["1.5", "-2"],
    ]
    assert text_to_arrow(quoted, texts, "c").to_pylist()[-1] == ["a b", "c,d", None, "NULL"]
    assert (
        text_to_arrow(quoted, texts, "c").to_pylist()[:-1]
        == text_to_arrow(plain, texts, "c").to_pylist()
    )
    ints = text_to_arrow(pa.array([b"{1,NULL,3}", b"{}"], pa.binary()), arrow_type(1007), "c")
    assert ints.to_pylist() == [[1, None, 3], []]
