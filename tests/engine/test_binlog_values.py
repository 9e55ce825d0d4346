"""Values through the MariaDB binlog: charsets, zero dates, keys that repeat, dotted names."""

from __future__ import annotations

import pytest
from tests.engine._binlog import Binlog, lake

from combined.engine import Engine


def test_text_of_every_unicode_and_latin1_charset_lands_as_the_server_reads_it(
    binlog: Binlog,
) -> None:
    """UTF-16/32 and UCS-2 are big-endian in the log; latin1 is MariaDB's cp1252.

    Before this change a utf16 column read 'ü' from the log as '\\ufc00' (Python's
    utf16 took the machine's order), a utf32 or ucs2 one failed the capture, and so
    did a latin1 value holding one of cp1252's unassigned bytes (0x81).
    """
    columns = ("u16", "u32", "u2", "u16le", "l1")
    charsets = ("utf16", "utf32", "ucs2", "utf16le", "latin1")
    binlog.sql(
        "DROP TABLE {t}",
        "CREATE TABLE {t} (id INT PRIMARY KEY, "
        + ", ".join(
            f"{c} VARCHAR(20) CHARACTER SET {s}" for c, s in zip(columns, charsets, strict=True)
        )
        + ") ENGINE=InnoDB",
    )
    row = "({id}, 'ü€😀', 'ü€😀', 'ü€', 'ü€😀', CONCAT('é€', CONVERT(x'819d' USING latin1)))"
    binlog.sql("INSERT INTO {t} VALUES " + row.format(id=1))
    query = f"SELECT id, {', '.join(columns)} FROM {{}} ORDER BY id"
    engine = Engine.open(binlog.project())
    try:
        (run,) = engine.capture()
        binlog.sql(
            "INSERT INTO {t} VALUES " + row.format(id=2),
            "UPDATE {t} SET id = 3, u16 = 'ÿ', l1 = 'Ÿ' WHERE id = 1",
        )
        (run,) = engine.capture()
        assert run.state == "succeeded", run.error
        rows = engine.sql(query.format("db.items")).to_pylist()
        assert [tuple(r.values()) for r in rows] == binlog.sql(query.format("{t}"))
        assert rows[0]["u32"] == "ü€😀" and rows[0]["l1"] == "é€\x81\x9d"
    finally:
        engine.close()


def test_text_of_single_byte_and_east_asian_charsets_lands_as_the_server_reads_it(
    binlog: Binlog,
) -> None:
    """Each of a single-byte charset's bytes, and East Asian text, read from the log as a
    snapshot reads them (the server's conversion to utf8mb4).

    Before this change cp1250's 0x81 failed the capture ("'charmap' codec can't
    decode byte 0x81"); with it left out, cp866, koi8u and swe7 landed other
    characters than the snapshot's, dec8 and eucjpms (no Python codec) UTF-8
    replacement characters, and sjis's backslash the fullwidth one.
    """
    single = ("cp1250", "cp866", "koi8u", "swe7", "dec8")
    columns = (*single, "eucjpms", "sjis")
    binlog.sql(
        "DROP TABLE {t}",
        "CREATE TABLE {t} (id INT PRIMARY KEY, "
        + ", ".join(f"{c} VARCHAR(250) CHARACTER SET {c}" for c in columns)
        + ") ENGINE=InnoDB",
    )
    every = bytes(b for b in range(0x20, 0x100) if b != 0x7F).hex()
    text = "CONVERT(X'{}' USING utf8mb4)".format("日本語 表\\ ソ".encode().hex())
    values = ", ".join([*(f"_{c} X'{every}'" for c in single), text, text])
    binlog.sql(f"INSERT INTO {{t}} VALUES (1, {values})")
    query = f"SELECT id, {', '.join(columns)} FROM {{}} ORDER BY id"
    engine = Engine.open(binlog.project())
    try:
        (run,) = engine.capture()
        assert run.state == "succeeded", run.error
        binlog.sql(f"INSERT INTO {{t}} SELECT 2, {', '.join(columns)} FROM {{t}} WHERE id = 1")
        (run,) = engine.capture()
        assert run.state == "succeeded", run.error
        rows = [tuple(r.values()) for r in engine.sql(query.format("db.items")).to_pylist()]
        assert rows == binlog.sql(query.format("{t}"))
        assert rows[1][1:] == rows[0][1:]  # the log's row, the snapshot's
        assert rows[1][-1] == "日本語 表\\ ソ"
    finally:
        engine.close()


