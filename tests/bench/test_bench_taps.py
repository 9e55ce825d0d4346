"""bench.taps: a Singer tap, an Airbyte source and an HTTP API, floor and captures measured."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from bench.cdc import _cli_cpu

from bench import taps


@pytest.mark.parametrize("case", taps.CASES)
def test_a_few_records_are_measured_at_every_step_and_land_in_the_lake(case: str) -> None:
    out = taps.measure(case, 300, page_size=40)
    assert list(out["steps"]) == list(taps.STEPS)
    assert all(s["cpu_s"] > 0 and s["peak_rss_mb"] > 0 for s in out["steps"].values())
    assert [s["rows"] for s in out["steps"].values()] == [300] * 4
    assert ("server_cpu_s" in out["steps"]["first capture"]) is (case == "http")
    assert out["differences"] == 0
    lines = taps.table([out])
    assert any(f"{case} 300 records, changed re-capture" in line for line in lines)
    assert lines[-1].endswith("lake equals the records after the last capture: yes")


def test_the_records_are_the_same_in_every_protocol() -> None:
    plain = [json.loads(line) for line in taps.records(120)]
    assert [r["id"] for r in plain] == list(range(120))
    assert sum(r["note"] is None for r in plain) == 12
    assert plain[86399 % 120]["updated_at"].endswith("Z")
    assert next(taps.records(86401)) != list(taps.records(86401))[-1]
    assert list(taps.records(86401))[-1].endswith('"updated_at":"2024-01-02T00:00:00Z"}')
    changed = [json.loads(line) for line in taps.records(120, changed=True)]
    assert [r["id"] for r, c in zip(plain, changed, strict=True) if r != c] == [50]
    singer = [json.loads(line) for line in taps._singer_lines(120, False)]
    airbyte = [json.loads(line) for line in taps._airbyte_lines(120, False)]
    assert [m["record"] for m in singer if m["type"] == "RECORD"] == plain
    assert [m["record"]["data"] for m in airbyte if m["type"] == "RECORD"] == plain


def test_the_comparison_sees_a_change_the_lake_has_not_captured(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    taps.write("singer", 300, tmp_path / "data")
    taps.project("singer", tmp_path)
    assert _cli_cpu(tmp_path, "capture")[0] == 0
    records = tmp_path / "data" / "records.jsonl"
    assert taps.differences(tmp_path, records) == 0
    taps.write("singer", 300, tmp_path / "data", changed=True)
    # ids 50, 150, 250: each in the lake and not in the records, and the other way round
    assert taps.differences(tmp_path, records) == 6
    assert _cli_cpu(tmp_path, "capture")[0] == 0
    assert taps.differences(tmp_path, records) == 0
    assert taps.lake_rows(tmp_path) == 300
