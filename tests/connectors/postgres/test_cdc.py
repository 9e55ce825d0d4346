"""Change capture offline: the batcher and the assembler.

The tests feed the pgoutput messages captured in ``data/pgoutput_v1.hex``
(see ``test_pgoutput.py``). The extraction against a real slot is in
``test_cdc_slot.py``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from combined.connectors.abc import Extraction
from combined.connectors.postgres import _assemble as assemble_module
from combined.connectors.postgres._cdc import (
    CHANGE_COLUMNS,
    OP_TRUNCATE,
    UNCHANGED_COLUMN,
    CdcExtraction,
    ChangeBatcher,
    _Assembler,
    lsn_from_state,
)
from combined.connectors.postgres._connect import Settings
from combined.connectors.postgres._fill import FillDeferred
from combined.connectors.postgres._pgoutput import (
    Begin,
    Commit,
    Delete,
    Insert,
    PgoutputDecoder,
    PgoutputMessage,
    Relation,
    RelationColumn,
    TupleData,
    Type,
    Update,
    arrow_type,
    decode_message,
    lsn_to_text,
    text_to_arrow,
)
from combined.connectors.postgres._rewrite import Marks
from combined.errors import (
    NeedsSnapshot,
    ProtocolViolation,
    SchemaMismatch,
    SourceError,
    UnsupportedType,
)
from combined.protocol import (
    EMITTED_AT_COLUMN,
    OP_COLUMN,
    POSITION_COLUMN,
    Message,
    RecordBatchMessage,
    StateMessage,
)

DATA = Path(__file__).parent / "data"
BIG = "".join(f"{i:05d}" for i in range(1000))


def read_fixture(name: str) -> list[PgoutputMessage]:
    """Decode a ``<lsn> <hex>`` fixture file written by test_pgoutput.py."""
    decoder = PgoutputDecoder()
    return [
        decoder.decode(bytes.fromhex(line.split()[1]))
        for line in (DATA / name).read_text().splitlines()
        if line and not line.startswith("#")
    ]


V1 = read_fixture("pgoutput_v1.hex")
T_REL = next(m for m in V1 if isinstance(m, Relation) and m.name == "cdc_fx_t")
F_REL = next(m for m in V1 if isinstance(m, Relation) and m.name == "cdc_fx_f")
ENUM = next(m for m in V1 if isinstance(m, Type))
TXN = next(m for m in V1 if isinstance(m, Begin))


def _batcher(rel: Relation = T_REL, **kw: Any) -> ChangeBatcher:
    return ChangeBatcher(rel, type_overrides={ENUM.oid: (25, -1)}, **kw)


def _add(b: ChangeBatcher, *changes: PgoutputMessage) -> None:
    for c in changes:
        assert isinstance(c, Insert | Update | Delete)
        b.add(c, commit_lsn=TXN.final_lsn, commit_time=TXN.commit_time)


def _changes(rel: Relation) -> list[PgoutputMessage]:
    return [m for m in V1 if getattr(m, "relation_oid", None) == rel.oid]


# -- type mapping -----------------------------------------------------------


def test_arrow_types_follow_the_postgresql_type_and_modifier() -> None:
    assert arrow_type(23) == pa.int32()
    assert arrow_type(1700, (12 << 16 | 2) + 4) == pa.decimal128(12, 2)
    assert arrow_type(1700, (60 << 16 | 10) + 4) == pa.decimal256(60, 10)
    assert arrow_type(1700, -1) == pa.string()  # no fixed scale: text stays exact
    assert arrow_type(1184) == pa.timestamp("us", tz="UTC")
    assert arrow_type(2950) == pa.string() and arrow_type(3802) == pa.string()
    assert arrow_type(17) == pa.binary()


@pytest.mark.parametrize("oid", [790, 791, 600, 3904])  # money, money[], point, int4range
def test_unmapped_types_name_the_column(oid: int) -> None:
    with pytest.raises(UnsupportedType, match="column 'price'") as info:
        arrow_type(oid, column="price")
    assert info.value.hint


def test_text_values_convert_column_by_column() -> None:
    assert text_to_arrow([b"t", b"f", None], pa.bool_(), "c").to_pylist() == [True, False, None]
    times = text_to_arrow([b"13:14:15.5", None], pa.time64("us"), "c").to_pylist()
    assert times[0] is not None and times[0].isoformat() == "13:14:15.500000" and times[1] is None
    assert text_to_arrow([b"\\x00ff", b"\\x", None], pa.binary(), "c").to_pylist() == [
        b"\x00\xff",
        b"",
        None,
    ]
    floats = text_to_arrow([b"NaN", b"-Infinity", b"1.5"], pa.float64(), "c").to_pylist()
    assert floats[1] == float("-inf") and floats[2] == 1.5 and floats[0] != floats[0]


def test_arrays_and_intervals_are_parsed_per_value() -> None:
    ints = text_to_arrow([b"{1,NULL,3}", None, b"{}", b"[0:1]={4,5}"], arrow_type(1007), "c")
    assert ints.type == pa.list_(pa.int32())
    assert ints.to_pylist() == [[1, None, 3], None, [], [4, 5]]
    texts = text_to_arrow([b'{"a b","c\\"d",plain,NULL,"NULL"}'], arrow_type(1009), "c")
    assert texts.to_pylist() == [["a b", 'c"d', "plain", None, "NULL"]]
    money = text_to_arrow([b"{1.50,-2.00}"], arrow_type(1231, (10 << 16 | 2) + 4), "c")
    assert money.to_pylist() == [[Decimal("1.50"), Decimal("-2.00")]]
    spans = text_to_arrow(
        [b"P1Y2M3DT4H5M6.5S", b"PT0S", b"PT-1H-2M-3.25S", None], arrow_type(1186), "c"
    ).to_pylist()
    assert [(s.months, s.days, s.nanoseconds) for s in spans[:3]] == [
        (14, 3, (4 * 3600 + 5 * 60 + 6.5) * 10**9),
        (0, 0, 0),
        (0, 0, -3723_250_000_000),
    ]
    assert spans[3] is None
    # Said "not a valid list<item: int32>" with a hint about infinite dates and
    # NaN numerics, where the snapshot names the array's shape.
    with pytest.raises(SchemaMismatch) as failed:
        text_to_arrow([b"{{1,2},{3,4}}"], arrow_type(1007), "grid")
    assert failed.value.message.startswith("column 'grid' holds a multi-dimensional array")
    assert "leave 'grid' out" in (failed.value.hint or "")
    assert "infinite" not in (failed.value.hint or "")
    # subscripts from 2 (or -1): the snapshot's read refuses them, and the stream
    # landed their elements alone
    for bounded in (b"[2:3]={4,5}", b"[-1:0]={4,5}"):
        with pytest.raises(SchemaMismatch) as failed:
            text_to_arrow([b"{1}", bounded], arrow_type(1007), "c")
        assert "start at neither 0 nor 1" in failed.value.message


@pytest.mark.parametrize(
    ("value", "type_"),
    [(b"NaN", pa.decimal128(10, 2)), (b"24:00:00", pa.time64("us")), (b"\xff", pa.string())],
)
def test_values_without_an_arrow_form_fail_naming_the_column(
    value: bytes, type_: pa.DataType
) -> None:
    with pytest.raises(SchemaMismatch, match="column 'amount'"):
        text_to_arrow([value], type_, "amount")


@pytest.mark.parametrize("text", [b"NaN", b"Infinity", b"-Infinity", b"{1.5,NaN}"])
def test_a_decimals_nan_or_infinity_is_named_as_the_snapshot_names_it(text: bytes) -> None:
    # Said "holds a value that is not a valid decimal128(10, 2)" with a hint about
    # infinite dates (which land), where the snapshot says "holds NaN or infinity".
    typmod = (10 << 16 | 2) + 4
    listed = text.startswith(b"{")
    type_ = arrow_type(1231 if listed else 1700, typmod)
    with pytest.raises(SchemaMismatch) as failed:
        text_to_arrow([b"{1.25}" if listed else b"1.25", text], type_, "amount")
    told = failed.value.message
    assert told == "column 'amount' holds NaN or infinity, which decimal128(10, 2) cannot hold"
    hint = failed.value.hint or ""
    assert "leave 'amount' out" in hint and "cast to text" in hint and "infinite" not in hint


def test_infinite_dates_are_duckdbs_infinities() -> None:
    # "not a valid date32[day]": a date of 'infinity' stopped the stream.
    inf = 2**31 - 1
    dates = text_to_arrow([b"infinity", b"-infinity", None, b"2024-02-29"], pa.date32(), "d")
    assert dates.view(pa.int32()).to_pylist() == [inf, -inf, None, 19782]
    lists = text_to_arrow([b"{infinity,NULL,-infinity}", b"{}", None], arrow_type(1182), "d")
    assert lists.values.view(pa.int32()).to_pylist() == [inf, None, -inf]
    assert lists.is_null().to_pylist() == [False, False, True]


# -- the batcher on captured rows -------------------------------------------


def test_batcher_converts_captured_rows() -> None:
    b = _batcher()
    inserts = [m for m in _changes(T_REL) if isinstance(m, Insert)][:2]
    _add(b, *inserts)
    batch = b.flush()
    assert batch is not None and b.rows == 0 and b.flush() is None
    assert batch.schema.names == [c.name for c in T_REL.columns] + list(CHANGE_COLUMNS)
    assert batch.schema.field("amount").type == pa.decimal128(12, 2)
    assert batch.schema.field("m").type == pa.string()  # the enum reads as its label
    one, two = batch.to_pylist()
    assert one["big"] == BIG and one["amount"] == Decimal("12.34")
    assert one["ts"] == datetime(2024, 3, 1, 12, 0, 0, 123456, tzinfo=UTC)
    assert one["data"] == b"\x00\x01\xff" and one["doc"] == '{"a": [1, 2]}'
    assert one["u"] == "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11" and one["m"] == "happy"
    assert one["flag"] is True and two["flag"] is False and two["name"] is None
    assert two["amount"] == Decimal("-0.50") and two["f"] != two["f"]  # NaN
    assert one[OP_COLUMN] == "insert" and one[UNCHANGED_COLUMN] is None
    assert one[POSITION_COLUMN] == lsn_to_text(TXN.final_lsn)
    assert one[EMITTED_AT_COLUMN] == TXN.commit_time


def test_columns_that_are_null_in_every_row_keep_their_type() -> None:
    b = _batcher()
    second = [m for m in _changes(T_REL) if isinstance(m, Insert)][1]
    _add(b, second)
    batch = b.flush()
    assert batch is not None and batch.schema == b.schema
    assert batch.column("data").type == pa.binary() and batch.column("data").null_count == 1


def test_unchanged_toast_value_is_named_not_nulled() -> None:
    b = _batcher()
    update = next(m for m in _changes(T_REL) if isinstance(m, Update) and m.old is None)
    _add(b, update)
    batch = b.flush()
    assert batch is not None
    (row,) = batch.to_pylist()
    assert row[OP_COLUMN] == "update" and row["name"] == "uno"
    assert row["big"] is None and row[UNCHANGED_COLUMN] == ["big"]


def test_full_identity_fills_unchanged_values_from_the_old_row() -> None:
    b = _batcher(F_REL)
    _add(b, *_changes(F_REL))
    batch = b.flush()
    assert batch is not None
    ins, upd, dele = batch.to_pylist()
    assert upd[OP_COLUMN] == "update" and upd["note"] == "n2"
    assert upd["big"] == BIG and upd[UNCHANGED_COLUMN] is None
    assert dele[OP_COLUMN] == "delete" and dele["big"] == BIG


def test_key_change_is_a_delete_of_the_old_key_then_an_insert() -> None:
    b = _batcher()
    rekey = next(m for m in _changes(T_REL) if isinstance(m, Update) and m.old_kind == "K")
    delete = next(m for m in _changes(T_REL) if isinstance(m, Delete))
    _add(b, rekey, delete)
    batch = b.flush()
    assert batch is not None
    rows = batch.to_pylist()
    assert [(r[OP_COLUMN], r["id"]) for r in rows] == [
        ("delete", 2),
        ("insert", 20),  # a row the new key did not hold
        ("delete", 20),
    ]
    assert rows[1]["name"] is None and rows[1]["big"] == "small"
    assert all(r["amount"] is None for r in (rows[0], rows[2]))  # deletes carry only the key


def test_full_identity_key_change_deletes_the_old_key() -> None:
    # Under REPLICA IDENTITY FULL every update sends the whole old row ("O"):
    # one that moved the row to another key left the old key in the lake.
    rel = Relation(
        1,
        "public",
        "full_t",
        "f",
        (RelationColumn("id", 23, -1, True), RelationColumn("v", 25, -1, True)),
    )
    b = ChangeBatcher(rel, key=("id",))
    old = TupleData("tt", (b"1", b"a"))
    _add(
        b,
        Update(1, TupleData("tt", (b"101", b"a")), old, "O"),
        Update(1, TupleData("tt", (b"101", b"b")), TupleData("tt", (b"101", b"a")), "O"),
    )
    batch = b.flush()
    assert batch is not None
    assert [(r[OP_COLUMN], r["id"], r["v"]) for r in batch.to_pylist()] == [
        ("delete", 1, "a"),
        ("insert", 101, "a"),
        ("update", 101, "b"),
    ]


def test_batches_are_bounded_by_rows_and_bytes() -> None:
    insert = next(m for m in _changes(T_REL) if isinstance(m, Insert))
    b = _batcher(batch_rows=2)
    _add(b, insert)
    assert not b.full
    _add(b, insert)
    assert b.full and b.rows == 2
    b = _batcher(batch_bytes=4096)
    _add(b, insert)  # carries 5000 bytes of text
    assert b.full and b.nbytes > 4096
    with pytest.raises(ProtocolViolation):
        _batcher(batch_rows=0)


def test_a_batch_of_mostly_null_rows_is_bounded_by_what_its_arrow_weighs() -> None:
    # 300 int8 columns, all null but the key: 2 wire bytes a value and
    # more than 8 in the batch. Bounded by wire bytes alone, a 16 MB batch
    # of such rows was 61 MB of Arrow, staged and scanned whole.
    columns = [RelationColumn("id", 20, -1, True)]
    columns += [RelationColumn(f"c{i}", 20, -1, False) for i in range(299)]
    rel = Relation(91_000, "public", "sparse", "d", tuple(columns))
    row = TupleData("t" + "n" * 299, (b"1", *[None] * 299))
    b = ChangeBatcher(rel, batch_bytes=1 << 20)
    while not b.full:
        b.add(Insert(rel.oid, row), commit_lsn=TXN.final_lsn, commit_time=TXN.commit_time)
    batch = b.flush()
    assert batch is not None
    assert batch.nbytes <= 1.25 * (1 << 20), (batch.num_rows, batch.nbytes)


def test_truncate_is_a_one_row_marker() -> None:
    b = _batcher()
    marker = b.truncate_batch(commit_lsn=TXN.final_lsn, commit_time=TXN.commit_time)
    assert marker.num_rows == 1 and marker.schema == b.schema
    (row,) = marker.to_pylist()
    assert row[OP_COLUMN] == OP_TRUNCATE and row["id"] is None
    assert row[POSITION_COLUMN] == lsn_to_text(TXN.final_lsn)


def test_rows_of_another_relation_or_shape_are_refused() -> None:
    b = _batcher()
    with pytest.raises(ProtocolViolation):
        b.add(Insert(F_REL.oid, TupleData("t", (b"1",))), commit_lsn=1, commit_time=TXN.commit_time)
    with pytest.raises(SchemaMismatch):
        b.add(Insert(T_REL.oid, TupleData("t", (b"1",))), commit_lsn=1, commit_time=TXN.commit_time)


# -- the assembler on the captured stream -----------------------------------


def _assemble(
    starts: dict[str, int] | None = None, batch_rows: int = 1000, drain: bool = True
) -> list[Message]:
    asm = _Assembler(
        {"t": "cdc_fx_t", "f": "public.cdc_fx_f"},
        starts or {"t": 0, "f": 0},
        batch_rows=batch_rows,
        resolve_types=lambda oids: {ENUM.oid: (25, -1)} if ENUM.oid in oids else {},
    )
    out: list[Message] = []
    for m in V1:
        out += asm.feed(m)
        if drain and isinstance(m, Commit):
            out += asm.drain()
    return out + asm.states(asm.position, final=True)


def _describe(out: list[Message]) -> list[tuple[str, str, Any]]:
    desc: list[tuple[str, str, Any]] = []
    for m in out:
        if isinstance(m, StateMessage):
            desc.append((m.dataset, "state", m.state["lsn"]))
        else:
            desc.append((m.dataset, "rows", m.batch.column(OP_COLUMN).to_pylist()))
    return desc


COMMITS = [m for m in V1 if isinstance(m, Commit)]


def test_each_transaction_yields_its_rows_then_its_state() -> None:
    out = _assemble()
    ends = [lsn_to_text(c.end_lsn) for c in COMMITS]
    final = ends[-1]
    assert _describe(out) == [
        ("t", "rows", ["insert", "insert"]),
        ("t", "state", ends[0]),
        ("t", "rows", ["update"]),
        ("t", "state", ends[1]),
        ("t", "rows", ["delete", "insert"]),  # a key change
        ("t", "state", ends[2]),
        ("t", "rows", ["delete"]),
        ("t", "state", ends[3]),
        ("f", "rows", ["insert", "update"]),
        ("f", "state", ends[4]),
        ("f", "rows", ["delete"]),
        ("f", "state", ends[5]),
        ("t", "rows", [OP_TRUNCATE]),
        ("t", "state", ends[7]),
        ("t", "rows", ["insert"]),
        ("t", "state", ends[8]),
        ("t", "rows", ["insert"]),
        ("t", "state", final),
        ("t", "state", final),
        ("f", "state", final),
    ]
    states = [m for m in out if isinstance(m, StateMessage)]
    # The table's oid rides with its checkpoint: the next read refuses another table;
    # so do its columns' types: the next read fills a column whose type changed.
    types = {c.name: [c.type_oid, c.type_modifier] for c in T_REL.columns}
    assert states[0].state == {"lsn": ends[0], "dataset": "t", "relid": T_REL.oid, "types": types}
    assert states[0].position == lsn_to_text(COMMITS[0].commit_lsn)
    assert states[0].emitted_at == COMMITS[0].commit_time.isoformat()
    assert [s.final for s in states[-2:]] == [True, True] and states[-1].emitted_at is None


def test_a_relation_change_starts_a_batch_with_the_new_schema() -> None:
    batches = [m.batch for m in _assemble() if isinstance(m, RecordBatchMessage)]
    t_batches = [b for b in batches if "amount" in b.schema.names]
    assert "extra" not in t_batches[0].schema.names
    assert t_batches[-2].schema.names[-5:] == ["extra", *CHANGE_COLUMNS]
    assert t_batches[-2].to_pylist()[0]["extra"] == 7


def test_rows_coalesce_across_transactions_and_cut_at_a_commit() -> None:
    out = _assemble(batch_rows=3, drain=False)
    ends = [lsn_to_text(c.end_lsn) for c in COMMITS]
    # A full batch is cut at its last commit: committed rows, their state, the open rest.
    assert _describe(out)[:6] == [
        ("t", "rows", ["insert", "insert"]),
        ("t", "state", ends[0]),
        ("t", "rows", ["update"]),  # its commit is not read yet: no state follows
        ("t", "rows", ["delete", "insert"]),  # the second and third transactions
        ("t", "state", ends[2]),
        ("t", "rows", ["delete"]),
    ]
    t_ops = [op for d, kind, ops in _describe(out) if d == "t" and kind == "rows" for op in ops]
    assert t_ops == [
        *("insert", "insert", "update", "delete", "insert", "delete"),
        *(OP_TRUNCATE, "insert", "insert"),
    ]


def test_transactions_before_a_datasets_start_are_skipped() -> None:
    out = _assemble(starts={"t": COMMITS[2].end_lsn, "f": 0})
    t_ops = [ops for d, kind, ops in _describe(out) if d == "t" and kind == "rows"]
    assert t_ops[0] == ["delete"]  # the first three transactions are already in the lake
    f_ops = [ops for d, kind, ops in _describe(out) if d == "f" and kind == "rows"]
    assert f_ops == [["insert", "update"], ["delete"]]


def _enum_as_text(oids: Any) -> dict[int, tuple[int, int]]:
    return {ENUM.oid: (25, -1)}


def test_a_renamed_table_fails_the_capture() -> None:
    asm = _Assembler({"t": "cdc_fx_t"}, {"t": 0}, resolve_types=_enum_as_text)
    asm.feed(TXN)
    asm.feed(T_REL)
    renamed = Relation(T_REL.oid, "public", "other", "d", T_REL.columns)
    with pytest.raises(SchemaMismatch, match="renamed"):
        asm.feed(renamed)


def test_a_table_dropped_and_created_again_fails_the_capture() -> None:
    # The old table's rows were never deleted; streaming on left them in the lake.
    asm = _Assembler({"t": "cdc_fx_t"}, {"t": 0}, resolve_types=_enum_as_text)
    asm.feed(TXN)
    asm.feed(T_REL)
    again = Relation(T_REL.oid + 1, T_REL.namespace, T_REL.name, "d", T_REL.columns)
    with pytest.raises(NeedsSnapshot, match="dropped and created again") as err:
        asm.feed(again)
    assert "teardown" in (err.value.hint or "")


def test_a_key_that_deletes_do_not_carry_fails() -> None:
    asm = _Assembler(
        {"t": "cdc_fx_t"}, {"t": 0}, keys={"t": ("name",)}, resolve_types=_enum_as_text
    )
    with pytest.raises(SchemaMismatch, match="keyed on name"):
        asm.feed(T_REL)
    full = _Assembler({"f": "cdc_fx_f"}, {"f": 0}, keys={"f": ("note",)})
    full.feed(F_REL)  # REPLICA IDENTITY FULL carries every column


def test_streamed_transactions_are_refused() -> None:
    asm = _Assembler({"t": "cdc_fx_t"}, {"t": 0})
    with pytest.raises(SourceError, match="in progress"):
        asm.feed(decode_message(b"S\0\0\0\x07\x01"))


def test_unsupported_column_fails_at_the_relation_message() -> None:
    rel = Relation(5, "public", "cdc_fx_t", "d", (RelationColumn("cash", 790, -1, False),))
    with pytest.raises(UnsupportedType, match="'cash'"):
        _Assembler({"t": "cdc_fx_t"}, {"t": 0}).feed(rel)


def test_lsn_from_state() -> None:
    assert lsn_from_state(None) is None and lsn_from_state({}) is None
    assert lsn_from_state({"lsn": "1/A"}) == (1 << 32) + 10
    with pytest.raises(ProtocolViolation):
        lsn_from_state({"position": "1/A"})


def test_extraction_satisfies_the_protocol() -> None:
    ex = CdcExtraction(
        Settings("host=unused"), slot="s", publication="p", datasets={"a": "t"}, start_lsn=0
    )
    assert isinstance(ex, Extraction)
    assert ex.finish("abort").cleanup_succeeded


def test_a_relation_under_another_oid_than_the_checkpoints_is_refused() -> None:
    # The checkpoint was committed for the table under another oid: it was
    # dropped and created again since, whatever the stream says next.
    asm = _Assembler(
        {"t": "cdc_fx_t", "f": "public.cdc_fx_f"},
        {"t": 0, "f": 0},
        oids={"t": T_REL.oid + 1},
        resolve_types=lambda oids: {ENUM.oid: (25, -1)} if ENUM.oid in oids else {},
    )
    with pytest.raises(SourceError, match="dropped and created again"):
        for m in V1:
            asm.feed(m)


def _types(rel: Relation, **changed: int) -> dict[str, tuple[int, int]]:
    """``rel``'s columns' (type oid, modifier), a column's modifier as given in ``changed``."""
    return {c.name: (c.type_oid, changed.get(c.name, c.type_modifier)) for c in rel.columns}


