"""Servers whose binary log leaves out changes of a captured table, silently.

A filter by database (``binlog_do_db``, ``binlog_ignore_db``), and a replica
that does not log what it applies (``log_slave_updates`` off, MariaDB's
default). These are server options (no ``SET GLOBAL``), so each test starts
private MariaDB servers of its own, on free ports of 127.0.0.1, and stops
them afterwards: the shared server is never restarted.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pymysql
import pytest

from combined.engine import Engine
from combined.errors import ConfigError

PROJECT = """\
version: 1
lake: ./lake
sources:
  db:
    connector: mariadb
    config:
      dsn: mysql://root@127.0.0.1:{port}/shop
    datasets:
      items:
        relation: {relation}
        key: [id]
        strategy: cdc
"""


def _binary(name: str) -> str | None:
    return shutil.which(name) or shutil.which(name, path="/usr/sbin:/usr/local/sbin")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PrivateServer:
    """A MariaDB started for one test, with a row-based binlog and extra options."""

    def __init__(self, root: Path, options: list[str]) -> None:
        from tests.conftest import REQUIRE

        server, install = _binary("mariadbd"), _binary("mariadb-install-db")
        if server is None or install is None:
            message = "mariadbd and mariadb-install-db are needed to start a private server"
            if REQUIRE:
                pytest.fail(message)
            pytest.skip(message)
        data = root / "data"
        user = ["--user=root"] if os.geteuid() == 0 else []
        subprocess.run(
            [install, "--no-defaults", f"--datadir={data}", *user,
             "--auth-root-authentication-method=normal"],
            check=True, capture_output=True,
        )  # fmt: skip
        self.port = _free_port()
        self.log = (root / "server.log").open("wb")
        self.process = subprocess.Popen(
            [server, "--no-defaults", f"--datadir={data}", *user, f"--port={self.port}",
             "--bind-address=127.0.0.1", f"--socket={root / 'sock'}",
             f"--pid-file={root / 'pid'}", "--log-bin=mysql-bin", "--binlog-format=ROW",
             "--binlog-row-metadata=FULL", "--server-id=1", "--innodb-buffer-pool-size=16M",
             *options],
            stdout=subprocess.DEVNULL, stderr=self.log,
        )  # fmt: skip
        deadline = time.monotonic() + 60
        while True:
            try:
                self.sql("SELECT 1")
                return
            except pymysql.err.OperationalError:
                if time.monotonic() > deadline or self.process.poll() is not None:
                    self.stop()
                    raise
                time.sleep(0.2)

    def sql(self, *statements: str) -> list[tuple[Any, ...]]:
        conn = pymysql.connect(host="127.0.0.1", port=self.port, user="root", autocommit=True)
        out: list[tuple[Any, ...]] = []
        with conn, conn.cursor() as cur:
            for statement in statements:
                cur.execute(statement)
                out = list(cur.fetchall())
        return out

    def replicate(self, primary: PrivateServer) -> None:
        """Replicate ``primary`` from its log's start."""
        self.sql(
            f"CHANGE MASTER TO MASTER_HOST='127.0.0.1', MASTER_PORT={primary.port}, "
            "MASTER_USER='root', MASTER_USE_GTID=no",
            "START SLAVE",
        )

    def caught_up(self, query: str, rows: list[tuple[Any, ...]]) -> None:
        """Wait until the replica's ``query`` gives ``rows``."""
        deadline = time.monotonic() + 30
        while self.sql(query) != rows:
            assert time.monotonic() < deadline, f"the replica did not catch up: {self.sql(query)}"
            time.sleep(0.1)

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(60)
        self.log.close()


Start = Callable[..., PrivateServer]


@pytest.fixture
def private(tmp_path: Path) -> Iterator[Start]:
    """Start private servers with options (``private("--binlog-do-db=x")``); stopped after."""
    servers: list[PrivateServer] = []

    def start(*options: str) -> PrivateServer:
        servers.append(PrivateServer(tmp_path / f"server{len(servers)}", list(options)))
        return servers[-1]

    yield start
    for s in servers:
        s.stop()


def _engine(root: Path, server: PrivateServer, relation: str) -> Engine:
    path = root / "combined.yaml"
    path.write_text(PROJECT.format(port=server.port, relation=relation))
    return Engine.open(path)


@pytest.mark.parametrize(
    ("option", "said"),
    [
        ("--binlog-ignore-db=shop", "leaves database shop out"),
        ("--binlog-do-db=other", "leaves database shop out"),
        ("--binlog-do-db=shop", "is not logged"),  # TRUNCATE from another default database
        ("--binlog-ignore-db=other", "is not logged"),
    ],
)
def test_a_binlog_filter_is_refused_by_check_and_capture_naming_the_fix(
    private: Start, tmp_path: Path, option: str, said: str
) -> None:
    """Before, `check` passed and every capture succeeded while the server logged nothing
    of the database (its rows), or nothing of a TRUNCATE run from another default database:
    the lake kept rows the source no longer had."""
    server: PrivateServer = private(option)
    server.sql(
        "CREATE DATABASE shop",
        "CREATE DATABASE other",
        "CREATE TABLE shop.t (id INT PRIMARY KEY, v INT) ENGINE=InnoDB",
        "INSERT INTO shop.t VALUES (1, 1), (2, 2)",
    )
    engine = _engine(tmp_path, server, "t")
    try:
        with pytest.raises(ConfigError) as err:
            engine.check("db")
        assert said in str(err.value)
        assert option.lstrip("-").replace("-", "_") in str(err.value)
        assert "remove every binlog_do_db and binlog_ignore_db line" in (err.value.hint or "")
        (run,) = engine.capture()
        assert run.state != "succeeded"
        assert said in (run.error or "")
    finally:
        engine.close()


def test_without_a_filter_the_private_server_captures(private: Start, tmp_path: Path) -> None:
    """The refusal is the filter's: the same server without one passes and captures."""
    server: PrivateServer = private()
    server.sql(
        "CREATE DATABASE shop",
        "CREATE TABLE shop.t (id INT PRIMARY KEY, v INT) ENGINE=InnoDB",
        "INSERT INTO shop.t VALUES (1, 1), (2, 2)",
    )
    engine = _engine(tmp_path, server, "t")
    try:
        engine.check("db")
        (run,) = engine.capture()
        assert run.state == "succeeded", run.error
        server.sql("TRUNCATE TABLE shop.t")
        (run,) = engine.capture()
        assert run.state == "succeeded", run.error
        assert engine.sql("SELECT count(*) AS n FROM db.items").column("n")[0].as_py() == 0
    finally:
        engine.close()


ROWS = "SELECT id, v FROM shop.t ORDER BY id"


def _replicated(private: Start, *options: str) -> tuple[PrivateServer, PrivateServer]:
    primary = private()
    replica = private("--server-id=2", *options)
    replica.replicate(primary)
    primary.sql(
        "CREATE DATABASE shop",
        "CREATE TABLE shop.t (id INT PRIMARY KEY, v INT) ENGINE=InnoDB",
        "INSERT INTO shop.t VALUES (1, 1), (2, 2)",
    )
    replica.caught_up(ROWS, [(1, 1), (2, 2)])
    return primary, replica


def test_a_replica_that_does_not_log_what_it_applies_is_refused(
    private: Start, tmp_path: Path
) -> None:
    """Before, `check` passed and every capture from such a replica succeeded with no change:
    its tables held the primary's deletes and inserts, its binlog none of them."""
    _, replica = _replicated(private)
    engine = _engine(tmp_path, replica, "t")
    try:
        with pytest.raises(ConfigError) as err:
            engine.check("db")
        assert "replica with log_slave_updates=OFF" in str(err.value)
        assert "add log_slave_updates=ON" in (err.value.hint or "")
        (run,) = engine.capture()
        assert run.state != "succeeded"
        assert "log_slave_updates=OFF" in (run.error or "")
    finally:
        engine.close()


def test_a_replica_that_logs_what_it_applies_captures_the_primarys_changes(
    private: Start, tmp_path: Path
) -> None:
    """With log_slave_updates on, the replica's binlog holds what it applied."""
    primary, replica = _replicated(private, "--log-slave-updates")
    engine = _engine(tmp_path, replica, "t")
    try:
        engine.check("db")
        (run,) = engine.capture()
        assert run.state == "succeeded", run.error
        primary.sql("DELETE FROM shop.t WHERE id = 1", "INSERT INTO shop.t VALUES (3, 3)")
        replica.caught_up(ROWS, [(2, 2), (3, 3)])
        (run,) = engine.capture()
        assert run.state == "succeeded", run.error
        lake = engine.sql("SELECT id, v FROM db.items ORDER BY id").to_pylist()
        assert [(r["id"], r["v"]) for r in lake] == [(2, 2), (3, 3)]
    finally:
        engine.close()
