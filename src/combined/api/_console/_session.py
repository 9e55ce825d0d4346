"""The console's session: a signed cookie that logging in with the API token opens.

The cookie (``combined_console``) is signed with a key derived from the API
token, ``HttpOnly`` and ``SameSite=Strict``; it holds whether the browser
logged in and the session's CSRF token, never the API token itself. A new
token makes every earlier session invalid. Served without a token
(``--insecure-no-auth``, loopback only) there is nothing to log in with: the
first page opens a session at once, signed with a key of this process only,
so that forms still carry a CSRF token.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from datetime import UTC, datetime, timedelta
from urllib.parse import quote

from fastapi import FastAPI, Request
from starlette.middleware.sessions import SessionMiddleware

from combined.catalog import Catalog, console

#: The session cookie's name.
COOKIE = "combined_console"
#: How long a login lasts (seconds): the cookie's signature expires then.
TTL_S = 12 * 3600
#: Where a request without a session is sent.
LOGIN = "/console/login"


def signing_key(token: str | None) -> str:
    """The key that signs session cookies: derived from ``token``, random without one."""
    if token is None:
        return secrets.token_hex(32)
    return hmac.new(token.encode(), b"combined console session v1", hashlib.sha256).hexdigest()


def install(app: FastAPI, token: str | None) -> None:
    """Add the session middleware (signed, HttpOnly, SameSite=Strict cookies) to ``app``."""
    app.add_middleware(
        SessionMiddleware,
        secret_key=signing_key(token),
        session_cookie=COOKIE,
        max_age=TTL_S,
        same_site="strict",
    )


def open_session(request: Request) -> None:
    """Start a fresh session (a new CSRF token): after a login, or without a token at all."""
    request.session.clear()
    request.session.update(auth=True, csrf=secrets.token_urlsafe(32))


def end_session(request: Request, catalog: Catalog) -> None:
    """Log out: the session ends here, and a copy of its cookie no longer opens it.

    The cookie is signed, not stored: clearing it in the browser left a copy
    taken before valid for its 12 hours. The session (the SHA-256 of its
    CSRF token, one a session) is recorded as ended in the catalog until its
    signature would expire, so that every server on the catalog, and this one
    after a restart, refuses the copy.
    """
    csrf = request.session.get("csrf")
    if isinstance(csrf, str) and csrf:
        now = datetime.now(UTC)
        with catalog.begin() as conn:
            console.end_session(conn, _known_as(csrf), now + timedelta(seconds=TTL_S), now)
    request.session.clear()


def _known_as(csrf: str) -> str:
    """How the catalog names a session: the SHA-256 hex of its CSRF token, never the token."""
    return hashlib.sha256(csrf.encode()).hexdigest()


def logged_in(request: Request, token: str | None, catalog: Catalog) -> bool:
    """Whether ``request`` carries a session; without a token, one is opened for it."""
    if "session" not in request.scope:
        return False
    if request.session.get("auth") is True:
        csrf = request.session.get("csrf")
        if isinstance(csrf, str) and csrf:
            with catalog.begin() as conn:
                if not console.session_ended(conn, _known_as(csrf)):
                    return True
        request.session.clear()  # (a copy of a cookie logged out)
    if token is None:
        open_session(request)
        return True
    return False


def csrf_token(request: Request) -> str:
    """The session's CSRF token, which every console form carries."""
    return str(request.session.get("csrf", ""))


def csrf_ok(request: Request, given: str | None) -> bool:
    """Whether ``given`` is this session's CSRF token (compared in constant time)."""
    expected = request.session.get("csrf")
    if not isinstance(expected, str) or not expected or not given:
        return False
    return hmac.compare_digest(given.encode(), expected.encode())


def login_url(request: Request) -> str:
    """The login page, told to come back to the page ``request`` asked for."""
    wanted = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    return f"{LOGIN}?next={quote(wanted, safe='')}"


def local_path(target: str | None, default: str = "/") -> str:
    """``target`` when it is a path on this server, else ``default`` (no open redirect)."""
    if not target or not target.startswith("/") or target.startswith("//") or "\\" in target:
        return default
    return target


def flash(request: Request, message: str, kind: str = "ok") -> None:
    """A message for the next page this session shows."""
    request.session["flash"] = {"kind": kind, "message": message}


def take_flash(request: Request) -> dict[str, str] | None:
    """The message left for this page, once."""
    value = request.session.pop("flash", None) if "session" in request.scope else None
    return value if isinstance(value, dict) else None