def _amount_retyped() -> Relation:
    """``T_REL`` with another modifier of ``amount`` (numeric(12,4), not (12,2))."""
    columns = tuple(
        dataclasses.replace(c, type_modifier=c.type_modifier + 2) if c.name == "amount" else c
        for c in T_REL.columns
    )
    return dataclasses.replace(T_REL, columns=columns)


def _filling(
    types: dict[str, tuple[int, int]], start: int, stream: list[PgoutputMessage] = V1
) -> list[tuple[str, list[str]]]:
    """Feed ``stream`` to an assembler whose checkpoint recorded ``types`` and the
    table's columns, at ``start``; the fills it asked for."""
    asked: list[tuple[str, list[str]]] = []

    def fill(relation: str, columns: Any, types: Any) -> Iterator[tuple[bytes | None, ...]]:
        asked.append((relation, list(columns)))
        return iter(())

    asm = _Assembler(
        {"t": "cdc_fx_t"},
        {"t": start},
        keys={"t": ("id",)},
        resolve_types=lambda oids: {ENUM.oid: (25, -1)} if ENUM.oid in oids else {},
        # every column the stream shows (its second relation message adds one)
        known={"t": [c.name for m in V1 if isinstance(m, Relation) for c in m.columns]},
        fill=fill,
        types={"t": types},
    )
    for m in stream:
        asm.feed(m)
        if asm.fill_waits:
            list(asm.fill_pending())
    return asked


