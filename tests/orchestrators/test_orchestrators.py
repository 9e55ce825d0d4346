"""The Dagster and Airflow examples, run by Dagster and Airflow themselves on real projects.

Each orchestrator runs in its own virtualenv (``envs.py``: built on first use,
which takes minutes, then reused). The same four projects for both: a capture
that succeeds (exit 0), one whose source is away (1: retried, then failed),
one whose credential is missing (4: failed at once, not retried), and a
cursor capture that publishes while its reconciliation disagrees (5:
succeeded, the disagreement reported), as docs/python.md says.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from tests.conftest import add_pg_source, make_shop
from tests.orchestrators.envs import ROOT, orchestrator_env, orchestrator_python

from combined import Engine

pytestmark = [pytest.mark.slow, pytest.mark.beside, pytest.mark.postgres, pytest.mark.timeout(2400)]

HERE = Path(__file__).parent

CURSOR_PROJECT = """\
version: 1
lake: ./lake
sources:
  pg:
    connector: postgres
    config:
      dsn: {dsn}
    datasets:
      events:
        relation: public.events
        key: [id]
        strategy: cursor
        cursor: {{column: id, trust: "ids come from a sequence"}}
"""


def _disagreeing(root: Path, dsn: str) -> Path:
    """A cursor project captured once, then 3 rows deleted at the source."""
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as pg:
        pg.execute("CREATE TABLE events (id int PRIMARY KEY, v text)")
        pg.execute("INSERT INTO events SELECT g, 'e' || g FROM generate_series(1, 20) g")
    root.mkdir()
    (root / "combined.yaml").write_text(CURSOR_PROJECT.format(dsn=dsn))
    engine = Engine.open(root / "combined.yaml")
    try:
        (run,) = engine.capture()
    finally:
        engine.close()
    assert run.state == "succeeded", run.error
    with psycopg.connect(dsn, autocommit=True) as pg:
        pg.execute("DELETE FROM events WHERE id <= 3")
    return root / "combined.yaml"


@pytest.fixture
def scenarios(
    tmp_path: Path, pg_server_dsn: str, pg_database: str, monkeypatch: pytest.MonkeyPatch
) -> list[dict[str, str]]:
    """The four projects, in the order: exit 0, 1, 4, 5."""
    succeeds = make_shop(tmp_path / "succeeds")
    away = make_shop(tmp_path / "away")
    (away.parent / "shop.db").unlink()  # the source is away: the capture fails, exit 1
    no_auth = make_shop(tmp_path / "no_auth")
    add_pg_source(no_auth.parent, "crm", pg_server_dsn, "COMBINED_ORCH_TEST_NO_PW")
    monkeypatch.delenv("COMBINED_ORCH_TEST_NO_PW", raising=False)  # exit 4
    disagrees = _disagreeing(tmp_path / "disagrees", pg_database)
    return [
        {"project": str(succeeds), "datasets": "shop.orders"},
        {"project": str(away), "datasets": "shop.orders"},
        {"project": str(no_auth), "datasets": "crm.customers"},
        {"project": str(disagrees), "datasets": "pg.events"},
    ]


def _run(name: str, driver: str, scenarios: Any, cwd: Path, **env: str) -> tuple[Any, str]:
    python = orchestrator_python(name)
    done = subprocess.run(
        [str(python), str(HERE / driver), json.dumps(scenarios)],
        capture_output=True,
        text=True,
        cwd=cwd,
        env={**orchestrator_env(), **env},
        timeout=1800,
    )
    assert done.returncode == 0, done.stderr[-6000:]
    *log, results = done.stdout.strip().splitlines()
    return json.loads(results), "\n".join(log) + done.stderr


def test_dagster_materializes_the_capture_asset_each_exit_status_as_documented(
    tmp_path: Path, scenarios: list[dict[str, str]]
) -> None:
    (ok, away, no_auth, disagrees), _ = _run("dagster", "run_dagster.py", scenarios, tmp_path)

    assert ok["success"] and ok["events"][-1] == "STEP_SUCCESS"
    (meta,) = ok["metadata"]
    assert meta["exit_status"] == 0 and meta["publication"].startswith("p")
    assert ok["checks"] == [
        {
            "name": "reconciliation",
            "passed": True,
            "severity": "WARN",
            "metadata": {"disagreeing": ""},
        }
    ]

    # exit 1: the asset fails, the retry policy retries it, then it fails for good
    assert not away["success"]
    assert away["events"].count("STEP_UP_FOR_RETRY") == 1
    assert away["events"][-1] == "STEP_FAILURE"
    assert "exit 1: sqlite database" in away["errors"][0]
    assert "does not exist" in away["errors"][0]
    assert away["metadata"] == []

    # exit 4: the asset fails at once, no retry, its failure says why
    assert not no_auth["success"]
    assert "STEP_UP_FOR_RETRY" not in no_auth["events"]
    assert no_auth["failure_metadata"] == [{"exit_status": 4}]
    assert "exit 4: secret env:COMBINED_ORCH_TEST_NO_PW" in no_auth["errors"][0]

    # exit 5: materialized (published) with its reconciliation check failed, a warning
    assert disagrees["success"]
    (meta,) = disagrees["metadata"]
    assert meta["exit_status"] == 5 and meta["publication"]
    (check,) = disagrees["checks"]
    assert (check["name"], check["passed"], check["severity"]) == ("reconciliation", False, "WARN")
    assert check["metadata"] == {"disagreeing": "events"}


def test_airflow_runs_the_capture_task_each_exit_status_as_documented(
    tmp_path: Path, scenarios: list[dict[str, str]]
) -> None:
    dags = tmp_path / "dags"
    dags.mkdir()
    shutil.copy(ROOT / "examples" / "airflow_capture.py", dags)
    env = {
        "AIRFLOW_HOME": str(tmp_path / "airflow"),
        "AIRFLOW__CORE__DAGS_FOLDER": str(dags),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        # The example's retries, without Airflow's five minutes between tries.
        "AIRFLOW__CORE__DEFAULT_TASK_RETRY_DELAY": "0",
    }
    results, log = _run("airflow", "run_airflow.py", scenarios, tmp_path, **env)
    ok, away, no_auth, disagrees = results

    assert ok["state"] == "success"
    assert ok["tasks"] == {"capture": {"state": "success", "tries": 1}}
    (returned,) = ok["returned"]
    assert returned["exit_status"] == 0 and returned["disagreeing"] == []
    assert returned["publications"][0].startswith("p")

    # exit 1: AirflowException, retried (retries=2), then the task and the DAG run fail
    assert away["state"] == "failed"
    assert away["tasks"] == {"capture": {"state": "failed", "tries": 3}}
    assert log.count("AirflowException: exit 1: sqlite database") == 3

    # exit 4: AirflowFailException, the task fails on its first try
    assert no_auth["state"] == "failed"
    assert no_auth["tasks"] == {"capture": {"state": "failed", "tries": 1}}
    assert "AirflowFailException: exit 4: secret env:COMBINED_ORCH_TEST_NO_PW" in log

    # exit 5: the task succeeds (published), its return value names what disagrees
    assert disagrees["state"] == "success"
    (returned,) = disagrees["returned"]
    assert returned["exit_status"] == 5 and returned["disagreeing"] == ["events"]
    assert "exit 5: reconciliation disagrees: events" in log
