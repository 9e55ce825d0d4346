"""Secret references inside a source's configuration.

A secret reference is a mapping holding exactly one key, ``secret``, whose
value names where the secret lives: ``env:NAME`` (an environment variable) or
``file:PATH`` (a file, relative to the project directory). References are not
secrets: they are stored, hashed and shown as they are. Values are resolved at
connect time only, and no function here ever puts a value in an error.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from combined._credentials import (
    SECRET_KEY,
    has_inline_credential,
    is_literal,
    is_secret_ref,
    redact_data,
    remember_secret,
    reserve_env,
    walk,
)
from combined.errors import SecretError

SCHEMES = ("env", "file")
"""The places a secret reference can point to."""

REFERENCE_HINT = 'use {secret: "env:NAME"} or {secret: "file:PATH"}'
#: Where a secret is shown with the rest (an HTTP source's headers and parameters): a
#: reference is refused there too, so the hint points at `auth`.
_SHOWN = ("headers", "params", "query")


def _literal_hint(loc: tuple[str | int, ...]) -> str:
    """The hint for a literal secret at ``loc``."""
    if any(part in _SHOWN for part in loc):
        return (
            "give it under `auth` instead, by reference (these are shown in errors and "
            "discovery): e.g. auth: {type: api_key, in: header, name: X-Api-Key, api_key: "
            '{secret: "env:API_KEY"}}, or type bearer or basic'
        )
    return REFERENCE_HINT


_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

Problem = tuple[tuple[str | int, ...], str, str]
"""A problem found in a configuration: (location inside it, predicate, hint)."""


def join_path(parts: Sequence[str | int]) -> str:
    """Render a location as a dotted path: ``sources.shop.hosts[0].password``."""
    text = ""
    for part in parts:
        if isinstance(part, int):
            text += f"[{part}]"
        else:
            text += f".{part}" if text else str(part)
    return text


def parse_secret_ref(reference: str) -> tuple[str, str]:
    """Split a reference into its scheme and target, or raise ``ValueError``.

    The error never quotes the reference: a malformed one may be a pasted secret.
    """
    scheme, sep, target = reference.partition(":")
    if not sep or scheme not in SCHEMES or not target:
        raise ValueError("is not a secret reference")
    if scheme == "env" and not _ENV_NAME.match(target):
        raise ValueError("does not name a valid environment variable")
    return scheme, target


def config_problems(config: Mapping[str, Any]) -> list[Problem]:
    """Everything that makes a source configuration unsafe or unusable.

    Finds literal secrets (text or numbers written under a credential-like key
    at any depth, see :mod:`combined._credentials`), strings carrying an
    inline credential, malformed references and values that do not map to
    JSON. Messages never quote a value.
    """
    problems: list[Problem] = []
    # A mapping that mixes a reference with other keys is reported once, as the mix.
    mixes: list[tuple[str | int, ...]] = []
    for loc, value, under_credential in walk(config):
        if any(loc[: len(mix)] == mix for mix in mixes):
            continue
        if is_secret_ref(value):
            try:
                parse_secret_ref(value[SECRET_KEY])
            except ValueError as exc:
                problems.append(((*loc, SECRET_KEY), str(exc), REFERENCE_HINT))
        elif isinstance(value, Mapping):
            if SECRET_KEY in value and isinstance(value[SECRET_KEY], str) and len(value) > 1:
                mixes.append(loc)
                problems.append((loc, "mixes a secret reference with other keys", REFERENCE_HINT))
            bad_keys = [k for k in value if not isinstance(k, str)]
            if bad_keys:
                problems.append(
                    (loc, f"has a key that is not text: {bad_keys[0]!r}", "quote the key")
                )
        elif under_credential and is_literal(value):
            problems.append((loc, "holds a literal secret", _literal_hint(loc)))
        elif isinstance(value, str) and has_inline_credential(value):
            problems.append(
                (
                    loc,
                    "holds a connection string with an inline credential",
                    "remove it from the string and give the secret under its own key as a "
                    'reference, such as `password: {secret: "env:NAME"}` (or file:PATH)',
                )
            )
        elif not isinstance(value, str | int | float | bool | list | tuple) and value is not None:
            problems.append(
                (
                    loc,
                    f"holds a {type(value).__name__}, which is not plain data",
                    "use text, numbers, booleans, lists or mappings",
                )
            )
    return problems


def find_secret_refs(config: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Every secret reference in ``config``, as (dotted path, reference), in order."""
    return [
        (join_path(loc), value[SECRET_KEY])
        for loc, value, _ in walk(config)
        if is_secret_ref(value)
    ]


