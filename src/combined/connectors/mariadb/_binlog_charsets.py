"""The text of a binary log's string columns, decoded in their charset as the server reads it.

The log carries a string in its column's charset (named by the table map,
``binlog_row_metadata=FULL``); the snapshot reads the server's conversion of
it to utf8mb4. A Python codec of the charset's name decodes other bytes than
the server for some charsets: these are named here by the codec that reads
them as the server does.
"""

from __future__ import annotations

import codecs
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from combined.errors import SchemaMismatch

#: MariaDB's latin1 is cp1252 with its five unassigned bytes (0x81, 0x8D, 0x8F,
#: 0x90, 0x9D) read as the C1 controls of the same number; Python's cp1252 refuses them.
_LATIN1_TABLE = "".join(bytes([b]).decode("cp1252", errors="ignore") or chr(b) for b in range(256))
_LATIN1 = "combined_mariadb_latin1"


#: Charsets whose Python codec of the same name reads other bytes than the
#: server writes: UTF-16, UTF-32 and UCS-2 are big-endian in MariaDB, while
#: Python's utf16 and utf32 take the machine's order when no BOM leads (and
#: Python has no ucs2).
_CHARSETS = {
    "utf16": "utf-16-be",
    "utf32": "utf-32-be",
    "ucs2": "utf-16-be",
    "utf16le": "utf-16-le",
    "latin1": _LATIN1,
    "cp1252": _LATIN1,  # how the library names latin1 (the server has no other cp1252)
}


def column_encoding(column: Any) -> str | None:
    from pymysqlreplication.row_event import RowsEvent

    name = getattr(column, "character_set_name", None)
    if name is None:
        return "utf-8"  # the library's default when the log names no charset
    encoding = _CHARSETS.get(str(name).lower()) or str(RowsEvent.charset_to_encoding(name))
    try:
        codecs.lookup(encoding)
    except LookupError:
        return None  # the library keeps these values as bytes
    return encoding


def library_charsets(columns: Sequence[Any]) -> None:
    """Name each text column of a table map by the codec that reads it as the server writes it.

    The library decodes a string with the Python codec of the charset's
    name: utf16 and utf32 in the machine's order, ucs2 not at all (kept as
    bytes), latin1 as Python's cp1252, which refuses 0x81. Named by the
    codec :func:`column_encoding` picks (a name the library passes through as
    is), the library's per-value path reads what the native one reads.
    Changes the table map's columns in place; naming them again is a no-op.
    """
    for column in columns:
        name = getattr(column, "character_set_name", None)
        if name is not None and str(name).lower() in _CHARSETS:
            column.character_set_name = _CHARSETS[str(name).lower()]


#: The library's encoding names read as Python reads them: UTF-8, and binary (bytes).
_AS_IS = frozenset({"utf8", "utf-8", "utf8mb4", "binary"})
#: Python codecs that may read a multi-byte charset as the server does, tried in order
#: after the one of its name (MariaDB's euckr is Microsoft's cp949, its eucjpms and
#: ujis are EUC-JP and its sjis Shift JIS, as the server's tables tell).
_LIKE = {
    "euckr": ("cp949",),
    "eucjpms": ("euc_jp", "euc_jis_2004"),
    "ujis": ("euc_jp",),
    "sjis": ("shift_jis", "cp932"),
    "big5": ("cp950",),
}
#: A charset no codec reads as the server does: the reason, by the library's name of it.
_UNREADABLE: dict[str, str] = {}
#: Codecs made from the server's tables, by name: a single-byte charset's decoding table,
#: or a multi-byte one's Python codec with the server's readings of what it reads otherwise.
_TABLES: dict[str, str] = {_LATIN1: _LATIN1_TABLE}
_PATCHED: dict[str, Patched] = {}
#: The library's names of the charsets the server was asked about.
_ASKED: set[str] = set()

Query = Callable[[str], list[tuple[Any, ...]]]


