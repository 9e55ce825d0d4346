"""Run the Airflow example's DAG with ``dag.test()``; print what Airflow recorded.

Run by the orchestrator environment's Python (``envs.py``) as
``run_airflow.py SCENARIOS``, a JSON list of ``{"project", "datasets"}``, with
``AIRFLOW_HOME`` (its SQLite metadata database, created here) and
``AIRFLOW__CORE__DAGS_FOLDER`` (holding the example) set: one DAG run each,
in order, the example given ``COMBINED_PROJECT`` and ``COMBINED_DATASETS``;
on stdout a JSON list of what each recorded.
"""

from __future__ import annotations

import json
import os
import runpy
import sys
from pathlib import Path
from typing import Any


def dag_test(project: str, datasets: str) -> dict[str, Any]:
    """Run the example's DAG once for ``datasets`` of ``project``; what Airflow recorded."""
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    os.environ.update(COMBINED_PROJECT=project, COMBINED_DATASETS=datasets)
    folder = Path(os.environ["AIRFLOW__CORE__DAGS_FOLDER"])
    dag = runpy.run_path(str(folder / "airflow_capture.py"))["combined_capture"]()
    run = dag.test()
    with create_session() as session:
        tis = run.get_task_instances(session=session)
        xcoms = XComModel.get_many(run_id=run.run_id, dag_ids=dag.dag_id, key="return_value")
        returned = [XComModel.deserialize_value(x) for x in session.scalars(xcoms)]
    return {
        "state": str(run.state),
        "tasks": {ti.task_id: {"state": str(ti.state), "tries": ti.try_number} for ti in tis},
        "returned": returned,
    }


def main(scenarios: list[dict[str, str]]) -> list[dict[str, Any]]:
    from airflow.utils.db import initdb

    initdb()
    return [dag_test(s["project"], s["datasets"]) for s in scenarios]


if __name__ == "__main__":
    print(json.dumps(main(json.loads(sys.argv[1])), default=str))
