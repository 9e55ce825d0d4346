"""A decoder for PostgreSQL's ``pgoutput`` logical replication protocol.

The server's built-in output plugin sends one binary message per
``XLogData`` frame (protocol versions 1 and 2; see "Logical Replication
Message Formats" in the PostgreSQL manual). :func:`decode_message` turns one
frame into a dataclass (frozen, but for the row messages made for every
change); :class:`PgoutputDecoder` does the same while
tracking the streamed-transaction blocks of version 2 (whose inner messages
carry an extra transaction id). :class:`RelationCache` keeps the latest
``Relation`` and ``Type`` message per OID, as a subscriber must.

Column values stay exactly as the wire states them: :class:`TupleData` holds
one kind per column (``n`` null, ``u`` unchanged TOAST value, ``t`` text,
``b`` binary) and the raw bytes of ``t``/``b`` columns. Converting text to
typed Arrow columns is the job of ``_batch.ChangeBatcher``, one column at a
time. LSNs are plain ints; :func:`lsn_to_text` and :func:`text_to_lsn`
convert to and from PostgreSQL's ``X/Y`` notation.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import lru_cache
from typing import Literal

from combined.connectors.postgres._catalog import relation_name
from combined.connectors.postgres._text import array_type_of, arrow_type, text_to_arrow
from combined.errors import ProtocolViolation, SourceError

__all__ = [
    "Begin",
    "Commit",
    "Delete",
    "Insert",
    "LogicalMessage",
    "Origin",
    "PgoutputDecoder",
    "PgoutputMessage",
    "Relation",
    "RelationCache",
    "RelationColumn",
    "RowChange",
    "StreamAbort",
    "StreamCommit",
    "StreamStart",
    "StreamStop",
    "Truncate",
    "TupleData",
    "Type",
    "Update",
    "array_type_of",
    "arrow_type",
    "decode_message",
    "lsn_to_text",
    "pg_timestamp",
    "text_to_arrow",
    "text_to_lsn",
]

_LSN_TEXT = re.compile(r"^([0-9A-Fa-f]{1,8})/([0-9A-Fa-f]{1,8})$")
_PG_EPOCH = datetime(2000, 1, 1, tzinfo=UTC)

_U8 = struct.Struct("!B")
_I16 = struct.Struct("!h")
_I32 = struct.Struct("!i")
_U32 = struct.Struct("!I")
_U64 = struct.Struct("!Q")
_I64 = struct.Struct("!q")
_BEGIN = struct.Struct("!QqI")
_COMMIT = struct.Struct("!BQQq")
#: The sizes of a begin and a commit message, their tag included.
_BEGIN_SIZE, _COMMIT_SIZE = 1 + _BEGIN.size, 1 + _COMMIT.size
_STREAM_COMMIT = struct.Struct("!IBQQq")

# Tuple column kinds, as bytes values, for the hot decoding loop.
_NULL, _UNCHANGED, _TEXT, _BINARY = b"n"[0], b"u"[0], b"t"[0], b"b"[0]


def lsn_to_text(lsn: int) -> str:
    """PostgreSQL's ``X/Y`` notation of a log sequence number."""
    if not 0 <= lsn < 1 << 64:
        raise ProtocolViolation(f"lsn out of range: {lsn}", hint="an lsn is an unsigned 64-bit int")
    return f"{lsn >> 32:X}/{lsn & 0xFFFFFFFF:X}"


def text_to_lsn(text: str) -> int:
    """The int value of an ``X/Y`` log sequence number."""
    m = _LSN_TEXT.match(text.strip()) if isinstance(text, str) else None
    if m is None:
        raise ProtocolViolation(
            f"invalid lsn text {text!r}",
            hint="an lsn is written as two hex numbers, like 0/16B3748",
        )
    return (int(m.group(1), 16) << 32) | int(m.group(2), 16)


@lru_cache(maxsize=64)
def pg_timestamp(micros: int) -> datetime:
    """An aware UTC datetime from microseconds since 2000-01-01 (the wire's clock).

    A transaction's begin and commit carry the same time, and a backlog's
    small transactions often share it: cached (each costs ~1.5 us).
    """
    return _PG_EPOCH + timedelta(microseconds=micros)


