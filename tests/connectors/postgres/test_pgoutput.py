"""The pgoutput decoder against messages captured from a real PostgreSQL.

``data/pgoutput_v1.hex`` and ``data/pgoutput_v2_stream.hex`` hold raw
pgoutput messages (one ``<lsn> <hex>`` line each) produced by
:func:`capture_v1` and :func:`capture_v2` below. The offline tests decode the
files; the live tests (``COMBINED_TEST_PG_DSN``, ``wal_level=logical``)
capture the same scripted changes again and check them the same way.

Regenerate the files with::

    COMBINED_TEST_PG_DSN=... python tests/connectors/postgres/test_pgoutput.py
"""

from __future__ import annotations

import os
import uuid
from datetime import UTC, datetime
from pathlib import Path

import psycopg
import pytest

from combined.connectors.postgres._pgoutput import (
    Begin,
    Commit,
    Delete,
    Insert,
    LogicalMessage,
    Origin,
    PgoutputDecoder,
    PgoutputMessage,
    Relation,
    RelationCache,
    StreamAbort,
    StreamCommit,
    StreamStart,
    StreamStop,
    Truncate,
    TupleData,
    Type,
    Update,
    decode_message,
    lsn_to_text,
    pg_timestamp,
    text_to_lsn,
)
from combined.errors import ProtocolViolation, SourceError

DATA = Path(__file__).parent / "data"
V1 = DATA / "pgoutput_v1.hex"
V2 = DATA / "pgoutput_v2_stream.hex"
FIXTURE_SUFFIX = "fx"
BIG = "".join(f"{i:05d}" for i in range(1000))  # 5000 bytes, stored out of line


# -- capture (shared by the live tests and the fixture generator) -----------


def _names(suffix: str) -> dict[str, str]:
    return {
        "t": f"cdc_{suffix}_t",
        "f": f"cdc_{suffix}_f",
        "pub": f"cdc_{suffix}_pub",
        "slot": f"cdc_{suffix}_slot",
        "enum": f"cdc_{suffix}_mood",
        "origin": f"cdc_{suffix}_origin",
    }


def _peek(conn: psycopg.Connection, slot: str, *options: str) -> list[tuple[str, bytes]]:
    placeholders = ", ".join(["%s"] * len(options))
    rows = conn.execute(
        f"SELECT lsn::text, data FROM pg_logical_slot_peek_binary_changes(%s, NULL, NULL, "
        f"{placeholders})",
        (slot, *options),
    ).fetchall()
    return [(lsn, bytes(data)) for lsn, data in rows]


def _drop(conn: psycopg.Connection, n: dict[str, str]) -> None:
    conn.execute(
        "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = %s",
        (n["slot"],),
    )
    conn.execute(f"DROP PUBLICATION IF EXISTS {n['pub']}")
    conn.execute(f"DROP TABLE IF EXISTS {n['t']}, {n['f']}")
    conn.execute(f"DROP TYPE IF EXISTS {n['enum']}")


