"""The http source's configuration: a base URL, its auth, and named endpoints.

An API has no catalog to discover, so its endpoints are declared in the
source's configuration (``endpoints:``), each with its path, query
parameters, where its records are in the body, how it pages, its declared
field types and the parameter that asks for what changed since a
checkpoint. A dataset's ``relation`` names an endpoint (it defaults to the
dataset's name), or is itself a path (``/orders``) read with the defaults.

Secrets go only under ``auth`` (a bearer token, a basic password, an API
key in a header or a query parameter). Everything else (the base URL,
headers, endpoint paths and parameters) appears in errors and discovery, so
a secret reference there is refused (see ``HTTPSource.PUBLIC_KEYS``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, Literal
from urllib.parse import urlsplit

from combined.connectors._subprocess._schema import json_keys_option
from combined.connectors.abc import refuse_unknown_keys
from combined.errors import ConfigError, NotFoundError

Style = Literal["none", "page", "offset", "cursor", "link"]
STYLES: tuple[Style, ...] = ("none", "page", "offset", "cursor", "link")
AuthType = Literal["none", "bearer", "basic", "api_key"]
SinceFormat = Literal["raw", "iso"]

SOURCE_KEYS = (
    "base_url",
    "auth",
    "headers",
    "timeout",
    "rate_limit",
    "max_pages",
    "max_retry_wait",
    "max_response_bytes",
    "check_path",
    "credential_hosts",
    "json_keys",
    "endpoints",
)
ENDPOINT_KEYS = ("path", "params", "records", "paginate", "fields", "allow_empty", "since")
PAGINATE_KEYS = (
    "style",
    "param",
    "start",
    "size_param",
    "size",
    "next",
    "max_pages",
    "expired",
    "restarts",
)
EXPIRED_KEYS = ("status", "field", "values")
#: How many times a read restarts after its page token expired, by default.
DEFAULT_RESTARTS = 3
SINCE_KEYS = ("param", "format")
AUTH_KEYS: Mapping[str, tuple[str, ...]] = {
    "none": ("type",),
    "bearer": ("type", "token"),
    "basic": ("type", "username", "password"),
    "api_key": ("type", "name", "in", "api_key"),
}

#: Declared field types, as the JSON Schema the Singer mapping reads.
FIELD_TYPES: Mapping[str, Mapping[str, Any]] = {
    "integer": {"type": ["null", "integer"]},
    "number": {"type": ["null", "number"]},
    "string": {"type": ["null", "string"]},
    "boolean": {"type": ["null", "boolean"]},
    "timestamp": {"type": ["null", "string"], "format": "date-time"},
    "date": {"type": ["null", "string"], "format": "date"},
    "json": {},
}
_DECIMAL = re.compile(r"^decimal\((\d+)\)$")
_TYPES_HINT = (
    "use integer, number, decimal(2), string, boolean, timestamp (RFC 3339 with an offset), "
    "date or json (objects and arrays as JSON text)"
)

DEFAULT_TIMEOUT_S = 30.0
DEFAULT_MAX_PAGES = 10_000
DEFAULT_MAX_RETRY_WAIT_S = 60.0
DEFAULT_MAX_RESPONSE_BYTES = 64 * 1024 * 1024


def field_schema(type_: str) -> Mapping[str, Any]:
    """The JSON Schema of a declared field type (``decimal(2)`` is a number of 2 decimals)."""
    found = FIELD_TYPES.get(type_)
    if found is not None:
        return found
    match = _DECIMAL.match(type_)
    if match is None:
        raise ValueError(type_)
    return {"type": ["null", "number"], "multipleOf": Decimal(1).scaleb(-int(match.group(1)))}


@dataclass(frozen=True, slots=True)
class Auth:
    """How each request authenticates; ``value`` is the resolved secret (never shown)."""

    type: AuthType = "none"
    username: str | None = None
    value: str | None = None
    #: The header or query parameter an API key goes in.
    name: str | None = None
    place: Literal["header", "query"] = "header"

    def secrets(self) -> tuple[str, ...]:
        """The secret values every shown text must be scrubbed of."""
        return (self.value,) if self.value else ()


@dataclass(frozen=True, slots=True)
class Expiry:
    """How an API says a page token (or next link) expired: a status, maybe a body field."""

    status: tuple[int, ...] = (410,)
    #: The dotted path of the body field that says so (e.g. ``error.code``), if any.
    field: str | None = None
    #: The field's values that mean "expired".
    values: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Paginate:
    """How an endpoint pages: the style and its parameters."""

    style: Style = "none"
    #: ``page``: the page-number param; ``offset``: the offset param; ``cursor``: the token param.
    param: str | None = None
    #: The first page number (``page``), 1 by default.
    start: int = 1
    #: The page-size (``page``) or limit (``offset``) param and its value, if any.
    size_param: str | None = None
    size: int | None = None
    #: ``cursor``: the body path of the next token; ``link``: of the next URL (else the header).
    next: str | None = None
    max_pages: int | None = None
    #: What a page token's expiry looks like (``cursor`` and ``link`` paging).
    expired: Expiry = field(default_factory=Expiry)
    #: How many times a read starts its pages over after an expiry.
    restarts: int = DEFAULT_RESTARTS


@dataclass(frozen=True, slots=True)
class Since:
    """The query parameter a cursor read passes its checkpoint in, and how it is written."""

    param: str
    format: SinceFormat = "raw"


@dataclass(frozen=True, slots=True)
class Endpoint:
    """One endpoint of the API: what a dataset's relation reads."""

    name: str
    path: str
    params: Mapping[str, str] = field(default_factory=dict)
    #: The dotted path of the records in the body; None when the body is the list.
    records: str | None = None
    paginate: Paginate = field(default_factory=Paginate)
    #: Declared field types by name, in declaration order.
    fields: tuple[tuple[str, str], ...] = ()
    allow_empty: bool = False
    since: Since | None = None
    declared: bool = True