# The row messages (``TupleData``, ``Insert``, ``Update``, ``Delete``) are not
# frozen, unlike the others: one is made for every row change, and a frozen
# dataclass's ``__init__`` (an ``object.__setattr__`` a field) cost ~11% of a
# change backlog's reading CPU. Only the change assembler changes one after
# decoding: a partition's row becomes its partitioned table's. ``Begin`` and
# ``Commit`` are not frozen either: a backlog of single-row transactions
# makes one of each a row. Nothing changes them.


@dataclass(slots=True, eq=True)
class TupleData:
    """The columns of one row as the wire states them.

    ``kinds`` has one character per column: ``n`` null, ``u`` an unchanged
    TOAST value that the server did not send, ``t`` text, ``b`` binary.
    ``values`` holds the raw bytes of ``t``/``b`` columns and ``None`` for the
    others. Keeping the wire form lets the batcher convert whole columns at
    once instead of building one Python object per value.
    """

    kinds: str
    values: tuple[bytes | None, ...]

    def __len__(self) -> int:
        return len(self.kinds)

    def text(self, index: int) -> str | None:
        """Column ``index`` as text (``None`` when null or unchanged)."""
        value = self.values[index]
        return None if value is None else value.decode()

    @property
    def unchanged(self) -> tuple[int, ...]:
        """Indexes of the columns whose unchanged TOAST value was not sent."""
        return tuple(i for i, k in enumerate(self.kinds) if k == "u")


@dataclass(frozen=True, slots=True)
class RelationColumn:
    """One column of a :class:`Relation`."""

    name: str
    type_oid: int
    type_modifier: int
    is_key: bool


@dataclass(slots=True)
class Begin:
    """``B``: a transaction starts; its commit LSN and time are already known."""

    final_lsn: int
    commit_time: datetime
    xid: int


@dataclass(slots=True)
class Commit:
    """``C``: the transaction committed; ``end_lsn`` is where a replay resumes."""

    flags: int
    commit_lsn: int
    end_lsn: int
    commit_time: datetime


@dataclass(frozen=True, slots=True)
class Origin:
    """``O``: the transaction was replayed from another node."""

    commit_lsn: int
    name: str


@dataclass(frozen=True, slots=True)
class Relation:
    """``R``: the shape of a table, sent before its first change (and after it changes).

    ``replica_identity`` is ``d`` (default: primary key), ``n`` (nothing),
    ``f`` (full row) or ``i`` (an index).
    """

    oid: int
    namespace: str
    name: str
    replica_identity: str
    columns: tuple[RelationColumn, ...]
    xid: int | None = None

    @property
    def qualified_name(self) -> str:
        """``schema.table``, a part quoted when it holds a dot or a quote (as a
        dataset's relation is keyed: :func:`relation_name`)."""
        return relation_name(self.namespace, self.name)

    @property
    def key(self) -> tuple[str, ...]:
        """The names of the replica identity columns."""
        return tuple(c.name for c in self.columns if c.is_key)

    def same_shape(self, other: Relation) -> bool:
        """Whether ``other`` has the same columns, types, modifiers and key."""
        return self.columns == other.columns and self.qualified_name == other.qualified_name


@dataclass(frozen=True, slots=True)
class Type:
    """``Y``: a non-built-in data type used by a following relation."""

    oid: int
    namespace: str
    name: str
    xid: int | None = None


@dataclass(slots=True, eq=True)
class Insert:
    """``I``: a new row."""

    relation_oid: int
    new: TupleData
    xid: int | None = None


@dataclass(slots=True, eq=True)
class Update:
    """``U``: a changed row.

    ``old`` is sent only when the replica identity changed (``K``: the old key
    columns, others null) or the identity is ``FULL`` (``O``: the whole old
    row); ``old_kind`` says which.
    """

    relation_oid: int
    new: TupleData
    old: TupleData | None = None
    old_kind: Literal["K", "O"] | None = None
    xid: int | None = None


