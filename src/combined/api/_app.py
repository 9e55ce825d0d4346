"""The FastAPI application: authentication, error statuses, read endpoints and actions.

Every endpoint is a thin call into :class:`combined.engine.Engine`. Actions
that capture only queue a Run (``202 Accepted``): a worker executes it, so
no request ever reads a source or waits for one.
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Annotated, Any, Literal

from fastapi import APIRouter, FastAPI, Query, Request, Response, Security
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.security import HTTPBearer
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

from combined._pyrows import python_rows
from combined.api import _console as console
from combined.api._console._docs import is_docs_path
from combined.api._guard import Guard
from combined.api._json import jsonable
from combined.api._webhooks import webhook_router
from combined.catalog import RunState
from combined.engine import Engine
from combined.errors import (
    CatalogError,
    CombinedError,
    ConfigError,
    NotFoundError,
    ProtocolViolation,
    SecretError,
    redact,
)

#: The HTTP status of each kind of engine error, most specific first.
STATUS: tuple[tuple[type[CombinedError], int], ...] = (
    (NotFoundError, 404),
    (SecretError, 503),  # the server's own secret reference cannot be resolved
    (ConfigError, 400),
    (ProtocolViolation, 409),
    (CatalogError, 503),
)

#: Paths open without the bearer token: the health check, and the webhooks,
#: which their provider's signature authenticates instead.
_OPEN = ("/health",)
_OPEN_PREFIXES = ("/webhooks/",)
#: The OpenAPI schema: the bearer token or a console session (for /docs) reads it.
_SCHEMA = "/openapi.json"

#: Where the API tells a defect (one redacted line; the server logs nothing more).
_log = logging.getLogger("combined.api")


def status_of(exc: CombinedError) -> int:
    """The HTTP status an engine error answers with (500 when it is not the caller's doing)."""
    for cls, status in STATUS:
        if isinstance(exc, cls):
            return status
    return 500


def error_body(kind: str, message: str, hint: str | None = None) -> dict[str, Any]:
    """The JSON body of every error answer."""
    return {"error": {"type": kind, "message": message, "hint": hint}}


def build(project_path: str | Path | None, token: str | None) -> FastAPI:
    """The application over one project; ``token`` None serves without authentication."""
    from combined import __version__

    engine = Engine.open(project_path)
    _ = engine.catalog  # opened (and migrated) once, before requests race to open it

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        try:
            yield
        finally:
            engine.close()

    app = FastAPI(
        title="Combined",
        version=__version__,
        summary="Governed capture into a Delta Lake you own: status, runs, queue, webhooks.",
        lifespan=lifespan,
        # /docs is the console's, its assets served here (no CDN); no /redoc.
        docs_url=None,
        redoc_url=None,
    )
    app.state.engine = engine
    _authenticate(app, token)
    _map_errors(app)
    # The console's session cookie is read before the bearer check (above):
    # it also admits its holder to /openapi.json, which /docs reads.
    console.install(app, engine, token)
    # Outermost: a foreign Host or Origin, or an oversized body, reaches nothing.
    app.add_middleware(Guard, loopback_only=token is None)

    @app.get("/health", tags=["service"], summary="Liveness (no token needed)")
    def health() -> dict[str, str]:
        return {"status": "ok"}

    # HEAD too: load balancers and uptime probes often ask with it.
    @app.head("/health", include_in_schema=False)
    def health_head() -> Response:
        return Response(status_code=200)

    @app.get("/metrics", tags=["service"], summary="Prometheus metrics, read from the catalog")
    def metrics() -> Response:
        from combined.api._metrics import metrics_body

        body, kind = metrics_body(engine)
        return Response(body, media_type=kind)

    # Declared (the bearer middleware checks it): /docs offers its Authorize button.
    bearer = HTTPBearer(auto_error=False, description="the server's COMBINED_API_TOKEN")
    app.include_router(_router(engine), prefix="/v1", dependencies=[Security(bearer)])
    app.include_router(webhook_router(engine))
    return app


def _authenticate(app: FastAPI, token: str | None) -> None:
    expected = None if token is None else token.encode()

    @app.middleware("http")
    async def bearer(
        request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        path = request.url.path
        if expected is None or path in _OPEN or path.startswith(_OPEN_PREFIXES):
            return await call_next(request)
        # The console's pages and /docs ask for their session (a login) themselves.
        if console.is_console_path(path) or is_docs_path(path):
            return await call_next(request)
        if path == _SCHEMA and request.session.get("auth") is True:
            return await call_next(request)
        scheme, _, given = request.headers.get("authorization", "").partition(" ")
        # Compared in constant time: the answer's timing tells nothing of the token.
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), expected):
            return JSONResponse(
                error_body(
                    "Unauthorized",
                    "a valid bearer token is required",
                    "send `Authorization: Bearer $COMBINED_API_TOKEN`",
                ),
                status_code=401,
                headers={"WWW-Authenticate": "Bearer"},
            )
        return await call_next(request)


