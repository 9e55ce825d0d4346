"""The pages of one endpoint: where the records are, and when paging safely stops.

Styles: ``none`` (one request), ``page`` (a page number, until an empty
page), ``offset`` (an offset advanced by the records read, until an empty
page), ``cursor`` (a next token from the body, passed back as a parameter,
until there is none) and ``link`` (the next URL from an RFC 8288 ``Link:
<...>; rel="next"`` header or a body path, until there is none).

Stopping is checked, never assumed: a next token or URL seen before, or a
page whose records repeat the previous page's (an API that ignores the page
parameter), fails the read instead of looping; so does a read past
``max_pages``. A short page never ends a read: an API may cap the page size
below the one asked for.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

import httpx

from combined.connectors._subprocess._rows import DECODER
from combined.connectors.http._client import Response, Session
from combined.connectors.http._restart import canonical
from combined.connectors.http._settings import Endpoint
from combined.errors import SchemaMismatch, SourceError

_MISSING = object()


@dataclass(frozen=True, slots=True)
class Page:
    """One page read: its number (from 1), URL, records and the digest of its body."""

    number: int
    url: httpx.URL
    records: list[Any]
    digest: str


def dig(body: Any, path: str) -> Any:
    """The value at dotted ``path`` in ``body`` (``_MISSING`` when a step is absent)."""
    value = body
    for step in path.split("."):
        if isinstance(value, Mapping) and step in value:
            value = value[step]
        elif isinstance(value, list) and step.isdigit() and int(step) < len(value):
            value = value[int(step)]
        else:
            return _MISSING
    return value


def decode(session: Session, response: Response) -> Any:
    """The JSON body of ``response``; SchemaMismatch naming the URL, type and length if not JSON.

    The body is read in the charset its content type names (UTF-8 when none).
    """
    declared = response.headers.get("content-type", "none")
    try:
        return DECODER.decode(response.text)
    except RecursionError:
        raise SchemaMismatch(
            f"GET {session.shown(response.url)} answered JSON nested too deep to read "
            f"({len(response.content)} bytes)",
            hint="check the endpoint: no record nests values thousands of levels deep; "
            "nothing was committed",
            content_type=response.content_type,
        ) from None
    except (UnicodeDecodeError, LookupError, ValueError):
        raise SchemaMismatch(
            f"GET {session.shown(response.url)} answered a body that is not JSON "
            f"(content type {session.scrub(declared)}, {len(response.content)} bytes)",
            hint="check the endpoint's path: it must answer JSON (in the charset its content "
            "type names, UTF-8 by default); nothing was committed",
            content_type=response.content_type,
        ) from None


def records_of(session: Session, endpoint: Endpoint, response: Response, body: Any) -> list[Any]:
    """The records of a decoded body, where ``endpoint.records`` says they are."""
    shown = session.shown(response.url)
    keys = ""
    if isinstance(body, Mapping):
        names = [str(k) for k in list(body)[:8]]
        keys = f" (its keys: {session.scrub(', '.join(names))})" if names else " (no keys)"
    where = f"config.endpoints.{endpoint.name}.records" if endpoint.declared else "`records`"
    if endpoint.records is None:
        if isinstance(body, list):
            return body
        raise SchemaMismatch(
            f"GET {shown} answered a JSON {type(body).__name__}, not a list of records{keys}",
            hint=f"set {where} to the dotted path of the list in the body (e.g. data.items)",
            path=None,
        )
    found = dig(body, endpoint.records)
    if found is None:
        return []  # an explicit null: an API's way of writing no record
    if found is _MISSING or not isinstance(found, list):
        what = "holds no" if found is _MISSING else "does not hold a list at"
        raise SchemaMismatch(
            f"GET {shown} answered a body that {what} records path {endpoint.records!r}{keys}",
            hint=f"fix {where} (run `combined discover` to see the body's shape); nothing was "
            "committed",
            path=endpoint.records,
        )
    return found


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _records_digest(records: list[Any]) -> str:
    return _digest(canonical(records).encode())


def _loop(session: Session, endpoint: Endpoint, page: int, what: str) -> SourceError:
    return SourceError(
        f"endpoint {endpoint.name!r}: page {page} {what}: paging would never end, so nothing "
        "was committed",
        hint="check the endpoint's `paginate` settings (the parameter the API reads, the path "
        "of its next token); `cursor` or `link` paging is the safe choice when the API offers it",
        endpoint=endpoint.name,
        page=page,
    )


@dataclass
class _Walk:
    """Where paging stands, and what it has seen (to refuse a loop that never ends)."""

    url: httpx.URL
    #: The page number or record offset of ``page`` and ``offset`` paging.
    position: int
    seen_tokens: set[str] = field(default_factory=set)
    seen_urls: set[str] = field(default_factory=set)
    #: The digest of the last numbered page's records.
    previous: str | None = None


def pages(
    session: Session, endpoint: Endpoint, params: Mapping[str, str], max_pages: int
) -> Iterator[Page]:
    """Read the endpoint's pages in order, with ``params`` on the first request."""
    paging = endpoint.paginate
    walk = _first(session, endpoint, params)
    number = 0
    while True:
        number += 1
        if number > max_pages:
            raise SourceError(
                f"endpoint {endpoint.name!r} has more than {max_pages} pages: the read stopped "
                "there and nothing was committed",
                hint=f"raise `max_pages` (under config or config.endpoints.{endpoint.name}."
                "paginate) if the endpoint really is that long",
                endpoint=endpoint.name,
            )
        # A token (or next link) the API expired is told apart from a refusal.
        tokened = number > 1 and paging.style in ("cursor", "link")
        response = session.get(walk.url, paging.expired if tokened else None)
        body = decode(session, response)
        records = records_of(session, endpoint, response, body)
        yield Page(number, response.url, records, _digest(response.content))
        if paging.style == "none":
            return
        if paging.style in ("page", "offset"):
            url = _numbered_next(session, endpoint, walk, records, number)
        elif paging.style == "cursor":
            url = _cursor_next(session, endpoint, walk, body, number)
        else:
            url = _link_next(session, endpoint, walk, response, body, number)
        if url is None:
            return
        walk.url = url


