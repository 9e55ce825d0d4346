"""The web console ``combined serve`` serves at ``/`` (docs/console.md).

Server-rendered pages (Jinja2 templates shipped in this package) over the
same engine facade as the API: datasets and their freshness, Runs with
their Attempts, a dataset's history, the quarantine, the live Activity
feed, MAR per month. Its assets (CSS, one small script, Swagger UI's files
for ``/docs``) are served by the server itself: nothing loads from a CDN and
nothing is built.

Every page needs a session (``_session``); every form carries the session's
CSRF token, and a post without it is refused (403).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request
from fastapi.responses import RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates
from jinja2 import Environment, PackageLoader, select_autoescape

from combined.api._console import _filters, _session

if TYPE_CHECKING:
    from combined.engine import Engine

#: Where the console's own assets are served.
STATIC = "/console/static"

#: Sent with every console page: nothing but this server's own scripts,
#: styles and forms; never framed (clickjacking); never cached.
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    ),
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}


def is_console_path(path: str) -> bool:
    """Whether ``path`` is the console's (its session, not the bearer token, admits it)."""
    return path == "/" or path.startswith("/console/")


class LoginRequired(Exception):
    """A console request without a session: answered with a redirect to the login."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.url = url


class Forbidden(Exception):
    """A console form posted without this session's CSRF token."""


class Console:
    """What every console page needs: the engine, the token (None: none), the templates."""

    def __init__(self, engine: Engine, token: str | None) -> None:
        self.engine = engine
        self.token = token
        env = Environment(
            loader=PackageLoader("combined.api._console", "templates"),
            autoescape=select_autoescape(default=True),
        )
        _filters.register(env)
        self.templates = Jinja2Templates(env=env)

    def require(self, request: Request) -> None:
        """Go on only with a session: else the browser is sent to the login."""
        if not _session.logged_in(request, self.token, self.engine.catalog):
            raise LoginRequired(_session.login_url(request))

    def page(self, request: Request, template: str, status: int = 200, **context: Any) -> Response:
        """``template`` rendered for this session."""
        return self.templates.TemplateResponse(
            request,
            template,
            {
                "csrf": _session.csrf_token(request),
                "flash": _session.take_flash(request),
                "with_login": self.token is not None,
                "static": STATIC,
                **context,
            },
            status_code=status,
            headers=SECURITY_HEADERS,
        )

    def error_page(self, request: Request, status: int, title: str, message: str) -> Response:
        """An error told as a page (the API answers JSON instead)."""
        return self.page(request, "error.html", status, title=title, message=message)


def install(app: FastAPI, engine: Engine, token: str | None) -> Console:
    """Add the console's pages, forms, assets, session and offline ``/docs`` to ``app``."""
    from combined.api._console import _actions, _docs, _pages

    console = Console(engine, token)
    app.state.console = console

    @app.exception_handler(LoginRequired)
    async def to_login(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, LoginRequired)
        return RedirectResponse(exc.url, status_code=303)

    @app.exception_handler(Forbidden)
    async def forbidden(request: Request, exc: Exception) -> Response:
        return console.error_page(request, 403, "Refused", str(exc))

    static = Path(__file__).parent / "static"
    app.mount(STATIC, StaticFiles(directory=static), name="console-static")
    app.include_router(_pages.router(console))
    app.include_router(_actions.router(console))
    _docs.install(app, console)
    _session.install(app, token)
    return console


__all__ = ["Console", "Forbidden", "LoginRequired", "install", "is_console_path"]