def resolve_secret(reference: str, root: Path, *, where: str = "") -> str:
    """The value a reference points to.

    ``root`` anchors relative ``file:`` paths; ``where`` is the dotted path of
    the reference, used in errors. Raises :class:`SecretError` naming the
    reference and where it is, never a value.
    """
    at = f" at {where}" if where else ""
    try:
        scheme, target = parse_secret_ref(reference)
    except ValueError as exc:
        raise SecretError(
            f"{where or 'the value'} {exc}", hint=REFERENCE_HINT, path=where
        ) from None
    if scheme == "env":
        reserve_env(target)
        value = os.environ.get(target)
        if value is None:
            raise SecretError(
                f"secret {reference}{at} is not set",
                hint=f"set the environment variable {target} before running",
                reference=reference,
                path=where,
            )
        fill = f"set the environment variable {target} to the secret"
    else:
        file = (root / Path(target).expanduser()).absolute()
        value = _read_file_secret(reference, file, at, where)
        fill = f"write the secret into {file}"
    if not value:
        # An empty secret would silently mean "no password": never what was meant.
        raise SecretError(
            f"secret {reference}{at} is empty",
            hint=f"{fill}, or remove the reference if the source needs no secret",
            reference=reference,
            path=where,
        )
    if "\0" in value:
        # A C library (libpq, a TLS stack) would read it only up to the NUL:
        # a shorter secret than the one written, refused rather than truncated.
        raise SecretError(
            f"secret {reference}{at} holds a NUL byte",
            hint=f"{fill} without the NUL byte (a secret is text)",
            reference=reference,
            path=where,
        )
    remember_secret(value)
    return value


def remember_project_secrets(references: Sequence[str], root: Path) -> None:
    """Reserve the variables ``references`` name and mask the values they hold now.

    Called with every reference of a project when it is loaded, so that a
    program Combined runs inherits none of them, and an error or a program's
    output that echoes any of them (another source's password included) is
    masked, even before that source's own secrets are resolved. A reference
    that cannot be resolved now is left for its own use to report.
    """
    for reference in references:
        try:
            scheme, target = parse_secret_ref(reference)
        except ValueError:
            continue
        if scheme == "env":
            reserve_env(target)
        try:
            resolve_secret(reference, root)
        except SecretError:
            continue


def _read_file_secret(reference: str, file: Path, at: str, where: str) -> str:
    try:
        text = file.read_text(encoding="utf-8")
    except OSError as exc:
        raise SecretError(
            f"secret {reference}{at} cannot be read: {exc.strerror or type(exc).__name__}",
            hint=f"create {file} holding the secret, or fix the path in the reference",
            reference=reference,
            path=where,
        ) from None
    except UnicodeDecodeError:
        raise SecretError(
            f"secret {reference}{at} is not utf-8 text",
            hint=f"save {file} as utf-8 text",
            reference=reference,
            path=where,
        ) from None
    # Editors add a final newline that is never part of the secret; a second
    # one would be deliberate, so only one is removed.
    if text.endswith("\r\n"):
        return text[:-2]
    return text.removesuffix("\n")


def resolve_secrets(config: Mapping[str, Any], root: Path, *, prefix: str = "") -> dict[str, Any]:
    """A deep copy of ``config`` with each secret reference replaced by its value.

    ``root`` anchors relative ``file:`` paths; ``prefix`` is the dotted path of
    ``config`` itself (``sources.shop.config``), used in errors.
    """

    def resolve(value: Any, loc: tuple[str | int, ...]) -> Any:
        if is_secret_ref(value):
            where = join_path(([prefix] if prefix else []) + list(loc))
            return resolve_secret(value[SECRET_KEY], root, where=where)
        if isinstance(value, Mapping):
            return {key: resolve(item, (*loc, str(key))) for key, item in value.items()}
        if isinstance(value, list | tuple):
            return [resolve(item, (*loc, index)) for index, item in enumerate(value)]
        return value

    return {key: resolve(item, (str(key),)) for key, item in config.items()}


def redact_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """A deep copy of ``config`` that is safe to store, log and hash.

    References stay as they are (they are not secrets); literal credentials,
    text or numbers under a credential-like key at any depth, become
    ``"***"``; credentials inside URLs and ``key=value`` strings are masked.
    """
    # The configuration is a mapping of settings, never a reference itself.
    return {str(key): redact_data(value, key=key) for key, value in config.items()}


def config_digest(config: Mapping[str, Any]) -> str:
    """The sha256 hex digest of the redacted ``config`` as canonical JSON.

    Equal configurations give equal digests whatever their key order; a
    changed secret value does not change it, a changed reference does.
    """
    return canonical_digest(redact_config(config))


def canonical_digest(data: Mapping[str, Any]) -> str:
    """The sha256 hex digest of ``data``, already safe to store, as canonical JSON.

    For bodies that hold a redacted configuration next to names chosen by the
    user (a dataset called ``secrets``), which redacting again would mask.
    """
    canonical = json.dumps(
        data,
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
        # Values outside JSON (dates from hand-built configs) are hashed by
        # their text form rather than refused, so a digest is always available.
        default=str,
    )
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()