def test_a_column_whose_type_changed_since_the_checkpoint_is_filled() -> None:
    # numeric(12,2) recorded, numeric(12,4) streamed: an ALTER COLUMN ... TYPE
    # rewrote every value without a change in the stream.
    recorded = _types(T_REL, amount=T_REL.columns[3].type_modifier + 2)
    assert _filling(recorded, 0) == [("public.cdc_fx_t", ["id", "amount"])]
    assert _filling(_types(T_REL), 0) == []  # the types recorded: nothing to fill
    assert _filling(_types(T_REL, id=4), 0) == []  # a key's new type keeps its identities


def test_a_relation_of_a_transaction_already_in_the_lake_leaves_the_recorded_types() -> None:
    # The stream resumes behind the checkpoint (the slot was not confirmed
    # before a crash): the skipped transaction's relation message shows the
    # types before an ALTER the checkpoint already saw. Taken for the
    # recorded ones, the next relation message (after the ALTER) filled
    # the column again.
    skipped = _amount_retyped()
    relations = [i for i, m in enumerate(V1) if isinstance(m, Relation) and m.name == "cdc_fx_t"]
    assert len(relations) >= 2
    stream = list(V1)
    stream[relations[0]] = skipped  # the first one's transaction is before the start
    # the start: the last commit before the second one's transaction
    begins = [m.final_lsn for m in stream[: relations[1]] if isinstance(m, Begin)]
    start = max(c.end_lsn for c in COMMITS if c.end_lsn < begins[-1])
    assert _filling(_types(T_REL), start, stream) == []


