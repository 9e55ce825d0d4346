"""A Singer tap whose provider rotates its OAuth refresh token on every use.

Like the singer-io taps' ``write_config`` and the Singer SDK's settings
write-back, it writes the new token back into its ``--config`` file. Its
configuration holds ``refresh_token`` and ``provider``: a JSON file standing
for the provider, ``{"valid": <the one refresh token it accepts>}``. Each run
(``--discover`` or a read) first exchanges the token: another one is refused
(exit 1, the revoked token printed on standard error); else the provider
issues a new one and revokes the old at once. A read then writes the
stream ``items`` (``id`` 1 to 3). With ``fail_after_rotation`` in the
provider file it prints the new token on standard error and exits 1 instead;
with ``write_back_changes_only`` it writes back the new token alone.
"""

from __future__ import annotations

import argparse
import json
import secrets
import sys
from typing import Any

SCHEMA: dict[str, Any] = {"type": "object", "properties": {"id": {"type": "integer"}}}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", required=True)
    parser.add_argument("--discover", action="store_true")
    parser.add_argument("--catalog")
    parser.add_argument("--state")
    args = parser.parse_args()
    with open(args.config) as f:
        config = json.load(f)
    with open(config["provider"]) as f:
        provider = json.load(f)
    if config["refresh_token"] != provider["valid"]:
        sys.stderr.write(f"refresh token {config['refresh_token']} was revoked\n")
        return 1
    provider["valid"] = "rt-" + secrets.token_hex(16)
    with open(config["provider"], "w") as f:
        json.dump(provider, f)
    config["refresh_token"] = provider["valid"]
    written = (
        {"refresh_token": provider["valid"]} if provider.get("write_back_changes_only") else config
    )
    with open(args.config, "w") as f:  # the write-back
        json.dump(written, f, indent=2)
    if provider.get("fail_after_rotation"):
        sys.stderr.write(f"rotated to {provider['valid']}, then the provider went away\n")
        return 1
    out = sys.stdout
    if args.discover:
        entry = {"tap_stream_id": "items", "schema": SCHEMA, "key_properties": ["id"]}
        out.write(json.dumps({"streams": [entry]}) + "\n")
        return 0
    out.write(json.dumps({"type": "SCHEMA", "stream": "items", "schema": SCHEMA}) + "\n")
    for i in (1, 2, 3):
        out.write(json.dumps({"type": "RECORD", "stream": "items", "record": {"id": i}}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
