"""A tap's catalog: its streams, and the one-stream catalog a read hands back to it."""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from combined.connectors._subprocess._schema import BadSchema, FieldPlan, plan_stream
from combined.connectors._subprocess._typing import Typing
from combined.connectors.abc import CursorCandidate, DatasetDiscovery, FieldInfo, Strategy
from combined.errors import SourceError, UnsupportedType

_CURSOR_EVIDENCE = (
    "the tap's replication_key: a cursor read passes the tap its own bookmark (STATE) "
    "and commits the tap's next STATE with the records before it; deletes are not seen"
)


@dataclass(frozen=True, slots=True)
class Stream:
    """One stream of a tap's catalog."""

    tap_stream_id: str
    stream: str
    schema: Mapping[str, Any]
    key_properties: tuple[str, ...]
    replication_key: str | None
    entry: Mapping[str, Any]

    def names(self) -> tuple[str, str]:
        """The names that identify the stream in messages and declarations."""
        return (self.tap_stream_id, self.stream)

    def unsupported(self) -> frozenset[str]:
        """Properties whose metadata says ``inclusion: unsupported``."""
        return frozenset(
            name
            for name, meta in _field_metadata(self.entry)
            if meta.get("inclusion") == "unsupported"
        )


def _metadata(entry: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    items = entry.get("metadata")
    return [m for m in items if isinstance(m, Mapping)] if isinstance(items, list) else []


def _stream_metadata(entry: Mapping[str, Any]) -> Mapping[str, Any]:
    for item in _metadata(entry):
        if item.get("breadcrumb") == [] and isinstance(item.get("metadata"), Mapping):
            return item["metadata"]  # type: ignore[no-any-return]
    return {}


def _field_metadata(entry: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any]]]:
    out = []
    for item in _metadata(entry):
        crumb = item.get("breadcrumb")
        meta = item.get("metadata")
        if (
            isinstance(crumb, list)
            and len(crumb) == 2
            and crumb[0] == "properties"
            and isinstance(meta, Mapping)
        ):
            out.append((str(crumb[1]), meta))
    return out


def _bad(what: str, origin: str) -> SourceError:
    return SourceError(
        f"the tap's catalog ({origin}) is not a Singer catalog: {what}",
        hint="run the tap with --discover yourself and check its output; "
        'a Singer catalog is {"streams": [{"tap_stream_id", "schema", ...}]}',
    )


def parse_catalog(document: Any, origin: str) -> list[Stream]:
    """The streams of a catalog document; raises ``SourceError`` for anything else."""
    if not isinstance(document, Mapping) or not isinstance(document.get("streams"), list):
        raise _bad("no `streams` list", origin)
    streams = []
    for index, entry in enumerate(document["streams"]):
        if not isinstance(entry, Mapping):
            raise _bad(f"stream {index} is not an object", origin)
        ident = entry.get("tap_stream_id") or entry.get("stream")
        if not isinstance(ident, str) or not ident:
            raise _bad(f"stream {index} has neither tap_stream_id nor stream", origin)
        schema = entry.get("schema")
        if not isinstance(schema, Mapping):
            raise _bad(f"stream {ident!r} has no schema", origin)
        meta = _stream_metadata(entry)
        keys = entry.get("key_properties", meta.get("table-key-properties")) or []
        replication = entry.get("replication_key") or meta.get("replication-key")
        if not replication:
            valid = meta.get("valid-replication-keys")
            replication = valid[0] if isinstance(valid, list) and len(valid) == 1 else None
        streams.append(
            Stream(
                tap_stream_id=ident,
                stream=str(entry.get("stream") or ident),
                schema=schema,
                key_properties=tuple(str(k) for k in keys) if isinstance(keys, list) else (),
                replication_key=str(replication) if replication else None,
                entry=entry,
            )
        )
    return streams


def find_stream(streams: Sequence[Stream], name: str) -> Stream | None:
    """The stream declared as ``name`` (its tap_stream_id, else its stream name)."""
    for s in streams:
        if s.tap_stream_id == name:
            return s
    for s in streams:
        if s.stream == name:
            return s
    return None


def field_plans(stream: Stream, typing: Typing) -> tuple[FieldPlan, ...]:
    """The stream's column plans, as ``typing`` types them; ``UnsupportedType`` names a
    property without one."""
    try:
        plans = typing.apply(stream.names(), plan_stream(stream.schema))
    except BadSchema as exc:
        raise UnsupportedType(
            f"stream {stream.tap_stream_id!r}: {exc}",
            hint="fix the tap's schema for that property (or its catalog file)",
            stream=stream.tap_stream_id,
        ) from None
    dropped = stream.unsupported()
    return tuple(p for p in plans if p.name not in dropped)


def describe(stream: Stream, typing: Typing) -> DatasetDiscovery:
    """The discovery of one stream: fields, key_properties, replication_key, strategies."""
    plans = field_plans(stream, typing)
    strategies: tuple[Strategy, ...] = ("snapshot",)
    candidates: tuple[CursorCandidate, ...] = ()
    kind = "singer stream"
    if stream.replication_key:
        strategies = ("snapshot", "cursor")
        candidates = (CursorCandidate(stream.replication_key, _CURSOR_EVIDENCE),)
        kind = "singer stream; incremental by the tap's bookmark, deletes not seen"
    return DatasetDiscovery(
        name=stream.tap_stream_id,
        relation=stream.tap_stream_id,
        kind=kind,
        fields=tuple(FieldInfo(p.name, str(p.arrow), p.source_type, p.nullable) for p in plans),
        primary_key=stream.key_properties,
        unique_keys=(stream.key_properties,) if stream.key_properties else (),
        cursor_candidates=candidates,
        strategies=strategies,
    )


def selected_catalog(
    stream: Stream,
    strategy: Literal["snapshot", "cursor"],
    columns: Sequence[str] | None,
) -> dict[str, Any]:
    """A catalog with ``stream`` alone selected, for its fields (``columns``, or all).

    The stream's metadata asks for ``FULL_TABLE`` on a snapshot and
    ``INCREMENTAL`` by its replication key on a cursor read.
    """
    entry = copy.deepcopy(dict(stream.entry))
    wanted = None if columns is None else set(columns)
    metadata: list[dict[str, Any]] = []
    seen_root = False
    for original in _metadata(stream.entry):
        item = copy.deepcopy(dict(original))
        meta = dict(item.get("metadata") or {})
        crumb = item.get("breadcrumb")
        if crumb == []:
            seen_root = True
            meta.update(_root_selection(stream, strategy))
        elif isinstance(crumb, list) and len(crumb) == 2 and crumb[0] == "properties":
            if meta.get("inclusion") != "unsupported":
                meta["selected"] = wanted is None or str(crumb[1]) in wanted
        item["metadata"] = meta
        metadata.append(item)
    if not seen_root:
        metadata.insert(0, {"breadcrumb": [], "metadata": _root_selection(stream, strategy)})
    entry["metadata"] = metadata
    if strategy == "cursor" and stream.replication_key:
        entry["replication_key"] = stream.replication_key
        entry["replication_method"] = "INCREMENTAL"
    elif strategy == "snapshot":
        entry["replication_method"] = "FULL_TABLE"
    entry["selected"] = True
    return {"streams": [entry]}


def _root_selection(stream: Stream, strategy: str) -> dict[str, Any]:
    meta: dict[str, Any] = {"selected": True}
    if strategy == "cursor" and stream.replication_key:
        meta["replication-method"] = "INCREMENTAL"
        meta["replication-key"] = stream.replication_key
    elif strategy == "snapshot":
        meta["replication-method"] = "FULL_TABLE"
    return meta