def _late(
    types: dict[str, tuple[int, int]] | None,
    now: Relation,
    read_at: int,
    fed: int = 5,
    *,
    was: Marks | None = None,
    seen: Marks | None = None,
    deferred: bool = False,
) -> tuple[list[Any], Any]:
    """The captured stream, then the run's end comparison with the catalog's ``now``
    read before ``read_at`` (and its enum labels and files ``seen``, the checkpoint's
    ``was``): the fills asked for (``deferred``: each to a later type), and the target."""
    asked: list[Any] = []

    def fill(relation: str, columns: Any, types: Any) -> Iterator[tuple[bytes | None, ...]]:
        asked.append(columns)
        if deferred:
            raise FillDeferred(relation)
        return iter(())

    asm = _Assembler(
        {"t": "cdc_fx_t"},
        {"t": 0},
        keys={"t": ("id",)},
        resolve_types=lambda oids: {ENUM.oid: (25, -1)} if ENUM.oid in oids else {},
        known={"t": [c.name for m in V1 if isinstance(m, Relation) for c in m.columns]},
        fill=fill,
        types=None if types is None else {"t": types},
        marks=None if was is None else {"t": was},
    )
    for m in V1[:fed]:  # the first transaction: its relation message shows the types
        asm.feed(m)
    list(asm.fill_late({"t": now}, read_at, COMMITS[0].end_lsn, {"t": seen} if seen else None))
    (t,) = asm.targets()
    return asked, t


