"""Row events decoded from their bytes equal the library's decoding, type for type.

Both decoders read the same stretch of a real server's binlog: the native
one (``_binlog_decode``) and ``mysql-replication``'s rows, as every change
was read before (``library_rows=True``). Their change batches must hold the
same rows, ops and positions.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from combined.connectors.mariadb import MariaDBSource
from combined.connectors.mariadb._binlog import BinlogExtraction
from combined.connectors.mariadb._binlog_setup import position_of
from combined.connectors.mariadb._connect import Settings
from combined.errors import SchemaMismatch
from combined.protocol import OP_COLUMN, POSITION_COLUMN, RecordBatchMessage, StateMessage

COLUMNS = (
    "t TINYINT, ut TINYINT UNSIGNED, sm SMALLINT, usm SMALLINT UNSIGNED, md MEDIUMINT, "
    "umd MEDIUMINT UNSIGNED, i INT, ui INT UNSIGNED, big BIGINT, ubig BIGINT UNSIGNED, "
    "d DECIMAL(10,2), d3 DECIMAL(12,2), dl DECIMAL(30,10), dh DECIMAL(65,30), d0 DECIMAL(5,0), "
    "df DECIMAL(4,4), "
    "f FLOAT, g DOUBLE, b BIT(1), bb BIT(13), s VARCHAR(20), sl VARCHAR(300), c CHAR(5), "
    "l1 VARCHAR(10) CHARACTER SET latin1, e ENUM('a','bé','c'), st SET('x','y','z'), j JSON, "
    "vb VARBINARY(10), fb BINARY(4), bl BLOB, tx TEXT, mt MEDIUMTEXT, dt DATETIME(3), "
    "dt0 DATETIME, dt6 DATETIME(6), ts TIMESTAMP(6) NULL, ts0 TIMESTAMP NULL, "
    "ts2 TIMESTAMP(2) NULL, da DATE, tm TIME(2), tm0 TIME, tm5 TIME(5), y YEAR, u UUID, "
    "v4 INET4, v6 INET6, pt POINT NULL"
)
FULL = (
    "-128, 255, -32768, 65535, -8388608, 16777215, -2147483648, 4294967295, "
    "-9223372036854775808, 18446744073709551615, -12345678.91, -9876543210.98, "
    "-12345678901234567890.0123456789, "
    "-12345678901234567890123456789012345.123456789012345678901234567891, -99999, -0.0001, "
    "-1.5e-20, 2.5e-300, 1, 8191, 'héllo wörld 😀', REPEAT('ü', 280), 'ab', 'café', 'bé', "
    "'z,x', '{\"a\": [1, 2.5, \"é\"], \"b\": null}', x'00ff00', x'0100', x'deadbeef00', "
    "'long text ✓', REPEAT('abc', 1000), '2024-01-02 03:04:05.123', '1000-01-01 00:00:00', "
    "'9999-12-31 23:59:59.999999', '2038-01-18 03:14:07.999999', '1970-01-02 00:00:01', "
    "'2024-02-29 12:00:00.25', '2024-02-29', '12:34:56.78', '23:59:59', '00:00:00.00001', "
    "2024, '123e4567-e89b-12d3-a456-426614174000', '10.0.0.0', '2001:db8::', POINT(1, 2)"
)
OTHER = (
    "0, 0, 1, 1, 0, 0, 7, 7, 0, 0, 0.00, 0.01, 0.0000000001, 1.5, 0, 0.9999, 0, -0.0, 0, 0, "
    "'', '', "
    "'', '', 'a', '', '[]', x'', x'', x'', '', '', '1000-01-01 00:00:00.001', "
    "'2000-02-29 00:00:00', '2000-01-01 00:00:00.000001', '1970-01-02 00:00:01.000001', "
    "'2020-01-01 00:00:00', '2001-01-01 00:00:00.01', '1000-01-01', '00:00:00', '00:00:01', "
    "'00:00:00', 1901, "
    "'00000000-0000-0000-0000-000000000001', '0.0.0.1', '::1', NULL"
)


def _read(dsn: str, request: Any, *, library: bool, **config: Any) -> list[pa.RecordBatch]:
    settings = Settings.from_config({"dsn": dsn, **config})
    start = position_of(request.state)
    assert start is not None
    read = BinlogExtraction(settings, request, start=start, library_rows=library)
    out = [m.batch for m in read if isinstance(m, RecordBatchMessage)]
    assert (read.library_events > 0) if library else (read.library_events == 0)
    return out


def _logged(read: Any) -> list[pa.RecordBatch]:
    """The read's batches less the rows filled from the source after an ALTER TABLE
    (they name the columns they leave unchanged), as the log holds them."""
    out = []
    for m in read:
        if not isinstance(m, RecordBatchMessage):
            continue
        batch = m.batch
        if "_combined_unchanged" in batch.schema.names:
            batch = batch.filter(pc.is_null(batch.column("_combined_unchanged")))
            batch = batch.drop_columns(["_combined_unchanged"])
        out.append(batch)
    return out


def _here(admin: Any) -> dict[str, Any]:
    """The server's binlog position now, as a checkpoint (the POINT column has no snapshot)."""
    ((name, offset, *_),) = admin.rows("SHOW MASTER STATUS")
    return {"binlog": f"{name}:{offset}"}


