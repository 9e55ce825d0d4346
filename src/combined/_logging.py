"""Logs through the standard :mod:`logging` module: text or JSON lines, always redacted.

Every command logs to standard error. ``--log-format json`` (or
``COMBINED_LOG_FORMAT=json``, or ``logging: {format: json}`` in
``combined.yaml``) writes one JSON object a line: ``timestamp`` (UTC,
ISO-8601), ``level``, ``logger``, ``message``, and ``run_id``, ``source``,
``dataset``, ``event`` and ``body`` where the record has them. The level
comes from ``--log-level``, ``COMBINED_LOG_LEVEL`` or ``logging: {level:}``
(WARNING unless set). The handler masks every secret value the project
resolved and every credential-shaped text (:func:`combined.errors.redact`),
in the message, its arguments, the extra fields and any traceback, whichever
library logged it.

Every Activity event is logged (logger ``combined.activity``, level INFO),
so a JSON log at INFO is the feed as it happens.
"""

from __future__ import annotations

import logging
import os
import sys
import traceback
from datetime import datetime
from typing import Any, Literal

from combined._credentials import redact, redact_data

Format = Literal["text", "json"]
FORMAT_ENV = "COMBINED_LOG_FORMAT"
LEVEL_ENV = "COMBINED_LOG_LEVEL"
LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")

#: The extra fields a record may carry, put in a JSON line when present.
FIELDS = ("run_id", "source", "dataset", "event", "body")
_HANDLER_NAME = "combined"
#: Set by an explicit choice (an option or the environment): a project's
#: ``logging:`` section does not override it.
_explicit = False


class Redact(logging.Filter):
    """Masks secrets in a record before any formatter sees it."""

    def filter(self, record: logging.LogRecord) -> bool:
        """Always keep the record, its text redacted."""
        record.msg = redact(record.getMessage())
        record.args = None
        if record.exc_info:
            text = "".join(traceback.format_exception(*record.exc_info))
            record.exc_text = redact(text.rstrip("\n"))
            record.exc_info = None
        for name in FIELDS:
            if hasattr(record, name):
                setattr(record, name, redact_data(getattr(record, name), key=name))
        return True


def _formatter(fmt: Format) -> logging.Formatter:
    if fmt == "text":
        return logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    from pythonjsonlogger.json import JsonFormatter

    return JsonFormatter(
        "%(levelname)s %(name)s %(message)s",
        rename_fields={"levelname": "level", "name": "logger"},
        timestamp=True,
        json_default=_jsonable,
        # Only the named fields and the extras in FIELDS: none of a record's internals.
        reserved_attrs=[
            k for k in logging.LogRecord("", 0, "", 0, "", None, None).__dict__ if k != "message"
        ]
        + ["taskName", "color_message"],
    )


def _jsonable(value: Any) -> Any:
    return value.isoformat() if isinstance(value, datetime) else str(value)


def configure(fmt: str | None = None, level: str | None = None, *, explicit: bool = True) -> None:
    """Send log records to standard error in ``fmt`` from ``level`` on.

    None takes the environment's choice (``COMBINED_LOG_FORMAT``,
    ``COMBINED_LOG_LEVEL``), else the default. A call with ``explicit``
    False (a project's ``logging:`` section) changes nothing an option or
    the environment chose.
    """
    global _explicit
    if not explicit and _explicit:
        return
    env_fmt, env_level = os.environ.get(FORMAT_ENV), os.environ.get(LEVEL_ENV)
    if explicit:
        _explicit = _explicit or bool(fmt or level or env_fmt or env_level)
        fmt, level = fmt or env_fmt, level or env_level
    else:  # the environment outranks the project file
        fmt, level = env_fmt or fmt, env_level or level
    chosen = check(fmt or "text", level)
    root = logging.getLogger()
    for handler in [h for h in root.handlers if h.get_name() == _HANDLER_NAME]:
        root.removeHandler(handler)
    handler = logging.StreamHandler(sys.stderr)
    handler.set_name(_HANDLER_NAME)
    handler.addFilter(Redact())
    handler.setFormatter(_formatter(chosen[0]))
    root.addHandler(handler)
    root.setLevel(chosen[1])


def current_format() -> Format:
    """The format the root logger's Combined handler writes (text when none is set)."""
    for handler in logging.getLogger().handlers:
        if handler.get_name() == _HANDLER_NAME and type(handler.formatter) is not logging.Formatter:
            return "json"
    return "text"


def check(fmt: str, level: str | None) -> tuple[Format, str]:
    """``fmt`` and ``level`` validated; raises :class:`ConfigError` naming the choices."""
    from combined.errors import ConfigError

    if fmt not in ("text", "json"):
        raise ConfigError(
            f"log format {fmt!r} is neither text nor json", hint="use --log-format json"
        )
    name = (level or "WARNING").upper()
    if name not in LEVELS:
        raise ConfigError(
            f"log level {level!r} is not one of {', '.join(LEVELS)}", hint="e.g. --log-level INFO"
        )
    return ("json" if fmt == "json" else "text"), name


def fields(**values: Any) -> dict[str, Any]:
    """``extra=`` for a log call: the known fields that are set."""
    return {k: v for k, v in values.items() if v is not None and k in FIELDS}
