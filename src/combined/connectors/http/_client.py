"""One HTTP session of a read: auth, rate limit, same-origin redirects, in-attempt waits, errors.

Every request goes through :meth:`Session.get`, which is the only place that
knows the secret: it adds the auth header or query parameter to a request
to the base URL's own origin (scheme, host and port exactly) or one listed
under ``credential_hosts``, and never to another (a redirect or a next-page
link elsewhere is refused before anything is sent). What a status means is
decided here, by type (see ``combined.errors``):

* 429 and 5xx, timeouts and connection failures are transient
  (:class:`~combined.errors.SourceUnavailable`, retried as another Attempt);
  a 429 or 503 whose ``Retry-After`` is within ``max_retry_wait`` is waited
  out inside the Attempt, a few times at most; one past it raises
  :class:`~combined.errors.RetryLater` at once (the Run's retry is queued for
  that time, and the API is not asked again before);
* 401 and 403 are :class:`~combined.errors.AuthRejected` (the Run needs auth);
* 404 and any other 4xx are terminal :class:`~combined.errors.SourceError`.

No error quotes a response body: an API may echo the token it was given.
URLs in errors are shown with the API key parameter masked, and every shown
text is scrubbed of the secret's value.
"""

from __future__ import annotations

import base64
import email.utils
import json
import math
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import httpx

from combined._credentials import masking
from combined.connectors.http._deadline import bounded_client
from combined.connectors.http._settings import Expiry, Settings
from combined.errors import (
    AuthRejected,
    RetryLater,
    SchemaMismatch,
    SourceError,
    SourceUnavailable,
)

#: How many times one request waits out a 429 or 503 inside an Attempt.
MAX_WAITS = 5
#: How many redirects one request follows (each to an origin the credentials may go to).
MAX_REDIRECTS = 5
_REDIRECTS = (301, 302, 303, 307, 308)
#: The longest ``Retry-After`` taken (a week): a retry deferred past the calendar
#: (``1e12`` s) ended the capture in an OverflowError.
MAX_RETRY_AFTER_S = 7 * 24 * 3600.0
#: The most of an error body read to match an expiry declaration (never shown).
_PROBE_BYTES = 64 * 1024


class PageExpired(SourceUnavailable):
    """The API says a page token (or next link) expired: the read may start its pages over."""


@dataclass(frozen=True, slots=True)
class Response:
    """A successful response, read whole (within ``max_response_bytes``)."""

    url: httpx.URL
    status: int
    headers: httpx.Headers
    content: bytes

    @property
    def content_type(self) -> str:
        """The media type the server declared, or ``none``."""
        return self.headers.get("content-type", "none").split(";")[0].strip() or "none"

    @property
    def text(self) -> str:
        """The body as text: in the charset the server declared (UTF-8 when none), a
        UTF-8 byte order mark left out. Raises UnicodeDecodeError, or LookupError for a
        charset Python does not know."""
        named = "utf-8"
        for param in self.headers.get("content-type", "").split(";")[1:]:
            key, _, value = param.partition("=")
            if key.strip().lower() == "charset":  # (not odata.metadata=, version=, ...)
                named = value.strip().strip('"').lower()
        return self.content.decode("utf-8-sig" if named in ("utf-8", "utf8") else named)


def scrubber(settings: Settings) -> Callable[[str], str]:
    """A function masking the auth secret (as written, URL-encoded any way, in basic form)."""
    values: set[str] = set()
    auth = settings.auth
    for secret in auth.secrets():
        values.add(secret)  # (masking() masks its URL-encoded forms too)
        if auth.type == "basic":
            pair = f"{auth.username}:{secret}".encode()
            values.add(base64.b64encode(pair).decode())
    return masking(v for v in values if len(v) >= 3)


def origin_of(url: httpx.URL) -> tuple[str, str, int]:
    """The scheme, lower-cased host and port (the scheme's default when unwritten)."""
    port = url.port if url.port is not None else (443 if url.scheme == "https" else 80)
    return url.scheme, url.host.lower(), port


