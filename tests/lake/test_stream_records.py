"""What a source's first captures made, kept in the project's lake (``_combined/streams``)."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from combined.errors import LakeError
from combined.lake import LakeLayout
from combined.lake._streams import LakeStreamRecords


@pytest.mark.parametrize("lake_url", ["local", "s3"], indirect=True)
def test_a_record_is_kept_replaced_whole_and_read_by_another_process(
    tmp_path: Path, lake_url: str
) -> None:
    lake = str(tmp_path / "lake") if lake_url == "./lake" else lake_url
    records = LakeStreamRecords(LakeLayout(lake))
    assert records.kept("slot_a") is None
    records.keep("slot_a", {"consistent": "0/1", "database": "db"})
    records.keep("slot_b", {"consistent": "0/2"})
    records.keep("slot_a", {"consistent": "0/3"})
    again = LakeStreamRecords(LakeLayout(lake))  # (what a retry, in a new process, reads)
    assert again.kept("slot_a") == {"consistent": "0/3"}
    assert again.kept("slot_b") == {"consistent": "0/2"}


def test_a_record_is_its_owners_alone(tmp_path: Path) -> None:
    LakeStreamRecords(LakeLayout(tmp_path / "lake")).keep("s", {"k": "v"})
    where = tmp_path / "lake" / "_combined" / "streams"
    assert stat.S_IMODE(where.stat().st_mode) == 0o700
    assert stat.S_IMODE((where / "s.json").stat().st_mode) == 0o600
    assert [p.name for p in where.iterdir()] == ["s.json"]  # (no partial file left)


def test_a_record_another_tool_changed_is_told(tmp_path: Path) -> None:
    records = LakeStreamRecords(LakeLayout(tmp_path / "lake"))
    records.keep("s", {"k": "v"})
    (tmp_path / "lake" / "_combined" / "streams" / "s.json").write_text('{"k": 1}')
    with pytest.raises(LakeError, match="not one Combined wrote"):
        records.kept("s")
