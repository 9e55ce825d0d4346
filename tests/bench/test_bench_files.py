"""bench.files: a CSV and a JSON lines file, floor and captures measured, the lake compared."""

from __future__ import annotations

from pathlib import Path

import pytest
from bench.cdc import _cli_cpu

from bench import files


@pytest.mark.parametrize("fmt", ["csv", "json"])
def test_a_small_file_is_measured_at_every_step_and_lands_in_the_lake(fmt: str) -> None:
    out = files.measure(fmt, 500)
    assert list(out["steps"]) == list(files.STEPS)
    assert all(s["cpu_s"] > 0 and s["peak_rss_mb"] > 0 for s in out["steps"].values())
    assert out["lake_equals_source"] is True
    lines = files.table([out])
    assert any(f"{fmt} 500 rows, changed re-capture" in line for line in lines)
    assert lines[-1].endswith("lake equals the file after the last capture: yes")


def test_the_comparison_sees_a_change_the_lake_has_not_captured(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    files.write("csv", 300, tmp_path / "data" / "rows.csv")
    (tmp_path / "combined.yaml").write_text(
        "version: 1\nlake: ./lake\nsources:\n  f:\n    connector: files\n"
        "    config:\n      path: ./data\n    datasets:\n"
        '      d:\n        relation: "rows.csv"\n        key: [id]\n'
    )
    assert _cli_cpu(tmp_path, "capture")[0] == 0
    assert files.lake_totals(tmp_path) == files.totals("csv", 300, changed=False)
    changed = files.totals("csv", 300, changed=True)
    assert changed[1] == files.totals("csv", 300, changed=False)[1] + 3  # ids 50, 150, 250
    files.write("csv", 300, tmp_path / "data" / "rows.csv", changed=True)
    assert files.lake_totals(tmp_path) != changed
    assert _cli_cpu(tmp_path, "capture")[0] == 0
    assert files.lake_totals(tmp_path) == changed
