"""Every form a known secret may take in a text, and one function that masks them all.

A secret is echoed in other shapes than its own: a server's error quotes the
URL it was sent, percent-encoded by whatever encoder built it (``%2f`` or
``%2F``, ``/`` kept or not, a space as ``+`` or ``%20``); a JSON body or a
repr escapes its quotes; a basic ``Authorization`` holds it in base64; a log
keeps each line of a PEM key on its own. An exact list of encoded forms
missed the mixed ones (a token percent-encoded in lowercase hex was stored
in a Run's error), so a secret's URL form is a pattern: each of its
characters as it is or as the percent-escapes of its UTF-8 bytes, in either
case, any character (an encoder may write `~` as `%7E`, or every letter).
A text holding no ``%`` or ``+`` (most log lines) is asked the plain forms
alone; any other all of them, in one alternation.
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
def forms(value: str, shortest: int = MIN_KNOWN_LENGTH) -> tuple[dict[str, int], dict[str, int]]:
    """Patterns of the texts ``value`` may be written as (itself, without the spaces and
    line ends around it, escaped in JSON or a repr, in base64, each of its lines) and of
    its URL-encoded forms, each with the length of what it hides. ``shortest``: the least
    length of the whole value's forms; a line of fewer than 8 characters is never one (a
    `{` of a JSON key file, a PEM's `AB==`)."""
    bare = value.strip()  # (a secret file's last line end: the value is used without it)
    whole = {value, bare, json.dumps(value)[1:-1], repr(value)[1:-1]}
    texts = {t for t in whole if len(t.strip()) >= shortest} | base64_forms(value)
    lines = value.splitlines()
    texts |= {t for t in lines if len(lines) > 1 and len(t.strip()) >= _MIN_LINE}
    plain = {re.escape(t): len(t) for t in texts}
    # (every character may be encoded: `~` as %7E, or every one, as some encoders do)
    encoded = {url_form(v): len(v) for v in {value, bare} if len(v.strip()) >= shortest}
    return plain, encoded


@dataclass
class Masker:
    """Masks the forms of a set of secrets in one alternation, the longest hidden text
    first (none left half shown by a shorter one it contains): the plain forms alone, or
    with the URL-encoded ones in a text that may hold them (compiled when first needed)."""

    values: frozenset[str]
    shortest: int = MIN_KNOWN_LENGTH
    _plain: re.Pattern[str] | None = field(init=False, default=None)
    _forms: list[tuple[int, int, str]] = field(init=False, default_factory=list)
    _every: re.Pattern[str] | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        plain: dict[str, int] = {}
        for value in self.values:
            texts, encoded = forms(value, self.shortest)
            plain.update(texts)
            # (an encoded form before a plain one of the same length: `000%` is in `000%25`)
            self._forms += [(-n, 0, form) for form, n in encoded.items()]
        self._forms += [(-n, 1, form) for form, n in plain.items()]
        self._forms.sort()
        if plain:
            self._plain = re.compile("|".join(f for f, _ in sorted(plain.items(), key=_longest)))

    def __call__(self, text: str, mask: str) -> str:
        if "%" in text or "+" in text:
            if self._every is None and self._forms:
                self._every = re.compile("|".join(form for _, _, form in self._forms))
            pattern = self._every
        else:
            pattern = self._plain
        return pattern.sub(mask, text) if pattern is not None else text


def _longest(item: tuple[str, int]) -> tuple[int, str]:
    return -item[1], item[0]


def masker_of(values: Iterable[str], shortest: int = MIN_KNOWN_LENGTH) -> Masker | None:
    """A :class:`Masker` of ``values``, or None when none has a form to mask."""
    chosen = frozenset(v for v in values if any(forms(v, shortest)))
    return Masker(chosen, shortest) if chosen else None


__all__ = ["MIN_KNOWN_LENGTH", "Masker", "base64_forms", "forms", "masker_of", "url_form"]
