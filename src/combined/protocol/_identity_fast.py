"""The canonical texts of a batch as one two-level DuckDB SELECT: the staging hot path.

The same texts as :func:`identity_text_sql` and :func:`payload_text_sql` (the
reference, ``_identity_sql``), byte for byte, computed with less work
(tests compare the two over every type family, with and without nulls):

* an inner projection computes each top-level column's text once, a list's
  or struct's too (DuckDB shares a repeated scalar expression by itself, but
  not one holding a lambda; the reference binds a nested text to a lambda
  parameter instead, which builds a one-element list per row);
* the outer concat then takes that text, its byte length and ``':'`` as
  pieces, without the ``strlen(...) || ':'`` string built per cell;
* a column the batch holds without a null (``nonnull``) skips the
  ``CASE WHEN v IS NULL`` that picks its head, and adjacent constant pieces
  merge into one literal;
* a list's scalar items build their text in one CASE, not a concat of a
  CASE and a length string.

Measured on one DuckDB thread, the canonical texts of a million narrow rows
(bigint, int, text, timestamptz) cost about a fifth less, of a list of
strings about half (bench/RESULTS.md, "The staging hash's SQL").
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

import pyarrow as pa

from combined.protocol._identity_sql import (
    _cell_sql,
    _checked_key,
    _checked_payload,
    _concat,
    _field_type,
    _literal,
    _nested_text_sql,
    _refuse_wide_members,
    _scalar_tlv,
    quote_ident,
)
from combined.protocol._identity_types import (
    _NULL,
    _TAGS,
    IDENTITY_ENCODING,
    _kind,
    _tlv_py,
)

#: Inner text columns are named ``__combined_t<i>``; no source column starts so.
_TEXT = "__combined_t"


@dataclass(frozen=True)
class _Text:
    """One top-level column's text in the inner projection."""

    column: str  # the inner column holding the text (NULL exactly when the value is)
    tag: str
    length: str | None  # a constant byte length, or None: strlen of the text


class _Lit(str):
    """A SQL string literal piece, kept apart so that adjacent ones merge."""

    raw: str

    def __new__(cls, raw: str) -> _Lit:
        piece = super().__new__(cls, _literal(raw))
        piece.raw = raw
        return piece


def _merged(pieces: Sequence[str]) -> list[str]:
    out: list[str] = []
    for piece in pieces:
        if isinstance(piece, _Lit) and out and isinstance(out[-1], _Lit):
            out[-1] = _Lit(out[-1].raw + piece.raw)
        else:
            out.append(piece)
    return out


def _item_sql(v: str, t: pa.DataType, depth: int, where: str) -> str:
    """``<tag><n>:<text>`` of a list item ``v``, ``n0:`` when NULL (the reference's text)."""
    kind = _kind(t, where)
    scalar = _scalar_tlv(v, t, kind) if kind != "null" else None
    if scalar is None:  # a null type or a nested item: the reference's expression
        return _cell_sql(v, t, depth, where)
    tag, text, length = scalar
    if length is not None and length.isdigit():
        body = f"concat({_literal(f'{tag}{length}:')}, {text})"
    else:
        size = length if length is not None else f"strlen({text})"
        body = f"concat({_literal(tag)}, {size}, ':', {text})"
    return f"(CASE WHEN {v} IS NULL THEN {_literal(_NULL)} ELSE {body} END)"


def _inner_text(v: str, t: pa.DataType, kind: str, where: str, nonnull: bool) -> tuple[str, str]:
    """``(tag, text)`` of a nested top-level ``v``: its text without tag and length."""
    _refuse_wide_members(t, where)
    value_t = t.value_type if pa.types.is_dictionary(t) else t
    if kind == "list":
        var = "__combined_v0"
        item = _item_sql(var, value_t.value_type, 1, f"{where}[]")
        text = f"array_to_string(list_transform({v}, lambda {var}: {item}), '')"
    else:  # a struct's or map's text: the reference's
        text = _nested_text_sql(v, t, kind, 0, where)
    if not nonnull and kind != "list":
        # (a struct's concat is never NULL: NULL exactly when the value is; a
        # list's text is, and a CASE over a list cost as much again as its text)
        text = f"(CASE WHEN {v} IS NULL THEN NULL ELSE {text} END)"
    return _TAGS[kind], text


