"""Every form a known secret may take in a text, and one function that masks them all.

A secret is echoed in other shapes than its own: a server's error quotes the
URL it was sent, percent-encoded by whatever encoder built it (``%2f`` or
``%2F``, ``/`` kept or not, a space as ``+`` or ``%20``); a JSON body or a
repr escapes its quotes; a basic ``Authorization`` holds it in base64; a log
keeps each line of a PEM key on its own. An exact list of encoded forms
missed the mixed ones (a token percent-encoded in lowercase hex was stored
in a Run's error), so a secret's URL form is a pattern: each of its
characters as it is or as the percent-escapes of its UTF-8 bytes, in either
case. It is asked only of a text holding a ``%`` or a ``+`` (most log
lines hold neither), before the plain forms.
"""

from __future__ import annotations

import base64
import functools
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field

MIN_KNOWN_LENGTH = 4
"""How long a known secret must be to be masked everywhere: a shorter one would
mask ordinary words (a one-letter password, every occurrence of that letter)."""

#: The least length of a line of a multi-line secret masked on its own.
_MIN_LINE = 8
#: Characters no URL encoder needs to encode (RFC 3986's unreserved ones).
_UNRESERVED = re.compile(r"[A-Za-z0-9._~-]*")


def base64_forms(value: str) -> set[str]:
    """The base64 texts (standard and URL-safe) that ``value`` is inside any encoding of.

    Base64 writes 3 bytes as 4 characters, so the characters a secret
    becomes depend on where it stands in what is encoded (``user:secret``
    in a basic ``Authorization``): for each of the three offsets, the groups
    of 4 its own bytes fill alone. Only forms of 8 characters or more (6
    bytes of the secret): a shorter one would mask ordinary text.
    """
    raw, forms = value.encode(), set()
    for offset in range(3):
        encoded = base64.b64encode(b"\0" * offset + raw).decode()
        core = encoded[4 if offset else 0 : 4 * ((offset + len(raw)) // 3)]
        if len(core) >= 8:
            forms |= {core, core.replace("+", "-").replace("/", "_")}
    return forms


def url_form(value: str) -> str:
    """A pattern of ``value`` with any of its characters percent-encoded (hex in either
    case), a space also as ``+``: what any URL encoder, or none, makes of it."""
    parts = []
    for char in value:
        escapes = "".join(f"%{byte:02X}" for byte in char.encode())
        hexed = "".join(f"[{c}{c.lower()}]" if c.isalpha() else c for c in escapes)
        # (the escapes first: a `%` as it is would stop short of `%25`)
        options = [hexed, re.escape(char), *([r"\+"] if char == " " else [])]
        parts.append(f"(?:{'|'.join(options)})")
    return "".join(parts)


@functools.lru_cache(maxsize=4096)
def forms(value: str, shortest: int = MIN_KNOWN_LENGTH) -> tuple[frozenset[str], str | None]:
    """The texts ``value`` may be written as (itself, escaped in JSON or a repr, in base64,
    each of its lines), and the pattern of its URL-encoded forms (None when no encoder
    changes it). ``shortest``: the least length of the whole value's forms; a line of
    fewer than 8 characters is never one (a `{` of a JSON key file, a PEM's `AB==`)."""
    whole = {value, json.dumps(value)[1:-1], repr(value)[1:-1]}
    texts = {t for t in whole if len(t.strip()) >= shortest} | base64_forms(value)
    lines = value.splitlines()
    texts |= {t for t in lines if len(lines) > 1 and len(t.strip()) >= _MIN_LINE}
    encoded = None
    if len(value.strip()) >= shortest and _UNRESERVED.fullmatch(value) is None:
        encoded = url_form(value)
    return frozenset(texts), encoded


@dataclass
class Masker:
    """Masks the forms of a set of secrets: the plain ones in one alternation, longest
    first (none left half shown by a shorter one it contains), then the URL-encoded ones
    in a text that may hold them (compiled when first needed), before the plain ones."""

    values: frozenset[str]
    shortest: int = MIN_KNOWN_LENGTH
    _plain: re.Pattern[str] | None = field(init=False, default=None)
    _encoded: list[str] = field(init=False, default_factory=list)
    _encoded_pattern: re.Pattern[str] | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        texts: set[str] = set()
        for value in self.values:
            plain, encoded = forms(value, self.shortest)
            texts |= plain
            if encoded is not None:
                self._encoded.append(encoded)
        if texts:
            ordered = sorted(sorted(texts), key=len, reverse=True)
            self._plain = re.compile("|".join(re.escape(t) for t in ordered))

    def __call__(self, text: str, mask: str) -> str:
        if self._encoded and ("%" in text or "+" in text):  # (first: `000%` is in `000%25`)
            if self._encoded_pattern is None:
                self._encoded_pattern = re.compile("|".join(sorted(self._encoded, key=len)[::-1]))
            text = self._encoded_pattern.sub(mask, text)
        if self._plain is not None:
            text = self._plain.sub(mask, text)
        return text


def masker_of(values: Iterable[str], shortest: int = MIN_KNOWN_LENGTH) -> Masker | None:
    """A :class:`Masker` of ``values``, or None when none has a form to mask."""
    chosen = frozenset(v for v in values if any(forms(v, shortest)[0]) or forms(v, shortest)[1])
    return Masker(chosen, shortest) if chosen else None


__all__ = ["MIN_KNOWN_LENGTH", "Masker", "base64_forms", "forms", "masker_of", "url_form"]