def capture_v1(dsn: str, suffix: str) -> list[tuple[str, bytes]]:
    """Run the scripted changes and return their pgoutput (version 1) messages.

    Insert; update leaving an out-of-line TOAST value unchanged; update of the
    key; delete; REPLICA IDENTITY FULL insert/update/delete; a transactional
    logical message; truncate; a column added mid-stream; a replicated-origin
    transaction.
    """
    n = _names(suffix)
    with psycopg.connect(dsn, autocommit=True) as c:
        _drop(c, n)
        try:
            c.execute(f"CREATE TYPE {n['enum']} AS ENUM ('happy', 'sad')")
            c.execute(
                f"CREATE TABLE {n['t']} (id int PRIMARY KEY, name text, big text,"
                " amount numeric(12,2), ts timestamptz, flag bool, data bytea, doc jsonb,"
                f" u uuid, d date, f float8, m {n['enum']})"
            )
            c.execute(f"ALTER TABLE {n['t']} ALTER COLUMN big SET STORAGE EXTERNAL")
            c.execute(f"CREATE TABLE {n['f']} (id int PRIMARY KEY, note text, big text)")
            c.execute(f"ALTER TABLE {n['f']} REPLICA IDENTITY FULL")
            c.execute(f"ALTER TABLE {n['f']} ALTER COLUMN big SET STORAGE EXTERNAL")
            c.execute(f"CREATE PUBLICATION {n['pub']} FOR TABLE {n['t']}, {n['f']}")
            c.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (n["slot"],))
            c.execute("SET TimeZone = 'UTC'")
            c.execute(
                f"INSERT INTO {n['t']} VALUES (1, 'one', %s, 12.34,"
                " '2024-03-01 12:00:00.123456+00', true, '\\x0001ff', '{\"a\": [1, 2]}',"
                " 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', '2024-03-01', 1.5, 'happy'),"
                " (2, NULL, 'small', -0.5, NULL, false, NULL, NULL, NULL, NULL, 'NaN', NULL)",
                (BIG,),
            )
            c.execute(f"UPDATE {n['t']} SET name = 'uno' WHERE id = 1")
            c.execute(f"UPDATE {n['t']} SET id = 20 WHERE id = 2")
            c.execute(f"DELETE FROM {n['t']} WHERE id = 20")
            with c.transaction():
                c.execute(f"INSERT INTO {n['f']} VALUES (1, 'n1', %s)", (BIG,))
                c.execute(f"UPDATE {n['f']} SET note = 'n2' WHERE id = 1")
            c.execute(f"DELETE FROM {n['f']} WHERE id = 1")
            c.execute("SELECT pg_logical_emit_message(true, 'combined.test', 'hello')")
            c.execute(f"TRUNCATE {n['t']}")
            c.execute(f"ALTER TABLE {n['t']} ADD COLUMN extra int")
            c.execute(f"INSERT INTO {n['t']} (id, name, extra) VALUES (3, 'three', 7)")
            c.execute("SELECT pg_replication_origin_create(%s)", (n["origin"],))
            try:
                c.execute("SELECT pg_replication_origin_session_setup(%s)", (n["origin"],))
                c.execute(f"INSERT INTO {n['t']} (id, name) VALUES (4, 'four')")
                c.execute("SELECT pg_replication_origin_session_reset()")
            finally:
                c.execute("SELECT pg_replication_origin_drop(%s)", (n["origin"],))
            return _peek(
                c,
                n["slot"],
                *("proto_version", "1", "publication_names", n["pub"], "messages", "true"),
            )
        finally:
            _drop(c, n)


def capture_v2(dsn: str, suffix: str) -> list[tuple[str, bytes]]:
    """A transaction larger than logical_decoding_work_mem, streamed in progress
    (version 2), one streamed and rolled back, and a small ordinary one."""
    n = _names(suffix)
    with psycopg.connect(dsn, autocommit=True) as c:
        _drop(c, n)
        try:
            c.execute(f"CREATE TABLE {n['t']} (id int PRIMARY KEY, v text)")
            c.execute(f"CREATE PUBLICATION {n['pub']} FOR TABLE {n['t']}")
            c.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (n["slot"],))
            with c.transaction():
                c.execute(f"INSERT INTO {n['t']} SELECT g, 'v' FROM generate_series(1, 700) g")
            with c.transaction(force_rollback=True):
                c.execute(f"INSERT INTO {n['t']} SELECT g, 'w' FROM generate_series(1001, 1700) g")
            c.execute(f"INSERT INTO {n['t']} VALUES (5000, 'small')")
            c.execute("SET logical_decoding_work_mem = '64kB'")
            return _peek(
                c,
                n["slot"],
                *("proto_version", "2", "publication_names", n["pub"], "streaming", "on"),
            )
        finally:
            _drop(c, n)


def write_fixture(path: Path, messages: list[tuple[str, bytes]], what: str) -> None:
    """Save captured messages as ``<lsn> <hex>`` lines."""
    header = f"# {what}\n# regenerate: python tests/connectors/postgres/test_pgoutput.py\n"
    path.write_text(header + "".join(f"{lsn} {data.hex()}\n" for lsn, data in messages))