@dataclass(frozen=True)
class Patched:
    """A Python codec, with the server's reading where it reads other characters; or,
    with no codec (``base`` None), the server's reading of each sequence alone."""

    base: str | None
    fixes: dict[int, str]
    #: The server's reading of each sequence it reads as one character.
    server: dict[bytes, str]
    #: The name its :meth:`handle` is registered under.
    errors: str

    def decode(self, data: bytes) -> str:
        if self.base is None:
            out, at = [], 0
            while at < len(data):
                text, at = self.read_at(data, at)
                out.append(text)
            return "".join(out)
        text = codecs.decode(data, self.base, self.errors)
        return text.translate(self.fixes) if self.fixes else text

    def encode(self, text: str, errors: str = "strict") -> tuple[bytes, int]:
        if self.base is None:
            raise UnicodeError("a charset read from the server's readings is read, not written")
        return text.encode(self.base, errors), len(text)

    def handle(self, error: UnicodeError) -> tuple[str, int]:
        """What the server reads where the Python codec reads nothing."""
        assert isinstance(error, UnicodeDecodeError)
        return self.read_at(error.object, error.start)

    def read_at(self, data: bytes, at: int) -> tuple[str, int]:
        """The character the server reads at ``at``: of the longest sequence it reads as
        one (``?`` where it maps it to none), else ``?`` for the one byte."""
        for size in (3, 2, 1):
            text = self.server.get(bytes(data[at : at + size]))
            if text is not None and at + size <= len(data):
                return text, at + size
        return "?", at + 1


_HANDLER = "combined_mariadb_"


def _served_codec(name: str) -> codecs.CodecInfo | None:
    table = _TABLES.get(name)
    if table is not None:
        encoding = codecs.charmap_build(table)
        return codecs.CodecInfo(
            name=name,
            encode=lambda text, errors="strict": codecs.charmap_encode(text, errors, encoding),
            decode=lambda data, errors="strict": codecs.charmap_decode(data, errors, table),
        )
    patched = _PATCHED.get(name)
    if patched is None:
        return None
    return codecs.CodecInfo(
        name=name,
        encode=patched.encode,
        decode=lambda data, errors="strict": (patched.decode(bytes(data)), len(data)),
    )


codecs.register(_served_codec)


def learn_charsets(columns: Sequence[Any], plans: Mapping[str, Any], query: Query) -> None:
    """Read from the server how it reads each charset of the dataset's text columns.

    Once per charset and process: a single-byte charset becomes the table of
    its 256 bytes as the server converts them to utf8mb4; a multi-byte one the
    Python codec that, with the server's reading of the one and two byte
    sequences (three for EUC-JP's) where it reads others, reads every one of
    them as the server does. A charset no codec reads so is refused, naming the
    column: before, Python's codec of its name failed the capture (cp1250's
    0x81) or read other characters silently (cp866, koi8u, swe7, sjis's 0x815F),
    and a charset Python has no codec for (eucjpms, dec8) was read as UTF-8.
    """
    for column in columns:
        plan = plans.get(str(getattr(column, "name", "")))
        name = getattr(column, "character_set_name", None)
        if plan is None or name is None:
            continue
        known = str(name).lower()
        if known not in _AS_IS and known not in _CHARSETS and known not in _UNREADABLE:
            _learn(known, getattr(column, "collation_name", None), query)
        if known in _UNREADABLE:
            raise SchemaMismatch(
                f"column {plan.name!r} ({plan.source_type}) is in a charset {_UNREADABLE[known]}",
                hint="leave the column out of the dataset's `columns:`, capture the relation "
                "with the snapshot or cursor strategy, or convert the column to utf8mb4 "
                "(ALTER TABLE ... MODIFY ... CHARACTER SET utf8mb4)",
                column=plan.name,
            )


def _learn(known: str, collation: Any, query: Query) -> None:
    """Learn ``known`` from the server, once (each transaction logs its own table map);
    again after a failed query."""
    if known in _ASKED or not _NAME.fullmatch(known):
        return
    _ask(known, collation, query)
    _ASKED.add(known)


