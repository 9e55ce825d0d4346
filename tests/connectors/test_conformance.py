"""Every built-in connector passes the conformance suite a third-party connector runs.

Each class below gives :class:`~combined.testing.conformance.SourceConformance`
one connector over a real source (a SQLite file, a PostgreSQL and a MariaDB
database, a directory of CSV files, an HTTP API on 127.0.0.1, a Singer tap and
an Airbyte source run as programs) holding ``ROWS`` rows.
"""

from __future__ import annotations

import json
import sqlite3
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.connectors.airbyte.fixtures import SOURCES
from tests.connectors.http.fake_api import FakeAPI, order, serve
from tests.connectors.singer.fixtures import TAPS
from tests.echo_postgres import echoing_postgres

from combined.connectors.abc import CursorSpec
from combined.testing.conformance import ConformanceCase, SourceConformance

ROWS = 50
BAD = "refused-Secret-2c8e4d"
GOOD = "accepted-Token-7b1f9a"


class TestSQLite(SourceConformance):
    @pytest.fixture
    def case(self, tmp_path: Path) -> ConformanceCase:
        from combined.connectors.sqlite import SQLiteSource

        con = sqlite3.connect(tmp_path / "shop.db")
        con.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY, status TEXT, u INTEGER)")
        con.executemany("INSERT INTO orders VALUES (?, ?, ?)", [(i, "x", i) for i in range(ROWS)])
        con.commit()
        con.close()
        return ConformanceCase(
            connector=SQLiteSource,
            config={"path": str(tmp_path / "shop.db")},
            relation="orders",
            key=("id",),
            rows=ROWS,
            cursor=CursorSpec("u", lookback=0, trust="test: u only grows"),
        )


class TestPostgres(SourceConformance):
    @pytest.fixture
    def case(self, pg_database: str) -> Iterator[ConformanceCase]:
        import psycopg

        from combined.connectors.postgres import PostgresSource

        with psycopg.connect(pg_database, autocommit=True) as conn:
            conn.execute("CREATE TABLE orders (id int PRIMARY KEY, status text, u int NOT NULL)")
            conn.execute(
                "INSERT INTO orders SELECT i, 'x', i FROM generate_series(1, %s) i", [ROWS]
            )
        port, thread = echoing_postgres(connections=2)
        yield ConformanceCase(
            connector=PostgresSource,
            config={"dsn": pg_database, "password": GOOD},
            relation="public.orders",
            key=("id",),
            rows=ROWS,
            secrets=(GOOD, BAD),
            # A server that echoes the password it was sent in its refusal.
            bad_config={"dsn": f"postgresql://app@127.0.0.1:{port}/app", "password": BAD},
            cursor=CursorSpec("u", lookback=0, trust="test: u only grows"),
        )
        thread.join(timeout=0.1)


class TestMariaDB(SourceConformance):
    @pytest.fixture
    def case(self, mariadb_database: str) -> ConformanceCase:
        import pymysql

        from combined.connectors.mariadb import MariaDBSource
        from combined.connectors.mariadb._connect import Settings

        kwargs = Settings.from_config({"dsn": mariadb_database}).connect_kwargs()
        with pymysql.connect(**kwargs) as conn, conn.cursor() as cur:
            cur.execute("DROP TABLE IF EXISTS conformance")
            cur.execute(
                "CREATE TABLE conformance (id int PRIMARY KEY, status text, u int NOT NULL)"
            )
            cur.executemany(
                "INSERT INTO conformance VALUES (%s, 'x', %s)", [(i, i) for i in range(ROWS)]
            )
            conn.commit()
        return ConformanceCase(
            connector=MariaDBSource,
            config={"dsn": mariadb_database},
            relation="conformance",
            key=("id",),
            rows=ROWS,
            secrets=(BAD,),
            bad_config={"dsn": mariadb_database, "password": BAD},
            cursor=CursorSpec("u", lookback=0, trust="test: u only grows"),
        )


class TestFiles(SourceConformance):
    @pytest.fixture
    def case(self, tmp_path: Path) -> ConformanceCase:
        from combined.connectors.files import FilesSource

        (tmp_path / "orders").mkdir()
        for part in range(2):
            lines = [f"{i},x" for i in range(part * ROWS // 2, (part + 1) * ROWS // 2)]
            (tmp_path / "orders" / f"{part}.csv").write_text("id,status\n" + "\n".join(lines))
        return ConformanceCase(
            connector=FilesSource,
            config={"path": str(tmp_path), "files": {"orders": {"glob": "orders/*.csv"}}},
            relation="orders",
            key=("id",),
            rows=ROWS,
        )


class TestHTTP(SourceConformance):
    @pytest.fixture
    def case(self) -> Iterator[ConformanceCase]:
        from combined.connectors.http import HTTPSource

        for api in serve():
            for i in range(1, ROWS + 1):
                api.orders[i] = order(i, day=1 + i % 28)
            endpoint = {
                "path": "/orders/page",
                "records": "data.items",
                "paginate": {"style": "page", "param": "page", "size_param": "per_page", "size": 7},
            }
            yield ConformanceCase(
                connector=HTTPSource,
                config=_http_config(api, api.token, endpoint),
                relation="orders",
                key=("id",),
                rows=ROWS,
                secrets=(api.token, BAD),
                bad_config=_http_config(api, BAD, endpoint),
            )


def _http_config(api: FakeAPI, token: str, endpoint: dict[str, Any]) -> dict[str, Any]:
    return {
        "base_url": api.base_url,
        "auth": {"type": "bearer", "token": token},
        "endpoints": {"orders": endpoint},
    }


def _program_case(connector: Any, program: Path, tmp_path: Path) -> ConformanceCase:
    """A Singer tap or Airbyte source (a real program) over ``ROWS`` users."""
    users = [{"id": i, "name": f"u{i}", "updated_at": "2024-05-01T10:00:00Z"} for i in range(ROWS)]
    data = tmp_path / "data.json"
    data.write_text(json.dumps({"expected_token": GOOD, "users": users, "events": []}))

    def config(token: str) -> dict[str, Any]:
        return {
            "command": [sys.executable, str(program)],
            "config": {"data_file": str(data), "api_token": token},
        }

    return ConformanceCase(
        connector=connector,
        config=config(GOOD),
        relation="users",
        key=("id",),
        rows=ROWS,
        secrets=(GOOD, BAD),
        bad_config=config(BAD),
    )


class TestSinger(SourceConformance):
    @pytest.fixture
    def case(self, tmp_path: Path) -> ConformanceCase:
        from combined.connectors.singer import SingerSource

        return _program_case(SingerSource, TAPS / "good_tap.py", tmp_path)


class TestAirbyte(SourceConformance):
    @pytest.fixture
    def case(self, tmp_path: Path) -> ConformanceCase:
        from combined.connectors.airbyte import AirbyteSource

        return _program_case(AirbyteSource, SOURCES / "good_source.py", tmp_path)