class RateLimit:
    """At most ``per_second`` requests a second: each waits for its slot."""

    def __init__(self, per_second: float | None) -> None:
        self._interval = 1.0 / per_second if per_second else 0.0
        self._next = 0.0
        self._lock = threading.Lock()

    def wait(self) -> None:
        """Sleep until the next request may go."""
        if not self._interval:
            return
        with self._lock:
            now = time.monotonic()
            slot = max(now, self._next)
            self._next = slot + self._interval
        if slot > now:
            time.sleep(slot - now)


def retry_after(value: str | None, now: datetime | None = None) -> float | None:
    """Seconds a ``Retry-After`` asks to wait (seconds or an HTTP date), at most
    :data:`MAX_RETRY_AFTER_S`; None if unreadable (``inf`` and ``NaN`` too).

    A negative number of seconds is no delay the standard knows (delay-seconds
    are digits): read as none, so the usual backoff applies, not 0 (which
    re-asked a busy server at once, five times in a row). A date already past
    is 0: it says the time has come.
    """
    if value is None:
        return None
    text = value.strip()
    try:
        seconds = float(text)
        if seconds < 0:
            return None
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(text)
        except (TypeError, ValueError):
            return None
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        seconds = (when - (now or datetime.now(UTC))).total_seconds()
    if not math.isfinite(seconds):
        return None
    return min(max(0.0, seconds), MAX_RETRY_AFTER_S)


def _head(response: httpx.Response, limit: int) -> bytes:
    """At most ``limit`` bytes of ``response``'s body."""
    chunks: list[bytes] = []
    size = 0
    for chunk in response.iter_bytes():
        chunks.append(chunk)
        size += len(chunk)
        if size >= limit:
            break
    return b"".join(chunks)[:limit]


def _read(response: httpx.Response, content: bytes) -> httpx.Response:
    """``response`` with its ``content`` read: decoded, so without its Content-Encoding.

    ``iter_bytes`` has already undone the gzip (or deflate) the API sent; a
    response built with that header would decode the plain bytes once more.
    """
    headers = response.headers.copy()
    headers.pop("content-encoding", None)
    return httpx.Response(
        response.status_code, headers=headers, content=content, request=response.request
    )


def _says_expired(expiry: Expiry, response: httpx.Response) -> bool:
    """Whether an error answer is the expiry ``expiry`` declares (its status, its field)."""
    if response.status_code not in expiry.status:
        return False
    if expiry.field is None:
        return True
    try:
        body = json.loads(response.content)
    except ValueError:
        return False
    value: Any = body
    for step in expiry.field.split("."):
        if not isinstance(value, dict) or step not in value:
            return False
        value = value[step]
    return isinstance(value, str | int) and str(value) in expiry.values


