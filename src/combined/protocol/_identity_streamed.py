"""Payload hashes of rows holding byte strings of megabytes, their text fed to md5 in pieces.

A byte string's canonical text is its lowercase hex (``docs/identity.md``,
section 1.2). In SQL, ``lower(hex(v))`` inside the row's ``concat`` builds
the hex, its lowercase copy and the row's whole text, each twice the
value's bytes, before md5 reads any of it: a row of 10 MB held 60-70 MB of
DuckDB's memory while it was hashed, and ``lower`` alone costs as much CPU
as md5. A row whose byte strings hold more than ``STREAMED_BYTES`` is hashed
here instead, by a vectorised function DuckDB calls with the row's pieces:
the text of the members around each byte string (built by the same SQL as
the whole text) and the byte string itself, whose hex md5 is fed a megabyte
at a time. The text, and so the digest, is the same; other rows keep the SQL.
"""

from __future__ import annotations

import binascii
import hashlib
import inspect
import threading
from collections.abc import Callable, Sequence
from functools import partial
from typing import TYPE_CHECKING

import pyarrow as pa

from combined.protocol._digest import HEX, Digest, digest_sql_type, digest_type
from combined.protocol._identity_sql import (
    _checked_payload,
    _concat,
    _field_type,
    _member_pieces,
    payload_hash_sql,
    quote_ident,
)
from combined.protocol._identity_types import IDENTITY_ENCODING, _kind, _tlv_py

if TYPE_CHECKING:
    import duckdb

#: Bytes of a row's byte strings past which the row is hashed in pieces. Measured
#: on one thread over 160 MB of rows (bench/RESULTS.md): byte strings of 1 kB
#: cost 2.06 CPU-s in pieces against 1.46 in SQL (a Python call a row), of
#: 8 kB 0.88 against 1.16, of 64 kB 0.74 against 1.55, of 8 MB 0.75 against 1.52
#: (and a sixth of the memory).
STREAMED_BYTES = 64 << 10
#: Bytes of a byte string turned into hex at a time.
_PIECE = 1 << 20
_LOCK = threading.Lock()


def streamed_payload_hash_sql(
    con: duckdb.DuckDBPyConnection,
    columns: Sequence[str],
    schema: pa.Schema,
    digest: Digest = HEX,
    *,
    large: int = STREAMED_BYTES,
) -> str:
    """:func:`payload_hash_sql`, hashing rows of byte strings over ``large`` bytes in pieces.

    The function it calls is created on ``con`` (its cursors see it too).
    Without a byte string among ``columns``, :func:`payload_hash_sql` itself.
    """
    names = _checked_payload(columns)
    blobs = [n for n in names if _kind(_field_type(schema, n), n) == "binary"]
    whole = payload_hash_sql(columns, schema, digest)
    if not blobs:
        return whole
    # The text between byte strings, each byte string's member head, in order.
    texts: list[list[str]] = [[f"'{IDENTITY_ENCODING}'"]]
    heads: list[bytes] = []
    for name in names:
        if name in blobs:
            heads.append((_tlv_py("s", name) + "x").encode("utf-8"))
            texts.append([])
        else:
            texts[-1].extend(
                _member_pieces(name, quote_ident(name), _field_type(schema, name), 0, "")
            )
    cast = [f"CAST({quote_ident(n)} AS BLOB)" for n in blobs]
    args = [_concat(texts[0])]
    for value, text in zip(cast, texts[1:], strict=True):
        args += [value, _concat(text)]
    function = _function(con, heads, digest, len(args))
    held = " + ".join(f"coalesce(octet_length({v}), 0)" for v in cast)
    return f"(CASE WHEN {held} > {large} THEN {function}({', '.join(args)}) ELSE {whole} END)"


#: The function of each name, for the process's life: a database's catalog keeps
#: a function created on one of its cursors after that cursor closed, and calls
#: the Python object it was given (freed with the cursor, it crashed the next
#: reduction of a database kept open, found by review).
_FUNCTIONS: dict[str, Callable[..., pa.Array]] = {}


def _function(
    con: duckdb.DuckDBPyConnection, heads: Sequence[bytes], digest: Digest, arity: int
) -> str:
    """The name of the function hashing rows of these byte strings' ``heads``, created once."""
    import duckdb

    key = hashlib.md5(repr((digest, list(heads))).encode("utf-8")).hexdigest()[:16]
    name = f"_combined_streamed_md5_{key}"
    with _LOCK:
        digests = _FUNCTIONS.get(name)
        if digests is None:
            digests = partial(_digests, heads=heads, digest=digest)
            # (DuckDB counts the function's parameters: one for each piece)
            digests.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
                [
                    inspect.Parameter(f"p{i}", inspect.Parameter.POSITIONAL_ONLY)
                    for i in range(arity)
                ]
            )
            _FUNCTIONS[name] = digests
    from duckdb.func import ARROW, SPECIAL

    try:
        con.create_function(
            name,
            digests,
            ["VARCHAR", *["BLOB", "VARCHAR"] * len(heads)],
            digest_sql_type(digest),
            type=ARROW,
            null_handling=SPECIAL,  # (a null byte string is a member left out)
            side_effects=False,
        )
    except (duckdb.NotImplementedException, duckdb.CatalogException):
        pass  # (created before on this connection, or on another of its database)
    return name


def _digests(*pieces: pa.Array, heads: Sequence[bytes], digest: Digest) -> pa.Array:
    """Each row's md5 of its ``pieces``: texts, with a byte string between each two."""
    texts, blobs = pieces[0::2], pieces[1::2]
    out: list[bytes | str] = []
    for row in range(len(pieces[0])):
        md5 = hashlib.md5()
        _feed(md5, texts[0][row])
        for head, blob, text in zip(heads, blobs, texts[1:], strict=True):
            value = blob[row].as_buffer() if blob[row].is_valid else None
            if value is not None:  # (a null member is left out)
                md5.update(head + b"%d:" % (2 * value.size))
                view = memoryview(value)
                for start in range(0, len(view), _PIECE):
                    md5.update(binascii.hexlify(view[start : start + _PIECE]))
            _feed(md5, text[row])
        out.append(md5.hexdigest() if digest == HEX else md5.digest())
    return pa.array(out, digest_type(digest))


def _feed(md5: hashlib._Hash, text: pa.Scalar) -> None:
    """Feed ``md5`` a text's UTF-8 bytes, as Arrow holds them."""
    data = text.as_buffer()
    if data is not None:
        md5.update(memoryview(data))
