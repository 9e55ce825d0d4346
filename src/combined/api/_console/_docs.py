"""``/docs`` offline: Swagger UI's files come from this server, not from a CDN.

FastAPI's own ``/docs`` page loads Swagger UI from a CDN, so it stays blank
where the server has no way out; ReDoc likewise (``/redoc`` is therefore not
served). Here the page loads the files the ``swagger-ui-bundle-v2`` package
ships, served under ``/docs/assets/``. The page needs a console session (a
browser without one is sent to the login, never asked for a bearer header);
with one, it reads ``/openapi.json``, and its "Try it out" calls still send
the bearer token given to its Authorize button.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from fastapi import FastAPI, Request, Response
from fastapi.openapi.docs import get_swagger_ui_html, get_swagger_ui_oauth2_redirect_html
from fastapi.staticfiles import StaticFiles
from swagger_ui_bundle import swagger_ui_path

if TYPE_CHECKING:
    from combined.api._console import Console

DOCS = "/docs"
ASSETS = "/docs/assets"


def is_docs_path(path: str) -> bool:
    """Whether ``path`` is the docs page or its assets (the bearer token is not asked)."""
    return path == DOCS or path.startswith(DOCS + "/")


def install(app: FastAPI, console: Console) -> None:
    """Serve Swagger UI at ``/docs`` from the files the package ships."""
    app.mount(ASSETS, StaticFiles(directory=Path(str(swagger_ui_path))), name="docs-assets")

    @app.get(DOCS, include_in_schema=False)
    def docs(request: Request) -> Response:
        console.require(request)
        return get_swagger_ui_html(
            openapi_url="/openapi.json",
            title="Combined API",
            swagger_js_url=f"{ASSETS}/swagger-ui-bundle.js",
            swagger_css_url=f"{ASSETS}/swagger-ui.css",
            swagger_favicon_url=f"{ASSETS}/favicon-32x32.png",
            oauth2_redirect_url=f"{DOCS}/oauth2-redirect",
        )

    @app.get(f"{DOCS}/oauth2-redirect", include_in_schema=False)
    def oauth2_redirect() -> Response:
        return get_swagger_ui_oauth2_redirect_html()
