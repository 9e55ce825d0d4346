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
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from combined.errors import SecretError, redact

SECRET_KEY = "secret"
"""The one key of a secret reference mapping."""

SCHEMES = ("env", "file")
"""The places a secret reference can point to."""

REFERENCE_HINT = 'use {secret: "env:NAME"} or {secret: "file:PATH"}'

# Exact key names (after lower-casing and turning "-" into "_") and suffixes
# that mark a value as a credential. Suffixes catch ``client_secret`` or
# ``access_token``; a false positive is cheap because a reference always works.
_SENSITIVE_NAMES = frozenset(
    {"password", "passwd", "pwd", "secret", "token", "api_key", "apikey", "secret_key"}
)
_SENSITIVE_SUFFIXES = ("_password", "_passwd", "_secret", "_token", "_api_key")

_DSN_PASSWORD = re.compile(r"[a-zA-Z][a-zA-Z0-9+.-]*://[^:/@\s]*:[^@\s]+@")
_KV_PASSWORD = re.compile(r"(?i)\b(password|passwd|pwd|secret|token|api_?key)\s*=\s*[^\s&;]")
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


def is_sensitive_key(key: object) -> bool:
    """Whether a configuration key conventionally holds a credential."""
    if not isinstance(key, str):
        return False
    name = key.lower().replace("-", "_")
    return name in _SENSITIVE_NAMES or name.endswith(_SENSITIVE_SUFFIXES)


def has_inline_password(text: str) -> bool:
    """Whether ``text`` carries a password inside a DSN or a ``key=value`` string."""
    return bool(_DSN_PASSWORD.search(text) or _KV_PASSWORD.search(text))


def is_secret_ref(value: object) -> bool:
    """Whether ``value`` is shaped like a secret reference: ``{secret: "<text>"}``."""
    return isinstance(value, Mapping) and len(value) == 1 and isinstance(value.get(SECRET_KEY), str)


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


def _walk(value: Any, loc: tuple[str | int, ...]) -> Iterator[tuple[tuple[str | int, ...], Any]]:
    """Yield every (location, value) below ``value``, without entering references."""
    yield loc, value
    if is_secret_ref(value):
        return
    if isinstance(value, Mapping):
        for key, item in value.items():
            yield from _walk(item, (*loc, str(key)))
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            yield from _walk(item, (*loc, index))


def _is_literal_secret(key: str | int, value: object) -> bool:
    """A non-empty scalar under a credential key: a secret written in the clear."""
    if not is_sensitive_key(key) or isinstance(value, bool) or value is None:
        return False
    return isinstance(value, int | float) or (isinstance(value, str) and value != "")


def config_problems(config: Mapping[str, Any]) -> list[Problem]:
    """Everything that makes a source configuration unsafe or unusable.

    Finds literal secrets under credential keys, DSNs with an inline password,
    malformed references and values that do not map to JSON. Messages never
    quote a value.
    """
    problems: list[Problem] = []
    # The ``secret`` value of a mixed mapping is reported once, as the mix.
    skip: set[tuple[str | int, ...]] = set()
    for loc, value in _walk(config, ()):
        if not loc or loc in skip:
            continue
        if is_secret_ref(value):
            try:
                parse_secret_ref(value[SECRET_KEY])
            except ValueError as exc:
                problems.append(((*loc, SECRET_KEY), str(exc), REFERENCE_HINT))
        elif isinstance(value, Mapping):
            if SECRET_KEY in value and isinstance(value[SECRET_KEY], str) and len(value) > 1:
                skip.add((*loc, SECRET_KEY))
                problems.append((loc, "mixes a secret reference with other keys", REFERENCE_HINT))
            bad_keys = [k for k in value if not isinstance(k, str)]
            if bad_keys:
                problems.append(
                    (loc, f"has a key that is not text: {bad_keys[0]!r}", "quote the key")
                )
        elif _is_literal_secret(loc[-1], value):
            problems.append((loc, "holds a literal secret", REFERENCE_HINT))
        elif isinstance(value, str) and has_inline_password(value):
            problems.append(
                (
                    loc,
                    "holds a connection string with an inline password",
                    "remove the password from it and put it under `password:` as "
                    + REFERENCE_HINT.removeprefix("use "),
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
        for loc, value in _walk(config, ())
        if loc and is_secret_ref(value)
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
        value = os.environ.get(target)
        if value is None:
            raise SecretError(
                f"secret {reference}{at} is not set",
                hint=f"set the environment variable {target} before running",
                reference=reference,
                path=where,
            )
        return value
    file = (root / Path(target).expanduser()).absolute()
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

    References stay as they are (they are not secrets); literal credentials
    under credential keys become ``"***"``; passwords inside DSNs and
    ``key=value`` strings are masked.
    """

    def clean(key: str | int, value: Any) -> Any:
        if is_secret_ref(value):
            return {SECRET_KEY: value[SECRET_KEY]}
        if isinstance(value, Mapping):
            return {str(k): clean(str(k), v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [clean(index, item) for index, item in enumerate(value)]
        if _is_literal_secret(key, value):
            return "***"
        if isinstance(value, str):
            return redact(value)
        return value

    return {str(key): clean(str(key), value) for key, value in config.items()}


def config_digest(config: Mapping[str, Any]) -> str:
    """The sha256 hex digest of the redacted ``config`` as canonical JSON.

    Equal configurations give equal digests whatever their key order; a
    changed secret value does not change it, a changed reference does.
    """
    canonical = json.dumps(
        redact_config(config),
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
        # Values outside JSON (dates from hand-built configs) are hashed by
        # their text form rather than refused, so a digest is always available.
        default=str,
    )
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()