class Session:
    """The HTTP client of one read (or one check or discovery); close it when done."""

    def __init__(self, settings: Settings, scrub: Callable[[str], str]) -> None:
        self.settings = settings
        self.scrub = scrub
        self._base = httpx.URL(settings.base_url)
        self._origins = {origin_of(self._base), *settings.credential_hosts}
        self._rate = RateLimit(settings.rate_limit)
        headers = {"Accept": "application/json", **settings.headers}
        self._client, self._deadline = bounded_client(settings.timeout, headers)

    def close(self) -> None:
        """Close the connection pool; idempotent."""
        self._client.close()

    # -- URLs -------------------------------------------------------------------------------

    def url(self, path: str, params: Mapping[str, str] | None = None) -> httpx.URL:
        """The URL of ``path`` under the base URL, with ``params`` (no auth added)."""
        base = str(self._base).rstrip("/")
        url = httpx.URL(f"{base}/{path.lstrip('/')}")
        return url.copy_merge_params(dict(params)) if params else url

    def shown(self, url: httpx.URL | str) -> str:
        """``url`` as errors show it: the API key parameter masked, secrets scrubbed."""
        url = httpx.URL(str(url))
        auth = self.settings.auth
        if auth.place == "query" and auth.name is not None and auth.name in url.params:
            url = url.copy_set_param(auth.name, "***")
        return self.scrub(str(url)).replace("%2A%2A%2A", "***")

    def may_receive(self, url: httpx.URL) -> bool:
        """Whether ``url``'s origin may receive the credentials: base_url's, or one allowed.

        Scheme, host and port must match exactly: an ``https`` link to another
        port of base_url's host is another server, which gets nothing.
        """
        return origin_of(url) in self._origins

    def refuse_elsewhere(self, url: httpx.URL, why: str) -> None:
        """Raise when ``url`` leaves the origins the credentials may go to."""
        if not self.may_receive(url):
            scheme, host, port = origin_of(url)
            raise SourceError(
                f"{why} leads to another host or port ({scheme}://{host}:{port}), where the "
                "source's credentials are never sent: nothing more was read",
                hint="set base_url to the origin the API really answers on (base_url is "
                f"{self._base.scheme}://{self._base.host}:{origin_of(self._base)[2]}), or list "
                "that origin under credential_hosts if it is the same API",
                host=host,
                port=port,
            )

    def _signed(self, url: httpx.URL) -> tuple[httpx.URL, dict[str, str]]:
        auth = self.settings.auth
        headers: dict[str, str] = {}
        if auth.type == "bearer" and auth.value:
            headers["Authorization"] = f"Bearer {auth.value}"
        elif auth.type == "basic" and auth.value:
            pair = f"{auth.username}:{auth.value}".encode()
            headers["Authorization"] = "Basic " + base64.b64encode(pair).decode()
        elif auth.type == "api_key" and auth.value and auth.name:
            if auth.place == "header":
                headers[auth.name] = auth.value
            else:
                url = url.copy_set_param(auth.name, auth.value)
        return url, headers

    # -- requests ---------------------------------------------------------------------------

    def get(self, url: httpx.URL, expiry: Expiry | None = None) -> Response:
        """GET ``url`` (on an allowed origin), following redirects to allowed origins.

        Raises the error its outcome means; waits out a short ``Retry-After``.
        An answer ``expiry`` describes raises :class:`PageExpired`.
        """
        self.refuse_elsewhere(url, f"the request for {self.shown(url)}")
        waits = 0
        redirects = 0
        while True:
            response = self._send(url, expiry)
            status = response.status_code
            if status in _REDIRECTS:
                location = response.headers.get("location")
                redirects += 1
                if not location or redirects > MAX_REDIRECTS:
                    raise SourceError(
                        f"GET {self.shown(url)} redirected "
                        + (
                            "without a Location"
                            if not location
                            else f"more than {MAX_REDIRECTS} times"
                        ),
                        hint="check base_url and the endpoint's path",
                        status=status,
                    )
                target = url.join(location)
                self.refuse_elsewhere(target, f"a redirect of {self.shown(url)}")
                url = target
                continue
            wait = retry_after(response.headers.get("retry-after"))
            if status in (429, 503):
                if wait is not None and wait > self.settings.max_retry_wait:
                    raise self._retry_later(url, status, response.reason_phrase, wait)
                if wait is not None and waits < MAX_WAITS:
                    waits += 1
                    time.sleep(wait)
                    continue
            if status >= 400 and expiry is not None and _says_expired(expiry, response):
                what = f"GET {self.shown(url)} answered {status} {response.reason_phrase}"
                raise PageExpired(
                    f"{what.rstrip()}: the page token expired",
                    hint="the read starts its pages over (paginate.restarts)",
                    status=status,
                )
            if status >= 400:
                raise self._status_error(url, status, response.reason_phrase, waits, wait)
            return Response(url, status, response.headers, response.content)

    def _send(self, url: httpx.URL, expiry: Expiry | None = None) -> httpx.Response:
        signed, headers = self._signed(url)
        shown = self.shown(url)
        self._rate.wait()
        try:
            with (
                self._deadline.within(self.settings.timeout),
                self._client.stream("GET", signed, headers=headers) as response,
            ):
                if response.status_code >= 300:
                    # An error's body is read only to match an expiry declaration,
                    # never shown: it may echo the token.
                    probe = expiry is not None and expiry.field is not None
                    return _read(response, _head(response, _PROBE_BYTES) if probe else b"")
                declared = response.headers.get("content-length")
                limit = self.settings.max_response_bytes
                if declared is not None and declared.isdigit() and int(declared) > limit:
                    raise self._too_large(shown, limit)
                chunks: list[bytes] = []
                size = 0
                for chunk in response.iter_bytes():
                    size += len(chunk)
                    if size > limit:
                        raise self._too_large(shown, limit)
                    chunks.append(chunk)
                return _read(response, b"".join(chunks))
        except httpx.DecodingError:
            raise SchemaMismatch(
                f"GET {shown} answered a body its Content-Encoding does not decode "
                "(the compressed data is corrupt or not in that encoding)",
                hint="check the API's compression, or ask for plain bodies with "
                "`headers: {Accept-Encoding: identity}`; nothing was committed",
            ) from None
        except httpx.TimeoutException as exc:
            raise SourceUnavailable(
                f"GET {shown} did not complete within {self.settings.timeout:g} s "
                f"({type(exc).__name__}): `timeout` bounds the whole request, its body included",
                hint="raise `timeout` if the API is slow to answer (or ask for smaller pages); "
                "the capture is retried",
            ) from None
        except httpx.TransportError as exc:
            raise SourceUnavailable(
                f"GET {shown} failed: {type(exc).__name__}: {self.scrub(str(exc)) or 'no detail'}",
                hint="check that base_url is reachable from here; the capture is retried",
            ) from None

    def _retry_later(self, url: httpx.URL, status: int, reason: str, wait: float) -> RetryLater:
        """A ``Retry-After`` past the ceiling: the Attempt ends, a later Run asks again."""
        what = f"GET {self.shown(url)} answered {status} {reason}".rstrip()
        return RetryLater(
            f"{what} asking to retry after {wait:g} s, more than max_retry_wait "
            f"({self.settings.max_retry_wait:g} s): the source is not asked again before then",
            hint="a retry of the Run is queued for that time; raise max_retry_wait to wait "
            "inside the Attempt instead",
            status=status,
            retry_after_s=wait,
        )

    def _too_large(self, shown: str, limit: int) -> SourceError:
        return SourceError(
            f"GET {shown} answered with a body over {limit} bytes",
            hint="ask for smaller pages (paginate.size), or raise `max_response_bytes`",
        )

    def _status_error(
        self, url: httpx.URL, status: int, reason: str, waits: int, wait: float | None = None
    ) -> SourceError:
        shown = self.shown(url)
        what = f"GET {shown} answered {status} {reason}".rstrip()
        if status in (401, 403):
            return AuthRejected(
                f"{what}: the credentials were refused",
                hint="check the secret the source's `auth` references, and that it may read "
                "this endpoint; then capture again",
                status=status,
            )
        if status == 429 or status >= 500:
            waited = f" (after waiting {waits} times)" if waits else ""
            return SourceUnavailable(
                f"{what}{waited}: the API is busy or failing",
                hint="the capture is retried; lower `rate_limit` if the API keeps limiting it",
                status=status,
                # The next Attempt waits at least this long (its Retry-After).
                **({"retry_after_s": wait} if wait is not None else {}),
            )
        if status == 404:
            return SourceError(
                f"{what}: the endpoint does not exist",
                hint="check base_url and the endpoint's path",
                status=status,
            )
        return SourceError(
            f"{what}: the API refused the request",
            hint="check the endpoint's path and params against the API's documentation",
            status=status,
        )


__all__ = [
    "MAX_RETRY_AFTER_S",
    "MAX_WAITS",
    "PageExpired",
    "RateLimit",
    "Response",
    "Session",
    "origin_of",
    "retry_after",
    "scrubber",
]
