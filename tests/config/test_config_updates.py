"""Where a connector's configuration updates are kept (``config._updates``), on real files."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from combined.config._secrets import resolve_secrets
from combined.config._updates import ConfigUpdates


def _declared(reference: str) -> dict[str, Any]:
    return {
        "command": "source-x",
        "config": {"region": "eu", "refresh_token": {"secret": reference}},
    }


def _cycle(root: Path, declared: dict[str, Any], new_token: str) -> dict[str, Any]:
    """One run: resolve and apply, the connector rotates the token; the next run's config."""
    told: list[tuple[list[str], list[str]]] = []
    updates = ConfigUpdates(
        root, "src", declared, lambda keys, where: told.append((list(keys), list(where)))
    )
    given = updates.apply(resolve_secrets(declared, root))
    after = {**given, "config": {**given["config"], "refresh_token": new_token}}
    assert updates.update(given, after) == ["config.refresh_token"]
    assert told and told[-1][0] == ["config.refresh_token"]
    return ConfigUpdates(root, "src", declared).apply(resolve_secrets(declared, root))


def test_a_linked_secret_file_is_rewritten_at_its_target(tmp_path: Path) -> None:
    vault = tmp_path / "vault"
    vault.mkdir()
    (vault / "token").write_text("old-token-1234\n")
    (tmp_path / "token").symlink_to(vault / "token")
    after = _cycle(tmp_path, _declared("file:token"), "new-token-5678")
    assert after["config"]["refresh_token"] == "new-token-5678"
    assert (tmp_path / "token").is_symlink()
    assert (vault / "token").read_text() == "new-token-5678\n"
    assert stat.S_IMODE((vault / "token").stat().st_mode) == 0o600
    assert not (tmp_path / ".combined").exists()  # nothing else holds it


@contextlib.contextmanager
def _read_only(directory: Path) -> Iterator[None]:
    """``directory`` unwritable, even by root (immutable, where chattr works)."""
    if os.geteuid() != 0:
        directory.chmod(0o500)
        try:
            yield
        finally:
            directory.chmod(0o700)
        return
    chattr = shutil.which("chattr")
    if chattr is None or subprocess.run([chattr, "+i", str(directory)]).returncode != 0:
        pytest.skip("root writes into any directory chattr +i cannot protect here")
    try:
        yield
    finally:
        subprocess.run([chattr, "-i", str(directory)], check=True)


def test_a_secret_file_on_a_read_only_mount_falls_back_to_the_update_file(tmp_path: Path) -> None:
    mount = tmp_path / "mount"
    mount.mkdir()
    (mount / "token").write_text("old-token-1234")
    with _read_only(mount):
        after = _cycle(tmp_path, _declared("file:mount/token"), "new-token-5678")
    assert after["config"]["refresh_token"] == "new-token-5678"
    assert (mount / "token").read_text() == "old-token-1234"
    kept = tmp_path / ".combined" / "config-updates" / "src.json"
    assert stat.S_IMODE(kept.stat().st_mode) == 0o600
    entries = json.loads(kept.read_text())["updates"]
    assert [(e["path"], e["value"]) for e in entries] == [
        (["config", "refresh_token"], "new-token-5678")
    ]


def test_a_key_the_connector_removed_stays_removed(tmp_path: Path) -> None:
    declared = {"config": {"region": "eu", "legacy_token": "gone-soon"}}
    updates = ConfigUpdates(tmp_path, "src", declared)
    given = updates.apply(declared)
    assert updates.update(given, {"config": {"region": "eu"}}) == ["config.legacy_token"]
    assert ConfigUpdates(tmp_path, "src", declared).apply(declared) == {"config": {"region": "eu"}}
