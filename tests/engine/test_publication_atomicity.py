"""A reader never sees a half-published capture of several datasets."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from combined.engine import Engine
from combined.lake import LakeTable

TABLES = ("a", "b", "c")
ROWS = 50_000

PROJECT = """\
version: 1
lake: ./lake
catalog: sqlite:///.combined/catalog.db
sources:
  shop:
    connector: sqlite
    config:
      path: ./shop.db
    datasets:
      a: {key: [id]}
      b: {key: [id]}
      c: {key: [id]}
"""


def _poll(gen: int) -> str:
    """One row per table: the generation its rows carry, their spread, their count, and
    how many different Runs committed the rows of generation ``gen``."""
    return " UNION ALL ".join(
        f"SELECT '{t}' AS t, min(gen) AS lo, max(gen) AS hi, count(*) AS n, "
        f"count(DISTINCT _combined_run_id) FILTER (WHERE gen = {gen}) AS runs FROM shop.{t}"
        for t in TABLES
    )


def _make(root: Path) -> None:
    con = sqlite3.connect(root / "shop.db")
    for t in TABLES:
        # the payload differs per table, so each dataset has content of its own
        con.execute(f"CREATE TABLE {t} (id INTEGER PRIMARY KEY, gen INTEGER, pad TEXT)")
        con.executemany(
            f"INSERT INTO {t} VALUES (?, 1, ?)",
            ((i, f"{t}-{i}-{'x' * 40}") for i in range(1, ROWS + 1)),
        )
    con.commit()
    con.close()
    (root / "combined.yaml").write_text(PROJECT)


def _capture_process(root: Path) -> subprocess.Popen[str]:
    env = {**os.environ, "COMBINED_RETRY_BACKOFF_S": "0"}
    return subprocess.Popen(
        [sys.executable, "-c", "from combined.cli import main; main()", "capture"],
        cwd=root,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.mark.slow
def test_reader_polling_during_a_capture_sees_all_old_or_all_new(tmp_path: Path) -> None:
    _make(tmp_path)
    first = _capture_process(tmp_path)
    out, errs = first.communicate(timeout=300)
    assert first.returncode == 0, errs
    # The commit window (shop.a committed in the lake, the publication not yet made)
    # lasts a fraction of a second: a loaded machine's polls may all miss it, so a
    # capture is tried again, up to three, until one poll lands in it. Every poll of
    # every round must see all old or all new.
    polls = []
    for gen in (2, 3, 4):
        in_window, seen = _polled_capture(tmp_path, gen)
        polls.append(seen)
        if in_window:
            break
    # the polls really ran while shop.a was committed in the lake but not yet published
    assert in_window > 0, f"no poll landed in the commit window ({polls} polls a round)"


def _polled_capture(root: Path, gen: int) -> tuple[int, int]:
    """Change every row to generation ``gen`` and capture, polling the publication all the
    while; (the polls that landed in the commit window, all the polls)."""
    # every row of every table changes, so each dataset gets a new version
    con = sqlite3.connect(root / "shop.db")
    for t in TABLES:
        con.execute(f"UPDATE {t} SET gen = ?", (gen,))
    con.commit()
    con.close()

    engine = Engine.open(root / "combined.yaml")
    lake_a = LakeTable(root / "lake" / "shop" / "a", "combined:shop/a")
    published_a = lake_a.version()
    old = {t: (gen - 1, gen - 1, ROWS, 0) for t in TABLES}
    seen: list[dict[str, tuple[int, int, int, int]]] = []
    in_window = 0  # polls answered from the old basis while the lake already held new data
    capture = _capture_process(root)
    try:
        while True:
            running = capture.poll() is None
            lake_ahead = (lake_a.version() or 0) > (published_a or 0)
            rows = engine.sql(_poll(gen)).to_pylist()
            state = {r["t"]: (r["lo"], r["hi"], r["n"], r["runs"]) for r in rows}
            seen.append(state)
            if running and lake_ahead and state == old:
                in_window += 1
            if not running:
                break
        out, errs = capture.communicate(timeout=300)
        assert capture.returncode == 0, errs
        new_run = engine.runs(1)[0].id
        final = engine.sql(_poll(gen)).to_pylist()
        published_run = engine.sql(
            f"SELECT DISTINCT _combined_run_id AS r FROM shop.a WHERE gen = {gen}"
        ).to_pylist()
    finally:
        if capture.poll() is None:
            capture.kill()
            capture.wait()
        engine.close()

    new = {t: (gen, gen, ROWS, 1) for t in TABLES}
    mixed = [s for s in seen if s not in (old, new)]
    assert mixed == [], f"a reader saw a half-published capture: {mixed[0]}"
    assert {r["t"]: (r["lo"], r["hi"], r["n"], r["runs"]) for r in final} == new
    assert published_run == [{"r": new_run}]
    return in_window, len(seen)
