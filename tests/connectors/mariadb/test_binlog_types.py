"""Binlog change rows are typed exactly as snapshot rows of the same table are."""

from __future__ import annotations

from typing import Any

import pytest

from combined.connectors.mariadb import MariaDBSource
from combined.errors import SchemaMismatch
from combined.protocol import OP_COLUMN, RecordBatchMessage, StateMessage

COLUMNS = (
    "q INT UNSIGNED, big BIGINT UNSIGNED, d DECIMAL(10,2), f FLOAT, g DOUBLE, b BIT(1), "
    "bb BIT(5), s VARCHAR(20), e ENUM('a','b'), st SET('x','y','z'), j JSON, "
    "bin VARBINARY(10), dt DATETIME(3), ts TIMESTAMP(6) NULL, da DATE, tm TIME(2), y YEAR, "
    "tx TEXT, u UUID, n INT, fb BINARY(4), v4 INET4"
)
VALUES = (
    "4000000000, 18446744073709551615, -12.34, 0.1, 2.5e-300, 1, 5, 'héllo', 'b', 'z,x', "
    "'{\"a\": [1, 2]}', x'00ff', '2024-01-02 03:04:05.123', '2024-01-02 03:04:05.123456', "
    "'2024-01-02', '12:34:56.78', 2024, 'long text', '123e4567-e89b-12d3-a456-426614174000', "
    "NULL, x'0100', '10.0.0.0'"
)


def _rows(messages: list[Any]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for m in messages:
        if isinstance(m, RecordBatchMessage):
            out += m.batch.to_pylist()
    return out


@pytest.mark.usefixtures("binlog_on")
def test_a_change_row_has_the_snapshot_types_and_values(
    admin: Any, source: MariaDBSource, make_request: Any
) -> None:
    """Every mapped type, and an empty SET, read the same from the binlog as from a snapshot.

    The log drops the trailing zero bytes of a UUID (this one ends in 00), a
    BINARY(n) or an INET4: they are restored.

    Before this change the mariadb connector refused ``strategy: cdc`` outright.
    """
    admin.sql(
        f"CREATE TABLE typed (id INT PRIMARY KEY, {COLUMNS}) ENGINE=InnoDB",
        f"INSERT INTO typed VALUES (1, {VALUES})",
        "INSERT INTO typed (id, st) VALUES (2, '')",
    )
    first = list(source.read(make_request("typed", strategy="cdc")))
    (state,) = [m for m in first if isinstance(m, StateMessage)]
    snapshot = {r["id"]: r for r in _rows(first)}
    admin.sql(
        f"INSERT INTO typed VALUES (11, {VALUES})",
        "INSERT INTO typed (id, st) VALUES (12, '')",
    )
    changes = list(source.read(make_request("typed", strategy="cdc", state=state.state)))
    batch = next(m.batch for m in changes if isinstance(m, RecordBatchMessage))
    snap_batch = next(m.batch for m in first if isinstance(m, RecordBatchMessage))
    for field in snap_batch.schema:
        assert batch.schema.field(field.name).type == field.type, field.name
    streamed = {r["id"] - 10: r for r in _rows(changes)}
    for key in (1, 2):
        got = {k: v for k, v in streamed[key].items() if k != "id" and not k.startswith("_")}
        want = {k: v for k, v in snapshot[key].items() if k != "id"}
        assert got == want
        assert streamed[key][OP_COLUMN] == "insert"


@pytest.mark.usefixtures("binlog_on")
def test_a_zero_date_in_the_binlog_follows_zero_dates(
    admin: Any, source: MariaDBSource, make_request: Any
) -> None:
    """A zero date in a change is refused by default, as a snapshot refuses it; null on request.

    Before this change the mariadb connector refused ``strategy: cdc`` outright.
    """
    admin.sql("CREATE TABLE zd (id INT PRIMARY KEY, da DATE) ENGINE=InnoDB")
    first = list(source.read(make_request("zd", strategy="cdc")))
    (state,) = [m for m in first if isinstance(m, StateMessage)]
    admin.sql("SET SESSION sql_mode = ''", "INSERT INTO zd VALUES (1, '0000-00-00')")
    with pytest.raises(SchemaMismatch, match="zero date"):
        list(source.read(make_request("zd", strategy="cdc", state=state.state)))
    lenient = MariaDBSource({"dsn": admin.dsn, "zero_dates": "null"})
    rows = _rows(list(lenient.read(make_request("zd", strategy="cdc", state=state.state))))
    assert [(r["id"], r["da"]) for r in rows] == [(1, None)]