@dataclass(slots=True, eq=True)
class Delete:
    """``D``: a removed row, identified by its key (``K``) or its whole old row (``O``)."""

    relation_oid: int
    old: TupleData
    old_kind: Literal["K", "O"]
    xid: int | None = None


@dataclass(frozen=True, slots=True)
class Truncate:
    """``T``: every row of the listed relations was removed."""

    relation_oids: tuple[int, ...]
    cascade: bool
    restart_identity: bool
    xid: int | None = None


@dataclass(frozen=True, slots=True)
class LogicalMessage:
    """``M``: a message written with ``pg_logical_emit_message`` (option ``messages``)."""

    transactional: bool
    lsn: int
    prefix: str
    content: bytes
    xid: int | None = None


@dataclass(frozen=True, slots=True)
class StreamStart:
    """``S`` (version 2): a block of a transaction still in progress begins."""

    xid: int
    first_segment: bool


@dataclass(frozen=True, slots=True)
class StreamStop:
    """``E`` (version 2): the current streamed block ends."""


@dataclass(frozen=True, slots=True)
class StreamCommit:
    """``c`` (version 2): a streamed transaction committed."""

    xid: int
    flags: int
    commit_lsn: int
    end_lsn: int
    commit_time: datetime


@dataclass(frozen=True, slots=True)
class StreamAbort:
    """``A`` (version 2): a streamed (sub)transaction aborted; drop its changes."""

    xid: int
    subxid: int


RowChange = Insert | Update | Delete
PgoutputMessage = (
    Begin
    | Commit
    | Origin
    | Relation
    | Type
    | Insert
    | Update
    | Delete
    | Truncate
    | LogicalMessage
    | StreamStart
    | StreamStop
    | StreamCommit
    | StreamAbort
)


class _Reader:
    """A cursor over one message's bytes; every read is bounds-checked."""

    __slots__ = ("buf", "pos")

    def __init__(self, buf: bytes, pos: int = 0) -> None:
        self.buf = buf
        self.pos = pos

    def _take(self, fmt: struct.Struct) -> int:
        try:
            (value,) = fmt.unpack_from(self.buf, self.pos)
        except struct.error:
            raise _truncated(self.buf) from None
        self.pos += fmt.size
        return int(value)

    def u8(self) -> int:
        return self._take(_U8)

    def i16(self) -> int:
        return self._take(_I16)

    def i32(self) -> int:
        return self._take(_I32)

    def u32(self) -> int:
        return self._take(_U32)

    def u64(self) -> int:
        return self._take(_U64)

    def i64(self) -> int:
        return self._take(_I64)

    def char(self) -> str:
        return chr(self.u8())

    def cstring(self) -> str:
        end = self.buf.find(b"\0", self.pos)
        if end < 0:
            raise _truncated(self.buf)
        text = self.buf[self.pos : end].decode()
        self.pos = end + 1
        return text

    def raw(self, n: int) -> bytes:
        if n < 0 or self.pos + n > len(self.buf):
            raise _truncated(self.buf)
        out = self.buf[self.pos : self.pos + n]
        self.pos += n
        return out

    def tuple_data(self) -> TupleData:
        # The hot path of a change stream: plain locals, no per-column objects.
        buf, pos = self.buf, self.pos
        try:
            (n,) = _I16.unpack_from(buf, pos)
            pos += 2
            kinds = bytearray(n)
            values: list[bytes | None] = [None] * n
            for i in range(n):
                kind = buf[pos]
                pos += 1
                kinds[i] = kind
                if kind == _TEXT or kind == _BINARY:
                    (length,) = _I32.unpack_from(buf, pos)
                    pos += 4
                    end = pos + length
                    if end > len(buf):
                        raise _truncated(buf)
                    values[i] = buf[pos:end]
                    pos = end
                elif kind != _NULL and kind != _UNCHANGED:
                    raise SourceError(
                        f"unknown tuple column kind {chr(kind)!r}",
                        hint="the server speaks a newer pgoutput version than this decoder",
                    )
        except (IndexError, struct.error):
            raise _truncated(buf) from None
        self.pos = pos
        return TupleData(kinds.decode("ascii"), tuple(values))

    def done(self) -> None:
        if self.pos != len(self.buf):
            raise SourceError(
                f"{len(self.buf) - self.pos} unexpected trailing bytes in a pgoutput message",
                hint="the server speaks a newer pgoutput version than this decoder",
            )


