"""MAR counts carried in the usage commits agree with a recount and never double."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from combined import usage
from combined.lake import LakeLayout, LakeTable
from combined.usage import month_counts, record_usage


def _changes(path: Path, ids: list[str], ops: list[str]) -> Path:
    pq.write_table(pa.table({"_combined_id": ids, "op": ops}), str(path))
    return path


@pytest.mark.parametrize("shared_bytes", [usage.SHARED_BYTES, 0], ids=["shared", "own"])
def test_counts_travel_with_the_rows_and_match_a_recount(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, shared_bytes: int
) -> None:
    # (Billed on the lake's shared DuckDB database, and on one of its own.)
    monkeypatch.setattr(usage, "SHARED_BYTES", shared_bytes)
    lake = LakeLayout(tmp_path / "lake")
    first = _changes(tmp_path / "1.parquet", ["a", "b"], ["insert", "insert"])
    second = _changes(tmp_path / "2.parquet", ["a", "c", "b"], ["update", "insert", "delete"])
    assert record_usage(lake, "s", "d", first, month="2026-11")["2026-11"]["mar"] == 2
    got = record_usage(lake, "s", "d", second, month="2026-11")["2026-11"]
    assert got == {"mar": 3, "inserts": 3, "updates": 1, "deletes": 1}
    assert got == month_counts(lake, "s", "d", "2026-11")
    # the same transition again (a retried projection) adds nothing and writes nothing
    version = LakeTable(lake.usage("s", "d"), "x").version()
    assert record_usage(lake, "s", "d", second, month="2026-11")["2026-11"] == got
    assert LakeTable(lake.usage("s", "d"), "x").version() == version
    # a new month starts from zero
    december = record_usage(lake, "s", "d", first, month="2026-12")["2026-12"]
    assert december == {"mar": 2, "inserts": 2, "updates": 0, "deletes": 0}
    assert month_counts(lake, "s", "d", "2026-11") == got


def test_a_first_keyed_transition_bills_like_the_general_path(tmp_path: Path) -> None:
    lake = LakeLayout(tmp_path / "lake")
    ids = [f"id{i}" for i in range(1000)]
    ops = ["insert" if i % 3 else "update" for i in range(1000)]
    keyed = _changes(tmp_path / "1.parquet", ids, ops)
    fast = record_usage(lake, "s", "fast", keyed, month="2026-11", unique=True)["2026-11"]
    general = record_usage(lake, "s", "general", keyed, month="2026-11")["2026-11"]
    assert fast == general == {"mar": 1000, "inserts": 666, "updates": 334, "deletes": 0}
    assert fast == month_counts(lake, "s", "fast", "2026-11")
    # once the identities are known, the same transition again bills nothing
    version = LakeTable(lake.usage("s", "fast"), "x").version()
    again = record_usage(lake, "s", "fast", keyed, month="2026-11", unique=True)["2026-11"]
    assert again == fast
    assert LakeTable(lake.usage("s", "fast"), "x").version() == version


def test_an_event_stream_repeating_an_identity_is_billed_once(tmp_path: Path) -> None:
    lake = LakeLayout(tmp_path / "lake")
    events = _changes(tmp_path / "e.parquet", ["a", "a", "a", "b"], ["insert"] * 3 + ["delete"])
    got = record_usage(lake, "s", "d", events, month="2026-11")["2026-11"]
    assert got == {"mar": 2, "inserts": 1, "updates": 0, "deletes": 1}
    assert got == month_counts(lake, "s", "d", "2026-11")


def test_a_small_transition_against_a_large_month_bills_only_what_is_new(tmp_path: Path) -> None:
    # The month's rows are read only for the transition's identities: the
    # counts must still equal a recount of everything billed.
    lake = LakeLayout(tmp_path / "lake")
    first_ids = [f"id{i}" for i in range(5000)]
    first = _changes(tmp_path / "1.parquet", first_ids, ["insert"] * 5000)
    record_usage(lake, "s", "d", first, month="2026-11", unique=True)
    ids = [f"id{i}" for i in range(300)]  # known ids
    ops = ["insert" if i < 100 else "update" for i in range(300)]  # 100 repeat, 200 new ops
    ids += [f"new{i}" for i in range(50)] * 2  # 50 new identities, each twice
    ops += ["insert"] * 100
    second = _changes(tmp_path / "2.parquet", ids, ops)
    got = record_usage(lake, "s", "d", second, month="2026-11")["2026-11"]
    assert got == {"mar": 5050, "inserts": 5050, "updates": 200, "deletes": 0}
    assert got == month_counts(lake, "s", "d", "2026-11")
    rows = pa.concat_tables(
        pq.read_table(f) for f in (tmp_path / "lake").rglob("*.parquet") if "_usage" in str(f)
    )
    assert rows.num_rows == 5000 + 200 + 50  # nothing billed twice


def test_deliveries_bill_like_their_change_list(tmp_path: Path) -> None:
    # A keyed transition's Deliveries hold its changes: their (_combined_id,
    # _combined_op) bill as the change list would, a baseline's snapshot as an insert.
    lake = LakeLayout(tmp_path / "lake")
    ids = [f"id{i}" for i in range(300)]
    ops = ["snapshot" if i < 100 else ("update" if i % 2 else "delete") for i in range(300)]
    rows = pa.table({"x": list(range(300)), "_combined_id": ids, "_combined_op": ops})
    parts = [tmp_path / "d1.parquet", tmp_path / "d2.parquet"]
    pq.write_table(rows.slice(0, 150), str(parts[0]))
    pq.write_table(rows.slice(150), str(parts[1]))
    billed = ["insert" if op == "snapshot" else op for op in ops]
    listed = _changes(tmp_path / "c.parquet", ids, billed)
    via_list = record_usage(lake, "s", "a", listed, month="2026-11", unique=True)["2026-11"]
    via_rows = record_usage(lake, "s", "b", parts, month="2026-11", unique=True, deliveries=True)
    assert (
        via_rows["2026-11"]
        == via_list
        == {"mar": 300, "inserts": 100, "updates": 100, "deletes": 100}
    )
    assert month_counts(lake, "s", "b", "2026-11") == via_list


def test_the_spill_directory_is_private_to_the_connection_and_removed(tmp_path: Path) -> None:
    """Usage spills to a directory only this process can reach, never a shared fixed name.

    Reproduction: another user creates ``$TMPDIR/combined-usage-spill`` as a
    symlink to a directory of theirs; Combined's DuckDB spilled the billed
    identities there (the fixed name, its symlink followed). Now each
    connection gets a fresh ``mkdtemp`` directory (0700, ours, not a link),
    removed when the connection closes.
    """
    import json
    import os
    import stat
    import subprocess
    import sys

    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (tmp_path / "combined-usage-spill").symlink_to(theirs)
    code = (
        "import json, os\n"
        "from combined import usage\n"
        "from combined.lake._store import LakeStore\n"
        "usage.SHARED_BYTES = -1\n"  # (a transition too large for the shared database)
        "with usage._duck(LakeStore.at('.'), []) as con:\n"
        "    d = con.execute(\"SELECT current_setting('temp_directory')\").fetchone()[0]\n"
        "    st = os.lstat(d)\n"
        "    seen = {'dir': d, 'mode': st.st_mode, 'uid': st.st_uid}\n"
        "seen['after'] = os.path.lexists(d)\n"
        "print(json.dumps(seen))\n"
    )
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    seen = json.loads(out.stdout)
    spill = Path(seen["dir"])
    assert spill.parent == tmp_path and spill.name != "combined-usage-spill"
    assert stat.S_ISDIR(seen["mode"]) and not stat.S_ISLNK(seen["mode"])
    assert stat.S_IMODE(seen["mode"]) == 0o700 and seen["uid"] == os.getuid()
    assert not seen["after"]  # removed with the connection
    assert list(theirs.iterdir()) == []


def test_snapshots_beside_inserts_in_one_file_bill_as_inserts(tmp_path: Path) -> None:
    # The operations are mapped on the file's dictionary: two of its values
    # becoming one must still bill (and store) each row once, as a string.
    lake = LakeLayout(tmp_path / "lake")
    ids = [f"id{i}" for i in range(90)]
    ops = ["snapshot", "insert", "update"] * 30
    path = tmp_path / "d.parquet"
    pq.write_table(pa.table({"_combined_id": ids, "_combined_op": ops}), str(path))
    got = record_usage(lake, "s", "d", [path], month="2026-11", unique=True, deliveries=True)
    assert got["2026-11"] == {"mar": 90, "inserts": 60, "updates": 30, "deletes": 0}
    assert month_counts(lake, "s", "d", "2026-11") == got["2026-11"]
    stored = LakeTable(lake.usage("s", "d"), "x")
    table = pa.concat_tables(pq.read_table(f) for f in stored.files())
    assert table.schema.field("op").type == pa.string()
    assert table.schema.field("month").type == pa.string()
    assert sorted(table.column("op").to_pylist()) == ["insert"] * 60 + ["update"] * 30


def test_small_transitions_are_billed_without_opening_a_database(
    tmp_path: Path, duck_opens: list[object]
) -> None:
    # Opening a DuckDB database costs ~20 ms of CPU with its spill directory:
    # a re-capture of 200 small tables, one row changed in each, opened one a
    # table to bill it.
    lake = LakeLayout(tmp_path / "lake")
    first = _changes(tmp_path / "1.parquet", ["a", "b"], ["insert", "insert"])
    second = _changes(tmp_path / "2.parquet", ["a", "c"], ["update", "insert"])
    for dataset in ("d1", "d2"):
        record_usage(lake, "s", dataset, first, month="2026-11")
        got = record_usage(lake, "s", dataset, second, month="2026-11")["2026-11"]
        assert got == {"mar": 3, "inserts": 3, "updates": 1, "deletes": 0}
        assert month_counts(lake, "s", dataset, "2026-11") == got
    assert len(duck_opens) == 1  # the lake's shared database, once


def test_an_event_streams_truncates_bill_no_identity(tmp_path: Path) -> None:
    # A truncate event names no source row (every truncate has the same id).
    lake = LakeLayout(tmp_path / "lake")
    ops = ["snapshot", "truncate", "insert", "truncate"]
    rows = pa.table({"_combined_id": ["a", "t", "b", "t"], "_combined_op": ops})
    pq.write_table(rows, str(tmp_path / "d.parquet"))
    got = record_usage(lake, "s", "d", tmp_path / "d.parquet", month="2026-11", deliveries=True)
    assert got["2026-11"] == {"mar": 2, "inserts": 2, "updates": 0, "deletes": 0}
    assert got["2026-11"] == month_counts(lake, "s", "d", "2026-11")
