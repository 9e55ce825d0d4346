"""Checking, before any Run, that an object-store lake can be written."""

from __future__ import annotations

import os
import re
import uuid
from typing import TYPE_CHECKING

from combined._credentials import masking
from combined.errors import LakeError, LakeNotWritable, LakeUnreachable
from combined.lake._store import CREDENTIAL_ENV

if TYPE_CHECKING:
    from combined.lake._store import LakeStore

#: (what the store's error says, what is missing, what to do).
_REASONS = (
    (
        (
            "NO_SUCH_BUCKET",
            "NoSuchBucket",
            "bucket does not exist",
            "ContainerNotFound",
            "NOT_FOUND: ",  # Google's client: a write's only missing thing is its bucket
        ),
        "its bucket or container does not exist",
        "create it, or correct the bucket in `lake:`",
    ),
    (
        (
            "INVALID_ACCESS_KEY_ID",
            "InvalidAccessKeyId",
            "SIGNATURE_DOES_NOT_MATCH",
            "SignatureDoesNotMatch",
            "credentials",
            "Credentials",
            "AuthenticationFailed",
            "failed to authenticate",  # Azure's answer to a wrong account key
        ),
        "the store refused the credentials (none, or not valid)",
        "set the store's credentials in the environment (AWS_ACCESS_KEY_ID and "
        "AWS_SECRET_ACCESS_KEY, GOOGLE_APPLICATION_CREDENTIALS, AZURE_STORAGE_ACCOUNT_KEY)",
    ),
    (
        ("ACCESS_DENIED", "AccessDenied", "Forbidden", "403", "AuthorizationPermissionMismatch"),
        "the credentials lack permission to write (PutObject) and delete (DeleteObject) "
        "objects under it",
        "grant the credentials' principal write and delete permission on the lake's prefix",
    ),
    (
        (
            "Connection refused",
            "connection refused",
            "dns error",
            "failed to lookup address",
            "Couldn't connect to server",
            "Could not resolve host",
            "NETWORK_CONNECTION",
        ),
        "the store could not be reached",
        "check the store's endpoint (AWS_ENDPOINT_URL, the account or host in `lake:`) and "
        "that it is up",
    ),
    (
        ("Config error", "Unknown configuration key"),  # (delta-rs: AWS_ALLOW_HTTP=maybe)
        "a setting of the store in the environment is not valid",
        "fix the AWS_, AZURE_ or GOOGLE_ variable the store's message names",
    ),
)


def check_store(store: LakeStore, *, waiting: bool = False) -> None:
    """Write and delete a probe object at the lake's root, or raise LakeNotWritable
    (:class:`~combined.errors.LakeUnreachable` when the store did not answer).

    The message names the lake and what is missing (the bucket, the
    credentials, a permission); no credential value appears in it.
    ``waiting``: one try of a few seconds a request (:attr:`LakeStore.waiting_fs`).
    """
    from deltalake import DeltaTable
    from pyarrow.lib import ArrowException

    probe = store.join(f".write-probe-{uuid.uuid4().hex}")
    try:
        # (Fewer, shorter tries than a data file's: an unreachable store is told in seconds.)
        fs = store.waiting_fs if waiting else store.probe_fs
        with fs.open_output_stream(store.path(probe)) as out:
            out.write(b"")
        fs.delete_file(store.path(probe))
        # The Delta library reads the store's settings itself: one it alone parses
        # (AWS_ALLOW_HTTP=maybe) passed the write above, then failed the Run's first
        # lake write, a Run left queued (one listing, at the root).
        DeltaTable.is_deltatable(store.root, storage_options=store.storage_options(small=True))
    except LakeNotWritable:
        raise
    except (OSError, ValueError, ArrowException) as exc:
        raise _not_writable(store, str(exc)) from None


def _not_writable(store: LakeStore, text: str) -> LakeNotWritable:
    """The probe's error: the lake, what is missing, the store's words (credentials masked)."""
    missing, hint = refusal(text) or (
        "the store refused the write",
        "check the lake's URL, credentials and permissions",
    )
    refused = missing.startswith("the store refused")  # (not: could not be reached)
    if store.scheme == "s3" and not _aws_credentials() and refused:
        missing, hint = _REASONS[1][1:]
        missing = "no credentials were found in the environment (AWS_ACCESS_KEY_ID)"
    # Not reached, or failing (a 5xx, a timeout): it may answer later. Any other
    # answer (a bucket, credentials, a permission, a setting) needs a person.
    unanswered = missing in (_REASONS[3][1], "the store refused the write")
    return (LakeUnreachable if unanswered else LakeNotWritable)(
        f"the lake at {store.root} cannot be written: {missing} ({store_detail(text)})",
        hint=f"{hint}; nothing was captured",
    )