@pytest.mark.usefixtures("binlog_on")
def test_the_native_decoder_equals_the_library_on_every_type(admin: Any, make_request: Any) -> None:
    """Every supported type, NULLs, negative and extreme values, a key change, a large transaction.

    Before this change every row went through the library (no ``library_rows``
    switch, no native decoder).
    """
    admin.sql(f"CREATE TABLE every (id INT PRIMARY KEY, {COLUMNS}) ENGINE=InnoDB")
    state = _here(admin)
    admin.sql(
        f"INSERT INTO every VALUES (1, {FULL}), (2, {OTHER})",
        "INSERT INTO every (id) VALUES (3)",
        "UPDATE every SET d = -d, s = 'ñ', id = 4 WHERE id = 1",
        "UPDATE every SET tx = 'x' WHERE id = 2",
        "DELETE FROM every WHERE id = 3",
        "START TRANSACTION",
        "INSERT INTO every (id, s, d, dl, ts, tx) SELECT 100 + seq, CONCAT('ß', seq), "
        "seq / 7 - 500, -seq / 3, FROM_UNIXTIME(1700000000 + seq), REPEAT('é', seq % 50) "
        "FROM seq_1_to_5000",
        "UPDATE every SET d = d + 1, d3 = -d, s = NULL WHERE id > 100",
        "COMMIT",
    )
    request = make_request("every", strategy="cdc", state=state, batch_rows=700)
    native = _read(admin.dsn, request, library=False)
    library = _read(admin.dsn, request, library=True)
    assert all(b.num_rows <= 700 for b in native)
    got, want = pa.Table.from_batches(native), pa.Table.from_batches(library)
    assert got.schema == want.schema
    assert got.num_rows == want.num_rows == 4 + 1 + 1 + 5000 + 5000 + 1
    assert got.column(POSITION_COLUMN).to_pylist() == want.column(POSITION_COLUMN).to_pylist()
    for name in got.column_names:
        assert got.column(name).to_pylist() == want.column(name).to_pylist(), name
    ops = got.column(OP_COLUMN).to_pylist()
    # (the key change: the old key's delete, then the new key's insert)
    assert ops[:7] == ["insert", "insert", "insert", "delete", "insert", "update", "delete"]
    row = got.slice(0, 1).to_pylist()[0]
    assert row["s"] == "héllo wörld 😀" and row["e"] == "bé" and row["st"] == "x,z"
    assert str(row["dh"]).startswith("-12345678901234567890123456789012345.1234")


@pytest.mark.usefixtures("binlog_on")
def test_zero_dates_years_and_timestamps_read_as_a_snapshot_reads_them(
    admin: Any, source: MariaDBSource, make_request: Any
) -> None:
    """YEAR 0000 is 0 and a zero TIMESTAMP is a zero date, in the binlog as in a snapshot.

    Before this change the library read YEAR 0000 as 1900 and a zero
    TIMESTAMP as 1970-01-01 00:00:00, which the snapshot does not.
    """
    admin.sql(
        "CREATE TABLE zy (id INT PRIMARY KEY, y YEAR, ts TIMESTAMP NULL, da DATE, "
        "dt DATETIME(2)) ENGINE=InnoDB"
    )
    values = "2, 0, '0000-00-00 00:00:00', '0000-00-00', '0000-00-00 00:00:00'"
    admin.sql("SET SESSION sql_mode = ''", f"INSERT INTO zy VALUES ({values})")
    lenient = MariaDBSource({"dsn": admin.dsn, "zero_dates": "null"})
    try:
        first = list(lenient.read(make_request("zy", strategy="cdc")))
    finally:
        lenient.close()
    (state,) = [m for m in first if isinstance(m, StateMessage)]
    snapshot = pa.Table.from_batches(
        [m.batch for m in first if isinstance(m, RecordBatchMessage)]
    ).to_pylist()
    admin.sql(f"INSERT INTO zy VALUES (1{values[1:]})")
    request = make_request("zy", strategy="cdc", state=state.state)
    (batch,) = _read(admin.dsn, request, library=False, zero_dates="null")
    (row,) = batch.to_pylist()
    assert {k: v for k, v in row.items() if not k.startswith("_")} == snapshot[0] | {"id": 1}
    assert row["y"] == 0 and row["ts"] is None and row["da"] is None and row["dt"] is None
    with pytest.raises(Exception, match="zero date"):
        _read(admin.dsn, request, library=False)