def _truncated(buf: bytes) -> SourceError:
    kind = chr(buf[0]) if buf else "?"
    return SourceError(
        f"truncated pgoutput message {kind!r} ({len(buf)} bytes)",
        hint="the replication stream was cut or corrupted; restart the capture",
    )


def _old_kind(r: _Reader) -> Literal["K", "O"]:
    kind = r.char()
    if kind == "K":
        return "K"
    if kind == "O":
        return "O"
    raise SourceError(f"unexpected tuple marker {kind!r} for old row", hint="restart the capture")


_ROW_TAGS = frozenset((b"I", b"U", b"D"))
_B, _C = b"B"[0], b"C"[0]


def decode_message(data: bytes, *, in_stream: bool = False) -> PgoutputMessage:
    """Decode one pgoutput message (the payload of one ``XLogData`` frame).

    ``in_stream`` says whether the message sits inside a version-2
    ``StreamStart``/``StreamStop`` block, where data messages carry the
    transaction id first. Unknown or malformed input raises ``SourceError``.
    """
    if not data:
        raise SourceError("empty pgoutput message", hint="restart the capture")
    if type(data) is not bytes:
        data = bytes(data)
    size = len(data)
    # A begin and a commit of the usual size, first: a backlog of single-row
    # transactions makes two a row (no reader, no check of trailing bytes).
    if size == _BEGIN_SIZE and data[0] == _B:
        lsn, ts, xid = _BEGIN.unpack_from(data, 1)
        return Begin(lsn, pg_timestamp(ts), xid)
    if size == _COMMIT_SIZE and data[0] == _C:
        flags, commit_lsn, end_lsn, ts = _COMMIT.unpack_from(data, 1)
        return Commit(flags, commit_lsn, end_lsn, pg_timestamp(ts))
    r = _Reader(data, 1)
    tag = data[0:1]
    msg: PgoutputMessage
    if tag in _ROW_TAGS and not in_stream:
        # Row changes are nearly every message of a stream: tested first.
        msg = _decode_data(tag, r, None)
    elif tag == b"B":
        if len(data) < 1 + _BEGIN.size:
            raise _truncated(data)
        lsn, ts, xid = _BEGIN.unpack_from(data, 1)
        r.pos = 1 + _BEGIN.size
        msg = Begin(final_lsn=lsn, commit_time=pg_timestamp(ts), xid=xid)
    elif tag == b"C":
        if len(data) < 1 + _COMMIT.size:
            raise _truncated(data)
        flags, commit_lsn, end_lsn, ts = _COMMIT.unpack_from(data, 1)
        r.pos = 1 + _COMMIT.size
        msg = Commit(flags, commit_lsn, end_lsn, pg_timestamp(ts))
    elif tag == b"O":
        msg = Origin(commit_lsn=r.u64(), name=r.cstring())
    elif tag == b"S":
        msg = StreamStart(xid=r.u32(), first_segment=r.u8() == 1)
    elif tag == b"E":
        msg = StreamStop()
    elif tag == b"c":
        if len(data) < 1 + _STREAM_COMMIT.size:
            raise _truncated(data)
        xid, flags, commit_lsn, end_lsn, ts = _STREAM_COMMIT.unpack_from(data, 1)
        r.pos = 1 + _STREAM_COMMIT.size
        msg = StreamCommit(xid, flags, commit_lsn, end_lsn, pg_timestamp(ts))
    elif tag == b"A":
        msg = StreamAbort(xid=r.u32(), subxid=r.u32())
        # Version 4 (parallel apply) appends the abort LSN and time: not needed here.
        r.pos = len(data)
    else:
        xid = r.u32() if in_stream else None
        msg = _decode_data(tag, r, xid)
    r.done()
    return msg


