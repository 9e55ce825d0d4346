"""An Airbyte source whose provider rotates its OAuth refresh token on every use.

Its ``--config`` holds ``credentials.refresh_token`` and ``provider``: a JSON
file standing for the provider, ``{"valid": <the one refresh token it
accepts>, "fail_after_rotation": bool}``. Each command (``check``,
``discover``, ``read``) first exchanges the refresh token: a token other
than ``valid`` is refused (a TRACE ``config_error`` naming the revoked token
on standard error, exit 1); else the provider issues a new one, revokes the
old at once, and the source sends its whole updated configuration as a
``CONTROL`` ``CONNECTOR_CONFIG`` (and prints the new token to standard
error, as a careless connector would). Then ``discover`` prints the catalog
of its one stream ``items``, ``read`` its records, ``check`` a status. With
``fail_after_rotation`` set it exits 1 right after the update.
"""

from __future__ import annotations

import json
import secrets
import sys
import time
from typing import Any

STREAM: dict[str, Any] = {
    "name": "items",
    "json_schema": {"type": "object", "properties": {"id": {"type": "integer"}}},
    "supported_sync_modes": ["full_refresh"],
    "source_defined_primary_key": [["id"]],
}


def emit(message: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def rotate(config: dict[str, Any]) -> dict[str, Any] | None:
    """The provider's side: exchange the refresh token; None when it is refused."""
    with open(config["provider"]) as f:
        provider: dict[str, Any] = json.load(f)
    token = config["credentials"]["refresh_token"]
    if token != provider["valid"]:
        sys.stderr.write(f"refresh token {token} was revoked\n")
        emit(
            {
                "type": "TRACE",
                "trace": {
                    "type": "ERROR",
                    "emitted_at": time.time() * 1000,
                    "error": {
                        "message": "the refresh token was revoked",
                        "failure_type": "config_error",
                    },
                },
            }
        )
        return None
    provider["valid"] = "rt-" + secrets.token_hex(16)
    with open(config["provider"], "w") as f:
        json.dump(provider, f)
    config["credentials"] = {**config["credentials"], "refresh_token": provider["valid"]}
    config["credentials"]["access_token"] = "at-" + secrets.token_hex(16)
    sys.stderr.write(f"rotated: new refresh token {provider['valid']}\n")
    control = {"type": "CONNECTOR_CONFIG", "emitted_at": time.time() * 1000}
    emit({"type": "CONTROL", "control": {**control, "connectorConfig": {"config": config}}})
    return provider


def main() -> int:
    command = sys.argv[1]
    with open(sys.argv[sys.argv.index("--config") + 1]) as f:
        config = json.load(f)
    provider = rotate(config)
    if provider is None:
        return 1
    if provider.get("fail_after_rotation"):
        sys.stderr.write("the provider went away after the token exchange\n")
        return 1
    if command == "check":
        emit({"type": "CONNECTION_STATUS", "connectionStatus": {"status": "SUCCEEDED"}})
    elif command == "discover":
        emit({"type": "CATALOG", "catalog": {"streams": [STREAM]}})
    elif command == "read":
        for i in (1, 2, 3):
            record = {"stream": "items", "data": {"id": i}, "emitted_at": 0}
            emit({"type": "RECORD", "record": record})
    return 0


if __name__ == "__main__":
    sys.exit(main())