@pytest.mark.usefixtures("binlog_on")
def test_a_change_logged_before_a_type_change_goes_through_the_library(
    admin: Any, make_request: Any
) -> None:
    """A DECIMAL whose scale changed since the change was logged keeps its value.

    The log's DECIMAL(10,2) is not the catalog's DECIMAL(12,4): written into
    the new type's buffer as is, 12.34 would read 0.1234. Before this change
    there was no native decoder (no ``library_events``).
    """
    admin.sql("CREATE TABLE altered (id INT PRIMARY KEY, d DECIMAL(10,2)) ENGINE=InnoDB")
    state = _here(admin)
    admin.sql(
        "INSERT INTO altered VALUES (1, 12.34)",
        "ALTER TABLE altered MODIFY d DECIMAL(12,4)",
        "INSERT INTO altered VALUES (2, 5.6789)",
    )
    settings = Settings.from_config({"dsn": admin.dsn})
    request = make_request("altered", strategy="cdc", state=state)
    read = BinlogExtraction(settings, request, start=position_of(state) or ("", 0))
    rows = [r for b in _logged(read) for r in b.to_pylist()]
    assert [(r["id"], str(r["d"])) for r in rows] == [(1, "12.3400"), (2, "5.6789")]
    assert read.library_events == 1


#: Text columns of every charset whose bytes Python's codec of the same name misreads.
TEXTS = (
    ("u16", "VARCHAR(20) CHARACTER SET utf16"),
    ("u32", "VARCHAR(20) CHARACTER SET utf32"),
    ("u2", "VARCHAR(20) CHARACTER SET ucs2"),
    ("u16le", "VARCHAR(20) CHARACTER SET utf16le"),
    ("l1", "VARCHAR(20) CHARACTER SET latin1"),
    ("c1", "CHAR(8) CHARACTER SET latin1"),
    ("t1", "TEXT CHARACTER SET latin1"),
    ("t16", "TEXT CHARACTER SET utf16"),
    ("t32", "MEDIUMTEXT CHARACTER SET utf32"),
)
#: latin1's five bytes cp1252 leaves unassigned, among assigned ones.
LATIN1_ODD = "CONCAT('é€', CONVERT(x'818d8f909d' USING latin1))"


@pytest.mark.usefixtures("binlog_on")
def test_the_library_path_reads_every_charset_as_the_native_one(
    admin: Any, make_request: Any
) -> None:
    """Text that goes through the library (a change logged before a type change) reads right.

    Before this change the library read utf16 and utf32 in the machine's order
    ('ü' came back '\\ufc00'), kept ucs2 as bytes read as UTF-8, and failed the
    read on latin1's byte 0x81.
    """
    columns = ", ".join(f"{n} {t}" for n, t in TEXTS)
    admin.sql(f"CREATE TABLE cs (id INT PRIMARY KEY, d DECIMAL(10,2), {columns}) ENGINE=InnoDB")
    state = _here(admin)
    wide = "'ü€😀𝄞'"
    values = [wide, wide, "'ü€ÿ'", wide, LATIN1_ODD, LATIN1_ODD, LATIN1_ODD, wide, wide]
    admin.sql(
        f"INSERT INTO cs VALUES (1, 1.5, {', '.join(values)})",
        f"INSERT INTO cs VALUES (2, 2.5, {', '.join(values)})",
        "UPDATE cs SET id = 3, u16 = 'ÿ', l1 = 'Ÿ', t1 = CONVERT(x'81' USING latin1) WHERE id = 1",
        "ALTER TABLE cs MODIFY d DECIMAL(12,4)",  # the changes above: the library decodes them
        f"INSERT INTO cs VALUES (4, 4.5, {', '.join(values)})",  # this one: the native decoder
    )
    names = [n for n, _ in TEXTS]
    source = admin.rows(f"SELECT id, {', '.join(names)} FROM cs ORDER BY id")
    settings = Settings.from_config({"dsn": admin.dsn})
    request = make_request("cs", strategy="cdc", state=state)
    read = BinlogExtraction(settings, request, start=position_of(state) or ("", 0))
    got = pa.Table.from_batches(_logged(read))
    assert read.library_events == 3
    last = {r["id"]: tuple(r[n] for n in ["id", *names]) for r in got.to_pylist()}
    assert sorted(v for k, v in last.items() if k != 1) == [tuple(r) for r in source]
    assert last[2][1:] == last[4][1:]
    assert last[2][1] == "ü€😀𝄞" and last[2][5] == "é€\x81\x8d\x8f\x90\x9d"