def test_the_runs_end_fills_only_what_the_stream_did_not_show_newer() -> None:
    older = _amount_retyped()
    # the catalog read before the relation message's transaction: its type is older
    assert _late(_types(T_REL), older, COMMITS[0].end_lsn - 100)[0] == []
    # read after it: the catalog's type is the newer one (an ALTER with no change since)
    assert _late(_types(T_REL), older, COMMITS[0].end_lsn + 100)[0] == [["id", "amount"]]
    # a checkpoint that recorded no types, and no relation message: the catalog's
    # types are taken, nothing filled
    asked, t = _late(None, older, COMMITS[0].end_lsn + 100, fed=0)
    assert asked == [] and t.types is not None


#: The checkpoint's labels of enum column ``m`` (by pg_enum oid) and its table's file.
MARKS = Marks({"m": ((1, "sad"), (2, "ok"))}, {T_REL.oid: 10})
AFTER = COMMITS[0].end_lsn + 100  # a catalog read after the stream's relation message


def test_the_runs_end_reads_again_a_column_whose_enum_label_was_renamed() -> None:
    renamed = Marks({"m": ((1, "blue"), (2, "ok"))}, MARKS.files)
    asked, t = _late(_types(T_REL), T_REL, AFTER, was=MARKS, seen=renamed)
    assert asked == [["id", "m"]] and t.marks == renamed
    # a relation message newer than the catalog's read shows no label: read all the same
    assert _late(_types(T_REL), T_REL, AFTER - 200, was=MARKS, seen=renamed)[0] == [["id", "m"]]
    # renamed, then its old text added again as a new label: told by the oid
    again = Marks({"m": ((1, "blue"), (3, "sad"), (2, "ok"))}, MARKS.files)
    assert _late(_types(T_REL), T_REL, AFTER, was=MARKS, seen=again)[0] == [["id", "m"]]
    # labels added, none renamed: nothing read, the labels taken
    added = Marks({"m": ((3, "meh"), (1, "sad"), (2, "ok"))}, MARKS.files)
    asked, t = _late(_types(T_REL), T_REL, AFTER, was=MARKS, seen=added)
    assert asked == [] and t.marks == added


