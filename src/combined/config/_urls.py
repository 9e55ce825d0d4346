"""The project file's URLs and version: the lake's, the catalog's, and what they name."""

from __future__ import annotations

import re
from typing import Literal
from urllib.parse import urlsplit

from combined._credentials import has_inline_credential
from combined.config._values import _error, _text

_URL = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.-]*)://(.*)$", re.DOTALL)
_LAKE_SCHEMES = ("s3", "gs", "az", "file")
_CATALOG_HINT = "use sqlite:///PATH or postgresql://USER@HOST/DB (Combined chooses the driver)"

CatalogKind = Literal["sqlite", "postgresql"]
# The catalog's URL schemes; ``postgres://`` is PostgreSQL, as libpq reads it.
_CATALOG_SCHEMES: dict[str, CatalogKind] = {
    "sqlite": "sqlite",
    "postgresql": "postgresql",
    "postgres": "postgresql",
}
CATALOG_DRIVERS: dict[CatalogKind, str] = {"sqlite": "pysqlite", "postgresql": "psycopg"}
"""The SQLAlchemy driver the catalog uses for each kind of database."""


def _lake(value: object) -> str:
    hint = "use a local path or a file://, s3://, gs:// or az:// URL"
    text = _text(value)
    url = _URL.match(text)
    if url is None:
        return text
    if url.group(1).lower() == "file":
        if not url.group(2).startswith("/"):
            raise _error("is a file:// URL without an absolute path", "e.g. file:///data/lake")
        _refuse_escapes(url.group(2))
        return text
    if url.group(1).lower() not in _LAKE_SCHEMES:
        raise _error(f"uses an unsupported scheme: {url.group(1)}://", hint)
    if has_inline_credential(text):
        raise _error(
            "holds a credential inside the URL",
            "remove it; object stores read credentials from their usual environment",
        )
    _refuse_escapes(url.group(2))
    if not url.group(2).strip("/"):
        raise _error("names no bucket or container", hint)
    return text


def _refuse_escapes(path: str) -> None:
    """Refuse a lake URL's path holding ``%``, ``?`` or ``#``.

    The Delta library decodes a %xx where Arrow keeps it (its log under `pct x/`, its
    data under `pct%20x/`), and a `?` or `#` cut the table's path short.
    """
    if odd := sorted({c for c in "%?#" if c in path}):
        raise _error(
            f"holds {' and '.join(repr(c) for c in odd)}, which the lake's readers and "
            "writers take apart differently",
            "name the lake's folder without '%', '?' and '#' (spaces and other letters are "
            "written as they are: s3://bucket/my lake)",
        )


def _catalog(value: object) -> str:
    text = _text(value)
    url = _URL.match(text)
    if url is None:
        raise _error("is not a database URL", _CATALOG_HINT)
    if catalog_kind(text) is None:
        scheme = url.group(1)
        what = "driver" if scheme.partition("+")[0].lower() in _CATALOG_SCHEMES else "scheme"
        raise _error(f"uses an unsupported {what}: {scheme}://", _CATALOG_HINT)
    if has_inline_credential(text):
        raise _error(
            "holds a password inside the URL",
            'remove it from the URL and set `catalog_password: {secret: "env:NAME"}`',
        )
    try:
        _ = urlsplit(text).port  # reading the port checks it: SQLAlchemy will read it too
    except ValueError as exc:
        raise _error(f"is not a valid URL ({exc})", _CATALOG_HINT) from None
    return text


def catalog_kind(url: str) -> CatalogKind | None:
    """Which database a catalog URL names; None for an unsupported scheme or driver.

    A ``+driver`` after the scheme may name only the driver Combined uses
    (:data:`CATALOG_DRIVERS`).
    """
    backend, _, driver = url.partition("://")[0].lower().partition("+")
    kind = _CATALOG_SCHEMES.get(backend)
    if kind is None or driver not in ("", CATALOG_DRIVERS[kind]):
        return None
    return kind


def _version(value: object) -> Literal[1]:
    if value == 1 and not isinstance(value, bool):
        return 1
    if isinstance(value, str):
        raise _error(
            f"is the text {value!r}, not a number",
            "write `version: 1`: the number 1, unquoted",
        )
    raise _error(
        f"is {value!r}, but this Combined reads version 1",
        "write `version: 1`, or upgrade Combined to read newer project files",
    )
