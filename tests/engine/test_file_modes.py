"""What Combined writes (lake, catalog, quarantine, staging) is its owner's alone."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any


def _cli(root: Path, *args: str, env: dict[str, str] | None = None) -> int:
    """The CLI under the common umask 022 (files world-readable unless Combined says not)."""
    done = subprocess.run(
        [sys.executable, "-c", "from combined.cli import main; main()", *args],
        cwd=root,
        env={**os.environ, "COMBINED_RETRY_BACKOFF_S": "0", **(env or {})},
        capture_output=True,
        text=True,
        timeout=300,
        umask=0o022,
    )
    return done.returncode


def _open_to_others(top: Path) -> list[str]:
    """Every file or directory under ``top`` (itself included) that others may read or enter."""
    found = []
    for path in [top, *top.rglob("*")]:
        mode = path.lstat().st_mode
        if stat.S_IMODE(mode) & 0o077:
            found.append(f"{oct(stat.S_IMODE(mode))} {path.relative_to(top.parent)}")
    return found


def test_lake_catalog_quarantine_and_staging_are_owner_only(shop: Path, tools: Any) -> None:
    """Under umask 022, a real capture leaves nothing that other users can read.

    Reproduction: `combined capture` run with the usual umask 022 created the
    lake's Parquet and Delta log files 0644 and its directories 0755, the
    SQLite catalog 0644, the quarantine file and the run's staging files
    (left by a capture killed after staging) 0644: any local user could read
    the captured rows. Now every one is 0600 (files) or 0700 (directories).
    """
    tools.sql(
        shop,
        "CREATE TABLE people (id INTEGER, name TEXT);"
        "INSERT INTO people VALUES (1, 'a'), (2, 'b'), (2, 'c');",
    )
    project = shop / "combined.yaml"
    project.write_text(project.read_text() + "      people:\n        key: [id]\n")
    # killed after staging: the run's staging files stay on disk as it left them
    assert _cli(shop, "capture", "shop.orders", env={"COMBINED_FAULT": "after_staging"}) == -9
    staged = [p for p in (shop / "lake" / "_staging").rglob("*") if p.is_file()]
    assert staged
    assert _open_to_others(shop / "lake") == []
    assert _cli(shop, "capture", "shop.orders", "shop.customers") == 0
    assert _cli(shop, "capture", "shop.people") == 3  # its duplicate key awaits review
    lake, catalog = shop / "lake", shop / ".combined"
    assert [p for p in (lake / "shop" / "orders").rglob("*.parquet")]
    assert [p for p in (lake / "shop" / "orders" / "_delta_log").iterdir()]
    assert [p for p in (lake / "_quarantine").rglob("*") if p.is_file()]
    assert (catalog / "catalog.db").is_file()
    assert _open_to_others(lake) == []
    assert _open_to_others(catalog) == []
