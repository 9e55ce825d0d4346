"""What Airbyte messages other than records mean: TRACE errors, LOG lines, statuses."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from combined.connectors._subprocess._live import LiveConfig
from combined.connectors._subprocess._process import ChildProcess
from combined.connectors._subprocess._run import with_log
from combined.errors import CombinedError, ConfigError, SourceError, SourceUnavailable

_LONGEST = 2000


def _text(value: Any, scrub: Callable[[str], str]) -> str:
    """``value`` as text, masked, then shortened (a secret cut in two would not be found)."""
    text = scrub(str(value).strip())
    return text if len(text) <= _LONGEST else text[: _LONGEST - 3] + "..."


def log(proc: ChildProcess, message: Mapping[str, Any]) -> None:
    """A LOG message's level and text, into the connector's log tail (scrubbed when shown)."""
    entry = message.get("log")
    if isinstance(entry, Mapping):
        proc.log(f"{entry.get('level', 'INFO')} {_text(entry.get('message', ''), proc.scrub)}")


def trace_error(
    proc: ChildProcess,
    message: Mapping[str, Any],
    scrub: Callable[[str], str],
    doing: str,
    **context: Any,
) -> CombinedError | None:
    """The classified error of a ``TRACE`` of type ``ERROR``; None for any other trace.

    ``failure_type`` decides: ``config_error`` is a ``ConfigError``,
    ``transient_error`` a ``SourceUnavailable`` (retried as another Attempt),
    ``system_error`` (or none) a ``SourceError``. The connector's message,
    its internal message and the log tail are scrubbed of credentials.
    """
    trace = message.get("trace")
    if not isinstance(trace, Mapping) or trace.get("type") != "ERROR":
        return None
    error = trace.get("error")
    error = error if isinstance(error, Mapping) else {}
    said = _text(error.get("message") or "no message", scrub)
    internal = error.get("internal_message")
    if internal:
        said = f"{said} ({_text(internal, scrub)})"
    failure = error.get("failure_type")
    text = with_log(proc, f"the connector failed {doing}: {said}", "connector")
    kind: type[CombinedError]
    if failure == "config_error":
        kind = ConfigError
        hint = "fix the connector's `config:` in the source's configuration (the connector "
        hint += "says what is wrong); nothing was committed"
    elif failure == "transient_error":
        kind = SourceUnavailable
        hint = "a passing failure: the capture is retried as another attempt; nothing was committed"
    else:
        kind = SourceError
        hint = "read the connector's message and log above; nothing was committed"
    return kind(
        text, hint=hint, failure_type=failure if isinstance(failure, str) else None, **context
    )


def control(proc: ChildProcess, message: Mapping[str, Any], live: LiveConfig) -> None:
    """A ``CONTROL`` message: a ``CONNECTOR_CONFIG`` is the connector's configuration from now on.

    Kept at once, whatever becomes of the run (``docs/airbyte.md``,
    "Configuration updates"); the log tail names the changed keys, never a
    value. Other control types are ignored; a config update without a
    ``config`` object is a ``SourceError``.
    """
    body = message.get("control")
    if not isinstance(body, Mapping) or body.get("type") != "CONNECTOR_CONFIG":
        return
    update = body.get("connectorConfig")
    config = update.get("config") if isinstance(update, Mapping) else None
    if not isinstance(config, Mapping):
        raise SourceError(
            with_log(
                proc,
                "a CONTROL CONNECTOR_CONFIG without a `connectorConfig.config` object",
                "connector",
            ),
            hint="the connector must send its whole updated configuration; nothing was kept",
        )
    changed = live.receive(config)
    if changed:
        proc.log(
            f"Combined: the connector updated its configuration ({', '.join(changed)}); "
            "kept for its next run"
        )


def descriptor(value: Any) -> Mapping[str, Any] | None:
    """The ``stream_descriptor`` of a STREAM state or a STREAM_STATUS trace."""
    if isinstance(value, Mapping) and isinstance(value.get("stream_descriptor"), Mapping):
        return value["stream_descriptor"]  # type: ignore[no-any-return]
    return None


def failed(proc: ChildProcess, message: str, hint: str) -> SourceError:
    """A ``SourceError`` of a spec, check or discover run, with the connector's log tail."""
    return SourceError(with_log(proc, message, "connector"), hint=hint)


def exit_error(proc: ChildProcess, command: str, code: int) -> SourceError:
    """The error of a connector whose ``command`` (spec, check, discover) exited ``code``."""
    how = f"was killed by signal {-code}" if code < 0 else f"exited with status {code}"
    return failed(
        proc,
        f"the connector's {command} {how}",
        f"run the connector's `{command} --config <file>` yourself to see why",
    )