def _decode_data(tag: bytes, r: _Reader, xid: int | None) -> PgoutputMessage:
    if tag == b"I":
        oid = r.u32()
        if r.char() != "N":
            raise SourceError("insert without a new row", hint="restart the capture")
        return Insert(oid, r.tuple_data(), xid)
    if tag == b"U":
        oid = r.u32()
        old: TupleData | None = None
        old_kind: Literal["K", "O"] | None = None
        marker = r.char()
        if marker in ("K", "O"):
            old_kind = "K" if marker == "K" else "O"
            old = r.tuple_data()
            marker = r.char()
        if marker != "N":
            raise SourceError("update without a new row", hint="restart the capture")
        return Update(oid, r.tuple_data(), old, old_kind, xid)
    if tag == b"D":
        oid = r.u32()
        kind = _old_kind(r)
        return Delete(oid, r.tuple_data(), kind, xid)
    if tag == b"R":
        oid = r.u32()
        namespace = r.cstring()
        name = r.cstring()
        identity = r.char()
        columns = []
        for _ in range(r.i16()):
            flags = r.u8()
            columns.append(
                RelationColumn(
                    name=r.cstring(),
                    type_oid=r.u32(),
                    type_modifier=r.i32(),
                    is_key=bool(flags & 1),
                )
            )
        # The namespace of pg_catalog relations is sent as an empty string.
        return Relation(oid, namespace or "pg_catalog", name, identity, tuple(columns), xid)
    if tag == b"Y":
        return Type(oid=r.u32(), namespace=r.cstring(), name=r.cstring(), xid=xid)
    if tag == b"T":
        count = r.u32()
        options = r.u8()
        oids = tuple(r.u32() for _ in range(count))
        return Truncate(oids, bool(options & 1), bool(options & 2), xid)
    if tag == b"M":
        transactional = r.u8() == 1
        lsn = r.u64()
        prefix = r.cstring()
        content = r.raw(r.u32())
        return LogicalMessage(transactional, lsn, prefix, content, xid)
    raise SourceError(
        f"unsupported pgoutput message {tag.decode(errors='replace')!r}",
        hint="two-phase and newer protocol messages are not decoded; use proto_version 1 or 2",
    )


class PgoutputDecoder:
    """Decode a sequence of pgoutput messages, tracking version-2 stream blocks."""

    def __init__(self) -> None:
        self._in_stream = False

    @property
    def in_stream(self) -> bool:
        """Whether the decoder is inside a ``StreamStart``/``StreamStop`` block."""
        return self._in_stream

    def decode(self, data: bytes) -> PgoutputMessage:
        """Decode the next message of the stream."""
        msg = decode_message(data, in_stream=self._in_stream)
        if isinstance(msg, StreamStart):
            self._in_stream = True
        elif isinstance(msg, StreamStop):
            self._in_stream = False
        return msg


class RelationCache:
    """The latest ``Relation`` and ``Type`` message per OID of one stream.

    The server sends a relation's shape before its first change in a session
    and again whenever it may have changed; every change message refers to it
    by OID only.
    """

    def __init__(self) -> None:
        self._relations: dict[int, Relation] = {}
        self._types: dict[int, Type] = {}

    def update(self, relation: Relation) -> bool:
        """Store ``relation``; return whether its shape differs from the cached one."""
        previous = self._relations.get(relation.oid)
        self._relations[relation.oid] = relation
        return previous is None or not previous.same_shape(relation)

    def add_type(self, type_: Type) -> None:
        """Store a ``Type`` message."""
        self._types[type_.oid] = type_

    def get(self, oid: int) -> Relation:
        """The relation of a change message; unknown OIDs are a protocol error."""
        try:
            return self._relations[oid]
        except KeyError:
            raise SourceError(
                f"change for relation oid {oid} before its relation message",
                hint="the stream must be read from a transaction boundary; restart the capture",
            ) from None

    def find(self, oid: int) -> Relation | None:
        """The cached relation of ``oid``, if any."""
        return self._relations.get(oid)

    def type(self, oid: int) -> Type | None:
        """The ``Type`` message received for ``oid``, if any."""
        return self._types.get(oid)

    def __len__(self) -> int:
        return len(self._relations)