def _where(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


def _text(value: Any, where: str, hint: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"{where} must be non-empty text, not {value!r}", hint=hint)
    return value


def _positive(value: Any, where: str, example: str, *, whole: bool = False) -> float:
    kinds = (int,) if whole else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds) or value <= 0:
        what = "a whole number above zero" if whole else "a number above zero"
        raise ConfigError(f"{where} must be {what}, not {value!r}", hint=f"for example {example}")
    return float(value)


def _scalar_params(value: Any, where: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ConfigError(
            f"{where} must map query parameter names to values",
            hint="for example params: {status: any, per_page: 100}",
        )
    out = {}
    for name, item in value.items():
        if isinstance(item, bool):
            item = "true" if item else "false"
        if not isinstance(item, str | int | float):
            raise ConfigError(
                f"{where}.{name} must be text or a number, not {type(item).__name__}",
                hint="write one value per parameter",
            )
        out[str(name)] = str(item)
    return out


def _auth(value: Any) -> Auth:
    if value is None:
        return Auth()
    example = 'for example auth: {type: bearer, token: {secret: "env:API_TOKEN"}}'
    if not isinstance(value, Mapping):
        raise ConfigError("config.auth must be a mapping with a type", hint=example)
    kind = value.get("type", "none")
    if kind not in AUTH_KEYS:
        raise ConfigError(
            f"config.auth.type must be none, bearer, basic or api_key, not {kind!r}",
            hint=example,
        )
    refuse_unknown_keys("http", value, AUTH_KEYS[kind], where="config.auth")
    if kind == "none":
        return Auth()
    ref = 'a secret reference such as {secret: "env:API_TOKEN"}'
    if kind == "bearer":
        return Auth("bearer", value=_header_text(value, "token", ref))
    if kind == "basic":
        user = _text(value.get("username"), "config.auth.username", "the user name, as text")
        return Auth(
            "basic", username=user, value=_text(value.get("password"), "config.auth.password", ref)
        )
    place = value.get("in", "header")
    if place not in ("header", "query"):
        raise ConfigError(
            f"config.auth.in must be header or query, not {place!r}",
            hint="header sends the key as a request header, query as a query parameter",
        )
    name = _text(value.get("name"), "config.auth.name", "the header or parameter, e.g. X-Api-Key")
    text = _header_text(value, "api_key", ref) if place == "header" else None
    return Auth(
        "api_key",
        value=text or _text(value.get("api_key"), "config.auth.api_key", ref),
        name=name,
        place=place,
    )


def _header_text(auth: Mapping[str, Any], key: str, ref: str) -> str:
    """A secret sent in a header as it is: refused when it holds a line break or a control
    character, which no header can carry (every request failed, retried as transient)."""
    text = _text(auth.get(key), f"config.auth.{key}", ref)
    if any(ord(c) < 32 and c != "\t" or c == "\x7f" for c in text):
        raise ConfigError(
            f"config.auth.{key} holds a line break or another control character, which a "
            "request header cannot carry",
            hint="store the secret on one line (a file: secret's one final newline is "
            "dropped already)",
        )
    return text


_PAGINATE_EXAMPLE = (
    "for example paginate: {style: cursor, param: page_token, next: meta.next_token}"
)


def _paginate(value: Any, where: str) -> Paginate:
    if value is None or value == "none":
        return Paginate()
    if isinstance(value, str):
        value = {"style": value}
    example = _PAGINATE_EXAMPLE
    if not isinstance(value, Mapping):
        raise ConfigError(f"{where} must be none or a mapping with a style", hint=example)
    refuse_unknown_keys("http", value, PAGINATE_KEYS, where=where)
    style = value.get("style", "none")
    if style not in STYLES:
        raise ConfigError(
            f"{where}.style must be one of {', '.join(STYLES)}, not {style!r}", hint=example
        )
    param = value.get("param")
    if param is not None:
        param = _text(param, f"{where}.param", "the query parameter's name")
    size_param = value.get("size_param")
    if size_param is not None:
        size_param = _text(size_param, f"{where}.size_param", "e.g. per_page or limit")
    size = value.get("size")
    if size is not None:
        size = int(_positive(size, f"{where}.size", "size: 100", whole=True))
    start = value.get("start", 1 if style == "page" else 0)
    if isinstance(start, bool) or not isinstance(start, int) or start < 0:
        raise ConfigError(f"{where}.start must be a whole number, not {start!r}", hint="start: 1")
    nxt = value.get("next")
    if nxt is not None:
        nxt = _text(nxt, f"{where}.next", "a dotted path into the body, e.g. meta.next")
    pages = value.get("max_pages")
    if pages is not None:
        pages = int(_positive(pages, f"{where}.max_pages", "max_pages: 1000", whole=True))
    param, size_param = _style_needs(style, param, nxt, size, size_param, where)
    restarts = value.get("restarts", DEFAULT_RESTARTS)
    if isinstance(restarts, bool) or not isinstance(restarts, int) or restarts < 0:
        raise ConfigError(
            f"{where}.restarts must be a whole number, not {restarts!r}",
            hint="restarts: 3 (0 fails the read at the first expired page token)",
        )
    expired = _expiry(value.get("expired"), f"{where}.expired")
    return Paginate(style, param, start, size_param, size, nxt, pages, expired, restarts)


def _style_needs(
    style: str,
    param: str | None,
    nxt: str | None,
    size: int | None,
    size_param: str | None,
    where: str,
) -> tuple[str | None, str | None]:
    """The query parameter and size parameter a style needs (defaults, or refusals)."""
    example = _PAGINATE_EXAMPLE
    if style in ("page", "offset", "cursor") and param is None:
        default = {"page": "page", "offset": "offset", "cursor": None}[style]
        if default is None:
            raise ConfigError(
                f"{where} pages by cursor but names no `param` to pass the token in",
                hint=example,
            )
        param = default
    if style == "cursor" and nxt is None:
        raise ConfigError(
            f"{where} pages by cursor but names no `next`: where the body holds the next token",
            hint=example,
        )
    if style == "offset" and size is None:
        raise ConfigError(
            f"{where} pages by offset but sets no `size`: the offset advances by the records "
            "read, and the limit must be stated",
            hint="for example paginate: {style: offset, param: offset, size_param: limit, "
            "size: 100}",
        )
    if style == "offset" and size_param is None:
        size_param = "limit"
    return param, size_param


def _expiry(value: Any, where: str) -> Expiry:
    if value is None:
        return Expiry()
    example = "for example expired: {status: 400, field: error.code, values: [cursor_expired]}"
    if not isinstance(value, Mapping):
        raise ConfigError(f"{where} must be a mapping with a status", hint=example)
    refuse_unknown_keys("http", value, EXPIRED_KEYS, where=where)
    status = value.get("status", 410)
    codes = status if isinstance(status, list) else [status]
    if not codes or not all(
        isinstance(c, int) and not isinstance(c, bool) and 400 <= c <= 499 for c in codes
    ):
        raise ConfigError(
            f"{where}.status must be a 4xx status or a list of them, not {status!r}",
            hint=example,
        )
    path = value.get("field")
    values = value.get("values")
    if path is not None:
        path = _text(path, f"{where}.field", "a dotted path into the error body")
    if (path is None) != (values is None) or (
        values is not None
        and (
            not isinstance(values, list)
            or not values
            or not all(isinstance(v, str | int) and not isinstance(v, bool) for v in values)
        )
    ):
        raise ConfigError(
            f"{where}: `field` and `values` (a list of texts) go together", hint=example
        )
    return Expiry(tuple(codes), path, tuple(str(v) for v in values or ()))


def _fields(value: Any, where: str) -> tuple[tuple[str, str], ...]:
    if value is None:
        return ()
    example = "for example fields: {id: integer, total: decimal(2), updated_at: timestamp}"
    if not isinstance(value, Mapping) or not value:
        raise ConfigError(f"{where} must map field names to types", hint=example)
    out = []
    for name, type_ in value.items():
        text = str(type_).strip().lower() if isinstance(type_, str) else None
        if not isinstance(name, str) or not name or text is None:
            raise ConfigError(
                f"{where}: {name!r}: {type_!r} is not a field and a type", hint=example
            )
        try:
            field_schema(text)
        except ValueError:
            raise ConfigError(
                f"{where}.{name} is {type_!r}, which is not a field type", hint=_TYPES_HINT
            ) from None
        out.append((name, text))
    return tuple(out)


def _since(value: Any, where: str) -> Since | None:
    if value is None:
        return None
    example = "for example since: {param: updated_since, format: iso}"
    if isinstance(value, str):
        value = {"param": value}
    if not isinstance(value, Mapping):
        raise ConfigError(f"{where} must name the query parameter", hint=example)
    refuse_unknown_keys("http", value, SINCE_KEYS, where=where)
    fmt = value.get("format", "raw")
    if fmt not in ("raw", "iso"):
        raise ConfigError(
            f"{where}.format must be raw or iso, not {fmt!r}",
            hint="raw passes the checkpoint as the API wrote it; iso as an RFC 3339 UTC time",
        )
    return Since(_text(value.get("param"), f"{where}.param", example), fmt)


def _path(value: Any, where: str) -> str:
    path = _text(value, where, "the endpoint's path under base_url, e.g. /orders")
    if "://" in path or path.startswith("//"):
        raise ConfigError(
            f"{where} {path!r} is a full URL",
            hint="write the path under base_url (/orders): every request stays on its host",
        )
    return path


def _endpoint(name: str, body: Any, where: str) -> Endpoint:
    if not isinstance(body, Mapping):
        raise ConfigError(f"{where} must be a mapping with at least a path", hint="{path: /orders}")
    refuse_unknown_keys("http", body, ENDPOINT_KEYS, where=where)
    records = body.get("records")
    if records is not None:
        records = _text(records, f"{where}.records", "a dotted path, e.g. data.items")
    allow = body.get("allow_empty", False)
    if not isinstance(allow, bool):
        raise ConfigError(
            f"{where}.allow_empty must be true or false, not {allow!r}",
            hint="true only when no record at all is a real state of the endpoint",
        )
    return Endpoint(
        name=name,
        path=_path(body.get("path", f"/{name}"), f"{where}.path"),
        params=_scalar_params(body.get("params"), f"{where}.params"),
        records=records,
        paginate=_paginate(body.get("paginate"), f"{where}.paginate"),
        fields=_fields(body.get("fields"), f"{where}.fields"),
        allow_empty=allow,
        since=_since(body.get("since"), f"{where}.since"),
    )


def _origins(value: Any) -> tuple[tuple[str, str, int], ...]:
    """``credential_hosts``: origins written ``https://host[:port]``, normalised."""
    if value is None:
        return ()
    example = 'for example credential_hosts: ["https://files.example.com:8443"]'
    if not isinstance(value, list):
        raise ConfigError("config.credential_hosts must be a list of origins", hint=example)
    out = []
    for item in value:
        parts = urlsplit(item) if isinstance(item, str) else None
        try:
            port = None if parts is None else parts.port
        except ValueError:
            parts = None
        if (
            parts is None
            or parts.scheme not in ("http", "https")
            or not parts.hostname
            or parts.username
            or parts.password
            or parts.path not in ("", "/")
            or parts.query
            or parts.fragment
        ):
            raise ConfigError(
                f"config.credential_hosts: {item!r} is not an origin (scheme://host[:port])",
                hint=example,
            )
        default = 443 if parts.scheme == "https" else 80
        out.append((parts.scheme, parts.hostname.lower(), port or default))
    return tuple(out)


def _base_url(base: Any) -> str:
    """``config.base_url``: an http(s) URL without user info or query string."""
    hint = "set `base_url` to the API's root, e.g. https://api.example.com/v1"
    if not isinstance(base, str) or not base:
        raise ConfigError("the http source needs a base_url", hint=hint)
    parts = urlsplit(base)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"config.base_url {base!r} is not an http(s) URL", hint=hint)
    if parts.username or parts.password or parts.query:
        raise ConfigError(
            "config.base_url holds user info or a query string",
            hint="give credentials under `auth` and query parameters under an endpoint's `params`",
        )
    return base