def test_the_runs_end_reads_every_column_but_the_key_of_a_table_written_anew() -> None:
    moved = Marks(MARKS.labels, {T_REL.oid: 11})
    asked, t = _late(_types(T_REL), _amount_retyped(), AFTER, was=MARKS, seen=moved)
    names = [c.name for c in T_REL.columns]
    assert asked == [["id", "amount", *(n for n in names if n not in ("id", "amount"))]]
    assert t.marks == moved
    # a read deferred to a later type leaves the checkpoint's: the next run compares again
    asked, t = _late(_types(T_REL), T_REL, AFTER, was=MARKS, seen=moved, deferred=True)
    assert len(asked) == 1 and t.marks == MARKS


def test_a_checkpoint_without_labels_and_files_takes_the_catalogs() -> None:
    moved = Marks({"m": ((1, "blue"),)}, {T_REL.oid: 11})
    asked, t = _late(_types(T_REL), T_REL, AFTER, seen=moved)
    assert asked == [] and t.marks == moved


def test_a_key_columns_renamed_enum_label_needs_a_new_snapshot() -> None:
    was = Marks({"id": ((1, "sad"),)}, MARKS.files)  # (as if ``id`` were of an enum type)
    renamed = Marks({"id": ((1, "blue"),)}, MARKS.files)
    with pytest.raises(NeedsSnapshot, match="key column 'id'"):
        _late(_types(T_REL), T_REL, AFTER, was=was, seen=renamed)
    added = Marks({"id": ((1, "sad"), (2, "ok"))}, MARKS.files)
    assert _late(_types(T_REL), T_REL, AFTER, was=was, seen=added)[0] == []