def test_zero_dates_null_as_yaml_spells_it_reads_zero_dates_as_nulls(binlog: Binlog) -> None:
    """``zero_dates: null``, as the docs and the error's hint write it, is a YAML null.

    Before this change it failed every capture: "zero_dates must be 'error' or 'null', not None".
    """
    binlog.sql(
        "SET SESSION sql_mode = ''",
        "ALTER TABLE {t} ADD COLUMN d DATE",
        "UPDATE {t} SET d = IF(id % 2 = 0, '0000-00-00', '2024-02-29')",
    )
    path = binlog.project()
    path.write_text(path.read_text().replace("      dsn:", "      zero_dates: null\n      dsn:"))
    query = "SELECT id, CAST(d AS {}) AS d FROM {} WHERE id <= 4 ORDER BY id"
    engine = Engine.open(path)
    try:
        (run,) = engine.capture()
        assert run.state == "succeeded", run.error
        binlog.sql("SET SESSION sql_mode = ''", "UPDATE {t} SET d = '0000-00-00' WHERE id = 1")
        (run,) = engine.capture()
        assert run.state == "succeeded", run.error
        lake_rows = engine.sql(query.format("varchar", "db.items")).to_pylist()
        assert [tuple(r.values()) for r in lake_rows] == [
            (1, None),
            (2, None),
            (3, "2024-02-29"),
            (4, None),
        ]
    finally:
        engine.close()


def test_the_stream_follows_the_reads_zero_dates_as_the_snapshot_does(binlog: Binlog) -> None:
    """A read's ``zero_dates`` option, which the stitched snapshot honours, the stream honours
    too: it read the source's setting alone, and the zero date the snapshot had read as NULL
    failed the next capture ("set zero_dates: null", already set)."""
    binlog.sql("ALTER TABLE {t} ADD COLUMN d DATE", "DELETE FROM {t} WHERE id > 2")
    zero = ("SET SESSION sql_mode = ''", "UPDATE {t} SET d = '0000-00-00', qty = qty + 1")
    binlog.sql(*zero)
    engine = Engine.open(binlog.project())
    try:
        for _ in range(2):  # the stitched snapshot, then the stream
            (run,) = engine.capture(read_options={"zero_dates": "null"})
            assert run.state == "succeeded", run.error
            assert lake(engine) == binlog.source()
            assert engine.sql("SELECT count(d) AS n FROM db.items").column("n")[0].as_py() == 0
            binlog.sql(*zero)
    finally:
        engine.close()


@pytest.mark.parametrize("read", ["snapshot", "stream"])
def test_zero_dates_read_as_null_in_a_cdc_key_name_the_cause(binlog: Binlog, read: str) -> None:
    """Two zero dates of a key column, NULL under ``zero_dates: null``, repeat one key, in
    the stitched snapshot or the stream: the hint names them and the setting (no cast: a
    cdc dataset takes none), not "fix the key in the source", which holds no repeat."""
    zeros = "INSERT INTO {t} VALUES (1, 1, 'a', '0000-00-00'), (2, 2, 'b', '2020-00-05')"
    binlog.sql(
        "DROP TABLE {t}",
        "CREATE TABLE {t} (id INT, qty INT, note TEXT, d DATE NOT NULL PRIMARY KEY)",
        "INSERT INTO {t} VALUES (3, 3, 'c', '2021-01-01')",
    )
    if read == "snapshot":
        binlog.sql("SET SESSION sql_mode = ''", zeros)
    path = binlog.project()
    text = path.read_text().replace("key: [id]", "key: [d]")
    path.write_text(text.replace("      dsn:", "      zero_dates: null\n      dsn:"))
    engine = Engine.open(path)
    try:
        if read == "stream":
            (run,) = engine.capture()
            assert run.state == "succeeded", run.error
            binlog.sql("SET SESSION sql_mode = ''", zeros)
        (run,) = engine.capture()
        assert run.state == "needs_review"
        error = run.error or ""
        assert "holds 1 duplicate key(s) of (d)" in error
        assert "key column 'd' holds zero dates, and zero_dates: null reads" in error
        assert "set zero_dates: error" in error
        assert "casts" not in error and "fix the key in the source" not in error
    finally:
        engine.close()


def test_a_value_a_cdc_dataset_cannot_hold_names_columns_not_a_cast(binlog: Binlog) -> None:
    """The snapshot's and the binlog's refusals named a cast, which a cdc dataset refuses."""
    binlog.sql(
        "SET SESSION sql_mode = ''",
        "ALTER TABLE {t} ADD COLUMN tm TIME, ADD COLUMN d DATE",
        "UPDATE {t} SET d = '0000-00-00' WHERE id = 3",
    )
    engine = Engine.open(binlog.project())
    try:
        (run,) = engine.capture()  # the snapshot meets the zero date
        assert "set zero_dates: null" in (run.error or "")
        assert "leave 'd' out of the dataset's `columns:`" in (run.error or "")
        binlog.sql("UPDATE {t} SET d = NULL")
        (run,) = engine.capture()
        assert run.state == "succeeded", run.error
        binlog.sql("UPDATE {t} SET tm = '30:00:00' WHERE id = 2")
        (run,) = engine.capture()  # the binlog meets the 30-hour TIME
        assert run.state == "needs_review"
        assert "leave 'tm' out of the dataset's `columns:`" in (run.error or "")
        assert "declare casts" not in (run.error or "")
    finally:
        engine.close()


