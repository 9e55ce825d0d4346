"""The console's forms: log in and out, queue a capture, retry or cancel a Run, decide on
quarantine.

A form is a ``POST`` of ``application/x-www-form-urlencoded`` fields that
carries the session's CSRF token (field ``csrf``): without a session the
browser is sent to the login, and with a wrong or missing token the post is
refused (403) before anything happens. Each action then redirects to a page
(``303``) that tells what it did, or what went wrong and what to do.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated
from urllib.parse import parse_qs

from fastapi import APIRouter, Depends, Request, Response
from fastapi.responses import RedirectResponse

from combined.api._console import Forbidden, _session
from combined.errors import CombinedError, ConfigError

if TYPE_CHECKING:
    from combined.api._console import Console

Form = dict[str, str]


async def read_form(request: Request) -> Form:
    """The posted fields (the Guard already capped the body's size); the last of a repeat."""
    body = (await request.body()).decode("utf-8", errors="replace")
    return {k: v[-1] for k, v in parse_qs(body, keep_blank_values=True).items()}


def _back(to: str) -> RedirectResponse:
    return RedirectResponse(to, status_code=303)


def _attempt(request: Request, to: str, action: Callable[[], str]) -> RedirectResponse:
    """Do ``action``; tell its message (or the engine's error and hint) on the page ``to``."""
    try:
        _session.flash(request, action())
    except CombinedError as exc:
        _told(request, exc)
    return _back(to)


def _told(request: Request, exc: CombinedError) -> None:
    """The engine's error and its hint, for the next page."""
    hint = f" ({exc.hint})" if exc.hint else ""
    _session.flash(request, f"{exc.message}{hint}", "error")


async def checked(request: Request) -> Form:
    """The form's fields, once its session and CSRF token are good."""
    console: Console = request.app.state.console
    console.require(request)
    form = await read_form(request)
    if not _session.csrf_ok(request, form.get("csrf")):
        raise Forbidden(
            "this form does not carry your session's CSRF token: "
            "reload the page and submit it again"
        )
    return form


#: A posted form whose session and CSRF token were checked.
Checked = Annotated[Form, Depends(checked)]


def router(console: Console) -> APIRouter:
    """The forms over ``console``'s engine."""
    r = APIRouter(include_in_schema=False)
    login_routes(r, console)
    _dataset_actions(r, console)
    _run_actions(r, console)
    _quarantine_actions(r, console)
    return r


def login_routes(r: APIRouter, console: Console) -> None:
    """The login form: the API token, pasted once, opens a session (a signed cookie)."""
    expected = None if console.token is None else console.token.encode()

    @r.get("/console/login")
    def login_form(request: Request, next: str = "/") -> Response:
        if expected is None:  # served without a token: nothing to log in with
            return _back(_session.local_path(next))
        return console.page(request, "login.html", next=_session.local_path(next))

    @r.post("/console/login")
    async def login(request: Request) -> Response:
        form = await read_form(request)
        to = _session.local_path(form.get("next"))
        if expected is None:
            return _back(to)
        given = form.get("token", "").strip().encode()
        # Compared in constant time, as the API compares a bearer token.
        if not hmac.compare_digest(given, expected):
            return console.page(
                request,
                "login.html",
                401,
                next=to,
                error="that is not this server's API token ($COMBINED_API_TOKEN)",
            )
        _session.open_session(request)
        return _back(to)


def _dataset_actions(r: APIRouter, console: Console) -> None:
    """Logging out and queuing a capture."""
    engine = console.engine

    @r.post("/console/logout")
    def logout(request: Request, form: Checked) -> Response:
        _session.end_session(request, engine.catalog)
        return _back(_session.LOGIN if console.token is not None else "/")

    @r.post("/console/datasets/{source}/{dataset}/capture")
    def capture(request: Request, source: str, dataset: str, form: Checked) -> Response:
        from combined.runtime._scheduler import describe, enqueue

        def queue() -> str:
            engine.project.dataset(source, dataset)
            return "; ".join(describe(enqueue(engine, [f"{source}.{dataset}"])))

        return _attempt(request, _session.local_path(form.get("next")), queue)


def _run_actions(r: APIRouter, console: Console) -> None:
    """Retrying a run and canceling one."""
    engine = console.engine

    @r.post("/console/runs/{run_id}/retry")
    def retry(request: Request, run_id: str, form: Checked) -> Response:
        try:
            new = engine.retry(run_id, enqueue=True)
        except CombinedError as exc:
            _told(request, exc)
            return _back(f"/console/runs/{run_id}")
        _session.flash(request, f"run {new.id} queued: a retry of {run_id} under its admission")
        return _back(f"/console/runs/{new.id}")

    @r.post("/console/runs/{run_id}/cancel")
    def cancel(request: Request, run_id: str, form: Checked) -> Response:
        by = form.get("by", "").strip() or "console"
        reason = form.get("reason", "").strip() or None

        def ask() -> str:
            run = engine.cancel(run_id, by=by, reason=reason)
            if run.state == "canceled":
                return f"run {run_id} canceled by {by}"
            return f"run {run_id} asked to stop: it ends canceled at its next check"

        return _attempt(request, f"/console/runs/{run_id}", ask)


def _quarantine_actions(r: APIRouter, console: Console) -> None:
    """Releasing or discarding a quarantine entry."""
    engine = console.engine

    @r.post("/console/quarantine/{entry}/{decision}")
    def decide(request: Request, entry: str, decision: str, form: Checked) -> Response:
        decided = {"release": "released", "discard": "discarded"}.get(decision)
        if decided is None:
            return console.error_page(request, 404, "Not found", f"no decision {decision!r}")
        by, reason = form.get("by", "").strip(), form.get("reason", "").strip()

        def record() -> str:
            if not by or not reason:
                raise ConfigError(
                    f"entry {entry} was not {decided}: a decision needs your name and a reason",
                    hint="fill in both fields",
                )
            engine.decide_quarantine(entry, decided, by=by, reason=reason)
            return f"entry {entry} {decided} by {by}"

        return _attempt(request, "/console/quarantine", record)