def _ask(known: str, collation: Any, query: Query) -> None:
    where = (
        f"c.COLLATION_NAME = '{collation}'"
        if collation is not None and _NAME.fullmatch(str(collation))
        else f"c.CHARACTER_SET_NAME = '{known}'"
    )
    found = query(
        "SELECT s.CHARACTER_SET_NAME, s.MAXLEN FROM information_schema.COLLATIONS c "
        f"JOIN information_schema.CHARACTER_SETS s USING (CHARACTER_SET_NAME) WHERE {where}"
    )
    if not found:
        return  # not a charset of this server's: its codec as before
    charset, most = str(found[0][0]), int(found[0][1])
    codec = f"{_HANDLER}{charset}"
    if charset in ("utf8mb3", "utf8mb4", "utf8", "binary", "latin1") or charset in _CHARSETS:
        return
    if most == 1:
        table = _server_text(query, charset, [bytes([b]) for b in range(256)])
        if all(len(t) == 1 for t in table):
            _TABLES[codec] = "".join(table)
            _CHARSETS[known] = codec
            return
    else:
        patched = _patch(query, charset, known)
        if patched is not None:
            _PATCHED[codec] = patched
            _CHARSETS[known] = codec
            return
    _UNREADABLE[known] = f"({charset}) no codec reads from the binary log as the server does"


_NAME = re.compile(r"[A-Za-z0-9_]+")


def _sequences(most: int) -> list[bytes]:
    lead = [bytes([b]) for b in range(256)]
    two = [bytes([a, b]) for a in range(0x80, 0x100) for b in range(256)]
    three = [bytes([0x8F, a, b]) for a in range(0x80, 0x100) for b in range(0x80, 0x100)]
    return lead + two + (three if most >= 3 else [])


def _server_text(query: Query, charset: str, sequences: Sequence[bytes]) -> list[str]:
    """How the server reads each of ``sequences`` in ``charset``, as utf8mb4."""
    out: list[str] = []
    for at in range(0, len(sequences), 4096):
        part = sequences[at : at + 4096]
        values = " UNION ALL ".join(
            f"SELECT {i} AS n, X'{s.hex()}' AS b" for i, s in enumerate(part)
        )
        rows = query(
            f"SELECT HEX(CONVERT(CONVERT(b USING {charset}) USING utf8mb4)) "
            f"FROM ({values}) AS s ORDER BY n"
        )
        out += [bytes.fromhex(str(r[0])).decode("utf-8") for r in rows]
    return out


def _patch(query: Query, charset: str, known: str) -> Patched | None:
    """The Python codec, patched with the server's readings, that reads every short
    sequence of ``charset`` as the server does; else the server's readings alone, if
    they do (None: neither does)."""
    sequences = _sequences(3 if charset in ("ujis", "eucjpms") else 2)
    server = dict(zip(sequences, _server_text(query, charset, sequences), strict=True))
    ones = {k: v for k, v in server.items() if len(v) == 1}
    for base in (known, *_LIKE.get(charset, ()), None):
        try:
            base = codecs.lookup(base).name if base is not None else None
        except LookupError:
            continue
        errors = f"{_HANDLER}{charset}_{base}"
        patched = Patched(base, _fixes(server, base) if base else {}, ones, errors)
        codecs.register_error(errors, patched.handle)
        if all(patched.decode(raw) == text for raw, text in server.items()):
            return patched
    return None


def _fixes(server: Mapping[bytes, str], base: str) -> dict[int, str]:
    """The characters ``base`` reads where the server reads others, by what it reads."""
    fixes: dict[int, str] = {}
    for raw, text in server.items():
        try:
            mine = raw.decode(base)
        except UnicodeDecodeError:
            continue  # (read by the handler, from the server's readings)
        if len(mine) == len(text):
            fixes.update((ord(m), t) for m, t in zip(mine, text, strict=True) if m != t)
    return fixes