@pytest.mark.usefixtures("binlog_on")
def test_both_paths_read_single_byte_and_east_asian_charsets_as_the_server(
    admin: Any, make_request: Any
) -> None:
    """cp1250, koi8u, eucjpms and sjis text reads as the server reads it, on both paths.

    Before this change cp1250's 0x81 failed the read, koi8u's 0x95 read '∙'
    (the server: '•'), eucjpms (no Python codec) read as UTF-8 with replacement
    characters and sjis's 0x815F as '＼' (the server: '\\').
    """
    admin.sql(
        "CREATE TABLE mb (id INT PRIMARY KEY, d DECIMAL(10,2), w VARCHAR(20) CHARACTER SET cp1250, "
        "k TEXT CHARACTER SET koi8u, e VARCHAR(20) CHARACTER SET eucjpms, "
        "s CHAR(8) CHARACTER SET sjis) ENGINE=InnoDB"
    )
    state = _here(admin)
    text = "CONVERT(X'{}' USING utf8mb4)".format("日本語 表\\".encode().hex())
    values = f"_cp1250 X'81e9', _koi8u X'95c1', {text}, {text}"
    admin.sql(
        f"INSERT INTO mb VALUES (1, 1.5, {values})",
        "ALTER TABLE mb MODIFY d DECIMAL(12,4)",  # the insert above: the library decodes it
        f"INSERT INTO mb VALUES (2, 2.5, {values})",  # this one: the native decoder
    )
    source = admin.rows("SELECT id, w, k, e, s FROM mb ORDER BY id")
    settings = Settings.from_config({"dsn": admin.dsn})
    request = make_request("mb", strategy="cdc", state=state)
    read = BinlogExtraction(settings, request, start=position_of(state) or ("", 0))
    got = pa.Table.from_batches(_logged(read)).to_pylist()
    assert read.library_events == 1
    assert [tuple(r[n] for n in ("id", "w", "k", "e", "s")) for r in got] == list(source)
    assert source[0][1:] == ("?é", "•а", "日本語 表\\", "日本語 表\\")


#: ENUM and SET columns whose labels the log carries in another charset than UTF-8.
LABELLED = (
    "e ENUM('café','x','naïve','it''s','a\\\\b','nl\\nx') CHARACTER SET latin1, "
    "s SET('A','b','ü') CHARACTER SET ucs2, "
    "r ENUM('привет','мир') CHARACTER SET cp1251, "
    "u ENUM('ok','é') CHARACTER SET utf8mb4"
)


