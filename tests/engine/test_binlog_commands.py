"""`combined check`, `cdc setup`, `status`, `follow` and `teardown` on a MariaDB binlog source."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from tests.engine._binlog import Binlog, lake

from combined import cdc
from combined.engine import Engine


def test_status_shows_the_retention_and_how_long_to_stay_down(binlog: Binlog) -> None:
    """`cdc status` reports the committed position, the server's retention and the margin.

    Before this change `cdc status` knew only replication slots (and `status` showed a binlog
    dataset's "slot" as all nulls).
    """
    ((old,),) = binlog.sql("SELECT @@binlog_expire_logs_seconds")
    engine = Engine.open(binlog.project())
    try:
        engine.capture()
        binlog.sql("SET GLOBAL binlog_expire_logs_seconds = 86400")
        (status,) = cdc.status(engine, "db")
        assert status["committed_position"] == binlog.checkpoint()["binlog"]
        assert status["retention_seconds"] == 86400
        assert status["committed_retained"] is True
        assert 0 < status["may_stay_down_seconds"] <= 86400
        (row,) = engine.status()
        assert row["slot"]["retention_seconds"] == 86400
        assert row["slot"]["committed_retained"] is True
        assert "binlog" in cdc.setup(engine, "db")[0][0]
    finally:
        binlog.sql(f"SET GLOBAL binlog_expire_logs_seconds = {int(old)}")
        engine.close()


def test_check_names_each_missing_grant_and_setting_with_its_fix(
    binlog: Binlog, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`combined check` on a cdc source verifies the binlog preconditions and names the fix.

    Before this change `check` only connected, and the missing grants surfaced mid-capture.
    """
    from combined.errors import ConfigError

    user, password = f"cdc_{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
    database = binlog.dsn.rsplit("/", 1)[1]
    binlog.sql(
        f"CREATE USER '{user}'@'%' IDENTIFIED BY '{password}'",
        f"GRANT SELECT ON `{database}`.* TO '{user}'@'%'",
    )
    engine = Engine.open(binlog.project_as(user, password, monkeypatch))
    try:
        with pytest.raises(ConfigError) as err:
            engine.check("db")
        assert "REPLICATION SLAVE and REPLICATION CLIENT" in str(err.value)
        assert f"GRANT REPLICATION SLAVE, REPLICATION CLIENT ON *.* TO '{user}'" in (
            err.value.hint or ""
        )
        assert password not in str(err.value) + (err.value.hint or "")
        # a capture: a person must grant them (it ended "failed", exit 1: retry later)
        (run,) = engine.capture()
        assert run.state == "needs_auth", run.error
        assert "GRANT REPLICATION SLAVE, REPLICATION CLIENT" in (run.error or "")
        binlog.sql(f"GRANT REPLICATION SLAVE, REPLICATION CLIENT ON *.* TO '{user}'@'%'")
        engine.check("db")
        # those grants and SELECT are all a capture needs
        for change in ("DELETE FROM {t} WHERE id = 3", "UPDATE {t} SET qty = 0 WHERE id = 4"):
            binlog.sql(change)
            (run,) = engine.capture()
            assert run.state == "succeeded", run.error
        assert lake(engine) == binlog.source()
        with binlog.alone():
            binlog.sql("SET GLOBAL binlog_row_image = 'NOBLOB'")
            try:
                with pytest.raises(ConfigError) as err:
                    engine.check("db")
            finally:
                binlog.sql("SET GLOBAL binlog_row_image = 'FULL'")
        assert "binlog_row_image is NOBLOB" in str(err.value)
        assert "SET GLOBAL binlog_row_image = 'FULL'" in (err.value.hint or "")
    finally:
        engine.close()
        binlog.sql(f"DROP USER '{user}'@'%'")


def test_the_cdc_commands_drive_a_binlog_source(binlog: Binlog, tools: Any) -> None:
    """`combined check`, `cdc setup`, `status`, `follow` and `teardown` on a MariaDB source.

    Before this change `check` only connected, and `cdc setup` refused the mariadb connector
    ("cannot capture changes").
    """
    binlog.project()
    root = binlog.root
    ok = tools.cli(root, "check")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    setup = tools.cli(root, "cdc", "setup", "db")
    assert setup.returncode == 0, setup.stdout + setup.stderr
    assert "binary log settings and grants verified" in setup.stdout
    assert "succeeded" in setup.stdout

    binlog.sql("UPDATE {t} SET note = 'followed' WHERE id <= 10", "DELETE FROM {t} WHERE id = 11")
    follow = tools.cli(root, "cdc", "follow", "db", "--every", "0", "--iterations", "2")
    assert follow.returncode == 0, follow.stdout + follow.stderr
    status = tools.cli(root, "cdc", "status", "db", env={"COLUMNS": "200"})
    assert status.returncode == 0, status.stdout + status.stderr
    position = binlog.checkpoint()["binlog"]
    assert position in status.stdout and "may stay down" in status.stdout

    engine = Engine.open(root / "combined.yaml")
    try:
        assert lake(engine) == binlog.source()
    finally:
        engine.close()
    down = tools.cli(root, "cdc", "teardown", "db", "--yes")
    assert down.returncode == 0, down.stdout + down.stderr
    assert "checkpoint voided" in down.stdout
    again = tools.cli(root, "capture")  # a new stitched snapshot, reconciled with the lake
    assert again.returncode == 0, again.stdout + again.stderr
    assert binlog.checkpoint()["stitched"] is True