class FastTexts:
    """The two-level SELECT of a batch's canonical key and payload texts.

    ``nonnull`` names the top-level columns that hold no null in the batch
    (a dictionary column never counts: its values can be null where its
    indices are not).
    """

    def __init__(
        self,
        key: Sequence[str],
        payload: Sequence[str],
        schema: pa.Schema,
        nonnull: Collection[str] = (),
    ) -> None:
        # (no key: only the payload's text is asked for, as of a table without a key)
        self.key = _checked_key(key) if key else []
        self.payload = _checked_payload(payload)
        self.schema = schema
        self.nonnull = {n for n in nonnull if not pa.types.is_dictionary(_field_type(schema, n))}
        self._texts: dict[str, _Text | None] = {}
        self._inner: list[str] = []
        self._inner_of: dict[str, str] = {}  # a column's inner text, by column name
        for name in dict.fromkeys([*self.key, *self.payload]):
            self._texts[name] = self._text(name)

    def _text(self, name: str) -> _Text | None:
        t = _field_type(self.schema, name)
        kind = _kind(t, name)
        if kind == "null":
            return None
        v = quote_ident(name)
        scalar = _scalar_tlv(v, t, kind)
        if scalar is not None:
            tag, text, length = scalar
            length = length if length is not None and length.isdigit() else None
        else:
            (tag, text), length = _inner_text(v, t, kind, name, name in self.nonnull), None
        column = f"{_TEXT}{len(self._inner)}"
        self._inner.append(f"{text} AS {column}")
        self._inner_of[name] = self._inner[-1]
        return _Text(column, tag, length)

    def _pieces(self, name: str, head: str, absent: str) -> list[str]:
        text = self._texts[name]
        if text is None:  # a null type: absent, always
            return [_Lit(absent)] if absent else []
        head += text.tag
        if text.length is not None:
            head += f"{text.length}:"
            size: list[str] = []
        elif name in self.nonnull:
            size = [f"strlen({text.column})", _Lit(":")]
        else:
            size = [f"(strlen({text.column}) || ':')"]  # NULL, so skipped, with the text
        if name in self.nonnull:
            return [_Lit(head), *size, text.column]
        when_null = "NULL" if absent == "" else _literal(absent)
        first = f"(CASE WHEN {text.column} IS NULL THEN {when_null} ELSE {_literal(head)} END)"
        return [first, *size, text.column]

    def nullable(self) -> int:
        """Payload columns the batch holds a null in (their texts take a CASE)."""
        return sum(1 for name in self.payload if name not in self.nonnull)

    def identity_text(self) -> str:
        """The outer expression of the key's canonical text (as ``identity_text_sql``)."""
        pieces: list[str] = [_Lit(IDENTITY_ENCODING)]
        for name in self.key:
            pieces += self._pieces(name, "", _NULL)
        return _concat(_merged(pieces))

    def payload_text(self) -> str:
        """The outer expression of the payload's canonical text (as ``payload_text_sql``)."""
        return self._payload_concat([_Lit(IDENTITY_ENCODING)], self.payload)

    def _payload_concat(self, head: list[str], names: Sequence[str]) -> str:
        pieces = list(head)
        for name in names:
            pieces += self._pieces(name, _tlv_py("s", name), "")
        return _concat(_merged(pieces))

    def stages(self, md5: str, acc: str, columns: int, relation: str) -> list[str]:
        """The payload's text built ``columns`` columns a statement, each adding to ``acc``.

        DuckDB holds a 2,048-row vector for every node of an expression, a
        payload's concat ~0.23 MB a column: one statement over 1,600 columns
        would hold ~370 MB whatever the rows. Each statement reads ``relation``
        (the batch, and from the second on the text so far as ``acc``); the
        first gives ``id`` (with a key) and ``acc``, the last ``payload_hash``
        (``md5`` of the whole text: the same text, as concat is associative).
        """
        chunks = [self.payload[i : i + columns] for i in range(0, len(self.payload), columns)]
        statements = []
        for i, chunk in enumerate(chunks):
            head: list[str] = [quote_ident(acc)] if i else [_Lit(IDENTITY_ENCODING)]
            text = self._payload_concat(head, chunk)
            last = i == len(chunks) - 1
            outer = [f"{md5}({text}) AS payload_hash" if last else f"{text} AS {quote_ident(acc)}"]
            needed = [*chunk]
            if i == 0 and self.key:
                outer.insert(0, f"{md5}({self.identity_text()}) AS id")
                needed = [*self.key, *chunk]
            inner = [self._inner_of[n] for n in dict.fromkeys(needed) if n in self._inner_of]
            inner = ([quote_ident(acc)] if i else []) + (inner or ["1 AS __combined_none"])
            select = f"SELECT {', '.join(inner)} FROM {relation}"
            statements.append(f"SELECT {', '.join(outer)} FROM ({select})")
        return statements

    def select(self, outer: Sequence[str], relation: str, order: str | None = None) -> str:
        """``SELECT <outer> FROM (SELECT <texts> FROM <relation>)``, rows in scan order.

        ``order`` names a column of ``relation`` to sort the rows by, for a
        connection that does not preserve insertion order.
        """
        inner = list(self._inner) or ["1 AS __combined_none"]
        tail = ""
        if order is not None:
            inner.append(quote_ident(order))
            tail = f" ORDER BY {quote_ident(order)}"
        return f"SELECT {', '.join(outer)} FROM (SELECT {', '.join(inner)} FROM {relation}){tail}"
