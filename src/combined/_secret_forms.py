"""Every form a known secret may take in a text, as one pattern that masks them all.

A secret is echoed in other shapes than its own: a server's error quotes the
URL it was sent, percent-encoded by whatever encoder built it (``%2f`` or
``%2F``, ``/`` kept or not, a space as ``+`` or ``%20``, an unreserved
character encoded or not); a JSON body or a repr escapes its quotes; a
basic ``Authorization`` holds it in base64; a log keeps each line of a PEM
key on its own. An exact list of encoded forms missed the mixed ones (a
token percent-encoded in lowercase hex was stored in a Run's error), so a
secret's URL form is a pattern: each of its characters as it is or as the
percent-escapes of its UTF-8 bytes, in either case.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Iterable

MIN_KNOWN_LENGTH = 4
"""How long a known secret must be to be masked everywhere: a shorter one would
mask ordinary words (a one-letter password, every occurrence of that letter)."""


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
        options = [re.escape(char), hexed, *([r"\+"] if char == " " else [])]
        parts.append(f"(?:{'|'.join(options)})")
    return "".join(parts)


def forms(value: str, shortest: int = MIN_KNOWN_LENGTH) -> dict[str, int]:
    """Patterns of every form of ``value`` (of at least ``shortest`` characters), each with
    the length of what it hides."""
    texts = {*value.splitlines(), json.dumps(value)[1:-1], repr(value)[1:-1]}
    found = {
        re.escape(t): len(t) for t in texts | base64_forms(value) if len(t.strip()) >= shortest
    }
    if len(value.strip()) >= shortest:
        found[url_form(value)] = len(value) + 1  # (the whole value before its lines)
    return found


def pattern_of(values: Iterable[str], shortest: int = MIN_KNOWN_LENGTH) -> re.Pattern[str] | None:
    """One pattern of every form of ``values``: the longest first, none left half shown by a
    shorter one it contains; None for no form."""
    every: dict[str, int] = {}
    for value in values:
        every.update(forms(value, shortest))
    if not every:
        return None
    return re.compile("|".join(sorted(every, key=lambda form: (-every[form], form))))


__all__ = ["MIN_KNOWN_LENGTH", "base64_forms", "forms", "pattern_of", "url_form"]
