"""The HTTP API and provider-verified webhooks: a thin layer over the engine facade.

``create_app`` builds the FastAPI application; ``combined serve`` runs it.
FastAPI is imported only when an application is built (the ``api`` extra),
so the rest of Combined neither needs nor loads it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from combined.errors import ConfigError

if TYPE_CHECKING:
    from fastapi import FastAPI

TOKEN_ENV = "COMBINED_API_TOKEN"
"""The environment variable holding the API's bearer token."""

#: Shorter tokens are refused: a token is a password that a script sends.
MIN_TOKEN_LENGTH = 16


def create_app(
    project_path: str | Path | None = None,
    *,
    token: str | None = None,
    allow_no_auth: bool = False,
) -> FastAPI:
    """The API over the project at ``project_path`` (as ``combined`` finds it when None).

    ``token`` (default: ``$COMBINED_API_TOKEN``) is the bearer token every
    endpoint but ``/health`` and the webhooks requires. Without one the
    application is refused, unless ``allow_no_auth`` (the caller binds it
    to a loopback address).
    """
    token = token if token is not None else os.environ.get(TOKEN_ENV) or None
    if token is None and not allow_no_auth:
        raise ConfigError(
            f"the API needs a bearer token: {TOKEN_ENV} is not set",
            hint=f"set {TOKEN_ENV} to a long random value (e.g. `openssl rand -hex 32`), "
            "or pass --insecure-no-auth to serve on 127.0.0.1 only",
        )
    if token is not None and len(token) < MIN_TOKEN_LENGTH:
        raise ConfigError(
            f"{TOKEN_ENV} is shorter than {MIN_TOKEN_LENGTH} characters",
            hint="use a long random value, e.g. `openssl rand -hex 32`",
        )
    if token is not None and (token != token.strip() or not all(" " <= c <= "~" for c in token)):
        # (a client's header is read without its surrounding spaces: such a token never matched)
        raise ConfigError(
            f"{TOKEN_ENV} starts or ends with a space, or holds a line end or a character "
            "outside printable ASCII, which no client sends as written in an Authorization "
            "header",
            hint="use a long random value of letters and digits, e.g. `openssl rand -hex 32`",
        )
    try:
        from combined.api._app import build
    except ImportError as exc:
        raise ConfigError(
            f"the HTTP API needs the api extra ({exc.name} is not installed)",
            hint="pip install 'combined[api]'",
        ) from None
    return build(project_path, token)


__all__ = ["MIN_TOKEN_LENGTH", "TOKEN_ENV", "create_app"]