def read_fixture(path: Path) -> list[tuple[str, bytes]]:
    """Load ``<lsn> <hex>`` lines."""
    out = []
    for line in path.read_text().splitlines():
        if line and not line.startswith("#"):
            lsn, data = line.split()
            out.append((lsn, bytes.fromhex(data)))
    return out


# -- checks shared by the offline and live tests ----------------------------


def _kinds(messages: list[PgoutputMessage]) -> list[str]:
    return [type(m).__name__ for m in messages]


V1_KINDS = (
    ["Begin", "Type", "Relation", "Insert", "Insert", "Commit"]
    + ["Begin", "Update", "Commit"]
    + ["Begin", "Update", "Commit"]
    + ["Begin", "Delete", "Commit"]
    + ["Begin", "Relation", "Insert", "Update", "Commit"]
    + ["Begin", "Delete", "Commit"]
    + ["Begin", "LogicalMessage", "Commit"]
    + ["Begin", "Type", "Relation", "Truncate", "Commit"]
    + ["Begin", "Type", "Relation", "Insert", "Commit"]
    + ["Begin", "Origin", "Insert", "Commit"]
)


def check_v1(raw: list[tuple[str, bytes]], suffix: str) -> list[PgoutputMessage]:
    """Assert what the scripted version-1 changes must decode to."""
    n = _names(suffix)
    decoder = PgoutputDecoder()
    msgs = [decoder.decode(data) for _, data in raw]
    assert _kinds(msgs) == V1_KINDS

    begin, type_, rel = msgs[0], msgs[1], msgs[2]
    assert isinstance(begin, Begin) and isinstance(type_, Type) and isinstance(rel, Relation)
    assert (type_.namespace, type_.name) == ("public", n["enum"])
    assert rel.qualified_name == f"public.{n['t']}"
    assert rel.replica_identity == "d"
    assert rel.key == ("id",)
    assert [c.name for c in rel.columns] == [
        *("id", "name", "big", "amount", "ts", "flag", "data", "doc", "u", "d", "f", "m")
    ]
    amount = rel.columns[3]
    assert (amount.type_oid, amount.type_modifier) == (1700, (12 << 16 | 2) + 4)
    assert rel.columns[11].type_oid == type_.oid

    first, second, commit = msgs[3], msgs[4], msgs[5]
    assert isinstance(first, Insert) and isinstance(second, Insert) and isinstance(commit, Commit)
    assert first.relation_oid == rel.oid
    assert first.new.kinds == "t" * 12
    assert first.new.values[2] == BIG.encode()
    assert first.new.text(4) == "2024-03-01 12:00:00.123456+00"
    assert first.new.values[6] == b"\\x0001ff"
    assert second.new.kinds == "tnttntnnnntn"
    assert second.new.values[10] == b"NaN"
    # The begin announces the commit's LSN and time before any change.
    assert begin.final_lsn == commit.commit_lsn < commit.end_lsn
    assert begin.commit_time == commit.commit_time
    assert abs((commit.commit_time - datetime.now(UTC)).total_seconds()) < 10 * 365 * 86400

    toast = msgs[7]
    assert isinstance(toast, Update) and toast.old is None
    assert toast.new.kinds[2] == "u" and toast.new.unchanged == (2,)
    assert toast.new.text(1) == "uno"

    rekey = msgs[10]
    assert isinstance(rekey, Update) and rekey.old_kind == "K" and rekey.old is not None
    assert rekey.old.kinds == "t" + "n" * 11 and rekey.old.text(0) == "2"
    assert rekey.new.text(0) == "20"

    delete = msgs[13]
    assert isinstance(delete, Delete) and delete.old_kind == "K"
    assert delete.old.text(0) == "20" and delete.old.kinds == "t" + "n" * 11

    full_rel, full_update, full_delete = msgs[16], msgs[18], msgs[21]
    assert isinstance(full_rel, Relation) and full_rel.replica_identity == "f"
    assert isinstance(full_update, Update) and full_update.old_kind == "O"
    assert full_update.new.kinds == "ttu"
    assert full_update.old is not None and full_update.old.values[2] == BIG.encode()
    assert isinstance(full_delete, Delete) and full_delete.old_kind == "O"
    assert full_delete.old.text(1) == "n2"

    message = msgs[24]
    assert isinstance(message, LogicalMessage) and message.transactional
    assert (message.prefix, message.content) == ("combined.test", b"hello")

    truncate = msgs[29]
    assert isinstance(truncate, Truncate) and truncate.relation_oids == (rel.oid,)
    assert not truncate.cascade and not truncate.restart_identity

    grown, added = msgs[33], msgs[34]
    assert isinstance(grown, Relation) and grown.oid == rel.oid
    assert [c.name for c in grown.columns][-1] == "extra" and len(grown.columns) == 13
    assert isinstance(added, Insert) and added.new.kinds == "tt" + "n" * 10 + "t"

    origin = msgs[37]
    assert isinstance(origin, Origin) and origin.name == n["origin"]

    commits = [m for m in msgs if isinstance(m, Commit)]
    ends = [c.end_lsn for c in commits]
    assert ends == sorted(ends) and len(set(ends)) == len(ends)
    return msgs


