"""Configuration, classified errors (never holding the password) and discovery."""

from __future__ import annotations

import pickle
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from combined.connectors.mariadb import MariaDBSource
from combined.errors import (
    AuthRejected,
    CombinedError,
    ConfigError,
    NotFoundError,
    SourceUnavailable,
)

PASSWORD = "Pw-7f3k-not-shown"


def _dsn(
    base: str, user: str | None = None, database: str | None = None, port: int | None = None
) -> str:
    scheme, rest = base.split("://", 1)
    hostpart, db = rest.split("/", 1)
    host = hostpart.rsplit("@", 1)[-1]
    if port is not None:
        host = f"{host.rsplit(':', 1)[0]}:{port}"
    return f"{scheme}://{user or hostpart.split('@')[0]}@{host}/{database or db}"


def _shown(error: CombinedError) -> str:
    return error.describe() + repr(error.context) + repr(pickle.dumps(error)) + str(error)


@pytest.fixture
def account(admin: Any) -> Iterator[str]:
    """A user with a password, allowed to INSERT (not SELECT) into table `locked`."""
    user = f"ct_{uuid.uuid4().hex[:8]}"
    db = admin.rows("SELECT DATABASE()")[0][0]
    admin.sql(
        "CREATE TABLE locked (id INT PRIMARY KEY)",
        f"CREATE USER '{user}'@'%' IDENTIFIED BY '{PASSWORD}'",
        f"GRANT INSERT ON `{db}`.`locked` TO '{user}'@'%'",
    )
    try:
        yield user
    finally:
        admin.sql(f"DROP USER IF EXISTS '{user}'@'%'")


def test_the_dsn_is_checked_before_anything_connects() -> None:
    with pytest.raises(ConfigError, match="holds a password") as info:
        MariaDBSource({"dsn": f"mysql://root:{PASSWORD}@h/db"})
    assert PASSWORD not in _shown(info.value)
    with pytest.raises(ConfigError, match="mysql:// or mariadb://"):
        MariaDBSource({"dsn": "postgresql://root@h/db"})
    with pytest.raises(ConfigError, match="names no database"):
        MariaDBSource({"dsn": "mysql://root@h:3306/"})
    with pytest.raises(ConfigError, match="unknown parameter 'sslmode'"):
        MariaDBSource({"dsn": "mariadb://root@h/db?sslmode=require"})
    with pytest.raises(ConfigError, match="connect_timeout"):
        MariaDBSource({"dsn": "mysql://root@h/db", "connect_timeout": 0})
    with pytest.raises(ConfigError, match="zero_dates"):
        MariaDBSource({"dsn": "mysql://root@h/db", "zero_dates": "zero"})
    # A missing TLS file failed as "cannot reach the source ... can be retried".
    with pytest.raises(ConfigError, match="ssl_ca names '/nowhere/ca.pem', which is not a file"):
        MariaDBSource({"dsn": "mysql://root@h/db?ssl_ca=/nowhere/ca.pem"})
    src = MariaDBSource({"dsn": "mysql://root@h/db", "password": PASSWORD})
    assert PASSWORD not in repr(src.settings) + repr(src.config)


def test_a_wrong_password_is_auth_rejected_and_never_shown(
    mariadb_database: str, account: str
) -> None:
    wrong = PASSWORD + "-wrong"
    src = MariaDBSource({"dsn": _dsn(mariadb_database, user=account), "password": wrong})
    with pytest.raises(AuthRejected) as info:
        src.check()
    assert "password secret" in (info.value.hint or "")
    assert wrong not in _shown(info.value) and PASSWORD not in _shown(info.value)
    MariaDBSource({"dsn": _dsn(mariadb_database, user=account), "password": PASSWORD}).check()


def test_permission_denied_is_auth_rejected_with_the_grant_to_ask_for(
    mariadb_database: str, account: str, make_request: Any
) -> None:
    src = MariaDBSource({"dsn": _dsn(mariadb_database, user=account), "password": PASSWORD})
    with pytest.raises(AuthRejected) as info:
        list(src.read(make_request("locked")))
    assert "GRANT SELECT" in (info.value.hint or "")
    assert PASSWORD not in _shown(info.value)
    src.close()


def test_unknown_database_unreachable_host_and_missing_table_are_classified(
    mariadb_database: str, source: MariaDBSource, make_request: Any
) -> None:
    with pytest.raises(ConfigError, match="does not exist") as info:
        MariaDBSource({"dsn": _dsn(mariadb_database, database="no_such_db_x")}).check()
    assert "database name" in (info.value.hint or "")
    src = MariaDBSource(
        {"dsn": _dsn(mariadb_database, port=1), "password": PASSWORD, "connect_timeout": 2}
    )
    with pytest.raises(SourceUnavailable) as unreachable:
        src.check()
    assert SourceUnavailable.transient and PASSWORD not in _shown(unreachable.value)
    with pytest.raises(NotFoundError, match="'missing'") as missing_table:
        list(source.read(make_request("missing")))
    assert "`combined discover SOURCE`" in (missing_table.value.hint or "")


def test_discovery_reports_tables_views_types_keys_and_cursor_evidence(
    admin: Any, source: MariaDBSource
) -> None:
    admin.sql(
        "CREATE TABLE items (id BIGINT UNSIGNED AUTO_INCREMENT PRIMARY KEY,"
        " sku VARCHAR(20) NOT NULL, price DECIMAL(10,2), note TEXT,"
        " updated_at TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3)"
        " ON UPDATE CURRENT_TIMESTAMP(3), UNIQUE KEY (sku), KEY (updated_at))",
        "CREATE VIEW cheap AS SELECT id, price FROM items WHERE price < 10",
        "INSERT INTO items (sku, price) VALUES ('a', 1), ('b', 20)",
        "CREATE TABLE plain (id INT NOT NULL, v INT, UNIQUE KEY (id)) ENGINE=InnoDB",
        "CREATE TABLE loose (id INT, v INT) ENGINE=InnoDB",
        "CREATE TABLE old (id INT PRIMARY KEY) ENGINE=MyISAM",
    )
    found = source.discover()
    assert found.connector == "mariadb"
    items, cheap = found.dataset("items"), found.dataset("cheap")
    assert items is not None and cheap is not None
    assert (items.kind, cheap.kind) == ("table", "view")
    fields = {f.name: f for f in items.fields}
    assert fields["id"].arrow_type == "uint64" and not fields["id"].nullable
    assert fields["price"].arrow_type == "decimal128(10, 2)"
    assert fields["updated_at"].arrow_type == "timestamp[us, tz=UTC]"
    assert fields["price"].source_type == "decimal(10,2)"
    assert items.primary_key == ("id",) and items.unique_keys == (("sku",),)
    cands = {c.column: c.evidence for c in items.cursor_candidates}
    assert set(cands) == {"id", "updated_at"}
    assert "auto_increment" in cands["id"] and "ON UPDATE CURRENT_TIMESTAMP" in cands["updated_at"]
    assert "leads index" in cands["updated_at"]
    # The binlog streams a keyed table a consistent snapshot covers (the first capture).
    assert items.strategies == ("snapshot", "cursor", "cdc")
    assert cheap.primary_key == () and cheap.estimated_rows is None
    assert "cdc" not in cheap.strategies
    strategies = {d.name: d.strategies for d in found.datasets}
    assert strategies["plain"] == ("snapshot", "cursor", "cdc")  # a unique NOT NULL key
    assert strategies["loose"] == strategies["old"] == ("snapshot", "cursor")


@pytest.mark.parametrize("password", ["Pä-7f3k-hidden", "P€-7f3k-hidden"])
def test_a_password_beyond_ascii_authenticates_and_never_shows(
    admin: Any, mariadb_database: str, password: str
) -> None:
    # The server hashes the password as the client's utf8mb4 text wrote it.
    user = f"ct_{uuid.uuid4().hex[:8]}"
    db = admin.rows("SELECT DATABASE()")[0][0]
    admin.sql(
        f"CREATE USER '{user}'@'%' IDENTIFIED BY '{password}'",
        f"GRANT SELECT ON `{db}`.* TO '{user}'@'%'",
    )
    try:
        MariaDBSource({"dsn": _dsn(mariadb_database, user=user), "password": password}).check()
        wrong = password + "x"
        src = MariaDBSource({"dsn": _dsn(mariadb_database, user=user), "password": wrong})
        with pytest.raises(AuthRejected) as info:
            src.check()
        chained = repr(info.value.__cause__) + repr(info.value.__context__)
        assert wrong not in _shown(info.value) + chained
    finally:
        admin.sql(f"DROP USER IF EXISTS '{user}'@'%'")


def test_a_driver_error_is_not_chained_to_the_classified_error(
    mariadb_database: str, make_request: Any
) -> None:
    src = MariaDBSource({"dsn": _dsn(mariadb_database, port=1), "connect_timeout": 2})
    with pytest.raises(SourceUnavailable) as info:
        src.check()
    assert info.value.__cause__ is None and info.value.__context__ is None
    src = MariaDBSource({"dsn": mariadb_database})
    with pytest.raises(NotFoundError) as missing:
        list(src.read(make_request("missing_table")))
    assert missing.value.__context__ is None
    src.close()


def test_a_session_waits_for_a_slow_consumer_as_long_as_read_timeout(
    mariadb_database: str,
) -> None:
    # An unbuffered read stalls the server's writes while the engine stages a
    # batch; the server drops the session after net_write_timeout (60 s by default).
    from combined.connectors.mariadb._connect import Session, Settings

    session = Session(Settings.from_config({"dsn": mariadb_database, "read_timeout": 900}))
    try:
        ((value,),) = session.rows("SELECT @@session.net_write_timeout", "test")
        assert int(value) == 900
    finally:
        session.close()


def test_a_table_altered_after_the_snapshot_began_is_retried_as_another_attempt() -> None:
    import pymysql

    from combined.connectors.mariadb._connect import Settings, query_error

    settings = Settings.from_config({"dsn": "mysql://reader@db.example:3306/shop"})
    changed = pymysql.err.OperationalError(
        1412, "Table definition has changed, please retry transaction"
    )
    err = query_error(changed, settings, "reading rows")
    assert isinstance(err, SourceUnavailable) and err.transient
    other = query_error(pymysql.err.OperationalError(1064, "syntax"), settings, "reading rows")
    assert not isinstance(other, SourceUnavailable) and not other.transient


def test_connections_without_tls_options_share_one_tls_context(
    mariadb_database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PyMySQL loaded the system's certificates into a new context for every
    connection (~24 ms of CPU), for a TLS mode that verifies nothing."""
    import ssl

    from combined.connectors.mariadb._connect import DriverConnection, Session, Settings

    made: list[Any] = []
    create = ssl.create_default_context

    def counted(*args: Any, **kwargs: Any) -> ssl.SSLContext:
        made.append(kwargs)
        return create(*args, **kwargs)

    monkeypatch.setattr(DriverConnection, "_preferred", None)
    monkeypatch.setattr(ssl, "create_default_context", counted)
    settings = Settings.from_config({"dsn": mariadb_database})
    for _ in range(3):
        session = Session(settings)
        assert session.rows("SELECT 1 + 1", "adding") == [("2",)]  # (as text)
        session.close()
    assert len(made) == 1
    cafile = ssl.get_default_verify_paths().cafile
    if cafile:  # options of the DSN's get a context of their own, each time
        for _ in range(2):
            DriverConnection(host="127.0.0.1", ssl_ca=cafile, defer_connect=True)
        assert [m.get("cafile") for m in made] == [None, cafile, cafile]


def test_the_binlog_library_db_argument_opens_its_database_without_a_warning(
    mariadb_database: str,
) -> None:
    """``mysql-replication`` opens its control connection with PyMySQL's deprecated ``db``:
    every event read was wrapped in a warnings filter for it (~13% of a binlog read of
    single-row transactions). Under ``filterwarnings = error`` a warning fails here."""
    from combined.connectors.mariadb._connect import DriverConnection, Settings, stream_connection

    kwargs = stream_connection(Settings.from_config({"dsn": mariadb_database}))
    conn = DriverConnection(**kwargs, db="information_schema")
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT DATABASE()")
            assert cur.fetchone() == ("information_schema",)
    finally:
        conn.close()


def test_an_account_at_its_connection_limit_is_told_what_lifts_it(
    mariadb_database: str, admin: Any, account: str
) -> None:
    """A server that answered and refused (the account's MAX_USER_CONNECTIONS) was told
    "check host, port and network", which were fine, or failed the Run with "see the
    detail": it is retried, and the hint names the limit."""
    import pymysql

    admin.sql(f"ALTER USER '{account}'@'%' WITH MAX_USER_CONNECTIONS 1")
    db = mariadb_database.rsplit("/", 1)[1]
    host = mariadb_database.split("@", 1)[1].split("/", 1)[0]
    held = pymysql.connect(
        host=host.split(":")[0],
        port=int(host.split(":")[1]),
        user=account,
        password=PASSWORD,
        database=db,
    )
    try:
        src = MariaDBSource({"dsn": _dsn(mariadb_database, user=account), "password": PASSWORD})
        with pytest.raises(SourceUnavailable) as limited:
            src.check()
    finally:
        held.close()
    assert limited.value.transient
    assert "MAX_USER_CONNECTIONS <n>" in (limited.value.hint or ""), limited.value.hint
    assert "host, port" not in (limited.value.hint or "")
    assert PASSWORD not in _shown(limited.value)
