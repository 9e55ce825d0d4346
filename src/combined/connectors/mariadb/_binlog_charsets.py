"""The text of a binary log's string columns, decoded in their charset as the server reads it.

The log carries a string in its column's charset (named by the table map,
``binlog_row_metadata=FULL``); the snapshot reads the server's conversion of
it to utf8mb4. A Python codec of the charset's name decodes other bytes than
the server for some charsets: these are named here by the codec that reads
them as the server does.
"""

from __future__ import annotations

import codecs
from collections.abc import Sequence
from typing import Any

#: MariaDB's latin1 is cp1252 with its five unassigned bytes (0x81, 0x8D, 0x8F,
#: 0x90, 0x9D) read as the C1 controls of the same number; Python's cp1252 refuses them.
_LATIN1_TABLE = "".join(bytes([b]).decode("cp1252", errors="ignore") or chr(b) for b in range(256))
_LATIN1 = "combined_mariadb_latin1"


def _latin1_codec(name: str) -> codecs.CodecInfo | None:
    if name != _LATIN1:
        return None
    encoding = codecs.charmap_build(_LATIN1_TABLE)
    return codecs.CodecInfo(
        name=_LATIN1,
        encode=lambda text, errors="strict": codecs.charmap_encode(text, errors, encoding),
        decode=lambda data, errors="strict": codecs.charmap_decode(data, errors, _LATIN1_TABLE),
    )


codecs.register(_latin1_codec)

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
