"""A Run stopped by a full disk says which file system and what to do (a real tmpfs)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from combined.engine import Engine


def _in_small_tmpfs(mount: Path, root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``combined ARGS`` in ``root``, with a 1 MiB tmpfs mounted at ``mount`` for it alone
    (a user and mount namespace of its own: no privilege needed)."""
    if shutil.which("unshare") is None:
        pytest.skip("needs unshare(1) to mount a small tmpfs")
    probe = subprocess.run(
        ["unshare", "--user", "--map-root-user", "--mount", "true"], capture_output=True
    )
    if probe.returncode != 0:
        pytest.skip(f"user namespaces unavailable: {probe.stderr.decode().strip()}")
    script = 'mount -t tmpfs -o size=1m tmpfs "$1" && shift && exec "$@"'
    command = [sys.executable, "-c", "from combined.cli import main; main()", *args]
    return subprocess.run(
        ["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", script, "sh"]
        + [str(mount), *command],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_a_run_that_fills_the_disk_names_the_file_system_and_what_to_do(
    tmp_path: Path, tools: Any
) -> None:
    """Reproduction: a local lake on a full file system failed the Run with
    Arrow's bare words, `[Errno 28] Error writing bytes to file. Detail:
    [errno 28] No space left on device` (error type OSError), in the Run, its
    alert and the command's output: nothing said which file system, of which
    machine, nor what to do."""
    project = tools.make(tmp_path, orders=60_000)
    mount = tmp_path / "small"
    mount.mkdir()
    project.write_text(project.read_text().replace("lake: ./lake", f"lake: {mount}/lake"))
    assert f"lake: {mount}/lake" in project.read_text()
    done = _in_small_tmpfs(mount, tmp_path, "capture", "shop.orders")
    assert done.returncode == 1, done.stderr
    assert "has no space left: its staging under " + str(mount / "lake" / "_staging") in done.stderr
    assert "hint: free space there" in done.stderr
    engine = Engine.open(project)
    try:
        (run,) = engine.runs(1)
        events = engine.activity(kind="run.failed", run_id=run.id)
    finally:
        engine.close()
    assert run.state == "failed" and "has no space left" in (run.error or "")
    assert [e["body"]["error_type"] for e in events] == ["DiskFull"], events
