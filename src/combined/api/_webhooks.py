"""Provider-verified webhooks: a signed notification queues one capture of one dataset.

``POST /webhooks/{source}/{dataset}`` checks the provider's signature, an
HMAC-SHA256 of the raw request body under the secret the dataset's (or its
source's) ``webhook:`` setting references, and only then queues a capture of
exactly that dataset (trigger ``webhook``). A request without a valid
signature is answered 401 and leaves no trace in the catalog. The request
never reads the source: a worker executes the Run under the same lease,
staging, validation and publication as any capture.
"""

from __future__ import annotations

import hashlib
import hmac
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from combined.errors import CombinedError, NotFoundError

if TYPE_CHECKING:
    from combined.config import WebhookConfig
    from combined.engine import Engine

#: The largest body a webhook accepts: notifications are small, and the whole
#: body is held in memory to be signed.
MAX_BODY = 1024 * 1024


def signature(secret: str, body: bytes) -> str:
    """The hex HMAC-SHA256 of ``body`` under ``secret``: what a provider sends."""
    return hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def verify(setting: WebhookConfig, secret: str, body: bytes, given: str | None) -> str | None:
    """Why the signature ``given`` does not sign ``body``; None when it does."""
    if not given:
        return f"the {setting.header} header is missing"
    if not given.startswith(setting.prefix):
        return f"the {setting.header} header does not start with {setting.prefix!r}"
    digest = given[len(setting.prefix) :].strip().lower()
    # Constant time: how long the comparison takes tells nothing of the digest.
    if not hmac.compare_digest(digest.encode(), signature(secret, body).encode()):
        return f"the {setting.header} header does not sign this body"
    return None


def _refuse(status: int, kind: str, message: str, hint: str | None = None) -> JSONResponse:
    return JSONResponse(
        {"error": {"type": kind, "message": message, "hint": hint}}, status_code=status
    )


def webhook_router(engine: Engine) -> APIRouter:
    """The webhook endpoint over ``engine``'s project."""
    r = APIRouter()

    @r.post(
        "/webhooks/{source}/{dataset}",
        status_code=202,
        tags=["webhooks"],
        summary="A provider's signed notification: queue one capture of the dataset",
        responses={401: {"description": "missing or invalid signature"}},
    )
    async def webhook(source: str, dataset: str, request: Request) -> Any:
        try:
            setting = engine.webhook(source, dataset)
        except NotFoundError:
            setting = None
        if setting is None:
            # The same answer for an unknown dataset and one without a webhook:
            # an unauthenticated caller learns nothing of the project.
            return _refuse(404, "NotFoundError", f"no webhook at /webhooks/{source}/{dataset}")
        body = await _read_body(request)
        if body is None:
            return _refuse(413, "PayloadTooLarge", f"a webhook body is at most {MAX_BODY} bytes")
        try:
            secret = setting.secret.resolve(
                engine.project.root, where=f"webhook of {source}.{dataset}"
            )
        except CombinedError:
            return _unresolved_secret()
        why = verify(setting, secret, bytes(body), request.headers.get(setting.header))
        if why is not None:
            return _refuse(
                401,
                "InvalidSignature",
                f"signature refused: {why}",
                "sign the raw body with HMAC-SHA256 under the shared secret",
            )
        run, joined = await run_in_threadpool(engine.enqueue_dataset, source, dataset, "webhook")
        name = f"{source}.{dataset}"
        message = (
            f"a capture of {name} is already queued as run {run.id}: this delivery joins it"
            if joined
            else f"queued run {run.id} to capture {name}"
        )
        return JSONResponse(
            {"run_id": run.id, "state": run.state, "joined": joined, "message": message},
            status_code=202,
        )

    return r


async def _read_body(request: Request) -> bytearray | None:
    """The request's whole body; None as soon as it passes :data:`MAX_BODY` bytes."""
    body = bytearray()
    async for chunk in request.stream():
        body.extend(chunk)
        if len(body) > MAX_BODY:
            return None
    return body


def _unresolved_secret() -> JSONResponse:
    """503: the webhook's secret reference does not resolve on this server."""
    # The server's misconfiguration, not the caller's: which reference
    # failed is for the operator (`combined check`), not for anyone.
    return _refuse(
        503,
        "SecretError",
        "the webhook's secret cannot be resolved on this server",
        "the operator should check the webhook's secret reference in combined.yaml",
    )
