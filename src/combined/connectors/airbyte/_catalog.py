"""An Airbyte source's catalog: its streams, and the configured catalog of one read."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from combined.connectors._subprocess._schema import BadSchema, FieldPlan, plan_stream
from combined.connectors._subprocess._typing import Typing
from combined.connectors.abc import CursorCandidate, DatasetDiscovery, FieldInfo, Strategy
from combined.errors import ConfigError, NotFoundError, SourceError, UnsupportedType

_NO_DELETES = "incremental by the connector's state, deletes not seen"


@dataclass(frozen=True, slots=True)
class Stream:
    """One stream of an Airbyte catalog (an ``AirbyteStream``)."""

    name: str
    namespace: str | None
    json_schema: Mapping[str, Any]
    sync_modes: tuple[str, ...]
    source_defined_cursor: bool
    default_cursor: tuple[str, ...]
    primary_key: tuple[tuple[str, ...], ...]
    entry: Mapping[str, Any]

    @property
    def qualified(self) -> str:
        """``namespace.name``, or the name when the stream has no namespace."""
        return f"{self.namespace}.{self.name}" if self.namespace else self.name

    def key(self) -> tuple[str, ...]:
        """The source-defined primary key as columns; empty when a part is nested."""
        if any(len(path) != 1 for path in self.primary_key):
            return ()
        return tuple(path[0] for path in self.primary_key)

    def cursor(self) -> str | None:
        """The default cursor field as a column name (nested paths joined by dots)."""
        return ".".join(self.default_cursor) if self.default_cursor else None

    def matches(self, descriptor: Any) -> bool:
        """Whether a message's ``stream``/``namespace`` (or a stream descriptor) names this."""
        if not isinstance(descriptor, Mapping):
            return False
        return descriptor.get("name", descriptor.get("stream")) == self.name and (
            descriptor.get("namespace") or None
        ) == (self.namespace or None)


def _bad(what: str) -> SourceError:
    return SourceError(
        f"the connector's discover output is not an Airbyte catalog: {what}",
        hint="run the connector's `discover --config C` yourself and check its CATALOG message",
    )


def _paths(value: Any, what: str, name: str) -> tuple[tuple[str, ...], ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(
        isinstance(p, list) and p and all(isinstance(x, str) for x in p) for p in value
    ):
        raise _bad(f"the {what} of stream {name!r} is not a list of field paths")
    return tuple(tuple(p) for p in value)


def parse_catalog(document: Any) -> list[Stream]:
    """The streams of a CATALOG message's ``catalog``; ``SourceError`` for anything else."""
    if not isinstance(document, Mapping) or not isinstance(document.get("streams"), list):
        raise _bad("no `streams` list")
    streams = []
    for index, entry in enumerate(document["streams"]):
        if not isinstance(entry, Mapping):
            raise _bad(f"stream {index} is not an object")
        name = entry.get("name")
        if not isinstance(name, str) or not name:
            raise _bad(f"stream {index} has no name")
        schema = entry.get("json_schema")
        if not isinstance(schema, Mapping):
            raise _bad(f"stream {name!r} has no json_schema")
        modes = entry.get("supported_sync_modes") or ["full_refresh"]
        cursor = entry.get("default_cursor_field") or []
        if not isinstance(cursor, list) or not all(isinstance(c, str) for c in cursor):
            raise _bad(f"the default_cursor_field of stream {name!r} is not a field path")
        namespace = entry.get("namespace")
        streams.append(
            Stream(
                name=name,
                namespace=namespace if isinstance(namespace, str) and namespace else None,
                json_schema=schema,
                sync_modes=tuple(str(m) for m in modes) if isinstance(modes, list) else (),
                source_defined_cursor=bool(entry.get("source_defined_cursor")),
                default_cursor=tuple(cursor),
                primary_key=_paths(entry.get("source_defined_primary_key"), "primary key", name),
                entry=entry,
            )
        )
    return streams


def find_stream(streams: Sequence[Stream], relation: str, dataset: str) -> Stream:
    """The stream declared as ``relation``: its name, or ``namespace.name``."""
    named = [s for s in streams if s.name == relation]
    if len(named) == 1:
        return named[0]
    qualified = [s for s in streams if s.qualified == relation]
    if len(qualified) == 1:
        return qualified[0]
    if len(named) > 1:
        raise ConfigError(
            f"the connector has {len(named)} streams named {relation!r} in different namespaces",
            hint="name one as `stream: <namespace>.<name>`: "
            + ", ".join(s.qualified for s in named),
            dataset=dataset,
        )
    raise NotFoundError(
        f"the connector has no stream {relation!r}",
        hint="the connector's streams: " + (", ".join(s.qualified for s in streams) or "none"),
        dataset=dataset,
    )


def field_plans(stream: Stream, typing: Typing) -> tuple[FieldPlan, ...]:
    """The stream's column plans, as ``typing`` types them; ``UnsupportedType`` names a
    property without one."""
    try:
        return typing.apply((stream.qualified, stream.name), plan_stream(stream.json_schema))
    except BadSchema as exc:
        raise UnsupportedType(
            f"stream {stream.qualified!r}: {exc}",
            hint="the connector's json_schema for that property has no faithful type",
            stream=stream.qualified,
        ) from None


def describe(stream: Stream, name: str, typing: Typing) -> DatasetDiscovery:
    """The discovery of one stream, reported as dataset ``name``."""
    plans = field_plans(stream, typing)
    strategies: list[Strategy] = []
    if "full_refresh" in stream.sync_modes:
        strategies.append("snapshot")
    candidates: tuple[CursorCandidate, ...] = ()
    kind = "airbyte stream"
    if "incremental" in stream.sync_modes:
        strategies.append("cursor")
        kind = f"airbyte stream; {_NO_DELETES}"
        cursor = stream.cursor()
        if cursor is not None:
            evidence = (
                "the connector's source-defined cursor: a cursor read passes the connector "
                "its own per-stream STATE and commits its next STATE with the records "
                "before it; deletes are not seen"
                if stream.source_defined_cursor
                else "the connector's default cursor field (another field of the stream may "
                "be declared instead); deletes are not seen"
            )
            candidates = (CursorCandidate(cursor, evidence),)
    key = stream.key()
    return DatasetDiscovery(
        name=name,
        relation=name,
        kind=kind,
        fields=tuple(FieldInfo(p.name, str(p.arrow), p.source_type, p.nullable) for p in plans),
        primary_key=key,
        unique_keys=(key,) if key else (),
        cursor_candidates=candidates,
        strategies=tuple(strategies),
    )


def configured_catalog(
    stream: Stream,
    strategy: Literal["snapshot", "cursor"],
    cursor: str | None,
    key: Sequence[str],
) -> dict[str, Any]:
    """A configured catalog selecting ``stream`` alone.

    A snapshot reads it ``full_refresh`` (``overwrite``); a cursor read
    ``incremental`` by ``cursor`` (``append_dedup`` by the key).
    """
    primary = [list(p) for p in stream.primary_key] or [[k] for k in key]
    entry: dict[str, Any] = {
        "stream": dict(stream.entry),
        "sync_mode": "full_refresh",
        "destination_sync_mode": "overwrite",
        "primary_key": primary,
    }
    if strategy == "cursor":
        entry["sync_mode"] = "incremental"
        entry["destination_sync_mode"] = "append_dedup" if primary else "append"
        entry["cursor_field"] = (
            list(stream.default_cursor) if stream.source_defined_cursor else [cursor]
        )
    return {"streams": [entry]}