def _first(session: Session, endpoint: Endpoint, params: Mapping[str, str]) -> _Walk:
    """The first page's URL: ``params``, and the numbered paging's first page and size."""
    paging = endpoint.paginate
    query = dict(params)
    if paging.style in ("page", "offset"):
        assert paging.param is not None
        query[paging.param] = str(paging.start)
        if paging.size_param and paging.size:
            query[paging.size_param] = str(paging.size)
    url = session.url(endpoint.path, query)
    return _Walk(url, paging.start, seen_urls={str(url)})


def _numbered_next(
    session: Session, endpoint: Endpoint, walk: _Walk, records: list[Any], number: int
) -> httpx.URL | None:
    """``page`` or ``offset`` paging: the next page's URL; None after an empty page."""
    paging = endpoint.paginate
    if not records:
        return None
    digest = _records_digest(records)
    if digest == walk.previous:
        raise _loop(
            session,
            endpoint,
            number,
            f"holds the same records as page {number - 1} (the API may ignore "
            f"parameter {paging.param!r})",
        )
    walk.previous = digest
    walk.position += 1 if paging.style == "page" else len(records)
    assert paging.param is not None
    return walk.url.copy_set_param(paging.param, str(walk.position))


def _cursor_next(
    session: Session, endpoint: Endpoint, walk: _Walk, body: Any, number: int
) -> httpx.URL | None:
    """``cursor`` paging: the URL with the body's next token; None without one."""
    paging = endpoint.paginate
    assert paging.next is not None and paging.param is not None
    token = dig(body, paging.next)
    if token is _MISSING or token is None or token == "" or token is False:
        return None
    if isinstance(token, dict | list):
        raise SchemaMismatch(
            f"endpoint {endpoint.name!r}: the next token at {paging.next!r} on page "
            f"{number} is a JSON {type(token).__name__}, not a value",
            hint=f"point config.endpoints.{endpoint.name}.paginate.next at the token",
            endpoint=endpoint.name,
        )
    if isinstance(token, Decimal) and 0 <= token.adjusted() < 40 and token == int(token):
        token = int(token)  # (1e3: 1000, as before; 1e5000 as written, never 5001 digits)
    text = str(token)  # (a fraction as the body wrote it: a Decimal keeps its digits)
    if text in walk.seen_tokens:
        raise _loop(session, endpoint, number, "repeats a next token seen before")
    walk.seen_tokens.add(text)
    return walk.url.copy_set_param(paging.param, text)


def _link_next(
    session: Session, endpoint: Endpoint, walk: _Walk, response: Response, body: Any, number: int
) -> httpx.URL | None:
    """``link`` paging: the next link (body or Link header); None without one."""
    nxt = _next_link(endpoint, response, body, number)
    if nxt is None:
        return None
    target = response.url.join(nxt)
    session.refuse_elsewhere(target, f"the next page of endpoint {endpoint.name!r}")
    if str(target) in walk.seen_urls:
        raise _loop(session, endpoint, number, "links to a page read before")
    walk.seen_urls.add(str(target))
    return target


def _next_link(endpoint: Endpoint, response: Response, body: Any, number: int) -> str | None:
    paging = endpoint.paginate
    if paging.next is not None:
        found = dig(body, paging.next)
        if found is not _MISSING and found not in (None, ""):
            if not isinstance(found, str):
                raise SchemaMismatch(
                    f"endpoint {endpoint.name!r}: the next link at {paging.next!r} on page "
                    f"{number} is not text",
                    hint=f"point config.endpoints.{endpoint.name}.paginate.next at the next URL",
                    endpoint=endpoint.name,
                )
            return found
    return _header_next(response.headers)


def _header_next(headers: httpx.Headers) -> str | None:
    """The ``Link`` header's next URL: a link whose relations (RFC 8288: several, as
    ``rel="next last"``, compared without case) include ``next``."""
    for link in httpx.Response(200, headers=headers).links.values():
        if "next" in link.get("rel", "").lower().split():
            return link.get("url") or None
    return None


__all__ = ["Page", "decode", "dig", "pages", "records_of"]
