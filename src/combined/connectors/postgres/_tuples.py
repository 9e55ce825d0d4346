"""pgoutput tuple data of many rows, parsed at once into Arrow columns.

A change stream's rows are kept as the wire sent them (the message bytes
and where each row's ``TupleData`` starts) and parsed here once per batch:
one pass per column over every row at once (numpy), so no Python object is
made per value. A column's values become one Arrow binary array whose bytes
are copied once, out of the joined messages.

The format (``TupleData`` in "Logical Replication Message Formats"): an
int16 column count, then per column a kind byte (``n`` null, ``u`` an
unchanged TOAST value not sent, ``t`` text, ``b`` binary) and, for ``t`` and
``b``, an int32 length and that many bytes. Every row must end exactly at
the end of its message; anything else is refused as the decoder of one
message refuses it (:func:`._pgoutput.decode_message`).
"""

from __future__ import annotations

import struct
from array import array
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from combined.connectors.postgres._pgoutput import TupleData
from combined.errors import SchemaMismatch, SourceError

__all__ = ["ParsedRows", "encode_tuple", "join_messages", "parse_joined", "parse_tuples"]

_NULL, _UNCHANGED, _TEXT, _BINARY = b"n"[0], b"u"[0], b"t"[0], b"b"[0]
_I16 = struct.Struct("!h")
_I32 = struct.Struct("!i")


@dataclass(frozen=True, slots=True)
class ParsedRows:
    """Rows' columns: one kind per row and column, and the values as binary arrays."""

    #: ``kinds[i, j]``: the kind byte of row ``i``'s column ``j``.
    kinds: np.ndarray
    #: Per column, the ``t``/``b`` values (null elsewhere).
    columns: list[pa.Array]


def encode_tuple(row: TupleData) -> bytes:
    """The wire form of ``row`` (for rows the stream's own bytes do not hold as they are)."""
    parts = [_I16.pack(len(row.kinds))]
    for kind, value in zip(row.kinds, row.values, strict=True):
        if kind in "tb" and value is not None:
            parts += (kind.encode(), _I32.pack(len(value)), value)
        else:
            parts.append(b"u" if kind == "u" else b"n")
    return b"".join(parts)


def _truncated() -> SourceError:
    return SourceError(
        "truncated pgoutput message in a batch of row changes",
        hint="the replication stream was cut or corrupted; restart the capture",
    )


def _be32(raw: np.ndarray, at: np.ndarray) -> np.ndarray:
    """The big-endian signed int32 at each offset ``at`` of ``raw`` (as int64)."""
    # Four byte gathers into one aligned array read as big-endian int32: half
    # the time of shifting and or-ing four int64 arrays (a wide batch's parse).
    word = np.empty((len(at), 4), np.uint8)
    for k in range(4):
        np.take(raw, at + k, out=word[:, k])
    value: np.ndarray = word.view(">i4").ravel().astype(np.int64)
    return value


def parse_tuples(
    messages: Sequence[bytes], starts: Sequence[int], columns: int, relation: str
) -> ParsedRows:
    """Parse one ``TupleData`` per message, at ``starts``, of ``columns`` columns each.

    Raises ``SourceError`` on a truncated row, an unknown kind or bytes past
    a row's end, and ``SchemaMismatch`` on a row of another column count.
    """
    return parse_joined(join_messages(messages), starts, columns, relation)


def join_messages(messages: Sequence[bytes]) -> tuple[bytes, np.ndarray]:
    """The messages' bytes one after another, and each one's length (:func:`parse_joined`)."""
    lens = np.fromiter(map(len, messages), np.int64, len(messages))
    return b"".join(messages), lens


def parse_joined(
    joined: tuple[bytes, np.ndarray], starts: Sequence[int], columns: int, relation: str
) -> ParsedRows:
    """:func:`parse_tuples` of messages already joined (:func:`join_messages`).

    The caller may let the messages go first: a batch's rows are then held
    once, joined, while their values are copied out of them.
    """
    data_bytes, lens = joined
    n = len(lens)
    ends = np.cumsum(lens)
    raw = np.frombuffer(data_bytes, np.uint8)
    first = (
        np.frombuffer(starts, np.int64)
        if isinstance(starts, array) and starts.itemsize == 8
        else np.fromiter(starts, np.int64, n)
    )
    pos = ends - lens + first
    if (pos + 2 > ends).any():
        raise _truncated()
    count = (raw[pos].astype(np.int64) << 8) | raw[pos + 1]
    if (count != columns).any():
        bad = int(count[count != columns][0])
        raise SchemaMismatch(
            f"a row of {relation} has {bad} columns, its relation message {columns}",
            hint="restart the capture; the stream and its relation cache disagree",
        )
    pos = pos + 2
    data = pa.py_buffer(data_bytes)
    kinds = np.empty((n, columns), np.uint8, order="F")  # written a column at a time
    out = []
    for j in range(columns):
        if (pos >= ends).any():
            raise _truncated()
        kind = raw[pos]
        has = (kind == _TEXT) | (kind == _BINARY)
        known = has | (kind == _NULL) | (kind == _UNCHANGED)
        if not known.all():
            raise SourceError(
                f"unknown tuple column kind {chr(kind[~known][0])!r}",
                hint="the server speaks a newer pgoutput version than this decoder",
            )
        length = np.zeros(n, np.int64)
        if has.any():
            at = pos[has]
            if (at + 5 > ends[has]).any():
                raise _truncated()
            length[has] = _be32(raw, at + 1)
            if (length < 0).any():
                raise _truncated()
        start = np.where(has, pos + 5, pos + 1)
        pos = start + length
        if (pos > ends).any():
            raise _truncated()
        kinds[:, j] = kind
        out.append(_values(data, start, length, has))
    if (pos != ends).any():
        extra = int((ends - pos)[pos != ends][0])
        raise SourceError(
            f"{extra} unexpected trailing bytes in a pgoutput message",
            hint="the server speaks a newer pgoutput version than this decoder",
        )
    return ParsedRows(kinds, out)


def _values(data: pa.Buffer, start: np.ndarray, length: np.ndarray, has: np.ndarray) -> pa.Array:
    """The values at (``start``, ``length``) of ``data``, one binary array (null but ``has``).

    The values lie in order in ``data``: a large-binary array over it whose
    even elements are the values and odd ones the bytes between them, then
    its even elements taken (one copy of the values' bytes).
    """
    n = len(start)
    offsets = np.empty(2 * n, np.int64)
    offsets[0::2] = start
    offsets[1::2] = start + length
    spread = pa.Array.from_buffers(
        pa.large_binary(), 2 * n - 1, [None, pa.py_buffer(offsets), data]
    )
    picks = pa.array(np.arange(0, 2 * n, 2, dtype=np.int64), mask=~has)
    return spread.take(picks).cast(pa.binary())
