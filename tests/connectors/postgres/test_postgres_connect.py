"""Connecting: unreachable servers, refused roles, and passwords that never leak."""

from __future__ import annotations

import logging
import pickle
import uuid
from pathlib import Path
from typing import Any

import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from combined.connectors.abc import ReadRequest
from combined.connectors.postgres import PostgresSource
from combined.connectors.postgres._connect import Settings, query_error
from combined.errors import (
    AuthRejected,
    CombinedError,
    ConfigError,
    NotFoundError,
    SourceError,
    SourceUnavailable,
)

PASSWORD = "Hunter2-" + uuid.uuid4().hex[:12]


def _all_text(err: CombinedError) -> str:
    """Everything an error shows or logs: message, hint, context, notes, repr, pickle."""
    parts = [str(err), err.describe(), repr(err), repr(err.context), repr(pickle.dumps(err))]
    parts += getattr(err, "__notes__", [])
    parts += [str(err.__cause__), str(err.__context__)] if err.__cause__ else []
    return "\n".join(parts)


def _with(dsn: str, **kw: str | int) -> str:
    return make_conninfo(dsn, **kw)


@pytest.fixture
def role(admin):
    """A LOGIN role with a password, dropped afterwards."""
    name = f"combined_role_{uuid.uuid4().hex[:8]}"
    admin.execute(
        sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(
            sql.Identifier(name), sql.Literal(PASSWORD)
        )
    )
    try:
        yield name
    finally:
        admin.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(name)))


def test_an_unreachable_server_is_transient_and_never_shows_the_password(pg_dsn, role, caplog):
    caplog.set_level(logging.DEBUG)
    dsn = _with(pg_dsn, port=1, user=role, connect_timeout=2)
    source = PostgresSource({"dsn": dsn, "password": PASSWORD})
    with pytest.raises(SourceUnavailable) as info:
        source.check()
    err = info.value
    assert err.transient and "cannot reach" in err.message and err.hint
    assert PASSWORD not in _all_text(err)
    assert PASSWORD not in caplog.text
    with pytest.raises(SourceUnavailable) as again:
        list(source.read(_request()))
    assert PASSWORD not in _all_text(again.value)


def test_a_password_inside_the_dsn_is_refused_without_echoing_it(pg_dsn):
    parts = conninfo_to_dict(pg_dsn)
    uri = f"postgresql://{parts.get('user', 'postgres')}:{PASSWORD}@{parts.get('host')}:1/x"
    for dsn in (uri, _with(pg_dsn, password=PASSWORD)):
        with pytest.raises(ConfigError) as info:
            PostgresSource({"dsn": dsn})
        assert "holds a password" in info.value.message
        assert PASSWORD not in _all_text(info.value)


@pytest.mark.parametrize(
    "dsn",
    [
        f"host=h dbname=d sslpassword={PASSWORD}",
        f"postgresql://u@h/d?sslmode=require&sslpassword={PASSWORD}",
    ],
    ids=["keywords", "url"],  # the password is random: ids that name it differ between workers
)
def test_any_password_keyword_in_the_dsn_is_refused_without_echoing_it(dsn):
    with pytest.raises(ConfigError) as info:
        Settings.from_config({"dsn": dsn})
    assert info.value.message == "the postgres dsn holds a password (sslpassword)"
    assert PASSWORD not in _all_text(info.value)


def test_a_role_that_cannot_log_in_is_rejected(pg_dsn, admin):
    missing = f"combined_missing_{uuid.uuid4().hex[:8]}"
    with pytest.raises(AuthRejected) as info:
        PostgresSource({"dsn": _with(pg_dsn, user=missing), "password": PASSWORD}).check()
    assert info.value.run_state == "needs_auth" and not info.value.transient
    assert missing in info.value.message and PASSWORD not in _all_text(info.value)
    nologin = f"combined_nologin_{uuid.uuid4().hex[:8]}"
    admin.execute(sql.SQL("CREATE ROLE {} NOLOGIN").format(sql.Identifier(nologin)))
    try:
        with pytest.raises(AuthRejected, match="not permitted to log in"):
            PostgresSource({"dsn": _with(pg_dsn, user=nologin)}).discover()
    finally:
        admin.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(nologin)))


def test_a_password_role_reads_and_its_errors_stay_clean(pg_dsn, role, schema, admin):
    admin.execute(f"CREATE TABLE {schema}.secret (id int)")
    source = PostgresSource(
        {"dsn": _with(pg_dsn, user=role), "password": PASSWORD, "schemas": [schema]}
    )
    source.check()
    # No SELECT grant: the relation is not discovered and reading it is refused.
    assert source.discover().datasets == ()
    admin.execute(
        sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(
            sql.Identifier(schema), sql.Identifier(role)
        )
    )
    ext = source.read(_request(f"{schema}.secret"))
    with pytest.raises(AuthRejected) as info:
        list(ext)
    ext.finish("abort")
    assert "permission denied" in info.value.message
    assert PASSWORD not in _all_text(info.value)


def test_a_missing_database_is_a_configuration_error(pg_dsn):
    with pytest.raises(ConfigError, match="does not exist"):
        PostgresSource({"dsn": _with(pg_dsn, dbname="combined_no_such_db")}).check()


def test_settings_validate_and_hide_the_secret():
    settings = Settings.from_config(
        {"dsn": "host=h dbname=d", "password": "pw-secret", "schemas": ["a", "b"]}
    )
    assert "pw-secret" not in repr(settings)
    assert "pw-secret" in settings.conninfo() and "connect_timeout=10" in settings.conninfo()
    assert settings.scrub("auth failed for pw-secret") == "auth failed for ***"
    for bad in (
        {},
        {"dsn": "host=h", "schemas": "public"},
        {"dsn": "host=h", "schemas": []},
        {"dsn": "host=h", "connect_timeout": 0},
        {"dsn": "host=h", "password": 5},
        {"dsn": "not a dsn ="},
        {"dsn": "host=h", "casts": ["orders.total"]},
        {"dsn": "host=h", "casts": {"total": "text"}},  # no table
        {"dsn": "host=h", "casts": {"orders.total": 5}},
    ):
        with pytest.raises(ConfigError):
            Settings.from_config(bad)


def test_casts_are_found_by_relation_and_refused_for_cdc():
    config = {
        "dsn": "host=h",
        "casts": {"orders.a": "text", "public.orders.b": "text", "sales.orders.c": "text"},
    }
    settings = Settings.from_config(config)
    assert settings.casts_for("orders") == {"a": "text", "b": "text"}
    assert settings.casts_for("public.orders") == {"a": "text", "b": "text"}
    assert settings.casts_for("sales.orders") == {"c": "text"}
    assert settings.casts_for("sales.other") == {}
    source = PostgresSource(config)
    request = ReadRequest(dataset="o", relation="orders", key=("id",), strategy="cdc")
    with pytest.raises(ConfigError, match="read by cdc"):
        source.read(request)


class _DriverError(Exception):
    def __init__(self, message: str, sqlstate: str | None) -> None:
        super().__init__(message)
        self.sqlstate = sqlstate


@pytest.mark.parametrize(
    ("sqlstate", "expected"),
    [
        ("08006", SourceUnavailable),
        ("57P01", SourceUnavailable),
        ("40001", SourceUnavailable),
        ("53300", SourceUnavailable),
        ("42501", AuthRejected),
        ("28P01", AuthRejected),
        ("42P01", NotFoundError),
        ("22012", SourceError),
    ],
)
def test_errors_are_classified_by_sqlstate(sqlstate, expected):
    settings = Settings.from_config({"dsn": "host=h", "password": "pw-secret"})
    err = query_error(_DriverError("ERROR:  boom pw-secret", sqlstate), settings, "reading")
    assert type(err) is expected and "pw-secret" not in _all_text(err)


def _request(relation: str = "public.t"):
    from combined.connectors.abc import ReadRequest

    return ReadRequest(dataset="t", relation=relation, key=(), strategy="snapshot")


def test_check_warns_when_the_password_may_cross_the_network_in_clear_text(
    pg_dsn: str, tools: Any, tmp_path: Path, admin: Any, schema: str
) -> None:
    """`combined check` warns of a password sent without TLS to another machine.

    Reproduction: a source with a password and a dsn naming a remote host
    without `sslmode` (libpq's default `prefer` falls back to no TLS, and a
    server answering in the real one's place asks for the password in clear
    text); `combined check` said nothing. The same dsn with
    `sslmode=verify-full`, or a loopback host, draws no warning.
    """
    tools.make(tmp_path)
    remote = "postgresql://reader@192.0.2.10:5432/shop"  # TEST-NET-1: never answers
    tools.add_pg_source(tmp_path, "near", pg_dsn, "PGPW")
    tools.add_pg_source(tmp_path, "far", remote, "PGPW")
    tools.add_pg_source(tmp_path, "far_tls", remote + "?sslmode=verify-full", "PGPW")
    tools.add_pg_source(tmp_path, "far_scram", remote + "?require_auth=scram-sha-256", "PGPW")
    project = tmp_path / "combined.yaml"
    # `check` verifies the declared relation too: near's must exist.
    admin.execute(f'CREATE TABLE "{schema}".customers (id int PRIMARY KEY)')
    project.write_text(
        project.read_text()
        .replace("password:", "connect_timeout: 1\n      password:")
        .replace("relation: public.customers", f"relation: {schema}.customers")
    )
    done = tools.cli(tmp_path, "check", env={"PGPW": PASSWORD})
    out = " ".join(done.stdout.split())  # the console wraps long lines
    assert done.returncode == 1, done.stdout + done.stderr  # the remote hosts cannot answer
    assert "ok near" in out
    assert "warn far: the password may be sent in clear text to 192.0.2.10" in out
    assert "sslmode=verify-full" in out and "require_auth=scram-sha-256" in out
    assert "warn near" not in out and "warn far_tls" not in out and "warn far_scram" not in out
    assert PASSWORD not in done.stdout + done.stderr


def test_sessions_of_one_source_open_the_drivers_database_once(
    pg_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The driver reads the server's type catalog when it opens a database
    (~60 ms of CPU): a capture of 200 small tables did so 200 times."""
    import threading

    import adbc_driver_postgresql

    from combined.connectors import _adbc
    from combined.connectors.postgres import _connect

    opened: list[str] = []

    def opener(conninfo: str) -> Any:
        opened.append(conninfo)
        return adbc_driver_postgresql.connect(conninfo)

    monkeypatch.setattr(_connect, "_DATABASES", _adbc.SharedDatabases(opener, limit=1))
    settings = Settings.from_config({"dsn": pg_dsn})
    first = _connect.Session(settings)
    second = _connect.Session(settings)
    assert first.pid != second.pid  # two connections, one database
    first.close()
    assert second.rows("SELECT 41 + 1", "adding") == [(42,)]
    answers: list[Any] = []
    threads = [
        threading.Thread(
            target=lambda: answers.append(_connect.Session(settings).rows("SELECT 1", "one"))
        )
        for _ in range(4)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert answers == [[(1,)]] * 4
    assert len(opened) == 1
    # Another source (another string) opens its own; past the limit the
    # oldest is let go, and opened again when asked for.
    other = Settings.from_config({"dsn": pg_dsn, "application_name": "combined-other"})
    _connect.Session(other).close()
    _connect.Session(settings).close()
    second.close()
    assert len(opened) == 3


def test_a_bare_name_found_only_in_another_schema_is_named_in_the_hint(
    pg_dsn: str, admin: Any, schema: str
) -> None:
    """A bare name is read in schema public; one that lives only in another
    schema (listed in `schemas:` or not) said only "run discovery"; the hint names the command."""
    table = f"only_{uuid.uuid4().hex[:8]}"
    admin.execute(f"CREATE TABLE {schema}.{table} (id int PRIMARY KEY)")
    source = PostgresSource({"dsn": pg_dsn, "schemas": [schema]})
    ext = source.read(_request(table))
    with pytest.raises(NotFoundError) as info:
        list(ext)
    ext.finish("abort")
    assert f"public.{table}" in info.value.message
    assert f"{schema}.{table}" in (info.value.hint or "")
    ext = source.read(_request(f"public.{table}"))  # (a qualified name is taken as written)
    with pytest.raises(NotFoundError) as info:
        list(ext)
    ext.finish("abort")
    assert "`combined discover SOURCE`" in (info.value.hint or "")


def test_a_server_that_refuses_connections_is_told_by_what_lifts_it(pg_database, admin, role):
    """A database closed to connections (maintenance) or a role at its connection limit
    was told "check host, port and network", which are fine: the hint names the limit."""
    name = str(conninfo_to_dict(pg_database)["dbname"])
    source = PostgresSource({"dsn": _with(pg_database, user=role), "password": PASSWORD})
    admin.execute(sql.SQL("ALTER DATABASE {} ALLOW_CONNECTIONS false").format(sql.Identifier(name)))
    try:
        with pytest.raises(SourceUnavailable) as closed:
            source.check()
    finally:
        admin.execute(
            sql.SQL("ALTER DATABASE {} ALLOW_CONNECTIONS true").format(sql.Identifier(name))
        )
    assert closed.value.transient and "ALLOW_CONNECTIONS true" in (closed.value.hint or "")
    admin.execute(sql.SQL("ALTER ROLE {} CONNECTION LIMIT 0").format(sql.Identifier(role)))
    with pytest.raises(SourceUnavailable) as limited:
        source.check()
    assert "ALTER ROLE <role> CONNECTION LIMIT" in (limited.value.hint or "")
    assert "host, port" not in (closed.value.hint or "") + (limited.value.hint or "")
    assert PASSWORD not in _all_text(closed.value) + _all_text(limited.value)
