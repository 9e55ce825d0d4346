"""An Attempt's deadline ends a PostgreSQL statement that does not return, on the server."""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest
from tests.engine.test_attempt_deadline import stopped_at_each_deadline

PROJECT = """\
version: 1
lake: ./lake
sources:
  pg:
    connector: postgres
    config: {{dsn: "{dsn}"}}
    datasets:
      stuck: {{key: [id]}}
"""

#: What the server's statement sleeps: far past the deadline.
SLEEP_S = 20


def test_a_statement_that_does_not_return_is_canceled_at_the_attempt_deadline(
    tmp_path: Path, pg_database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Reproduction: a view whose rows wait on the server (a lock, a slow
    function: here ``pg_sleep``) held each Attempt until its statement
    returned, past ``COMBINED_ATTEMPT_TIMEOUT_S=2``: the deadline's abort
    waited for the read's lock, which the blocked fetch held, so the Run took
    three times the statement's duration (a statement that never returns held
    the worker for good). The deadline now asks the server to cancel the
    statement in progress, and each Attempt ends within moments of it."""
    with psycopg.connect(pg_database, autocommit=True) as conn:
        conn.execute("CREATE TABLE items (id int PRIMARY KEY)")
        conn.execute("INSERT INTO items SELECT generate_series(1, 10)")
        conn.execute(
            f"CREATE VIEW stuck AS SELECT i.id FROM items i, (SELECT pg_sleep({SLEEP_S})) s"
        )
    monkeypatch.setenv("COMBINED_ATTEMPT_TIMEOUT_S", "2")
    monkeypatch.setenv("COMBINED_RETRY_BACKOFF_S", "0")
    (tmp_path / "combined.yaml").write_text(PROJECT.format(dsn=pg_database))
    stopped_at_each_deadline(tmp_path / "combined.yaml", "pg.stuck", 2, within=SLEEP_S)
    name = pg_database.rsplit("/", 1)[1]
    with psycopg.connect(pg_database, autocommit=True) as conn:
        left = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND query LIKE %s"
            " AND pid <> pg_backend_pid()",
            (name, "%stuck%"),
        ).fetchone()
    assert left == (0,), "a canceled read's statement still runs on the server"
