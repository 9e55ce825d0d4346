"""A Singer tap or an Airbyte source that writes lines written before it ran (bench/taps.py).

``python tap_program.py singer --config C (--discover | --catalog K [--state S])``
``python tap_program.py airbyte (spec | check | discover | read) --config C [--catalog K]``

Its configuration names ``lines`` (the file of the messages a read writes,
whole: Singer SCHEMA/RECORD/STATE lines, or Airbyte RECORD/STATE/TRACE lines)
and ``schema`` (the stream ``orders``'s JSON Schema, for discovery). A read
copies ``lines`` to standard output as they are, so the program itself costs
next to nothing: what a capture spends is the connector's. It imports
nothing of Combined (it runs as a program of its own).
"""

from __future__ import annotations

import json
import shutil
import sys
from typing import Any

STREAM = "orders"


def _config(args: list[str]) -> dict[str, Any]:
    with open(args[args.index("--config") + 1]) as f:
        config: dict[str, Any] = json.load(f)
    return config


def _emit(message: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(message) + "\n")


def _copy(path: str) -> None:
    with open(path, "rb") as lines:
        shutil.copyfileobj(lines, sys.stdout.buffer, 1 << 20)
    sys.stdout.buffer.flush()


def singer(args: list[str]) -> int:
    """``--discover``: the catalog; else the read's lines."""
    config = _config(args)
    if "--discover" not in args:
        _copy(config["lines"])
        return 0
    schema = config["schema"]
    metadata: list[dict[str, Any]] = [
        {"breadcrumb": [], "metadata": {"inclusion": "available", "table-key-properties": ["id"]}}
    ]
    metadata += [
        {"breadcrumb": ["properties", name], "metadata": {"inclusion": "available"}}
        for name in schema["properties"]
    ]
    stream = {
        "tap_stream_id": STREAM,
        "stream": STREAM,
        "schema": schema,
        "key_properties": ["id"],
        "metadata": metadata,
    }
    _emit({"streams": [stream]})
    return 0


def airbyte(args: list[str]) -> int:
    """``spec``, ``check``, ``discover`` and ``read``, as a minimal Airbyte source answers them."""
    command = args[0]
    if command == "spec":
        _emit({"type": "SPEC", "spec": {"connectionSpecification": {"type": "object"}}})
        return 0
    config = _config(args)
    if command == "check":
        _emit({"type": "CONNECTION_STATUS", "connectionStatus": {"status": "SUCCEEDED"}})
    elif command == "discover":
        stream = {
            "name": STREAM,
            "json_schema": config["schema"],
            "supported_sync_modes": ["full_refresh"],
            "source_defined_primary_key": [["id"]],
        }
        _emit({"type": "CATALOG", "catalog": {"streams": [stream]}})
    elif command == "read":
        _copy(config["lines"])
    else:
        print(f"unknown command {command!r}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    flavour, *rest = sys.argv[1:]
    sys.exit(singer(rest) if flavour == "singer" else airbyte(rest))
