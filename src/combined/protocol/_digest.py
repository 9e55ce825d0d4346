"""How a lake table stores its digests: identity encoding v1 (hex) or v2 (binary).

Both are the md5 of the same canonical text (``docs/identity.md``, encoding
``c1``): v1 writes its 32 lowercase hex digits, v2 its 16 bytes. So the v1
digest of a row is exactly the hex of its v2 digest, and a lake written
before v2 stays comparable with one written after. A table records its
format in its own schema (the type of ``_combined_id``): a table that
exists keeps the format it was created with; a new table is v2.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from combined.protocol._identity_types import ID_COLUMN

#: A digest format: ``"hex"`` (identity encoding v1) or ``"binary"`` (v2).
Digest = Literal["hex", "binary"]

HEX: Digest = "hex"
BINARY: Digest = "binary"

#: The format of a new table.
DEFAULT_DIGEST: Digest = BINARY

#: The identity encoding version of each format (``docs/identity.md``, section 7).
ENCODING_VERSION: dict[Digest, int] = {HEX: 1, BINARY: 2}


def digest_of(schema: pa.Schema | None) -> Digest:
    """The digest format of a lake table of ``schema`` (None: no table yet, so the default).

    A ``_combined_id`` of a string type is v1 (hex); of a binary type, v2.
    A table without the column (none written by Combined) takes the default.
    """
    if schema is None or ID_COLUMN not in schema.names:
        return DEFAULT_DIGEST
    t = schema.field(ID_COLUMN).type
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return HEX
    return BINARY


def digest_type(digest: Digest) -> pa.DataType:
    """The Arrow type of a digest column in ``digest`` format."""
    return pa.string() if digest == HEX else pa.binary()


def digest_sql_type(digest: Digest) -> str:
    """The DuckDB type of a digest column in ``digest`` format."""
    return "VARCHAR" if digest == HEX else "BLOB"


def md5_sql(text: str, digest: Digest) -> str:
    """A DuckDB expression: the md5 of the VARCHAR expression ``text`` in ``digest`` format."""
    return f"md5({text})" if digest == HEX else f"unhex(md5({text}))"


def pair_term_sql(first: str, second: str, digest: Digest, extra: str = "''") -> str:
    """A DuckDB UHUGEINT: the md5 of a pair of digests (a transition digest's term).

    v1 hashes ``first|second`` followed by the VARCHAR ``extra`` (as it
    always did: a table's running content digest continues across
    versions of the code). v2 hashes the two digests' 32 bytes followed by
    ``extra``'s bytes: one md5 block, where the hex text took two.
    An empty ``extra`` (every sync mode but ``append``) is left out: the same
    bytes, without a concatenation a row (a tenth of the term's CPU).
    """
    if digest == HEX:
        tail = "" if extra == "''" else f" || {extra}"
        return f"md5_number({first} || '|' || {second}{tail})"
    tail = "" if extra == "''" else f" || CAST({extra} AS BLOB)"
    return f"md5_number({first} || {second}{tail})"


def empty_sql(digest: Digest) -> str:
    """A DuckDB literal: the empty value of a digest column (for coalesce)."""
    return "''" if digest == HEX else "''::BLOB"


def as_sql(column: str, have: Digest, want: Digest) -> str:
    """SQL converting the digest ``column`` from format ``have`` to ``want``.

    Exact both ways: a v1 digest is the lowercase hex of the v2 one.
    """
    if have == want:
        return column
    return f"lower(hex({column}))" if want == HEX else f"unhex({column})"


def digest_text(value: object) -> str:
    """A digest read back from DuckDB or Arrow, as text: v2's bytes in hex, v1's as they are."""
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).hex()
    return str(value)


class DigestSet:
    """Membership in a set of digests, its lookup built once for many batches.

    ``pyarrow.compute.is_in`` builds a hash set of its values at every call:
    asked batch after batch about the same millions of digests, it cost
    ~0.4 CPU-s a 65,536-row batch at 2M digests. Digests of one width (v2's
    16 bytes, v1's 32 hex digits) are sorted once as fixed-width byte
    strings and looked up by binary search; anything else (a null, mixed
    widths) is asked of ``is_in``.
    """

    def __init__(self, values: pa.Array | pa.ChunkedArray) -> None:
        self._values = values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values
        fixed = fixed_width(self._values)
        # 16-byte digests: their first 64-bit words sorted (a binary search over
        # integers, ~8x faster than over 16-byte strings), the second checked.
        self._words: tuple[np.ndarray, np.ndarray] | None = None
        if fixed is not None and fixed.dtype.itemsize == 16 and len(fixed):
            words = fixed.view(np.uint64).reshape(-1, 2)
            order = np.argsort(words[:, 0])
            first, second = words[order, 0], words[order, 1]
            if not np.any(first[1:] == first[:-1]):  # (else the byte strings decide)
                self._words = first, second
        self._sorted = fixed
        if fixed is not None and self._words is None:
            self._sorted = np.sort(fixed)

    #: Whether the first words are held byte-swapped (:meth:`of_words`).
    _swapped = False

    @classmethod
    def of_words(cls, words: np.ndarray) -> DigestSet:
        """The set of 16-byte digests given as their (n, 2) 64-bit ``words``, sorted in place.

        No Arrow array of them, no order of indices: the rows are sorted as
        16-byte strings where they lie (their bytes' order), so the first
        words, byte-swapped (one copy, 8 bytes a digest), are sorted as
        integers. 5M digests: 80 + 40 MB, where an Arrow array of them, its
        concatenation and :meth:`__init__`'s sort held ~300 MB at once.
        """
        self = cls.__new__(cls)
        words.view("V16").reshape(-1).sort()
        self._sorted = words.view("S16").reshape(-1)
        self._values = pa.FixedSizeBinaryArray.from_buffers(
            pa.binary(16), len(words), [None, pa.py_buffer(words)]
        )
        first = words[:, 0].byteswap()
        self._words = None
        if len(first) and not np.any(first[1:] == first[:-1]):
            self._words, self._swapped = (first, words[:, 1]), True
        return self

    def __call__(self, ids: pa.Array) -> pa.Array:
        """A boolean a value of ``ids``: whether the set holds it."""
        asked = None if self._sorted is None else fixed_width(ids)
        if asked is None or self._sorted is None or asked.dtype != self._sorted.dtype:
            return pc.is_in(ids, value_set=self._values.cast(ids.type))
        if not len(self._sorted):
            return pa.array(np.zeros(len(asked), np.bool_))
        if self._words is not None:
            first, second = self._words
            words = asked.view(np.uint64).reshape(-1, 2)
            keys = words[:, 0].byteswap() if self._swapped else words[:, 0]
            # Searched in order: each search starts near the last (random ones
            # missed the cache at every step, ~0.9 us each at 5M digests).
            order = np.argsort(keys)
            at = np.empty(len(order), np.intp)
            at[order] = np.searchsorted(first, keys[order])
            np.minimum(at, len(first) - 1, out=at)
            return pa.array((first[at] == keys) & (second[at] == words[:, 1]))
        at = np.minimum(np.searchsorted(self._sorted, asked), len(self._sorted) - 1)
        return pa.array(self._sorted[at] == asked)


def fixed_width(values: pa.Array, width: int | None = None) -> np.ndarray | None:
    """``values`` (binary or text, none null, all one width) as numpy byte strings
    viewed in place, or None (a null, a value of another width, or not ``width``).

    Every value is exactly the width, so numpy's byte strings (which treat
    trailing zero bytes as padding) compare them as their bytes.
    """
    if pa.types.is_string(values.type) or pa.types.is_binary_view(values.type):
        values = values.cast(pa.binary())
    elif pa.types.is_large_string(values.type):
        values = values.cast(pa.large_binary())
    large = pa.types.is_large_binary(values.type)
    if values.null_count or not (large or pa.types.is_binary(values.type)):
        return None
    n = len(values)
    if not n:
        return np.empty(0, f"S{width or 1}")
    _, offsets_buffer, data = values.buffers()
    size = 8 if large else 4
    offsets = np.frombuffer(offsets_buffer, f"<i{size}", n + 1, values.offset * size)
    each = int(offsets[1] - offsets[0])
    if not each or (width is not None and each != width):
        return None
    if int(offsets[-1] - offsets[0]) != each * n or np.any(np.diff(offsets) != each):
        return None
    return np.frombuffer(data, f"S{each}", n, int(offsets[0]))