def _map_errors(app: FastAPI) -> None:
    @app.exception_handler(CombinedError)
    async def combined_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, CombinedError)
        return _told(request, status_of(exc), type(exc).__name__, exc.message, exc.hint)

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, exc: Exception) -> Response:
        # FastAPI's own body ({"detail": [...]}) echoed the input and was no error body.
        assert isinstance(exc, RequestValidationError)
        message = "; ".join(_invalid(e) for e in exc.errors()) or "the request is not valid"
        return _told(request, 422, "ValidationError", message, "see /docs for what it takes")

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, StarletteHTTPException)
        kind = "NotFound" if exc.status_code == 404 else "HTTPError"
        hint = "see /docs for the routes" if exc.status_code in (404, 405) else None
        told = _told(request, exc.status_code, kind, str(exc.detail), hint)
        told.headers.update(exc.headers or {})
        return told

    @app.middleware("http")
    async def internal_error(
        request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        # A defect: told in one redacted line, as the CLI tells it. Handled
        # here, not by an exception handler: Starlette re-raises what reaches
        # its outermost layer, and the server then logs the whole traceback,
        # whose message and values may hold secrets.
        try:
            return await call_next(request)
        except Exception as exc:
            line = f"internal error ({type(exc).__name__}): {redact(str(exc))}"
            _log.error("%s %s: %s", request.method, request.url.path, line)
            return JSONResponse(
                error_body("InternalError", line, "this is a bug in Combined: report it"),
                status_code=500,
            )


def _invalid(error: Mapping[str, Any]) -> str:
    """One validation error, where and what (never the value sent)."""
    where = [str(part) for part in error.get("loc", ()) if part != "body"]
    place = {"query": "query parameter", "path": "path parameter", "header": "header"}
    if where and where[0] in place:
        return f"{place[where[0]]} {'.'.join(where[1:])!r}: {error.get('msg', 'not valid')}"
    field = ".".join(where)
    return f"body field {field!r}: {error.get('msg')}" if field else str(error.get("msg"))


def _told(request: Request, status: int, kind: str, message: str, hint: str | None) -> Response:
    """An error answer: a page on the console's paths, else the JSON error body."""
    if console.is_console_path(request.url.path):
        shown: console.Console = request.app.state.console
        return shown.error_page(request, status, kind, f"{message} ({hint})" if hint else message)
    return JSONResponse(error_body(kind, message, hint), status_code=status)


class Decision(BaseModel):
    """A quarantine decision: who decides and why (both recorded with it)."""

    reason: Annotated[str, Field(min_length=1, max_length=2000)]
    by: Annotated[str, Field(min_length=1, max_length=128)]


class Cancel(BaseModel):
    """A cancel request: why, and who asks (``api`` when not said); both optional."""

    reason: Annotated[str | None, Field(max_length=2000)] = None
    by: Annotated[str | None, Field(min_length=1, max_length=128)] = None


class Reset(BaseModel):
    """A reset (``combined reset``): why (required, recorded with it), who (``api`` when not
    said), and whether the tables the lake still holds go too (only when asked)."""

    # A misspelt field (``drop_tables``) is refused, never read as "keep the tables".
    model_config = ConfigDict(extra="forbid")

    reason: Annotated[str, Field(min_length=1, max_length=2000)]
    by: Annotated[str | None, Field(min_length=1, max_length=128)] = None
    drop_table: Annotated[
        bool, Field(description="remove the tables the lake still holds (the CLI's --drop-table)")
    ] = False


Limit = Annotated[int, Query(ge=0, le=1000, description="how many (0: none)")]
#: A page of records: never more than MAX_PAGE, whatever the entry holds.
MAX_PAGE = 1000
Page = Annotated[int, Query(ge=1, le=MAX_PAGE, description=f"records (1 to {MAX_PAGE})")]
Offset = Annotated[int, Query(ge=0, description="the first record (a page's next_offset)")]
_MONTH = r"^\d{4}-(0[1-9]|1[0-2])$"


def _router(engine: Engine) -> APIRouter:
    """Every JSON route, registered in the order the OpenAPI document lists them."""
    r = APIRouter()
    _dataset_routes(r, engine)
    _reset_routes(r, engine)
    _run_routes(r, engine)
    _ledger_routes(r, engine)
    _quarantine_routes(r, engine)
    _activity_routes(r, engine)
    return r


def _dataset_routes(r: APIRouter, engine: Engine) -> None:
    """Datasets: their status and history, and queuing their captures."""

    @r.get("/datasets", tags=["datasets"], summary="Every dataset's freshness and position")
    def datasets(
        slots: Annotated[
            bool, Query(description="also ask cdc sources for their slot lag")
        ] = False,
    ) -> dict[str, Any]:
        return {"datasets": jsonable(engine.status(slots=slots))}

    @r.get("/datasets/{source}/{dataset}", tags=["datasets"], summary="One dataset's status")
    def dataset(source: str, dataset: str, slots: bool = False) -> dict[str, Any]:
        engine.project.dataset(source, dataset)
        name = f"{source}.{dataset}"
        (row,) = [s for s in engine.status(slots=slots) if s["dataset"] == name]
        waiting = [r.id for r in engine.queued() if r.source == source and dataset in r.datasets]
        return {**jsonable(row), "queued_runs": waiting}

    @r.get(
        "/datasets/{source}/{dataset}/history",
        tags=["datasets"],
        summary="A dataset's versions with their publications",
    )
    def history(source: str, dataset: str) -> dict[str, Any]:
        return {"versions": jsonable(engine.history(f"{source}.{dataset}"))}

    @r.post(
        "/datasets/{source}/{dataset}/captures",
        status_code=202,
        tags=["captures"],
        summary="Queue a capture of one dataset (a worker executes it)",
    )
    def capture_dataset(source: str, dataset: str) -> dict[str, Any]:
        engine.project.dataset(source, dataset)
        return _queued(engine, f"{source}.{dataset}")

    @r.post(
        "/sources/{source}/captures",
        status_code=202,
        tags=["captures"],
        summary="Queue a capture of every dataset of a source (a worker executes it)",
    )
    def capture_source(source: str) -> dict[str, Any]:
        engine.project.source(source)
        return _queued(engine, source)


def _reset_routes(r: APIRouter, engine: Engine) -> None:
    """Resets: a dataset's lake table forgotten by a recorded decision (``combined reset``)."""

    def reset(selector: str, body: Reset) -> dict[str, Any]:
        done = engine.reset(
            [selector], by=body.by or "api", reason=body.reason, drop_table=body.drop_table
        )
        return {"resets": jsonable(done)}

    summary = "Forget {}'s lake table{} by a recorded decision: the next capture is a first one"

    @r.post(
        "/datasets/{source}/{dataset}/reset",
        tags=["datasets"],
        summary=summary.format("a dataset", ""),
    )
    def reset_dataset(source: str, dataset: str, body: Reset) -> dict[str, Any]:
        engine.project.dataset(source, dataset)
        return reset(f"{source}.{dataset}", body)

    @r.post(
        "/sources/{source}/reset", tags=["datasets"], summary=summary.format("each dataset", "s")
    )
    def reset_source(source: str, body: Reset) -> dict[str, Any]:
        engine.project.source(source)
        return reset(source, body)


def _queued(engine: Engine, selector: str) -> dict[str, Any]:
    """The answer of a queued capture: its Run (the new one, else the first it joined), and
    each part: which Run captures which datasets, and whether it joined one already queued
    or running (a source's datasets may be in several: only the first was named)."""
    from combined.runtime._scheduler import enqueue, per_source

    parts = enqueue(engine, [selector])
    (run,) = per_source(parts)
    told = [{"run_id": p.run.id, "datasets": list(p.datasets), "joined": p.joined} for p in parts]
    return {"run_id": run.id, "run": jsonable(run), "parts": told}


def _told_gone(run: Any, gone: dict[str, Any]) -> dict[str, Any]:
    """A Run as JSON, with ``worker_gone`` (when its process was last heard from) for one not
    ended whose process is gone: a repair or the next worker ends it (``Engine.gone``)."""
    told = dict(jsonable(run))
    heard = gone.get(run.id)
    told["worker_gone"] = None if heard is None else {"last_heard_at": jsonable(heard)}
    return told


def _run_routes(r: APIRouter, engine: Engine) -> None:
    """Runs: listing, showing, retrying and canceling them, and the queue."""

    @r.get("/runs", tags=["runs"], summary="Newest runs first")
    def runs(
        limit: Limit = 20,
        state: Annotated[list[RunState] | None, Query(description="only these states")] = None,
    ) -> dict[str, Any]:
        gone = engine.gone()
        return {"runs": [_told_gone(run, gone) for run in engine.runs(limit, states=state)]}

    @r.get("/runs/{run_id}", tags=["runs"], summary="One run: admission, attempts, deliveries")
    def run(run_id: str) -> dict[str, Any]:
        shown = engine.run(run_id)
        return {**jsonable(shown), "run": _told_gone(shown["run"], engine.gone())}

    @r.post(
        "/runs/{run_id}/retry",
        status_code=202,
        tags=["runs"],
        summary="Queue a retry of a failed run under its admission",
    )
    def retry(run_id: str) -> dict[str, Any]:
        new = engine.retry(run_id, enqueue=True)
        return {"run_id": new.id, "run": jsonable(new)}

    @r.post(
        "/runs/{run_id}/cancel",
        status_code=202,
        tags=["runs"],
        summary="Cancel a queued run now, or ask a running one to stop (it ends canceled)",
    )
    def cancel(run_id: str, body: Cancel | None = None) -> dict[str, Any]:
        asked = body or Cancel()
        run = engine.cancel(run_id, by=asked.by or "api", reason=asked.reason)
        return {"run_id": run.id, "run": jsonable(run)}

    @r.get("/queue", tags=["runs"], summary="Runs waiting for a worker, oldest first")
    def queued(limit: Limit = 100) -> dict[str, Any]:
        return {"runs": jsonable(engine.queued(limit))}


def _ledger_routes(r: APIRouter, engine: Engine) -> None:
    """Publications and monthly active rows."""

    @r.get("/publications", tags=["publications"], summary="Newest publications with members")
    def publications(limit: Limit = 20) -> dict[str, Any]:
        return {"publications": jsonable(engine.publications(limit))}

    @r.get("/usage", tags=["usage"], summary="Monthly active rows per source and dataset")
    def usage(
        month: Annotated[str | None, Query(pattern=_MONTH, description="YYYY-MM")] = None,
    ) -> dict[str, Any]:
        return {"usage": jsonable(engine.usage(month))}


def _quarantine_routes(r: APIRouter, engine: Engine) -> None:
    """Quarantine: its entries, their records, and decisions on them."""

    @r.get("/quarantine", tags=["quarantine"], summary="Entries awaiting review")
    def quarantine(
        source: str | None = None,
        all: Annotated[bool, Query(description="also decided entries")] = False,  # noqa: A002
    ) -> dict[str, Any]:
        return {"entries": jsonable(engine.quarantine(source, include_decided=all))}

    @r.get("/quarantine/{entry}", tags=["quarantine"], summary="One entry and a page of records")
    def quarantine_show(entry: str, limit: Page = 20, offset: Offset = 0) -> dict[str, Any]:
        q, table = engine.quarantine_records(entry, limit, offset)
        end = offset + table.num_rows
        following = end if table.num_rows == limit and end < q["record_count"] else None
        return {
            "entry": jsonable(q),
            "records": jsonable(python_rows(table)),
            "offset": offset,
            "next_offset": following,
        }

    def decide(entry: str, decision: Literal["released", "discarded"], body: Decision) -> Any:
        q = engine.decide_quarantine(entry, decision, by=body.by, reason=body.reason)
        return {"entry": jsonable(q)}

    @r.post("/quarantine/{entry}/release", tags=["quarantine"], summary="Release an entry")
    def release(entry: str, body: Decision) -> dict[str, Any]:
        return dict(decide(entry, "released", body))

    @r.post("/quarantine/{entry}/discard", tags=["quarantine"], summary="Discard an entry")
    def discard(entry: str, body: Decision) -> dict[str, Any]:
        return dict(decide(entry, "discarded", body))


def _activity_routes(r: APIRouter, engine: Engine) -> None:
    """The activity feed."""

    @r.get("/activity", tags=["activity"], summary="The activity feed, newest first")
    def activity(
        limit: Limit = 50,
        kind: str | None = None,
        run_id: str | None = None,
        source: str | None = None,
        dataset: str | None = None,
    ) -> dict[str, Any]:
        rows = engine.activity(limit, kind=kind, run_id=run_id, source=source, dataset=dataset)
        return {"events": jsonable(rows)}
