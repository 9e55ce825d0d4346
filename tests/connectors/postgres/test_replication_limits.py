"""A server whose replication limits are reached: the error says which and what lifts it.

A private PostgreSQL cluster (initdb'd for the test, on its own port, one
replication slot and one WAL sender) so that its limits can be reached
without taking a slot any other test needs.
"""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest
from tests.connectors.postgres._cluster import private_cluster

from combined.connectors.postgres._connect import Settings
from combined.connectors.postgres._replication import create_slot
from combined.errors import SourceError, SourceUnavailable


@pytest.fixture
def limited_server() -> Iterator[str]:
    """A DSN of a new cluster allowing one replication slot, whose one slot is taken."""
    settings = "-c wal_level=logical -c max_replication_slots=1 -c max_wal_senders=1"
    with private_cluster(settings) as dsn:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("SELECT pg_create_logical_replication_slot('taken', 'pgoutput')")
        yield dsn


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
