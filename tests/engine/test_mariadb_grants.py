"""`combined check` warns of a MariaDB table read through column grants alone.

The server hides from an account every column it holds no grant on: a
dataset without `columns:` read the granted ones and succeeded, the others
missing from the lake, and `check` said nothing.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pymysql
import pytest

from combined.connectors.mariadb._connect import Settings
from combined.engine import Engine

#: Each dataset's table (``{p}_<table>``) and the columns it lists (None: every column).
DATASETS: dict[str, tuple[str, list[str] | None]] = {
    "part": ("part", None),
    "listed": ("part", ["id", "qty"]),
    "every": ("every", None),
    "insert": ("insert", None),
    "whole": ("whole", None),
}


class Account:
    """Tables of the test database, and an account granted some of their columns."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.database = dsn.rsplit("/", 1)[1]
        self.prefix = f"cg_{uuid.uuid4().hex[:8]}"
        self.user, self.password = self.prefix, uuid.uuid4().hex

    def sql(self, *statements: str) -> None:
        kwargs = Settings.from_config({"dsn": self.dsn}).connect_kwargs()
        kwargs.pop("conv")
        kwargs.pop("cursorclass")
        with pymysql.connect(**kwargs) as conn, conn.cursor() as cur:
            for statement in statements:
                cur.execute(statement.format(p=self.prefix, db=self.database, u=self.user))

    def project(self, root: Path) -> Path:
        """The project reading each of :data:`DATASETS` as the account (JSON is YAML)."""
        datasets = {
            name: {"relation": f"{self.prefix}_{table}", "key": ["id"]}
            | ({"columns": columns} if columns else {})
            for name, (table, columns) in DATASETS.items()
        }
        config = {
            "dsn": f"mysql://{self.user}@{self.dsn.split('@', 1)[1]}",
            "password": {"secret": "env:COMBINED_TEST_GRANTS_PASSWORD"},
        }
        source = {"connector": "mariadb", "config": config, "datasets": datasets}
        path = root / "combined.yaml"
        path.write_text(json.dumps({"version": 1, "lake": "./lake", "sources": {"db": source}}))
        return path


@pytest.fixture
def account(mariadb_database: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Account]:
    a = Account(mariadb_database)
    monkeypatch.setenv("COMBINED_TEST_GRANTS_PASSWORD", a.password)
    tables = ("part", "every", "insert", "whole")
    a.sql(
        "CREATE TABLE {p}_part (id INT PRIMARY KEY, qty INT, note TEXT, secret TEXT)",
        "INSERT INTO {p}_part VALUES (1, 2, 'n', 's')",
        "CREATE TABLE {p}_every (id INT PRIMARY KEY, qty INT)",
        "CREATE TABLE {p}_insert (id INT PRIMARY KEY, qty INT, note TEXT)",
        "CREATE TABLE {p}_whole (id INT PRIMARY KEY, qty INT)",
        f"CREATE USER '{a.user}'@'%' IDENTIFIED BY '{a.password}'",
    )
    try:
        a.sql(
            "GRANT SELECT (id, qty) ON `{db}`.`{p}_part` TO '{u}'@'%'",
            "GRANT SELECT (id, qty) ON `{db}`.`{p}_every` TO '{u}'@'%'",
            "GRANT INSERT, SELECT (id) ON `{db}`.`{p}_insert` TO '{u}'@'%'",
            "GRANT SELECT ON `{db}`.`{p}_whole` TO '{u}'@'%'",
        )
        yield a
    finally:
        a.sql(
            "DROP USER IF EXISTS '{u}'@'%'",
            *(f"DROP TABLE IF EXISTS {{p}}_{t}" for t in tables),
        )


def test_check_warns_of_columns_hidden_by_column_grants(
    account: Account, tmp_path: Path, tools: Any
) -> None:
    engine = Engine.open(account.project(tmp_path))
    try:
        warned: list[str] = []
        engine.check("db", warned.append)  # a warning, not a failure
        told = {w.split(":", 1)[0]: w for w in warned}
        assert sorted(told) == ["dataset every", "dataset insert", "dataset part"], warned
        grant = f"GRANT SELECT ON `{account.database}`.`{account.prefix}_part` TO "
        assert grant + f"'{account.user}'@'%'" in told["dataset part"]
        assert "some columns are hidden from it" in told["dataset part"]
        assert "`columns:`" in told["dataset part"]
        assert "a column added later stays hidden" in told["dataset every"]
        assert "may not read column(s) qty, note" in told["dataset insert"]
        assert account.password not in " ".join(warned)

        (run,) = engine.capture(["db.part"])  # what the warning is about: no error, two columns
        assert run.state == "succeeded", run.error
        assert engine.sql("SELECT * FROM db.part").column_names[:2] == ["id", "qty"]
        assert "note" not in engine.sql("SELECT * FROM db.part").column_names
        (run,) = engine.capture(["db.insert"])  # the columns it sees but may not read
        assert run.state == "needs_auth", run.error
    finally:
        engine.close()
    cli = tools.cli(tmp_path, "check", env={"COLUMNS": "400"})
    assert cli.returncode == 0, cli.stdout + cli.stderr
    assert "warn db: dataset part: the account" in cli.stdout
