"""An empty catalog is rebuilt from the lake: publications, Runs and admissions included.

Before the lake held its publications (``_combined/publications``), deleting
the catalog lost every publication for good: ``combined repair`` said "the
catalog matches the lake", and every earlier ``--as-of`` answer was gone.
"""

from __future__ import annotations

import random
import signal
import sqlite3
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from combined.engine import Engine

CRM = """\
  crm:
    connector: sqlite
    config:
      path: ./crm.db
    datasets:
      people:
        key: [id]
      dupes:
        key: [id]
        quarantine: {reader: oncall}
"""

QUERY = (
    "SELECT (SELECT count(*) FROM shop.orders) AS orders, "
    "(SELECT sum(total) FROM shop.orders) AS total, "
    "(SELECT count(*) FROM shop.customers) AS customers, "
    "(SELECT string_agg(name, ',' ORDER BY id) FROM crm.people) AS people"
)


def _crm(root: Path, script: str) -> None:
    con = sqlite3.connect(root / "crm.db")
    con.executescript(script)
    con.commit()
    con.close()


def _project(root: Path, tools: Any, lake_url: str) -> Path:
    tools.make(root)
    project = root / "combined.yaml"
    project.write_text(project.read_text().replace("lake: ./lake", f"lake: {lake_url}") + CRM)
    _crm(
        root,
        "CREATE TABLE people (id INTEGER, name TEXT); INSERT INTO people VALUES (1, 'a');"
        "CREATE TABLE dupes (id INTEGER, v TEXT); INSERT INTO dupes VALUES (1, 'x'), (1, 'y');",
    )
    return project


def _state(engine: Engine, instants: list[datetime]) -> dict[str, Any]:
    """What the catalog answers: publications, history, usage, runs, queries at instants."""
    history_keys = ("id", "parent_id", "inserts", "updates", "deletes", "row_count", "run_id")
    answers = []
    for at in instants:
        try:
            answers.append(engine.sql(QUERY, as_of=at).to_pylist())
        except Exception as exc:  # noqa: BLE001 - before the first publication
            answers.append(type(exc).__name__)
    runs = [
        (r.id, r.source, r.state, r.trigger, r.admission_id, r.publication_id, r.error)
        for r in engine.runs(1000)
    ]
    return {
        "publications": engine.publications(1000),
        "history": {
            name: [
                {k: v[k] for k in (*history_keys, "lake_version", "publications")}
                for v in engine.history(name)
            ]
            for name in ("shop.orders", "shop.customers", "crm.people")
        },
        # (without the instant the catalog's row was last written)
        "usage": [{k: v for k, v in u.items() if k != "updated_at"} for u in engine.usage()],
        "answers": answers,
        "runs": sorted(runs, key=str),
        "admissions": sorted({engine.run(r[0])["admission"].config_digest for r in runs}),
        "map": engine.publication_map(1000),
        "quarantine": sorted(
            ({k: v for k, v in e.items()} for e in engine.quarantine(include_decided=True)),
            key=lambda e: e["id"],
        ),
    }


# 30+ captures, a crash and a repair on each lake: minutes on a loaded machine,
# on S3 mostly spent waiting for the S3 server's answers (75 s alone, 145 s in
# the parallel suite): beside it (make test).
@pytest.mark.slow
@pytest.mark.beside
@pytest.mark.timeout(1800)
def test_a_deleted_catalog_is_rebuilt_with_its_publications(
    tmp_path: Path, tools: Any, lake_url: str
) -> None:
    project = _project(tmp_path, tools, lake_url)
    stamps = [datetime.now(UTC)]
    engine = Engine.open(project)
    try:
        for i in range(1, 31):
            tools.sql(tmp_path, f"UPDATE orders SET total = total + 1 WHERE id <= {i};")
            if i % 3 == 0:
                _crm(tmp_path, f"INSERT INTO people VALUES ({i}, 'p{i}');")
            names = (
                ["shop", "crm.people"]
                if i % 5 == 0
                else ["shop.orders"]
                if i % 2
                else ["crm.people", "shop.orders"]
            )
            for run in engine.capture(names):
                assert run.state == "succeeded", run.error
            stamps.append(datetime.now(UTC))
        # a quarantine: duplicate keys hold the capture; one entry released, one waiting
        for _ in range(2):
            (held,) = engine.capture(["crm.dupes"])
            assert held.state == "needs_review"
            _crm(tmp_path, "INSERT INTO dupes VALUES (2, 'z'), (2, 'w');")
        first, _ = sorted(e["id"] for e in engine.quarantine())
        engine.decide_quarantine(first, "released", by="ana", reason="known duplicates")
    finally:
        engine.close()
    # a capture killed after its commit, then one that publishes it
    tools.sql(tmp_path, "DELETE FROM orders WHERE id > 190;")
    killed = tools.cli(tmp_path, "capture", "shop.orders", env={"COMBINED_FAULT": "after_commit"})
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert tools.cli(tmp_path, "capture", "shop").returncode == 0
    stamps.append(datetime.now(UTC))
    engine = Engine.open(project)
    try:
        span = (stamps[-1] - stamps[0]).total_seconds()
        pick = random.Random(20)
        instants = [stamps[0] + timedelta(seconds=pick.uniform(0, span)) for _ in range(20)]
        before = _state(engine, instants)
    finally:
        engine.close()
    assert len(before["publications"]) >= 30
    states = {r[2] for r in before["runs"]}
    assert {"succeeded", "failed", "needs_review"} <= states  # the killed Run: failed
    assert len({str(a) for a in before["answers"]}) > 5  # the instants read different bases

    (tmp_path / ".combined" / "catalog.db").unlink()
    repaired = tools.cli(tmp_path, "repair")
    assert repaired.returncode == 0, repaired.stderr
    assert "restored" in repaired.stdout and "publication(s)" in repaired.stdout
    engine = Engine.open(project)
    try:
        after = _state(engine, instants)
    finally:
        engine.close()
    for key in before:
        assert after[key] == before[key], key


def test_a_publication_in_flight_is_not_taken_for_a_lost_catalog(
    tmp_path: Path, tools: Any
) -> None:
    """A catalog with no publication yet, whose first one is in the lake's
    ledger but not committed to the catalog (another process publishing, or
    one killed there), is not rebuilt from the ledger: restoring it would
    collide with, or double, that process's own publication."""
    from combined.lake._ledger import Ledger

    project = _project(tmp_path, tools, "./lake")
    killed = tools.cli(tmp_path, "capture", "crm.people", env={"COMBINED_FAULT": "after_ledger"})
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    engine = Engine.open(project)
    try:
        assert [r["seq"] for r in Ledger(engine.layout).records()] == [1]
        engine.repair()
        assert engine.publications(10) == []  # not restored: a Run had left the queue
        (run,) = engine.capture(["crm.people"])
        assert run.state == "succeeded", run.error
        (pub,) = engine.publications(10)
        assert pub["seq"] == 1 and pub["run_id"] == run.id
        # The ledger's later record of number 1 wins: a lost catalog gets this one back.
        assert [r["id"] for r in Ledger(engine.layout).records()] == [pub["id"]]
    finally:
        engine.close()
