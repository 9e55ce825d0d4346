"""A well-behaved Airbyte source for the tests: two streams, per-stream state.

Reads its rows from ``data_file`` (named in its ``--config``): a JSON object
``{"users": [...], "events": [...]}``. ``users`` supports ``incremental`` by
the source-defined cursor ``updated_at`` (per-stream state
``{"updated_at": <latest>}``; records at or after it are sent again);
``events`` is ``full_refresh`` only. A STATE follows every ``state_every``
users and the end; with ``fail_after: N`` in the data file the source exits
1 after N users. It refuses to run unless ``api_token`` equals
``expected_token`` of the data file (check: CONNECTION_STATUS FAILED), and
records what it saw (argv, config file mode, catalog, state) in
``probe_file`` when the config names one.
"""

from __future__ import annotations

import json
import os
import stat
import sys
import time
from decimal import Decimal
from typing import Any

USERS_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "id": {"type": "integer"},
        "name": {"type": ["null", "string"]},
        "updated_at": {"type": "string", "format": "date-time"},
        "balance": {"type": ["null", "number"], "multipleOf": 0.01},
        "seen": {
            "type": ["null", "string"],
            "format": "date-time",
            "airbyte_type": "timestamp_without_timezone",
        },
        "visits": {"type": ["null", "number"], "airbyte_type": "integer"},
        "tags": {"type": ["null", "array"], "items": {"type": "string"}},
    },
}
EVENTS_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "id": {"$ref": "WellKnownTypes.json#/definitions/Integer"},
        "kind": {"type": "string"},
    },
}
CATALOG = {
    "streams": [
        {
            "name": "users",
            "json_schema": USERS_SCHEMA,
            "supported_sync_modes": ["full_refresh", "incremental"],
            "source_defined_cursor": True,
            "default_cursor_field": ["updated_at"],
            "source_defined_primary_key": [["id"]],
        },
        {
            "name": "events",
            "json_schema": EVENTS_SCHEMA,
            "supported_sync_modes": ["full_refresh"],
            "source_defined_primary_key": [["id"]],
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


def log(text: str) -> None:
    emit({"type": "LOG", "log": {"level": "INFO", "message": text}})


def option(name: str) -> str | None:
    return sys.argv[sys.argv.index(name) + 1] if name in sys.argv else None


def record(stream: str, data: dict[str, Any]) -> None:
    emitted = int(time.time() * 1000)
    emit({"type": "RECORD", "record": {"stream": stream, "data": data, "emitted_at": emitted}})


def state(stream: str, value: dict[str, Any]) -> None:
    descriptor = {"name": stream}
    body = {"stream_descriptor": descriptor, "stream_state": value}
    emit({"type": "STATE", "state": {"type": "STREAM", "stream": body}})


def status(stream: str, value: str) -> None:
    trace = {"stream_descriptor": {"name": stream}, "status": value}
    emit({"type": "TRACE", "trace": {"type": "STREAM_STATUS", "stream_status": trace}})


def main() -> int:
    command = sys.argv[1]
    if command == "spec":
        emit({"type": "SPEC", "spec": {"connectionSpecification": {"type": "object"}}})
        return 0
    config_path = option("--config")
    assert config_path is not None
    with open(config_path) as f:
        config = json.load(f)
    with open(config["data_file"]) as f:
        data = json.load(f, parse_float=Decimal)
    if config.get("probe_file"):
        catalog_path, state_path = option("--catalog"), option("--state")
        probe = {
            "argv": sys.argv[1:],
            "mode": stat.S_IMODE(os.stat(config_path).st_mode),
            "dir_mode": stat.S_IMODE(os.stat(os.path.dirname(config_path)).st_mode),
            "catalog": json.load(open(catalog_path)) if catalog_path else None,
            "state": json.load(open(state_path)) if state_path else None,
        }
        with open(config["probe_file"], "a") as f:
            f.write(json.dumps(probe) + "\n")
    log("source starting")
    authorised = config.get("api_token") == data.get("expected_token")
    if command == "check":
        result = {"status": "SUCCEEDED"}
        if not authorised:
            result = {"status": "FAILED", "message": f"bad token {config.get('api_token')}"}
        emit({"type": "CONNECTION_STATUS", "connectionStatus": result})
        return 0
    if not authorised:
        print(f"authentication failed for token {config.get('api_token')}", file=sys.stderr)
        return 2
    if command == "discover":
        emit({"type": "CATALOG", "catalog": CATALOG})
        return 0
    assert command == "read"
    with open(option("--catalog") or "") as f:
        configured = {s["stream"]["name"]: s for s in json.load(f)["streams"]}
    saved: dict[str, Any] = {}
    if option("--state"):
        with open(option("--state") or "") as f:
            for message in json.load(f):
                saved[message["stream"]["stream_descriptor"]["name"]] = message["stream"][
                    "stream_state"
                ]
    every = int(config.get("state_every", 1000))
    if "users" in configured:
        status("users", "STARTED")
        incremental = configured["users"]["sync_mode"] == "incremental"
        start = saved.get("users", {}).get("updated_at") if incremental else None
        rows = sorted(data.get("users", []), key=lambda r: r["updated_at"])
        mark = start
        for n, row in enumerate(rows, 1):
            if start is not None and row["updated_at"] < start:
                continue
            if data.get("fail_after") is not None and n > data["fail_after"]:
                print("the provider went away mid-stream", file=sys.stderr)
                return 1
            record("users", row)
            mark = row["updated_at"]
            if incremental and n % every == 0:
                state("users", {"updated_at": mark})
        if incremental:
            state("users", {"updated_at": mark} if mark else {})
        status("users", "COMPLETE")
    if "events" in configured:
        status("events", "STARTED")
        for row in data.get("events", []):
            record("events", row)
        status("events", "COMPLETE")
    log("source done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