@pytest.mark.usefixtures("binlog_on")
@pytest.mark.parametrize("library", [False, True])
def test_enum_and_set_labels_in_any_charset_read_as_the_server_writes_them(
    admin: Any, make_request: Any, library: bool
) -> None:
    """The library decodes the log's labels as UTF-8, an undecodable one as '': a latin1
    `café` landed as '' and a ucs2 `b` as '\\x00b', in every changed row, silently."""
    admin.sql(f"CREATE TABLE lab (id INT PRIMARY KEY, {LABELLED}) ENGINE=InnoDB")
    state = _here(admin)
    admin.sql(
        "INSERT INTO lab VALUES (1, 'café', 'A,b,ü', 'привет', 'é'), (2, 'x', '', 'мир', 'ok'),"
        " (3, 'it''s', 'b', NULL, NULL)",
        "UPDATE lab SET e = 'naïve', s = 'ü' WHERE id = 2",
        "UPDATE lab SET e = 'a\\\\b' WHERE id = 3",
        "INSERT INTO lab VALUES (4, 'nl\\nx', 'A', 'мир', 'ok')",
        "START TRANSACTION",
        "INSERT INTO lab VALUES (5, 'nl\\nx', 'b', 'мир', 'é')",
        "UPDATE lab SET e = 'café', s = 'A,ü' WHERE id = 4",
        "COMMIT",
        # Rows events of one table map (one statement's): its columns serve each.
        "INSERT INTO lab SELECT 100 + seq, 'café', 'b,ü', 'привет', 'é' FROM seq_1_to_3000",
    )
    source = admin.rows("SELECT id, e, s, r, u FROM lab ORDER BY id")
    request = make_request("lab", strategy="cdc", state=state)
    got = pa.Table.from_batches(_read(admin.dsn, request, library=library))
    last = {r["id"]: (r["id"], r["e"], r["s"], r["r"], r["u"]) for r in got.to_pylist()}
    assert [last[k] for k in sorted(last)] == [tuple(r) for r in source]
    assert last[1] == (1, "café", "A,b,ü", "привет", "é")
    assert last[3][1] == "a\\b" and last[5][1] == "nl\nx"
    assert last[4][1:3] == ("café", "A,ü")


def test_a_column_types_labels_read_as_the_server_writes_them(admin: Any) -> None:
    from combined.connectors.mariadb._binlog_decode import column_labels

    labels = ["it's", "a\\b", "nl\nx", "cr\rx", "tab\tx", "c,d", "(x)", "", "café"]
    quoted = ", ".join(
        "'" + label.replace("\\", "\\\\").replace("'", "''") + "'" for label in labels
    )
    quoted = quoted.replace("\n", "\\n").replace("\r", "\\r")
    admin.sql(f"CREATE TABLE lt (id INT PRIMARY KEY, e ENUM({quoted}), s SET('A', 'b'))")
    types = admin.rows(
        "SELECT COLUMN_TYPE FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = DATABASE()"
        " AND TABLE_NAME = 'lt' ORDER BY ORDINAL_POSITION"
    )
    assert [column_labels(str(t)) for (t,) in types] == [None, labels, ["A", "b"]]


@pytest.mark.usefixtures("binlog_on")
@pytest.mark.parametrize("library", [False, True])
def test_labels_a_change_was_logged_with_stand_after_the_column_changes_them(
    admin: Any, make_request: Any, library: bool
) -> None:
    """A label inserted mid-list later shifts the table's labels: the log's own hold."""
    admin.sql(
        "CREATE TABLE moved (id INT PRIMARY KEY, e ENUM('a','b','ü') CHARACTER SET latin1)"
        " ENGINE=InnoDB"
    )
    state = _here(admin)
    admin.sql(
        "INSERT INTO moved VALUES (1, 'b'), (2, 'a')",
        "ALTER TABLE moved MODIFY e ENUM('a','x','b','ü') CHARACTER SET latin1",
    )
    got = pa.Table.from_batches(_logged(_labelled_read(admin, make_request, state, library)))
    assert sorted((r["id"], r["e"]) for r in got.to_pylist()) == [(1, "b"), (2, "a")]
    # An undecodable label ('ü') at a place the table's labels no longer agree with: refused.
    admin.sql("DROP TABLE moved")
    admin.sql(
        "CREATE TABLE moved (id INT PRIMARY KEY, e ENUM('a','ü') CHARACTER SET latin1)"
        " ENGINE=InnoDB"
    )
    state = _here(admin)
    admin.sql(
        "INSERT INTO moved VALUES (1, 'ü')",
        "ALTER TABLE moved MODIFY e ENUM('ü','a') CHARACTER SET latin1",
    )
    with pytest.raises(SchemaMismatch, match="cannot be read in that charset"):
        _logged(_labelled_read(admin, make_request, state, library))


def _labelled_read(admin: Any, make_request: Any, state: Any, library: bool) -> Any:
    settings = Settings.from_config({"dsn": admin.dsn})
    request = make_request("moved", strategy="cdc", state=state)
    start = position_of(state)
    assert start is not None
    return BinlogExtraction(settings, request, start=start, library_rows=library)
