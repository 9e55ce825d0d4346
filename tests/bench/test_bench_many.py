"""bench.many: many small tables, floor and captures measured, the lake compared with the source."""

from __future__ import annotations

from pathlib import Path

import pytest
from bench.cdc import _cli_cpu

from bench import many


@pytest.mark.parametrize("connector", ["postgres", "mariadb"])
def test_a_few_tables_are_measured_at_every_step_and_land_in_the_lake(
    connector: str, pg_server_dsn: str, mariadb_server_dsn: str
) -> None:
    server = pg_server_dsn if connector == "postgres" else mariadb_server_dsn
    out = many.measure(connector, server, 4, 7)
    assert list(out["steps"]) == list(many.STEPS)
    assert all(s["cpu_s"] > 0 and s["peak_rss_mb"] > 0 for s in out["steps"].values())
    assert all(s["server_cpu_s"] is not None for s in out["steps"].values())
    assert out["lake_equals_source"] is True
    lines = many.table([out])
    assert any(f"{connector} 4 tables x 7 rows, changed re-capture" in line for line in lines)
    assert lines[-1].endswith("lake equals source after the last capture: yes")


def test_the_comparison_sees_a_change_the_lake_has_not_captured(
    pg_server_dsn: str, tmp_path: Path
) -> None:
    source = many.Source("postgres", pg_server_dsn, 3, 5)
    source.create()
    try:
        (tmp_path / "combined.yaml").write_text(source.project())
        assert _cli_cpu(tmp_path, "capture")[0] == 0
        assert many.lake_totals(tmp_path, 3) == source.totals() == [(5, 15)] * 3
        source.change()
        assert many.lake_totals(tmp_path, 3) != source.totals() == [(5, 16)] * 3
    finally:
        source.drop()
