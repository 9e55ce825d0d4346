"""A program's state as a checkpoint keeps it: exact, and without a secret.

A Singer tap's or an Airbyte source's STATE is opaque: it goes back to the
program, on the next read, as it wrote it. Its numbers are parsed exact
(``Decimal``); a checkpoint is JSON, and JSON's floats would round them (a
bookmark of 0.99999999999999999 came back as 1.0, past rows never read).
So the state is kept as its JSON text (``<key>_json``), every number written
with the digits it holds. Every string in it (names too) has the configured
secrets masked first: a program that writes its token into its state would
otherwise put it in the catalog and the lake's commit metadata. The mask
goes back to the program with the rest.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from decimal import Decimal
from typing import Any


def exact_json(value: Any) -> str:
    """JSON text of ``value``, each ``Decimal`` written as the digits it holds."""
    if isinstance(value, Decimal):
        if not value.is_finite():
            raise ValueError(f"{value} is not a JSON number")
        return str(value)
    if isinstance(value, Mapping):
        items = (f"{json.dumps(str(k))}:{exact_json(v)}" for k, v in value.items())
        return "{" + ",".join(items) + "}"
    if isinstance(value, list | tuple):
        return "[" + ",".join(exact_json(v) for v in value) + "]"
    return json.dumps(value)


def masked(value: Any, scrub: Callable[[str], str]) -> Any:
    """``value`` with ``scrub`` applied to every string in it, names included."""
    if isinstance(value, str):
        return scrub(value)
    if isinstance(value, Mapping):
        return {scrub(str(k)): masked(v, scrub) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [masked(v, scrub) for v in value]
    return value


def kept_state(key: str, value: Any, scrub: Callable[[str], str]) -> dict[str, Any]:
    """The checkpoint's entry of a program's state ``value``: ``{<key>_json: text}``."""
    return {f"{key}_json": exact_json(masked(value, scrub))}


def program_state(state: Mapping[str, Any] | None, key: str) -> Any:
    """The program's state a checkpoint kept (exact numbers as ``Decimal``), else None.

    A checkpoint written before the text was kept holds the parsed value
    under ``key`` itself.
    """
    if not state:
        return None
    text = state.get(f"{key}_json")
    if isinstance(text, str):
        return json.loads(text, parse_float=Decimal)
    return state.get(key)


__all__ = ["exact_json", "kept_state", "masked", "program_state"]
