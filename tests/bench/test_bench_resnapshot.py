"""bench/resnapshot.py: a table dropped and loaded again (``pgbench -i``), re-captured."""

from __future__ import annotations

import pytest

from bench import resnapshot

# (a million rows captured twice in fresh processes: beside the parallel suite)
pytestmark = pytest.mark.beside


def test_a_reload_of_new_ids_is_re_captured_in_bounded_memory(pg_database: str) -> None:
    # Every id new, every lake id gone: the deletes' output built its hash
    # table on the million deletes, and MAR's count of new ids held two hash
    # tables at once; each ran out of its 61 MB of DuckDB memory.
    r = resnapshot.run(pg_database, "new", 1_000_000)
    assert "error" not in r, r
    assert r["said"].endswith("+1000000 ~0 -1000000, 20 deliveries"), r
    # 331-350 MB in a long-lived venv, 409-419 MB in a freshly installed one:
    # the same code and libraries, but ~75 MB more of the libraries' file pages
    # resident (RssFile 214 against 137 MB at the peak; anonymous memory the
    # same, 195 MB). The bound leaves that room (bench/RESULTS.md).
    assert r["peak_rss_mb"] < 440, r
