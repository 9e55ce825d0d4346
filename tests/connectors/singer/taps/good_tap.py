"""A well-behaved Singer tap for the tests: two streams, incremental state.

Reads its rows from ``data_file`` (named in its ``--config``): a JSON object
``{"users": [...], "events": [...]}``. ``users`` is incremental by
``updated_at`` (the bookmark is ``bookmarks.users.replication_key_value``;
records at or after it are sent again, as Singer SDK taps do); ``events`` is
full table only. A STATE follows every ``state_every`` users and the end;
with ``fail_after: N`` in the data file the tap exits 1 after N users.
The tap refuses to run unless ``api_token`` equals ``expected_token`` of the
data file, and records what it saw (config path and mode, argv, state) in
``probe_file`` when the config names one.
"""

from __future__ import annotations

import argparse
import json
import os
import stat
import sys
from decimal import Decimal
from typing import Any

USERS_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "id": {"type": "integer"},
        "name": {"type": ["null", "string"]},
        "updated_at": {"type": "string", "format": "date-time"},
        "balance": {"type": ["null", "number"], "multipleOf": 0.01},
        "score": {"type": ["null", "number"]},
        "active": {"type": ["null", "boolean"]},
        "born": {"anyOf": [{"type": "string", "format": "date"}, {"type": "null"}]},
        "tags": {"type": ["null", "array"], "items": {"type": "string"}},
        "profile": {"type": ["null", "object"], "properties": {}},
    },
}
EVENTS_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "id": {"type": "integer"},
        "kind": {"type": "string"},
        "legacy": {"type": ["null", "string"]},
    },
}


def catalog() -> dict[str, Any]:
    def meta(schema: dict[str, Any], keys: list[str], rep: str | None) -> list[object]:
        root: dict[str, Any] = {"inclusion": "available", "table-key-properties": keys}
        if rep:
            root["valid-replication-keys"] = [rep]
        items: list[object] = [{"breadcrumb": [], "metadata": root}]
        for name in schema["properties"]:
            inclusion = "automatic" if name in keys or name == rep else "available"
            if name == "legacy":
                inclusion = "unsupported"
            items.append({"breadcrumb": ["properties", name], "metadata": {"inclusion": inclusion}})
        return items

    return {
        "streams": [
            {
                "tap_stream_id": "users",
                "stream": "users",
                "schema": USERS_SCHEMA,
                "key_properties": ["id"],
                "replication_key": "updated_at",
                "metadata": meta(USERS_SCHEMA, ["id"], "updated_at"),
            },
            {
                "tap_stream_id": "events",
                "stream": "events",
                "schema": EVENTS_SCHEMA,
                "key_properties": ["id"],
                "metadata": meta(EVENTS_SCHEMA, ["id"], None),
            },
        ]
    }


def encode(value: object) -> str:
    """JSON text keeping a Decimal's exact digits (``json.dumps`` cannot)."""
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, dict):
        return "{" + ",".join(f"{json.dumps(k)}:{encode(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ",".join(encode(v) for v in value) + "]"
    return json.dumps(value)


def emit(message: dict[str, Any]) -> None:
    sys.stdout.write(encode(message) + "\n")


def selected(cat: dict[str, Any]) -> dict[str, dict[str, Any]]:
    out = {}
    for entry in cat["streams"]:
        root: dict[str, Any] = next(
            (m["metadata"] for m in entry["metadata"] if m["breadcrumb"] == []), {}
        )
        if root.get("selected") or entry.get("selected"):
            out[entry["tap_stream_id"]] = root
    return out


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", required=True)
    parser.add_argument("--discover", action="store_true")
    parser.add_argument("--catalog")
    parser.add_argument("--state")
    args = parser.parse_args()
    with open(args.config) as f:
        config = json.load(f)
    with open(config["data_file"]) as f:
        data = json.load(f, parse_float=Decimal)
    if config.get("api_token") != data.get("expected_token"):
        print(f"authentication failed for token {config.get('api_token')}", file=sys.stderr)
        return 2
    state = None
    if args.state:
        with open(args.state) as f:
            state = json.load(f)
    if config.get("probe_file"):
        mode = stat.S_IMODE(os.stat(args.config).st_mode)
        dir_mode = stat.S_IMODE(os.stat(os.path.dirname(args.config)).st_mode)
        with open(config["probe_file"], "a") as f:
            probe = {
                "config": args.config,
                "mode": mode,
                "dir_mode": dir_mode,
                "argv": sys.argv[1:],
                "state": state,
                "catalog": json.load(open(args.catalog)) if args.catalog else None,
                "env": sorted(os.environ),
                "tap_region": os.environ.get("TAP_REGION"),
            }
            f.write(json.dumps(probe) + "\n")
    print("tap starting", file=sys.stderr)
    if args.discover:
        json.dump(catalog(), sys.stdout, indent=2)
        return 0
    with open(args.catalog) as f:
        streams = selected(json.load(f))
    every = int(config.get("state_every", 1000))
    if "users" in streams:
        schema_msg = {
            "type": "SCHEMA",
            "stream": "users",
            "schema": USERS_SCHEMA,
            "key_properties": ["id"],
            "bookmark_properties": ["updated_at"],
        }
        emit(schema_msg)
        incremental = streams["users"].get("replication-method") == "INCREMENTAL"
        start = None
        if incremental and state:
            start = state.get("bookmarks", {}).get("users", {}).get("replication_key_value")
        rows = sorted(data.get("users", []), key=lambda r: r["updated_at"])
        mark = start
        for n, row in enumerate(rows, 1):
            if start is not None and row["updated_at"] < start:
                continue
            if data.get("fail_after") is not None and n > data["fail_after"]:
                print("the provider went away mid-stream", file=sys.stderr)
                return 1
            emit({"type": "RECORD", "stream": "users", "record": row})
            mark = row["updated_at"]
            if incremental and n % every == 0:
                emit(
                    {
                        "type": "STATE",
                        "value": {"bookmarks": {"users": {"replication_key_value": mark}}},
                    }
                )
        if incremental:
            value = {"bookmarks": {"users": {"replication_key": "updated_at"}}}
            if mark is not None:
                value["bookmarks"]["users"]["replication_key_value"] = mark
            emit({"type": "STATE", "value": value})
    if "events" in streams:
        emit(
            {
                "type": "SCHEMA",
                "stream": "events",
                "schema": EVENTS_SCHEMA,
                "key_properties": ["id"],
            }
        )
        emit({"type": "ACTIVATE_VERSION", "stream": "events", "version": 1})
        for row in data.get("events", []):
            emit({"type": "RECORD", "stream": "events", "record": row, "version": 1})
        emit({"type": "ACTIVATE_VERSION", "stream": "events", "version": 1})
    print("tap done", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