def refusal(text: str) -> tuple[str, str] | None:
    """What a store's error says is missing (a bucket, valid credentials, a permission) and
    what to do; None when it names none of them (the store failed: a 5xx, a timeout)."""
    found = next(((what, hint) for signs, what, hint in _REASONS if _shows(signs, text)), None)
    if found == _REASONS[2][1:] and _READING.search(text):
        return _READ_DENIED
    return found


#: A refused request that listed or read (a denied LIST was told as a missing write permission).
_READING = re.compile(
    r"ListObjects|ListBucket|list-type|GetObject|HeadObject|\blist\b|performing (GET|HEAD)\b", re.I
)
_READ_DENIED = (
    "the credentials lack permission to list (ListBucket) or read (GetObject) objects under it",
    "grant the credentials' principal list and read permission on the lake's prefix "
    "(and write and delete: the lake needs all four)",
)


def store_failure(what: str, exc: BaseException, then: str) -> LakeError:
    """The LakeError for a write the store failed mid-run: ``what``, why, and what to do.

    ``then`` says what becomes of the interrupted work. The store's own
    message follows, its credential values masked.
    """
    text = str(exc)
    reason = refusal(text)
    if reason is None:
        detail, hint = store_detail(text), "the object store failed the write; once it answers"
        return LakeError(f"{what}: {detail}", hint=f"{hint}, capture again; {then}")
    missing, hint = reason
    return LakeError(f"{what}: {missing} ({store_detail(text)})", hint=f"{hint}; {then}")


def read_failure(what: str, exc: BaseException) -> LakeError:
    """The LakeError for a read the lake's store failed (unreachable, refused): ``what``,
    the store's words (credential values masked), and what to check. Nothing was changed."""
    text = str(exc)
    reason = refusal(text)
    detail = store_detail(text)
    if reason is None:
        hint = "check the lake's URL and that its store answers, then run it again"
        return LakeError(f"{what}: {detail}", hint=f"{hint}; nothing was changed")
    missing, hint = reason
    return LakeError(f"{what}: {missing} ({detail})", hint=f"{hint}; nothing was changed")


def _shows(signs: tuple[str, ...], text: str) -> bool:
    """Whether the error shows one of the signs; a number only as a whole word.

    The probe's random name is not read, nor a number inside a request id: a
    probe named ``...ebf403256c3f`` once read as an HTTP 403.
    """
    text = re.sub(r"\.write-probe-[0-9a-f]+", ".write-probe", text)
    return any(
        re.search(rf"(?<![0-9A-Za-z]){s}(?![0-9A-Za-z])", text) if s.isdigit() else s in text
        for s in signs
    )


def _aws_credentials() -> bool:
    """Whether the environment names AWS credentials (keys, a profile or a web identity)."""
    return any(
        os.environ.get(k)
        for k in (
            "AWS_ACCESS_KEY_ID",
            "AWS_PROFILE",
            "AWS_WEB_IDENTITY_TOKEN_FILE",
            "AWS_CONTAINER_CREDENTIALS_FULL_URI",
            "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
        )
    )


#: How much of a store's error is quoted: its start, and its end (where a chain's cause is).
_DETAIL_HEAD, _DETAIL_TAIL = 140, 155


def store_detail(text: str) -> str:
    """A store's error on one line, at most 300 characters, its secrets masked.

    Its lines are joined with `` / ``: delta-rs and the object store write an
    error's chain one cause a line, the root cause last. A longer text keeps
    its start and its end. Masked before it is cut: a secret cut in two would
    no longer be recognised.
    """
    text = masking(v for k in CREDENTIAL_ENV if (v := os.environ.get(k)))(text)
    text = " / ".join(line.strip() for line in text.splitlines() if line.strip())
    if len(text) > _DETAIL_HEAD + _DETAIL_TAIL + 5:
        text = f"{text[:_DETAIL_HEAD]} ... {text[-_DETAIL_TAIL:]}"
    return text or "no detail"
