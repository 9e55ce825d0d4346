"""A private PostgreSQL cluster, initdb'd for one test on its own port.

For what the shared server must not be given: its replication limits
reached, or a setting other than the suite's (``wal_level``).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


def _bin() -> Path | None:
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"), key=lambda p: int(p.parts[-3]))
    return found[-1].parent if found else None


def _run_as_postgres(*argv: str) -> None:
    """Run a server program (they refuse root) as the postgres user when we are root."""
    prefix = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
    subprocess.run([*prefix, *argv], check=True, capture_output=True, timeout=60)


@contextmanager
def private_cluster(settings: str) -> Iterator[str]:
    """A new cluster started with ``settings`` (``-c name=value ...``); yields the DSN of
    its ``postgres`` database, then stops it and removes its files."""
    bindir = _bin()
    if bindir is None or (os.geteuid() == 0 and shutil.which("runuser") is None):
        pytest.skip("PostgreSQL's server programs (initdb, pg_ctl) are not installed here")
    # (Not under pytest's own temporary directory: the postgres user may not
    # enter root's.)
    root = Path(tempfile.mkdtemp(prefix="combined-pgcluster-"))
    if os.geteuid() == 0:
        shutil.chown(root, "postgres")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    data = root / "data"
    _run_as_postgres(str(bindir / "initdb"), "-D", str(data), "-A", "trust", "-U", "postgres")
    options = f"-p {port} -c listen_addresses=127.0.0.1 -k {root} {settings}"
    ctl = str(bindir / "pg_ctl")
    _run_as_postgres(ctl, "-D", str(data), "-o", options, "-l", str(root / "log"), "-w", "start")
    try:
        yield f"postgresql://postgres@127.0.0.1:{port}/postgres"
    finally:
        _run_as_postgres(ctl, "-D", str(data), "-m", "immediate", "stop")
        shutil.rmtree(root, ignore_errors=True)
