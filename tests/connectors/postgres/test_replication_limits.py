"""A server whose replication limits are reached: the error says which and what lifts it.

A private PostgreSQL cluster (initdb'd for the test, on its own port, one
replication slot and one WAL sender) so that its limits can be reached
without taking a slot any other test needs.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from combined.connectors.postgres._connect import Settings
from combined.connectors.postgres._replication import create_slot
from combined.errors import SourceError, SourceUnavailable


def _bin() -> Path | None:
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"), key=lambda p: int(p.parts[-3]))
    return found[-1].parent if found else None


def _run_as_postgres(*argv: str) -> None:
    """Run a server program (they refuse root) as the postgres user when we are root."""
    prefix = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
    subprocess.run([*prefix, *argv], check=True, capture_output=True, timeout=60)


@pytest.fixture
def limited_server() -> Iterator[str]:
    """A DSN of a new cluster allowing one replication slot, whose one slot is taken."""
    bindir = _bin()
    if bindir is None or (os.geteuid() == 0 and shutil.which("runuser") is None):
        pytest.skip("PostgreSQL's server programs (initdb, pg_ctl) are not installed here")
    # (Not under pytest's own temporary directory: the postgres user may not
    # enter root's.)
    root = Path(tempfile.mkdtemp(prefix="combined-pglimits-"))
    if os.geteuid() == 0:
        shutil.chown(root, "postgres")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    data = root / "data"
    _run_as_postgres(str(bindir / "initdb"), "-D", str(data), "-A", "trust", "-U", "postgres")
    options = (
        f"-p {port} -c listen_addresses=127.0.0.1 -k {root} -c wal_level=logical "
        "-c max_replication_slots=1 -c max_wal_senders=1"
    )
    ctl = str(bindir / "pg_ctl")
    _run_as_postgres(ctl, "-D", str(data), "-o", options, "-l", str(root / "log"), "-w", "start")
    dsn = f"postgresql://postgres@127.0.0.1:{port}/postgres"
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("SELECT pg_create_logical_replication_slot('taken', 'pgoutput')")
        yield dsn
    finally:
        _run_as_postgres(ctl, "-D", str(data), "-m", "immediate", "stop")
        shutil.rmtree(root, ignore_errors=True)


def test_a_slot_past_max_replication_slots_names_the_limit_and_is_not_retried(
    limited_server: str,
) -> None:
    # It was a transient SourceUnavailable: "check that the server is
    # reachable; the run is retried as another attempt", which it was.
    with pytest.raises(SourceError) as caught:
        create_slot(Settings(limited_server), "combined_limits_test")
    error = caught.value
    assert not isinstance(error, SourceUnavailable) and not error.transient
    assert "all replication slots are in use" in error.message
    assert error.hint is not None
    assert "pg_drop_replication_slot('NAME')" in error.hint
    assert "ALTER SYSTEM SET max_replication_slots = N" in error.hint
