"""Row identity: the canonical text reads back in exactly one way (docs/identity.md, 1.1).

Distinct keys give distinct texts, whatever boundary moves between strings,
and null, the empty string and look-alike strings stay apart.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
from hypothesis import given
from hypothesis import strategies as st

from combined.protocol.identity import IDENTITY_ENCODING, identity_text_python


def tokens(text: str) -> list[tuple[str, str]]:
    """Parse a canonical text (after the version) into (tag, text) pairs."""
    data = text.encode("utf-8")
    assert data.startswith(IDENTITY_ENCODING.encode())
    pos, out = len(IDENTITY_ENCODING), []
    while pos < len(data):
        tag = chr(data[pos])
        colon = data.index(b":", pos)
        n = int(data[pos + 1 : colon])
        out.append((tag, data[colon + 1 : colon + 1 + n].decode("utf-8")))
        pos = colon + 1 + n
    assert pos == len(data)
    return out


_key_values = st.one_of(
    st.none(),
    st.tuples(st.just(pa.string()), st.text()),
    st.tuples(st.just(pa.int64()), st.integers(-(2**63), 2**63 - 1)),
    st.tuples(st.just(pa.binary()), st.binary()),
    st.tuples(st.just(pa.list_(pa.string())), st.lists(st.none() | st.text(), max_size=3)),
)


def _key_text(key: list[Any]) -> str:
    values = [None if k is None else k[1] for k in key]
    types = [pa.string() if k is None else k[0] for k in key]
    return identity_text_python(values, types)


def _key_meaning(key: list[Any]) -> list[Any]:
    # Distinct tags where types differ: the family, not the width, is meaning.
    return [None if k is None else (str(k[0]), k[1]) for k in key]


@given(st.lists(_key_values, min_size=1, max_size=4))
def test_canonical_text_parses_back_into_its_values(key: list[Any]) -> None:
    parsed = tokens(_key_text(key))
    assert len(parsed) == len(key)
    for (tag, text), k in zip(parsed, key, strict=True):
        if k is None:
            assert (tag, text) == ("n", "")
        elif k[0] == pa.string():
            assert (tag, text) == ("s", k[1])
        elif k[0] == pa.int64():
            assert (tag, int(text)) == ("e", k[1])
        elif k[0] == pa.binary():
            assert (tag, bytes.fromhex(text)) == ("x", k[1])
        else:
            assert tag == "l"


@given(st.lists(_key_values, min_size=1, max_size=4), st.lists(_key_values, min_size=1, max_size=4))
def test_distinct_keys_have_distinct_texts(a: list[Any], b: list[Any]) -> None:
    if _key_meaning(a) != _key_meaning(b):
        assert _key_text(a) != _key_text(b)


@given(st.lists(st.text(max_size=6), min_size=2, max_size=4), st.data())
def test_moving_a_boundary_between_strings_changes_the_text(
    parts: list[str], data: st.DataObject
) -> None:
    # The adversarial case for concatenation: the same characters split
    # differently across the key's values.
    joined = "".join(parts)
    cuts = sorted(
        data.draw(
            st.lists(st.integers(0, len(joined)), min_size=len(parts) - 1, max_size=len(parts) - 1)
        )
    )
    bounds = [0, *cuts, len(joined)]
    other = [joined[bounds[i] : bounds[i + 1]] for i in range(len(parts))]
    types = [pa.string()] * len(parts)
    if other != parts:
        assert identity_text_python(other, types) != identity_text_python(parts, types)


def test_null_empty_and_lookalike_strings_are_distinct() -> None:
    texts = {
        identity_text_python(v, [pa.string()] * len(v))
        for v in ([None], [""], ["n0:"], [None, None], ["n0:n0:"], ["", ""], ["s0:"])
    }
    assert len(texts) == 7
