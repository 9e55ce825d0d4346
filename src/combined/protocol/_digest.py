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
    16 bytes, v1's 32 hex digits) are sorted once and looked up by binary
    search; anything else (a null, mixed widths) is asked of ``is_in``.

    16-byte digests are searched as integers (~8x faster than as 16-byte
    strings): their first 8 bytes (:meth:`__init__`: a sorted copy of those
    and of the last 8), or, given as words to sort where they lie
    (:meth:`of_words`), their first 4 (a copy of 4 bytes a digest beside
    the 16). The search lands on the first digest of that key and steps
    through the few that share it. A set in which more than
    :data:`SHARED_KEY` digests share a key (not md5's uniform ids: chosen
    ones) is searched as byte strings.
    """

    #: The sorted keys searched (big-endian integers of the first 8 or 4 bytes), or None.
    _keys: np.ndarray | None = None
    #: The digests' (n, 2) words in the keys' order (4-byte keys), or their last words (8-byte).
    _rest: np.ndarray | None = None
    #: The digests as fixed-width byte strings (sorted for a search as strings), or None.
    _sorted: np.ndarray | None = None

    def __init__(self, values: pa.Array | pa.ChunkedArray) -> None:
        self._values = values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values
        fixed = fixed_width(self._values)
        self._sorted = fixed
        if fixed is not None and fixed.dtype.itemsize == 16 and len(fixed):
            words = fixed.view(np.uint64).reshape(-1, 2)
            keys = _first_words(words)
            rest = words[np.argsort(keys), 1]
            keys.sort()  # (in place: no second copy beside the order)
            if _longest_run(keys) <= SHARED_KEY:
                self._keys, self._rest = keys, rest
        if fixed is not None and self._keys is None:
            self._sorted = np.sort(fixed)

    @classmethod
    def of_words(cls, words: np.ndarray) -> DigestSet:
        """The set of 16-byte digests given as their (n, 2) 64-bit ``words``, sorted in place.

        No Arrow array of them, no order of indices: the rows are sorted as
        16-byte strings where they lie (their bytes' order), and only their
        first four bytes are copied (the search's integers). 5M digests:
        80 + 20 MB, where an Arrow array of them, its concatenation and a
        sort by indices held ~300 MB at once.
        """
        self = cls.__new__(cls)
        words.view("V16").reshape(-1).sort()
        self._sorted = words.view("S16").reshape(-1)
        self._values = pa.FixedSizeBinaryArray.from_buffers(
            pa.binary(16), len(words), [None, pa.py_buffer(words)]
        )
        keys = _prefixes(words)
        if _longest_run(keys) <= SHARED_KEY:
            self._keys, self._rest = keys, words
        return self

    def __call__(self, ids: pa.Array) -> pa.Array:
        """A boolean a value of ``ids``: whether the set holds it."""
        asked = None if self._sorted is None else fixed_width(ids)
        if asked is None or self._sorted is None or asked.dtype != self._sorted.dtype:
            return pc.is_in(ids, value_set=self._values.cast(ids.type))
        if not len(self._sorted):
            return pa.array(np.zeros(len(asked), np.bool_))
        if self._keys is not None:
            return pa.array(self._found(asked.view(np.uint64).reshape(-1, 2)))
        at = np.minimum(np.searchsorted(self._sorted, asked), len(self._sorted) - 1)
        return pa.array(self._sorted[at] == asked)

    def _found(self, asked: np.ndarray) -> np.ndarray:
        """Whether the set holds each of ``asked`` ((n, 2) words), by key then by steps."""
        held, rest = self._keys, self._rest
        assert held is not None and rest is not None
        whole = rest.ndim == 2  # (4-byte keys: the rest is every word)
        keys = _prefixes(asked) if whole else _first_words(asked)
        # Searched in order: each search starts near the last (random ones
        # missed the cache at every step, ~0.9 us each at 5M digests).
        todo = np.argsort(keys)
        at = np.searchsorted(held, keys[todo])
        found = np.zeros(len(asked), np.bool_)
        while len(todo):
            inside = at < len(held)
            todo, at = todo[inside], at[inside]
            same = held[at] == keys[todo]  # (still the asked key: else not held)
            todo, at = todo[same], at[same]
            if whole:
                hit = (rest[at, 0] == asked[todo, 0]) & (rest[at, 1] == asked[todo, 1])
            else:
                hit = rest[at] == asked[todo, 1]
            found[todo[hit]] = True
            todo, at = todo[~hit], at[~hit] + 1
        return found


#: Digests sharing a key past which a set is searched as byte strings: md5's ids
#: share their first four bytes with a few others at most (5M of them: ~0.1% of
#: those keys held twice), and the steps through a key are one pass each.
SHARED_KEY = 16


def _first_words(words: np.ndarray) -> np.ndarray:
    """The first 8 bytes of each (n, 2)-word digest as a big-endian 64-bit integer
    (a copy): sorted as the digests' bytes are."""
    first = words[:, 0]
    return first.byteswap() if np.little_endian else first.copy()


def _prefixes(words: np.ndarray) -> np.ndarray:
    """The first four bytes of each (n, 2)-word digest as a big-endian 32-bit
    integer: sorted as the digests' bytes are (a copy, 4 bytes a digest)."""
    first = words.view(np.uint32).reshape(-1, 4)[:, 0]
    return first.byteswap() if np.little_endian else first.copy()


def _longest_run(keys: np.ndarray) -> int:
    """The most digests of one key in the sorted ``keys``."""
    if len(keys) < 2:
        return len(keys)
    repeats = np.flatnonzero(keys[1:] == keys[:-1])  # (few: md5's ids)
    if not len(repeats):
        return 1
    breaks = np.flatnonzero(np.diff(repeats) != 1)
    streaks = np.diff(np.concatenate(([-1], breaks, [len(repeats) - 1])))
    return int(streaks.max()) + 1


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
