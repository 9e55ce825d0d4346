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


def _resume_from(engine: Engine, checkpoint: dict[str, Any]) -> None:
    """Make ``checkpoint`` the lake's committed one (a lake commit, as a capture's)."""
    from combined.runtime._project import commit_checkpoint

    run_id = f"test-{uuid.uuid4().hex[:8]}"
    assert commit_checkpoint(
        engine.catalog, engine.layout, "db", "items", checkpoint, run_id=run_id
    )


def test_check_refuses_a_resumed_position_the_server_no_longer_holds(
    binlog: Binlog, tools: Any
) -> None:
    """`combined check` tells a committed position purged or in another log, with the fix.

    Before this change `check` passed (the MariaDB connector ignored the committed
    checkpoints) and only the next capture ended ``needs_review``. Simulated by checkpoints
    naming a binlog file the server lacks, a GTID it never logged there, another log's
    first GTIDs and another creation time (purging the shared server's logs or RESET MASTER
    would end every other test's stream).
    """
    from combined.connectors.mariadb._binlog_setup import BinlogGone

    engine = Engine.open(binlog.project())
    try:
        engine.capture()
        binlog.sql("UPDATE {t} SET qty = 0 WHERE id = 1")
        (run,) = engine.capture()  # (a checkpoint with the GTID read before its position)
        assert run.state == "succeeded", run.error
        read = binlog.checkpoint()
        assert read["gtid"] and read["log"] and read["created"]
        engine.check("db")
        name, _, offset = str(read["binlog"]).rpartition(":")
        for other, said in (
            ({**read, "binlog": f"{name}9:{offset}"}, "is no longer on the server"),
            ({**read, "gtid": "0-1-987654321"}, "is not the log the lake's checkpoint"),
            ({**read, "log": "[0-77-5]"}, "is not the log the lake's checkpoint"),
            ({**read, "created": read["created"] - 5}, "is not the log the lake's checkpoint"),
        ):
            _resume_from(engine, other)
            with pytest.raises(BinlogGone) as err:
                engine.check("db")
            assert said in err.value.message, err.value.message
            assert binlog.table in err.value.message
            assert "`combined cdc teardown <source>` then `combined cdc setup <source>`" in (
                err.value.hint or ""
            )
        _resume_from(engine, {**read, "binlog": f"{name}9:{offset}"})
        told = tools.cli(binlog.root, "check", env={"COLUMNS": "300"})
        assert told.returncode == 1, told.stdout + told.stderr
        assert "fail db:" in told.stdout and "is no longer on the server" in told.stdout
        assert "combined cdc teardown" in told.stdout
        (run,) = engine.capture()  # what the capture and `cdc status` tell alike
        assert run.state == "needs_review" and "is no longer on the server" in (run.error or "")
        (status,) = cdc.status(engine, "db")
        assert status["committed_retained"] is False and status["may_stay_down_seconds"] == 0
        _resume_from(engine, read)
        engine.check("db")  # the position held again: nothing to tell
        (run,) = engine.capture()
        assert run.state == "succeeded", run.error
        assert lake(engine) == binlog.source()
    finally:
        engine.close()
