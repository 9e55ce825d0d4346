"""A checkpoint names which binary log it was read from, not its file and offset alone.

Reproduction (a MariaDB review): after `RESET MASTER` and three `FLUSH BINARY
LOGS`, four inserts put an event boundary of the new `mysql-bin.000004` at
the checkpoint's 1091: the capture succeeded from there, three rows lost for
good. These tests make the other history by rewriting what the checkpoint
recorded of its log (a real `RESET MASTER` would end every other test's
stream on the shared server).
"""

from __future__ import annotations

from typing import Any

import pytest
from tests.engine._binlog import Binlog, lake

from combined.connectors.abc import ReadRequest
from combined.connectors.mariadb._binlog import BinlogExtraction
from combined.connectors.mariadb._binlog_setup import BinlogGone
from combined.connectors.mariadb._connect import Settings
from combined.engine import Engine


def _read(binlog: Binlog, state: dict[str, Any]) -> list[Any]:
    settings = Settings.from_config({"dsn": binlog.dsn})
    request = ReadRequest(
        dataset="items", relation=binlog.table, key=("id",), strategy="cdc", state=state
    )
    name, _, offset = str(state["binlog"]).rpartition(":")
    extraction = BinlogExtraction(settings, request, start=(name, int(offset)))
    try:
        return list(extraction)
    finally:
        extraction.finish("abort")


def test_a_checkpoint_records_its_log_and_a_read_from_another_log_fails(binlog: Binlog) -> None:
    stitched = binlog.first_state()
    assert "log" in stitched  # the GTID list its file starts with
    assert stitched["created"] > 1_600_000_000  # and when it was created
    binlog.sql("UPDATE {t} SET qty = 0 WHERE id = 1")
    engine = Engine.open(binlog.project())
    try:
        (run,) = engine.capture()
        assert run.state == "succeeded", run.error
        read = binlog.checkpoint()
        name = str(read["binlog"]).rpartition(":")[0]
        ((_, start, kind, _, _, info),) = binlog.sql(
            f"SHOW BINLOG EVENTS IN '{name}' FROM {read['gtid_at']} LIMIT 1"
        )
        assert (start, kind) == (read["gtid_at"], "Gtid") and info.endswith(read["gtid"])
        assert read["log"] == stitched["log"] or name != stitched["binlog"].rpartition(":")[0]

        assert _read(binlog, read)  # the log it was read from: read on
        for other in (
            {**read, "gtid": "0-1-987654321"},
            {**read, "log": "[0-77-5]"},
            {**read, "created": read["created"] - 5},  # (begun again: RESET MASTER)
        ):
            with pytest.raises(BinlogGone) as info_:
                _read(binlog, other)
            told = info_.value.message
            assert "is not the log the lake's checkpoint was read from" in told, told
            assert "combined cdc teardown" in (info_.value.hint or "")
        # (a checkpoint of an older version, without these: its position alone is checked)
        older = {k: v for k, v in read.items() if k not in ("log", "gtid", "gtid_at", "created")}
        assert _read(binlog, older)
        assert lake(engine) == binlog.source()
    finally:
        engine.close()
