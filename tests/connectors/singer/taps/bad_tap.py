"""A misbehaving Singer tap for the tests; its ``--config`` ``mode`` says how.

Discovery always prints a one-stream catalog (``items``: ``id`` integer,
``label`` string), except in the ``discover_*`` modes. Modes:

- ``exit``: a SCHEMA, a RECORD, a log line, then exit status 3
- ``malformed``: a SCHEMA, a RECORD, then a line that is not JSON
- ``record_first``: a RECORD before any SCHEMA
- ``huge_stderr``: 20 MiB of log on standard error, then a good stream
- ``hang``: a SCHEMA, then a child process and itself sleep forever
  (their pids go to ``pid_file``)
- ``type_mismatch``: a record whose ``id`` is ``"abc"`` on line 4
- ``extra_field``: a record holding a property the schema does not declare
- ``leak``: logs its ``api_token`` (as it is, in a basic pair) and a derived token, exits 1
- ``batch``: a BATCH message
- ``schema_change``: a SCHEMA, a record, a SCHEMA with a new field, a record
- ``discover_fail``: discovery exits 2 after logging
- ``discover_garbage``: discovery prints text that is not a catalog
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import subprocess
import sys
import time
from typing import Any

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"id": {"type": "integer"}, "label": {"type": ["null", "string"]}},
}


def emit(message: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", required=True)
    parser.add_argument("--discover", action="store_true")
    parser.add_argument("--catalog")
    parser.add_argument("--state")
    args = parser.parse_args()
    with open(args.config) as f:
        config = json.load(f)
    mode = config.get("mode", "")
    if args.discover:
        if mode == "discover_fail":
            print("cannot reach the provider: connection refused", file=sys.stderr)
            return 2
        if mode == "discover_garbage":
            print("Usage: tap [options]")
            return 0
        entry = {"tap_stream_id": "items", "schema": SCHEMA, "key_properties": ["id"]}
        json.dump({"streams": [entry]}, sys.stdout)
        return 0
    schema = {"type": "SCHEMA", "stream": "items", "schema": SCHEMA, "key_properties": ["id"]}
    if mode == "record_first":
        emit({"type": "RECORD", "stream": "items", "record": {"id": 1}})
        emit(schema)
        return 0
    if mode == "huge_stderr":
        line = "x" * 1023 + "\n"
        for _ in range(20 * 1024):
            sys.stderr.write(line)
        sys.stderr.write("the last log line\n")
        sys.stderr.flush()
    emit(schema)
    if mode == "hang":
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        with open(config["pid_file"], "w") as f:
            f.write(f"{os.getpid()} {child.pid}\n")
        time.sleep(600)
        return 0
    emit({"type": "RECORD", "stream": "items", "record": {"id": 1, "label": "one"}})
    if mode == "exit":
        print("fatal: the provider said 500", file=sys.stderr)
        return 3
    if mode == "malformed":
        sys.stdout.write('{"type": "RECORD", "stream": "items", "record": {"id": 2}\n')
        return 0
    if mode == "type_mismatch":
        emit({"type": "RECORD", "stream": "items", "record": {"id": 2, "label": "two"}})
        emit({"type": "RECORD", "stream": "items", "record": {"id": "abc", "label": "x"}})
        return 0
    if mode == "extra_field":
        emit({"type": "RECORD", "stream": "items", "record": {"id": 2, "colour": "red"}})
        return 0
    if mode == "leak":
        token = config["api_token"]
        print(f"request failed: Authorization: Bearer {token}", file=sys.stderr)
        print(f"token={token}", file=sys.stderr)
        # an access token it was given for the api_token (Combined never saw it), as
        # a library's debug log prints the request; the api_token in a basic pair
        print(
            "send: b'GET /items HTTP/1.1\\r\\nAuthorization: Bearer at-5150-derived-access'",
            file=sys.stderr,
        )
        basic = base64.b64encode(f"tap-user:{token}".encode()).decode()
        print(f"Authorization: Basic {basic}", file=sys.stderr)
        print(f"retrying with {basic}", file=sys.stderr)
        return 1
    if mode == "batch":
        emit({"type": "BATCH", "stream": "items", "encoding": {"format": "jsonl"}, "manifest": []})
        return 0
    if mode == "schema_change":
        wider = {
            "type": "object",
            "properties": {**SCHEMA["properties"], "size": {"type": "integer"}},
        }
        emit({"type": "SCHEMA", "stream": "items", "schema": wider, "key_properties": ["id"]})
        emit({"type": "RECORD", "stream": "items", "record": {"id": 2, "label": "b", "size": 7}})
        return 0
    for i in range(2, 6):
        emit({"type": "RECORD", "stream": "items", "record": {"id": i, "label": str(i)}})
    return 0


if __name__ == "__main__":
    sys.exit(main())
