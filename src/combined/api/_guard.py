"""What every request passes before the application: its Host, its Origin, its body's size.

- **Host.** Served without a token (``--insecure-no-auth``, loopback only),
  a request must name a loopback host (``127.0.0.1``, ``localhost``,
  ``[::1]``, any port). A web page whose DNS name is re-pointed at 127.0.0.1
  (DNS rebinding) sends its own name as ``Host``: it is refused (``421``),
  so it can neither read nor act.
- **Origin.** A state-changing request (``POST``, ``PUT``, ``PATCH``,
  ``DELETE``) that a browser sends from another site is refused (``403``):
  its ``Origin`` must be the server's own (the ``Host`` it was sent to), and
  ``Sec-Fetch-Site``, when sent, must be ``same-origin`` or ``none``. A
  client that is not a browser sends neither and is not concerned. Webhooks
  are exempt: a provider's signature authenticates them.
- **Body size.** A request body is read (up to its limit) before the
  application sees it: ``64 KiB`` for the API, the webhook limit for
  webhooks. A larger one is answered ``413`` without reaching the
  application, whether its ``Content-Length`` says so or it streams.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any
from urllib.parse import urlsplit

from starlette.responses import JSONResponse

from combined.api._webhooks import MAX_BODY as WEBHOOK_MAX_BODY

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

#: The host names a server without a token answers to.
LOOPBACK_NAMES = frozenset({"127.0.0.1", "localhost", "::1"})

#: The largest JSON body an API request may carry (a quarantine decision is ~2 KiB).
MAX_BODY = 64 * 1024

_SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
_WEBHOOKS = "/webhooks/"


def host_name(host: str) -> str:
    """The name in a ``Host`` header, without its port (``[::1]:8000`` is ``::1``)."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1 : host.find("]")] if "]" in host else host
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def _refusal(status: int, kind: str, message: str, hint: str) -> JSONResponse:
    return JSONResponse(
        {"error": {"type": kind, "message": message, "hint": hint}}, status_code=status
    )


def why_refused(scope: Scope, *, loopback_only: bool) -> JSONResponse | None:
    """The answer to a request whose Host or Origin is refused; None when both pass."""
    headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
    host = headers.get("host", "")
    if loopback_only and host_name(host) not in LOOPBACK_NAMES:
        return _refusal(
            421,
            "MisdirectedRequest",
            f"this server answers only to a loopback host, not {host or 'no Host header'!r}",
            "served with --insecure-no-auth: use http://127.0.0.1:<port>; "
            "to be reached by another name, set COMBINED_API_TOKEN",
        )
    if scope["method"] in _SAFE_METHODS or scope["path"].startswith(_WEBHOOKS):
        return None
    origin = headers.get("origin")
    site = headers.get("sec-fetch-site")
    foreign = site is not None and site not in ("same-origin", "none")
    if origin is not None:
        parts = urlsplit(origin)
        same = parts.scheme in ("http", "https") and parts.netloc.lower() == host.lower()
        foreign = foreign or not same
    if foreign:
        return _refusal(
            403,
            "CrossOriginRefused",
            f"a {scope['method']} from another site ({origin or site}) is refused",
            "call the API from a script or from a page this server serves, not another site",
        )
    return None


class Guard:
    """ASGI middleware: refuse a foreign Host or Origin, and a body over its limit."""

    def __init__(self, app: ASGIApp, *, loopback_only: bool) -> None:
        self.app = app
        self.loopback_only = loopback_only

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        refused = why_refused(scope, loopback_only=self.loopback_only)
        if refused is not None:
            await refused(scope, receive, send)
            return
        limit = WEBHOOK_MAX_BODY if scope["path"].startswith(_WEBHOOKS) else MAX_BODY
        body = await _read_body(scope, receive, limit)
        if body is None:
            too_large = _refusal(
                413,
                "PayloadTooLarge",
                f"the request body is larger than {limit} bytes",
                "send a smaller body: API requests carry small JSON objects",
            )
            await too_large(scope, receive, send)
            return
        await self.app(scope, _replay(body, receive), send)


async def _read_body(scope: Scope, receive: Receive, limit: int) -> bytes | None:
    """The whole body, or None as soon as it (or its declared length) passes ``limit``."""
    for key, value in scope["headers"]:
        if key.lower() == b"content-length" and value.strip().isdigit() and int(value) > limit:
            return None
    body = bytearray()
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return bytes(body)  # the client left: the application hears it on its own read
        body.extend(message.get("body", b""))
        if len(body) > limit:
            return None
        if not message.get("more_body", False):
            return bytes(body)


def _replay(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` that hands over ``body`` once, then listens to the client."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay
