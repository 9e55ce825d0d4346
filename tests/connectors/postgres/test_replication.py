"""Publication and slot stand-up and management against a real PostgreSQL.

Needs ``COMBINED_TEST_PG_DSN`` and ``wal_level=logical``; every test uses its
own database, table, publication and slot names and drops its slots in
teardown (any it left are dropped with its database).
"""

from __future__ import annotations

import os
import pickle
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo
from tests.pg_cleanup import database_of

from combined.connectors.postgres._connect import Settings
from combined.connectors.postgres._pgoutput import (
    Commit,
    Insert,
    PgoutputDecoder,
    lsn_to_text,
)
from combined.connectors.postgres._publication import (
    drop_publication,
    ensure_publication,
    require_published,
)
from combined.connectors.postgres._replication import (
    SESSION_SETTINGS,
    ReplicationStream,
    SlotLost,
    SlotStatus,
    _connect,
    advance_slot,
    create_slot,
    current_wal_lsn,
    drop_slot,
    emit_heartbeat,
    require_own_slot,
    require_slot,
    resolve_user_types,
    slot_status,
)
from combined.errors import (
    AuthRejected,
    ConfigError,
    NeedsSnapshot,
    NotFoundError,
    SourceError,
    SourceUnavailable,
)

# -- offline ----------------------------------------------------------------


def test_a_slot_without_its_wal_is_lost() -> None:
    assert SlotStatus("s", exists=False).lost
    assert SlotStatus("s", exists=True, restart_lsn=1, wal_status="lost").lost
    assert SlotStatus("s", exists=True, restart_lsn=None, wal_status="reserved").lost
    ok = SlotStatus("s", exists=True, restart_lsn=1, confirmed_flush_lsn=2, wal_status="extended")
    assert not ok.lost
    assert ok.to_json()["confirmed_flush_lsn"] == "0/2" and ok.to_json()["restart_lsn"] == "0/1"


@pytest.mark.parametrize("name", ["", "Upper", "has-dash", "x" * 64, "a b", "s;drop"])
def test_slot_names_are_validated_before_any_command(name: str) -> None:
    with pytest.raises(ConfigError, match="invalid replication slot name"):
        create_slot(Settings("host=unused"), name)


def test_slot_lost_pickles_with_its_hint() -> None:
    err = SlotLost("replication slot 's' does not exist", hint="run teardown", slot="s")
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is SlotLost and back.hint == "run teardown" and back.context == {"slot": "s"}
    assert isinstance(back, SourceError) and not back.transient


def test_the_session_renders_values_the_way_the_batcher_parses_them() -> None:
    assert SESSION_SETTINGS["TimeZone"] == "UTC" and SESSION_SETTINGS["bytea_output"] == "hex"
    assert SESSION_SETTINGS["DateStyle"] == "ISO"


# -- live -------------------------------------------------------------------


@dataclass
class Names:
    """Unique object names for one test, and what it created."""

    dsn: str
    conn: psycopg.Connection[Any]
    sfx: str = field(default_factory=lambda: f"{os.getpid()}_{uuid.uuid4().hex[:8]}")
    tables: list[str] = field(default_factory=list)
    slots: list[str] = field(default_factory=list)
    pubs: list[str] = field(default_factory=list)
    types: list[str] = field(default_factory=list)

    def table(self, tag: str, columns: str = "id int PRIMARY KEY, v text") -> str:
        name = f"rep_{tag}_{self.sfx}"
        self.conn.execute(f"CREATE TABLE {name} ({columns})")
        self.tables.append(name)
        return name

    def slot(self, tag: str = "s") -> str:
        self.slots.append(f"rep_{tag}_{self.sfx}")
        return self.slots[-1]

    @property
    def pg(self) -> Settings:
        """The source settings the replication functions connect with."""
        return Settings(self.dsn)

    def pub(self, tag: str = "p") -> str:
        self.pubs.append(f"rep_{tag}_{self.sfx}")
        return self.pubs[-1]


@pytest.fixture
def names(dsn: str) -> Iterator[Names]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        n = Names(dsn, conn)
        try:
            yield n
        finally:
            for slot in n.slots:
                conn.execute(
                    "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots "
                    "WHERE slot_name = %s AND active_pid IS NOT NULL",
                    (slot,),
                )
                drop_slot(n.pg, slot)
            for pub in n.pubs:
                drop_publication(n.pg, pub)
            for table in n.tables:
                conn.execute(f"DROP TABLE IF EXISTS {table}")
            for type_ in n.types:
                conn.execute(f"DROP TYPE IF EXISTS {type_} CASCADE")


@pytest.mark.postgres
def test_a_publication_is_created_then_verified(names: Names) -> None:
    a, b = names.table("a"), names.table("b")
    pub = names.pub()
    made = ensure_publication(names.pg, pub, [a, f"public.{b}"])
    assert made.created and made.tables == (f"public.{a}", f"public.{b}")
    again = ensure_publication(names.pg, pub, [b])
    assert not again.created
    assert drop_publication(names.pg, pub) and not drop_publication(names.pg, pub)


@pytest.mark.postgres
def test_a_publication_missing_a_table_is_refused_unless_asked(names: Names) -> None:
    a, b = names.table("a"), names.table("b")
    pub = names.pub()
    ensure_publication(names.pg, pub, [a])
    with pytest.raises(SourceError, match="does not cover") as info:
        ensure_publication(names.pg, pub, [a, b])
    assert "ADD TABLE" in (info.value.hint or "")
    ensure_publication(names.pg, pub, [a, b], add_missing=True)
    row = names.conn.execute(
        "SELECT count(*) FROM pg_publication_tables WHERE pubname = %s", (pub,)
    ).fetchone()
    assert row == (2,)


@pytest.mark.postgres
def test_publications_that_would_lose_changes_are_refused(names: Names) -> None:
    keyless = names.table("k", "id int, v text")
    with pytest.raises(SourceError, match="no replica identity") as info:
        ensure_publication(names.pg, names.pub(), [keyless])
    assert "REPLICA IDENTITY FULL" in (info.value.hint or "")
    names.conn.execute(f"ALTER TABLE {keyless} REPLICA IDENTITY FULL")
    ensure_publication(names.pg, names.pub("full"), [keyless])
    # A unique index over NOT NULL columns would serve: the hint gives its statement.
    unique = names.table("u", "id int NOT NULL, v text")
    names.conn.execute(f"CREATE UNIQUE INDEX {unique}_id ON {unique} (id)")
    with pytest.raises(SourceError, match="no replica identity") as info:
        ensure_publication(names.pg, names.pub("u"), [unique])
    alter = f'ALTER TABLE "public"."{unique}" REPLICA IDENTITY'
    assert info.value.hint == f'{alter} USING INDEX "{unique}_id", or {alter} FULL'

    a = names.table("a")
    inserts_only = names.pub("ins")
    names.conn.execute(f"CREATE PUBLICATION {inserts_only} FOR TABLE {a} WITH (publish = 'insert')")
    with pytest.raises(SourceError, match="every kind of change"):
        ensure_publication(names.pg, inserts_only, [a])
    with pytest.raises(NotFoundError):
        ensure_publication(names.pg, names.pub("nf"), [f"missing_{names.sfx}"])
    with pytest.raises(ConfigError):
        ensure_publication(names.pg, names.pub("empty"), [])


@pytest.mark.postgres
def test_a_row_filter_or_a_column_list_is_refused_at_setup_and_at_capture(names: Names) -> None:
    """Both passed as verified: the rows outside the filter, and the columns outside
    the list, were then lost without a word (a row updated out of it came as a delete)."""
    if names.conn.info.server_version < 150000:
        pytest.skip("row filters and column lists came with PostgreSQL 15")
    a = names.table("a", "id int PRIMARY KEY, v text, w text")
    filtered, listed = names.pub("rf"), names.pub("cl")
    names.conn.execute(f"CREATE PUBLICATION {filtered} FOR TABLE {a} WHERE (v = 'acme')")
    names.conn.execute(f"CREATE PUBLICATION {listed} FOR TABLE {a} (id, v)")
    for pub, what in ((filtered, "a row filter"), (listed, "a column list")):
        with pytest.raises(SourceError, match=f"public.{a} with {what}") as info:
            ensure_publication(names.pg, pub, [a], add_missing=True)
        hint = info.value.hint or ""
        assert f"ALTER PUBLICATION {pub} SET TABLE public.{a}" in hint
        assert f"DROP PUBLICATION {pub}" in hint and "cdc setup" in hint
        with pytest.raises(NeedsSnapshot, match=what) as refused:
            require_published(names.pg, pub, f"public.{a}")
        assert "teardown" in (refused.value.hint or "")
    # Set on a partition of the captured table (on the table itself the server
    # refuses one unless publish_via_partition_root, which is refused already).
    parts = names.table("p", "id int, r text, PRIMARY KEY (id, r)) PARTITION BY LIST (r")
    names.conn.execute(f"CREATE TABLE {parts}_eu PARTITION OF {parts} FOR VALUES IN ('eu')")
    names.tables.insert(0, f"{parts}_eu")
    on_leaf = names.pub("leaf")
    names.conn.execute(f"CREATE PUBLICATION {on_leaf} FOR TABLE {parts}_eu WHERE (id > 1)")
    names.conn.execute(f"ALTER PUBLICATION {on_leaf} ADD TABLE {parts}")
    with pytest.raises(SourceError, match=f"{parts}_eu with a row filter"):
        ensure_publication(names.pg, on_leaf, [parts], add_missing=True)
    with pytest.raises(NeedsSnapshot, match=f"{parts}_eu with a row filter"):
        require_published(names.pg, on_leaf, f"public.{parts}")
    # Published whole again: verified.
    names.conn.execute(f"ALTER PUBLICATION {filtered} SET TABLE {a}")
    assert not ensure_publication(names.pg, filtered, [a]).created
    require_published(names.pg, filtered, f"public.{a}")


def _set_snapshot(name: str | None) -> sql.Composed:
    return sql.SQL("SET TRANSACTION SNAPSHOT {}").format(sql.Literal(name))


@pytest.mark.postgres
def test_the_slot_snapshot_and_stream_stitch_without_gap_or_double(names: Names) -> None:
    t = names.table("t")
    pub, slot = names.pub(), names.slot()
    names.conn.execute(f"INSERT INTO {t} VALUES (1, 'before')")
    ensure_publication(names.pg, pub, [t])
    with create_slot(names.pg, slot) as handle:
        assert handle.snapshot_valid and handle.snapshot_name
        status = require_slot(names.pg, slot)  # retention is confirmed before any read
        assert status.restart_lsn is not None and status.wal_status in ("reserved", "extended")
        assert status.confirmed_flush_lsn == handle.consistent_point
        names.conn.execute(f"INSERT INTO {t} VALUES (2, 'after')")
        with psycopg.connect(names.dsn) as reader:
            reader.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
            reader.execute(_set_snapshot(handle.snapshot_name))
            snap = reader.execute(f"SELECT id FROM {t} ORDER BY id").fetchall()
        assert snap == [(1,)]
        name, consistent = handle.snapshot_name, handle.consistent_point
    assert not handle.snapshot_valid
    # The server ends the creating walsender asynchronously; then the snapshot is gone.
    deadline, imported = time.monotonic() + 5, True
    while imported and time.monotonic() < deadline:
        with psycopg.connect(names.dsn) as late:
            late.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
            try:
                late.execute(_set_snapshot(name))
            except psycopg.Error:
                imported = False
        time.sleep(0.05)
    assert not imported

    stream = ReplicationStream(names.pg, slot, pub, consistent)
    try:
        decoder, ids = PgoutputDecoder(), []
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            got = stream.read(0.5)
            if got is None:
                continue
            msg = decoder.decode(got[0])
            if isinstance(msg, Insert):
                ids.append(msg.new.text(0))
            if isinstance(msg, Commit):
                break
        assert ids == ["2"]  # the snapshot holds 1, the stream holds 2
    finally:
        stream.close()


@pytest.mark.postgres
def test_the_stream_renders_timestamps_in_utc_whatever_the_dsn_says(names: Names) -> None:
    t = names.table("ts", "id int PRIMARY KEY, at timestamptz, b bytea")
    pub, slot = names.pub(), names.slot()
    ensure_publication(names.pg, pub, [t])
    with create_slot(names.pg, slot) as handle:
        start = handle.consistent_point
    names.conn.execute(
        f"INSERT INTO {t} VALUES (1, '2024-01-01 05:30:00+05:30', '\\xff')",
    )
    # make_conninfo, not string concatenation: the DSN may be a URI, where an
    # appended " options=..." would end up inside the database name.
    kolkata = make_conninfo(names.dsn, options="-c TimeZone=Asia/Kolkata -c bytea_output=escape")
    with psycopg.connect(kolkata) as plain:  # the DSN's options do take effect elsewhere
        assert plain.execute("SHOW TimeZone").fetchone() == ("Asia/Kolkata",)
    stream = ReplicationStream(Settings(kolkata), slot, pub, start)
    try:
        decoder, values = PgoutputDecoder(), None
        deadline = time.monotonic() + 10
        while values is None and time.monotonic() < deadline:
            got = stream.read(0.5)  # None also when only a keepalive arrived
            msg = decoder.decode(got[0]) if got is not None else None
            if isinstance(msg, Insert):
                values = msg.new.values[1:]
        assert values == (b"2024-01-01 00:00:00+00", b"\\xff")
    finally:
        stream.close()


@pytest.mark.postgres
def test_slot_status_reports_position_and_lag(names: Names) -> None:
    t = names.table("t")
    pub, slot = names.pub(), names.slot()
    ensure_publication(names.pg, pub, [t])
    create_slot(names.pg, slot).release_snapshot()
    before = slot_status(names.pg, slot)
    assert before.exists and before.plugin == "pgoutput" and not before.active
    names.conn.execute(f"INSERT INTO {t} SELECT g, 'x' FROM generate_series(1, 100) g")
    after = slot_status(names.pg, slot)
    assert after.lag_bytes is not None and after.lag_bytes > (before.lag_bytes or 0)
    assert after.current_lsn is not None and after.current_lsn > (before.current_lsn or 0)
    assert after.lag_seconds is None  # nothing streams from it
    missing = slot_status(names.pg, f"nope_{names.sfx}")
    assert not missing.exists and missing.lost
    with pytest.raises(SlotLost, match="does not exist") as info:
        require_slot(names.pg, f"nope_{names.sfx}")
    assert "teardown" in (info.value.hint or "") and "setup" in (info.value.hint or "")


@pytest.mark.postgres
def test_a_slot_of_another_database_is_refused_naming_both(names: Names) -> None:
    """A dsn moved to another database: streaming was refused on every attempt, with
    "check that the server is reachable" and a retry (the server was reachable)."""
    slot = names.slot()
    create_slot(names.pg, slot).release_snapshot()
    made_in = slot_status(names.pg, slot).database
    elsewhere = Settings(make_conninfo(names.dsn, dbname="template1"))
    for attempt in (
        lambda: require_slot(elsewhere, slot),
        lambda: ReplicationStream(elsewhere, slot, "p", 0),
    ):
        with pytest.raises(SourceError) as info:
            attempt()
        assert f"was made in database {made_in!r}" in info.value.message
        assert "'template1'" in info.value.message
        assert f"dsn at database {made_in!r}" in (info.value.hint or "")
        assert not info.value.transient
    assert require_slot(names.pg, slot).connected_to == made_in


@pytest.mark.postgres
def test_a_slot_another_database_made_is_never_dropped(names: Names) -> None:
    """Slot names are the server's: a setup in another database of the server took
    the slot for its own leftover and dropped it, breaking the capture that made it."""
    slot = names.slot()
    create_slot(names.pg, slot).release_snapshot()
    made_in = slot_status(names.pg, slot).database
    elsewhere = Settings(make_conninfo(names.dsn, dbname="postgres"))
    for attempt in (lambda: drop_slot(elsewhere, slot), lambda: require_own_slot(elsewhere, slot)):
        with pytest.raises(ConfigError, match=f"belongs to database {made_in!r}") as info:
            attempt()
        assert "'postgres' that the source's dsn names" in info.value.message
        assert "distinct `slot_prefix`" in (info.value.hint or "")
    assert slot_status(names.pg, slot).database == made_in
    require_own_slot(names.pg, slot)
    assert drop_slot(names.pg, slot)


def test_the_server_of_a_dsn_is_read_as_slots_share_names() -> None:
    from combined.connectors.postgres import PostgresSource

    def server(dsn: object) -> str | None:
        return PostgresSource.cdc_server({"dsn": dsn})

    local = {
        server("postgresql://u@127.0.0.1/a"),
        server("postgresql://u@localhost:5432/b"),
        server("host=/var/run/postgresql dbname=c"),
        server("dbname=d"),
    }
    assert local == {"localhost:5432"}
    assert server("postgresql://u@DB.example:6432/a") == "db.example:6432"
    assert server({"secret": "env:PG_DSN"}) is None


@pytest.mark.postgres
def test_slots_are_created_once_and_dropped_idempotently(names: Names) -> None:
    slot = names.slot()
    create_slot(names.pg, slot).release_snapshot()
    with pytest.raises(SourceError, match="already exists"):
        create_slot(names.pg, slot)
    assert drop_slot(names.pg, slot) is True
    assert drop_slot(names.pg, slot) is False


@pytest.mark.postgres
def test_a_slot_name_may_start_with_a_digit(names: Names) -> None:
    slot = f"1{names.slot()}"  # a slot_prefix such as `1st` gives one
    names.slots.append(slot)
    create_slot(names.pg, slot).release_snapshot()
    assert require_slot(names.pg, slot).exists


@pytest.mark.postgres
def test_an_idle_slot_advances_forward_only(names: Names) -> None:
    t = names.table("t")
    slot = names.slot()
    create_slot(names.pg, slot).release_snapshot()
    start = slot_status(names.pg, slot).confirmed_flush_lsn
    assert start is not None
    names.conn.execute(f"INSERT INTO {t} VALUES (1, 'x')")
    target = current_wal_lsn(names.pg)
    assert target > start
    assert advance_slot(names.pg, slot, target) == target
    assert advance_slot(names.pg, slot, start) == target  # never backwards
    assert emit_heartbeat(names.pg) > target


@pytest.mark.postgres
def test_enums_and_domains_resolve_to_builtin_types(names: Names) -> None:
    mood, money_ish, nested = (f"rep_{k}_{names.sfx}" for k in ("mood", "amt", "amt2"))
    names.types += [mood, money_ish]  # CASCADE takes the nested domain along
    names.conn.execute(f"CREATE TYPE {mood} AS ENUM ('a', 'b')")
    names.conn.execute(f"CREATE DOMAIN {money_ish} AS numeric(10,2) CHECK (VALUE >= 0)")
    names.conn.execute(f"CREATE DOMAIN {nested} AS {money_ish}")
    oids = {
        name: oid
        for name, oid in names.conn.execute(
            "SELECT typname, oid::int FROM pg_type WHERE typname = ANY(%s)",
            ([mood, money_ish, nested, f"_{mood}"],),
        )
    }
    got = resolve_user_types(names.pg, [*oids.values(), 790])
    assert got[oids[mood]] == (25, -1)
    assert got[oids[f"_{mood}"]] == (1009, -1)  # an array of enums reads as text[]
    assert 790 not in got  # money stays unsupported
    assert got[oids[money_ish]] == (1700, (10 << 16 | 2) + 4)
    assert got[oids[nested]] == (1700, (10 << 16 | 2) + 4)
    assert resolve_user_types(names.pg, []) == {}


@pytest.fixture
def nologin_role(dsn: str) -> Iterator[str]:
    """A role that exists but may not log in, dropped afterwards."""
    role = f"rep_nologin_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE ROLE {} NOLOGIN").format(sql.Identifier(role)))
        try:
            yield role
        finally:
            conn.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(role)))


@pytest.fixture
def plain_role(dsn: str) -> Iterator[str]:
    """A role that may log in but has no REPLICATION attribute, dropped afterwards."""
    role = f"rep_plain_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE ROLE {} LOGIN NOREPLICATION").format(sql.Identifier(role)))
        try:
            yield role
        finally:
            conn.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(role)))


def _assert_refused(info: pytest.ExceptionInfo[AuthRejected]) -> None:
    assert type(info.value) is AuthRejected
    assert not info.value.transient and info.value.run_state == "needs_auth"


@pytest.mark.postgres
def test_refused_credentials_are_not_transient(dsn: str, nologin_role: str) -> None:
    # The test server trusts 127.0.0.1, so a wrong password would be accepted:
    # the refusals here are a role that does not exist and one without LOGIN.
    for user in (f"nobody_{uuid.uuid4().hex[:6]}", nologin_role):
        refused = Settings(make_conninfo(dsn, user=user))
        with pytest.raises(AuthRejected) as info:
            slot_status(refused, "s")
        _assert_refused(info)
        with pytest.raises(AuthRejected) as info:
            ReplicationStream(refused, "s", "p", 0)
        _assert_refused(info)
        assert f'role "{user}"' in info.value.message  # the server's words, not a guess


@pytest.mark.postgres
def test_a_role_without_replication_is_told_the_cause_and_the_grant(
    dsn: str, plain_role: str
) -> None:
    settings = Settings(make_conninfo(dsn, user=plain_role))
    slot_status(settings, "s")  # an ordinary connection is fine
    for attempt in (
        lambda: ReplicationStream(settings, "s", "p", 0),
        lambda: create_slot(settings, "rep_never_created"),
    ):
        with pytest.raises(AuthRejected) as info:
            attempt()
        _assert_refused(info)
        # The cause is in the message (what the CLI prints and the Run keeps),
        # in the server's words of PostgreSQL up to 15 or from 16.
        message = info.value.message.lower()
        assert "replication" in message
        assert "must be superuser or replication role" in message or "wal sender" in message
        assert f'ALTER ROLE "{plain_role}" REPLICATION' in (info.value.hint or "")


@pytest.mark.postgres
def test_a_missing_database_is_a_configuration_error(dsn: str) -> None:
    missing = f"rep_roles_{uuid.uuid4().hex[:8]}"  # "role" in its name: still a database
    settings = Settings(make_conninfo(dsn, dbname=missing))
    for attempt in (
        lambda: slot_status(settings, "s"),
        lambda: ReplicationStream(settings, "s", "p", 0),
    ):
        with pytest.raises(ConfigError) as info:
            attempt()
        assert f'database "{missing}" does not exist' in info.value.message
        assert "database name in the dsn" in (info.value.hint or "")
        assert not info.value.transient


def test_an_unreachable_server_is_transient() -> None:
    down = Settings("host=127.0.0.1 port=1 dbname=postgres user=postgres", connect_timeout=5)
    for attempt in (lambda: slot_status(down, "s"), lambda: ReplicationStream(down, "s", "p", 0)):
        with pytest.raises(SourceUnavailable) as info:
            attempt()
        assert info.value.transient
        assert "connection refused" in info.value.message.lower()


def test_a_server_that_never_answers_times_out(silent_server: Any) -> None:
    settings = Settings(silent_server.dsn, connect_timeout=2)
    for attempt in (
        lambda: slot_status(settings, "s"),
        lambda: ReplicationStream(settings, "s", "p", 0),
    ):
        started = time.monotonic()
        err = silent_server.outcome(attempt, seconds=20)
        assert isinstance(err, SourceUnavailable) and err.transient, err
        assert time.monotonic() - started < 10


@pytest.mark.postgres
def test_every_connection_carries_the_application_name(names: Names) -> None:
    t = names.table("t")
    pub, slot = names.pub(), names.slot()
    app = f"rep_app_{names.sfx}"
    settings = Settings(names.dsn, application_name=app)
    with _connect(settings) as conn:
        assert conn.execute("SHOW application_name").fetchone() == (app,)
    ensure_publication(settings, pub, [t])
    create_slot(settings, slot).release_snapshot()
    stream = ReplicationStream(settings, slot, pub, 0)
    try:
        deadline = time.monotonic() + 5
        while (pid := slot_status(settings, slot).active_pid) is None:
            assert time.monotonic() < deadline, "the stream never took the slot"
            time.sleep(0.05)
        row = names.conn.execute(
            "SELECT application_name FROM pg_stat_activity WHERE pid = %s", (pid,)
        ).fetchone()
        assert row == (app,)
    finally:
        stream.close()


def test_lsn_text_in_status_json() -> None:
    assert lsn_to_text(SlotStatus("s", exists=True, restart_lsn=2**32).restart_lsn or 0) == "1/0"


@pytest.mark.postgres
def test_a_refused_control_statement_is_told_with_what_to_do(names: Names, plain_role: str) -> None:
    # The server refuses the statement itself (the role may connect): the
    # error is Combined's, terminal, with the server's words and the fix.
    table = names.table("owned")
    settings = Settings(make_conninfo(names.dsn, user=plain_role))
    with pytest.raises(AuthRejected) as info:
        ensure_publication(settings, names.pub(), [table])
    _assert_refused(info)
    assert "set up the publication" in info.value.message
    assert "permission denied" in info.value.message  # the server's words
    assert "CREATE PUBLICATION" in (info.value.hint or "")
    role, database = sql.Identifier(plain_role), sql.Identifier(database_of(names.dsn))
    names.conn.execute(sql.SQL("GRANT CREATE ON DATABASE {} TO {}").format(database, role))
    pub = names.pub()
    try:
        with pytest.raises(AuthRejected, match="must be owner"):
            ensure_publication(settings, pub, [table])  # CREATE is not enough
        names.conn.execute(
            sql.SQL("ALTER TABLE {} OWNER TO {}").format(sql.Identifier(table), role)
        )
        assert ensure_publication(settings, pub, [table]).created  # now it may
    finally:
        drop_publication(names.pg, pub)
        names.conn.execute(sql.SQL("REASSIGN OWNED BY {} TO postgres").format(role))
        names.conn.execute(sql.SQL("REVOKE CREATE ON DATABASE {} FROM {}").format(database, role))


@pytest.mark.postgres
def test_a_failed_control_statement_is_a_source_error_not_the_drivers(
    names: Names,
) -> None:
    # A type the catalog query cannot take: the driver's error never escapes.
    with pytest.raises(SourceError) as info:
        resolve_user_types(names.pg, [2**40])
    assert not isinstance(info.value, psycopg.Error)
    assert "resolve the source's user-defined types" in info.value.message


@pytest.mark.postgres
def test_a_publication_dropped_while_streaming_is_not_retried_as_transient(names: Names) -> None:
    # The slot can stream nothing more of the table without its publication:
    # retrying the attempt cannot help, only a new slot and snapshot can.
    t = names.table("t")
    pub, slot = names.pub(), names.slot()
    ensure_publication(names.pg, pub, [t])
    with create_slot(names.pg, slot) as handle:
        start = handle.consistent_point
    names.conn.execute(f"INSERT INTO {t} VALUES (1, 'before')")
    drop_publication(names.pg, pub)
    names.conn.execute(f"INSERT INTO {t} VALUES (2, 'after')")
    stream = ReplicationStream(names.pg, slot, pub, start)
    try:
        with pytest.raises(SourceError) as info:
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                stream.read(0.5)
        assert isinstance(info.value, NeedsSnapshot), info.value  # (needs_review)
        assert "teardown" in (info.value.hint or "")
        assert pub in info.value.message
    finally:
        stream.close()


def _read_for(stream: ReplicationStream, seconds: float) -> list[tuple[bytes, int]]:
    """Every message within ``seconds``, asking for keepalives as a capture does."""
    got: list[tuple[bytes, int]] = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        stream.request_reply()
        message = stream.read(0.2)
        if message is not None:
            got.append(message)
    return got


@pytest.mark.postgres
def test_the_stream_never_confirms_a_position_it_was_not_given(names: Names) -> None:
    """Keepalives never move the slot: only ``confirm`` does (issue 23, item 27).

    Reproduction: psycopg2's ReplicationCursor forwarded the flush position
    to a keepalive's walEnd whenever the last delivered message had been
    confirmed, or before any message arrived, and reported it to the server.
    Stream a slot while WAL moves past it (unpublished writes, heartbeats):
    confirmed_flush_lsn went to the server's position although nothing was
    confirmed; then confirm one delivered commit and keep reading: it went
    past that commit. A run killed then left the slot ahead of the lake.
    """
    t, other = names.table("t"), names.table("other")
    pub, slot = names.pub(), names.slot()
    ensure_publication(names.pg, pub, [t])
    create_slot(names.pg, slot).release_snapshot()
    start = slot_status(names.pg, slot).confirmed_flush_lsn
    assert start is not None
    stream = ReplicationStream(names.pg, slot, pub, start, status_interval=1)
    try:
        names.conn.execute(f"INSERT INTO {other} VALUES (1, 'not published')")
        emit_heartbeat(names.pg)
        assert _read_for(stream, 2.5) == []
        assert stream.wal_end > start  # the server did report a later position
        assert slot_status(names.pg, slot).confirmed_flush_lsn == start

        names.conn.execute(f"INSERT INTO {t} VALUES (1, 'published')")
        decoder, commit = PgoutputDecoder(), None
        deadline = time.monotonic() + 10
        while commit is None and time.monotonic() < deadline:
            got = stream.read(0.5)
            msg = decoder.decode(got[0]) if got is not None else None
            commit = msg if isinstance(msg, Commit) else None
        assert commit is not None
        stream.confirm(commit.end_lsn)
        names.conn.execute(f"INSERT INTO {other} VALUES (2, 'not published')")
        emit_heartbeat(names.pg)
        assert _read_for(stream, 2.5) == []
        assert stream.wal_end > commit.end_lsn
        assert slot_status(names.pg, slot).confirmed_flush_lsn == commit.end_lsn
    finally:
        stream.close()
    time.sleep(0.5)  # the walsender's last status arrives before it exits
    assert slot_status(names.pg, slot).confirmed_flush_lsn == commit.end_lsn