def _headers(headers: Any) -> dict[str, str]:
    """``config.headers``: header names to text."""
    if not isinstance(headers, Mapping) or not all(isinstance(v, str) for v in headers.values()):
        raise ConfigError(
            "config.headers must map header names to text",
            hint="for example headers: {Accept: application/json}",
        )
    return {str(k): v for k, v in headers.items()}


@dataclass(frozen=True, slots=True)
class Settings:
    """The validated configuration of one http source (the auth secret resolved)."""

    base_url: str
    auth: Auth
    headers: Mapping[str, str]
    timeout: float
    rate_limit: float | None
    max_pages: int
    max_retry_wait: float
    max_response_bytes: int
    check_path: str | None
    endpoints: Mapping[str, Endpoint]
    #: Origins (scheme, host, port) besides base_url's that may receive the credentials.
    credential_hosts: tuple[tuple[str, str, int], ...] = ()
    #: How objects and arrays stored as JSON text write an object's keys (``JSON_KEYS``).
    json_keys: str = "as_sent"

    @classmethod
    def parse(cls, config: Mapping[str, Any]) -> Settings:
        """Validate ``config``; raises :class:`~combined.errors.ConfigError`."""
        base = _base_url(config.get("base_url"))
        headers = _headers(config.get("headers") or {})
        rate = config.get("rate_limit")
        endpoints = config.get("endpoints") or {}
        if not isinstance(endpoints, Mapping):
            raise ConfigError(
                "config.endpoints must map endpoint names to their settings",
                hint="for example endpoints: {orders: {path: /orders, records: data}}",
            )
        check_path = config.get("check_path")
        return cls(
            base_url=base.rstrip("/"),
            auth=_auth(config.get("auth")),
            headers=headers,
            timeout=_positive(config.get("timeout", DEFAULT_TIMEOUT_S), "config.timeout", "30"),
            rate_limit=None if rate is None else _positive(rate, "config.rate_limit", "5"),
            max_pages=int(
                _positive(
                    config.get("max_pages", DEFAULT_MAX_PAGES),
                    "config.max_pages",
                    "10000",
                    whole=True,
                )
            ),
            max_retry_wait=_positive(
                config.get("max_retry_wait", DEFAULT_MAX_RETRY_WAIT_S),
                "config.max_retry_wait",
                "60",
            ),
            max_response_bytes=int(
                _positive(
                    config.get("max_response_bytes", DEFAULT_MAX_RESPONSE_BYTES),
                    "config.max_response_bytes",
                    "67108864",
                    whole=True,
                )
            ),
            check_path=None if check_path is None else _path(check_path, "config.check_path"),
            credential_hosts=_origins(config.get("credential_hosts")),
            json_keys=json_keys_option("http", config.get("json_keys", "as_sent")),
            endpoints={
                str(n): _endpoint(str(n), b, f"config.endpoints.{n}") for n, b in endpoints.items()
            },
        )

    def endpoint(self, relation: str) -> Endpoint:
        """The endpoint a dataset's relation names: declared, or the relation as a path."""
        found = self.endpoints.get(relation)
        if found is not None:
            return found
        if relation.startswith("/"):
            return Endpoint(name=relation, path=_path(relation, "relation"), declared=False)
        known = ", ".join(sorted(self.endpoints)) or "none declared"
        raise NotFoundError(
            f"relation {relation!r} is neither an endpoint of the source nor a path",
            hint=f"declare it under config.endpoints, or write the path as the relation "
            f"(/orders); endpoints: {known}",
            relation=relation,
        )

    def max_pages_of(self, endpoint: Endpoint) -> int:
        """The page guard of ``endpoint``: its own, else the source's."""
        return endpoint.paginate.max_pages or self.max_pages


__all__ = [
    "ENDPOINT_KEYS",
    "FIELD_TYPES",
    "Expiry",
    "SOURCE_KEYS",
    "Auth",
    "Endpoint",
    "Paginate",
    "Settings",
    "Since",
    "Style",
    "field_schema",
]
