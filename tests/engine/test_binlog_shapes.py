"""Table shapes a binlog capture meets: what it refuses up front, what it reads through."""

from __future__ import annotations

import pytest
from tests.engine._binlog import Binlog, lake

from combined import cdc
from combined.engine import Engine
from combined.errors import ConfigError


@pytest.mark.parametrize("engine_name", ["Aria", "MyISAM"])
def test_a_non_transactional_table_is_refused_by_check_and_setup(
    binlog: Binlog, engine_name: str
) -> None:
    """No consistent snapshot covers it, so no binlog position can be tied to its first read.

    Before, ``combined check`` passed it, ``cdc setup`` said "verified", and the
    first capture read the table whole and then failed, and the Run's other
    datasets with it.
    """
    binlog.sql(f"ALTER TABLE {{t}} ENGINE={engine_name}")
    engine = Engine.open(binlog.project())
    try:
        with pytest.raises(ConfigError) as err:
            engine.check("db")
        assert f"uses the {engine_name} engine, which is not transactional" in str(err.value)
        assert "ENGINE=InnoDB" in (err.value.hint or "")
        with pytest.raises(ConfigError, match="not transactional"):
            cdc.setup(engine, "db")
        (run,) = engine.capture()
        assert run.state == "failed" and "not transactional" in (run.error or "")
    finally:
        engine.close()


def test_a_table_made_non_transactional_after_its_snapshot_streams_on(binlog: Binlog) -> None:
    """Only the first snapshot needs a transactional engine: the log carries the rest."""
    engine = Engine.open(binlog.project())
    try:
        (run,) = engine.capture()
        assert run.state == "succeeded", run.error
        binlog.sql("ALTER TABLE {t} ENGINE=Aria", "UPDATE {t} SET qty = -1 WHERE id = 2")
        engine.check("db")  # (the stream resumes from its checkpoint: nothing to refuse)
        (run,) = engine.capture()
        assert run.state == "succeeded", run.error
        assert lake(engine) == binlog.source()
    finally:
        engine.close()