def test_rows_a_nullable_unique_key_repeats_are_held_not_merged(binlog: Binlog) -> None:
    # A UNIQUE key over a nullable column lets many rows hold NULL. The
    # snapshot held such rows in quarantine; the stream merged them into one
    # lake row, the last written winning, and the run succeeded: a row lost.
    binlog.sql(
        "DROP TABLE {t}",
        "CREATE TABLE {t} (id INT NULL, qty INT, note TEXT, UNIQUE KEY (id))",
        "INSERT INTO {t} VALUES (1, 1, 'a'), (2, 2, 'b')",
    )
    engine = Engine.open(binlog.project())
    try:
        (run,) = engine.capture()
        assert run.state == "succeeded", run.error
        binlog.sql(
            "INSERT INTO {t} VALUES (NULL, 3, 'c'), (NULL, 4, 'd')",
            "UPDATE {t} SET qty = 20 WHERE id = 2",
        )
        (run,) = engine.capture()
        assert run.state == "needs_review", run.error
        assert "holds 1 duplicate key(s) of (id)" in (run.error or "")
        assert "fix the key in the source" in (run.error or "")  # (its own NULLs)
        assert lake(engine) == [(1, 1, "a"), (2, 2, "b")]  # nothing committed
        (entry,) = engine.quarantine()
        assert entry["record_count"] == 2  # the two NULL rows, not the update of id 2
        binlog.sql("DELETE FROM {t} WHERE qty = 3")
        # Read again from the same checkpoint, the stream ends with one row of
        # NULL: the delete names the row it takes (the first), not the last
        # inserted, and applies before that insert. Nothing is lost.
        (run,) = engine.capture()
        assert run.state == "succeeded", run.error
        assert (
            set(lake(engine)) == set(binlog.source()) == {(1, 1, "a"), (2, 20, "b"), (None, 4, "d")}
        )
        # A key change was the old key's delete and the new key's update,
        # which replaced the row NULL held: a row lost. It is an insert, held.
        binlog.sql("UPDATE {t} SET id = NULL WHERE id = 1")
        (run,) = engine.capture()
        assert run.state == "needs_review"
        assert "holds 1 duplicate key(s) of (id)" in (run.error or "")
        assert set(lake(engine)) == {(1, 1, "a"), (2, 20, "b"), (None, 4, "d")}
    finally:
        engine.close()


def test_statements_on_a_table_whose_name_holds_a_dot_are_followed(binlog: Binlog) -> None:
    """A TRUNCATE or an ALTER of `` `dot.items` `` was read as one of table ``items`` in
    database ``dot``: the lake kept the truncated rows, and the added column unfilled."""
    from combined.connectors.mariadb import MariaDBSource

    dotted = f"dot.{binlog.table}"
    binlog.sql(f"RENAME TABLE {{t}} TO `{dotted}`")
    binlog.table = dotted
    path = binlog.project()
    path.write_text(path.read_text().replace(f"relation: {dotted}", f"relation: '`{dotted}`'"))
    engine = Engine.open(path)
    try:
        (run,) = engine.capture()
        assert run.state == "succeeded", run.error
        binlog.sql("INSERT INTO {t} VALUES (501, 501, 'n501')", "TRUNCATE TABLE {t}")
        binlog.sql("INSERT INTO {t} VALUES (7, 7, 'after')")
        (run,) = engine.capture()
        assert run.state == "succeeded", run.error
        assert lake(engine) == binlog.source() == [(7, 7, "after")]
        binlog.sql("ALTER TABLE {t} ADD COLUMN w INT NOT NULL DEFAULT 9")
        binlog.sql("INSERT INTO {t} VALUES (8, 8, 'later', 1)")
        (run,) = engine.capture()
        assert run.state == "succeeded", run.error
        rows = engine.sql("SELECT id, w FROM db.items ORDER BY id").to_pylist()
        assert [(r["id"], r["w"]) for r in rows] == [(7, 9), (8, 1)]
    finally:
        engine.close()
    source = MariaDBSource({"dsn": binlog.dsn})
    try:
        assert source.measure_key(f"`{dotted}`", ["id"]).rows == 2
    finally:
        source.close()