RAW_V1 = [
    bytes.fromhex(line.split()[1])
    for line in (DATA / "pgoutput_v1.hex").read_text().splitlines()
    if line and not line.startswith("#")
]


def _feed_raw(*, runs: bool, batch_rows: int, batch_bytes: int) -> list[Message]:
    """The captured stream, its row changes fed one by one or in runs (``feed_rows``)."""
    asm = _Assembler(
        {"t": "cdc_fx_t", "f": "public.cdc_fx_f"},
        {"t": 0, "f": 0},
        batch_rows=batch_rows,
        batch_bytes=batch_bytes,
        resolve_types=lambda oids: {ENUM.oid: (25, -1)} if ENUM.oid in oids else {},
    )
    out: list[Message] = []
    pending: list[bytes] = []
    for data in [*RAW_V1, b""]:
        if data[:1] in (b"I", b"U", b"D"):
            pending.append(data)
            continue
        if runs:
            out += asm.feed_rows(pending)
        else:
            for row in pending:
                out += asm.feed_wire(row)
        pending = []
        if data:
            out += asm.feed(decode_message(data))
    return out + asm.states(asm.position, final=True)


@pytest.mark.parametrize("few", [0, assemble_module._FEW_ROWS])
@pytest.mark.parametrize(
    ("batch_rows", "batch_bytes"), [(1000, 64 << 20), (1, 64 << 20), (1000, 40)]
)
def test_rows_fed_in_runs_make_the_batches_rows_fed_one_by_one_make(
    batch_rows: int, batch_bytes: int, few: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Runs of several relations' rows, an update with its old row among them,
    # batches cut by rows or by bytes inside a run: the same messages either way,
    # whether a run of a few rows takes the numpy round (``few`` 0) or not.
    monkeypatch.setattr(assemble_module, "_FEW_ROWS", few)
    one = _feed_raw(runs=False, batch_rows=batch_rows, batch_bytes=batch_bytes)
    many = _feed_raw(runs=True, batch_rows=batch_rows, batch_bytes=batch_bytes)
    assert _describe(many) == _describe(one)
    batches = [(m.batch for m in x if isinstance(m, RecordBatchMessage)) for x in (one, many)]
    for a, b in zip(*batches, strict=True):
        assert a.schema == b.schema and repr(a.to_pylist()) == repr(b.to_pylist())  # NaN too
    assert len([m for m in one if isinstance(m, RecordBatchMessage)]) > 2