def check_v2(raw: list[tuple[str, bytes]]) -> None:
    """Assert the streamed (version 2) transactions decode with their xids."""
    decoder = PgoutputDecoder()
    msgs = [decoder.decode(data) for _, data in raw]
    starts = [m for m in msgs if isinstance(m, StreamStart)]
    assert starts and starts[0].first_segment
    committed_xid = starts[0].xid
    inserts = [m for m in msgs if isinstance(m, Insert)]
    streamed = [m for m in inserts if m.xid == committed_xid]
    assert [m.new.text(0) for m in streamed] == [str(i) for i in range(1, 701)]
    commit = next(m for m in msgs if isinstance(m, StreamCommit))
    assert commit.xid == committed_xid and commit.commit_lsn < commit.end_lsn
    abort = next(m for m in msgs if isinstance(m, StreamAbort))
    assert abort.xid == abort.subxid != committed_xid
    assert sum(isinstance(m, StreamStart) for m in msgs) == sum(
        isinstance(m, StreamStop) for m in msgs
    )
    # The ordinary transaction after the streamed ones carries no xid prefix.
    assert _kinds(msgs)[-3:] == ["Begin", "Insert", "Commit"]
    last = msgs[-2]
    assert isinstance(last, Insert) and last.xid is None and last.new.text(1) == "small"
    assert not decoder.in_stream


# -- offline ----------------------------------------------------------------


def test_decodes_captured_v1_messages() -> None:
    check_v1(read_fixture(V1), FIXTURE_SUFFIX)


def test_decodes_captured_v2_streamed_messages() -> None:
    check_v2(read_fixture(V2))


def test_lsn_text_round_trip() -> None:
    assert lsn_to_text(0) == "0/0"
    assert lsn_to_text(0x16B3748) == "0/16B3748"
    assert lsn_to_text((0xA << 32) | 0xFF) == "A/FF"
    for text in ("0/0", "0/16B3748", "FFFFFFFF/FFFFFFFF", "1/0"):
        assert lsn_to_text(text_to_lsn(text)) == text
    assert text_to_lsn("a/ff") == (0xA << 32) | 0xFF


@pytest.mark.parametrize("bad", ["", "0", "0/", "/1", "1/2/3", "G/0", "123456789/0", " x/1"])
def test_invalid_lsn_text_is_refused(bad: str) -> None:
    with pytest.raises(ProtocolViolation, match="invalid lsn"):
        text_to_lsn(bad)


def test_lsn_out_of_range_is_refused() -> None:
    with pytest.raises(ProtocolViolation):
        lsn_to_text(-1)
    with pytest.raises(ProtocolViolation):
        lsn_to_text(1 << 64)


def test_wire_timestamps_count_from_2000() -> None:
    assert pg_timestamp(0) == datetime(2000, 1, 1, tzinfo=UTC)
    assert pg_timestamp(1) == datetime(2000, 1, 1, 0, 0, 0, 1, tzinfo=UTC)


def test_every_truncated_message_is_an_error() -> None:
    for _, data in read_fixture(V1):
        for cut in range(1, len(data), max(1, len(data) // 7)):
            if data[:1] in b"E":
                continue
            with pytest.raises(SourceError):
                decode_message(data[:cut])


def test_trailing_bytes_and_unknown_messages_are_errors() -> None:
    _, begin = read_fixture(V1)[0]
    with pytest.raises(SourceError, match="trailing"):
        decode_message(begin + b"\0")
    # A row change (decoded first, before the other tags) is checked the same way.
    insert = b"I\0\0\0\x01N\0\x01t\0\0\0\x012"
    assert isinstance(decode_message(insert), Insert)
    with pytest.raises(SourceError, match="trailing"):
        decode_message(insert + b"\0")
    in_block = insert[:1] + b"\0\0\0\x07" + insert[1:]  # inside a stream: xid first
    assert decode_message(in_block, in_stream=True) == Insert(1, TupleData("t", (b"2",)), 7)
    with pytest.raises(SourceError, match="trailing"):
        decode_message(in_block + b"\0", in_stream=True)
    with pytest.raises(SourceError, match="unsupported pgoutput message 'K'"):
        decode_message(b"K\0\0\0\0")
    with pytest.raises(SourceError, match="empty"):
        decode_message(b"")
    bad_kind = b"I\0\0\0\x01N\0\x01x"
    with pytest.raises(SourceError, match="unknown tuple column kind"):
        decode_message(bad_kind)


def test_tuple_data_keeps_the_wire_kinds() -> None:
    msg = decode_message(b"I\0\0\0\x07N\0\x04t\0\0\0\x02hinub\0\0\0\x01\xff")
    assert isinstance(msg, Insert) and msg.relation_oid == 7
    assert msg.new == TupleData("tnub", (b"hi", None, None, b"\xff"))
    assert msg.new.text(0) == "hi" and msg.new.text(1) is None
    assert msg.new.unchanged == (2,) and len(msg.new) == 4


def test_relation_cache_reports_shape_changes() -> None:
    msgs = [decode_message(d) for _, d in read_fixture(V1)]
    rels = [m for m in msgs if isinstance(m, Relation)]
    cache = RelationCache()
    assert cache.update(rels[0]) is True  # first sight
    assert cache.update(rels[2]) is False  # re-sent before the truncate, same shape
    assert cache.update(rels[3]) is True  # a column was added
    assert cache.get(rels[0].oid).columns[-1].name == "extra"
    with pytest.raises(SourceError, match="before its relation message"):
        cache.get(1)
    types = [m for m in msgs if isinstance(m, Type)]
    cache.add_type(types[0])
    assert cache.type(types[0].oid) == types[0]


# -- live -------------------------------------------------------------------


# Each live capture runs in a database of its own (pg_database): a slot decodes
# every logical message of its database, whatever the publication, so another
# test's pg_logical_emit_message (another worker's capture, a CDC heartbeat)
# would otherwise be decoded among the scripted changes.


@pytest.mark.postgres
@pytest.mark.usefixtures("dsn")  # wal_level=logical
def test_live_v1_capture_decodes_like_the_fixture(pg_database: str) -> None:
    suffix = f"t{os.getpid()}_{uuid.uuid4().hex[:8]}"
    raw = capture_v1(pg_database, suffix)
    live = check_v1(raw, suffix)
    fixture = check_v1(read_fixture(V1), FIXTURE_SUFFIX)
    assert _kinds(live) == _kinds(fixture)


@pytest.mark.postgres
@pytest.mark.usefixtures("dsn")
def test_live_v2_capture_decodes(pg_database: str) -> None:
    check_v2(capture_v2(pg_database, f"t{os.getpid()}_{uuid.uuid4().hex[:8]}"))


if __name__ == "__main__":
    _dsn = os.environ["COMBINED_TEST_PG_DSN"]
    write_fixture(V1, capture_v1(_dsn, FIXTURE_SUFFIX), "pgoutput proto_version 1, capture_v1")
    write_fixture(V2, capture_v2(_dsn, FIXTURE_SUFFIX), "pgoutput proto_version 2, capture_v2")
