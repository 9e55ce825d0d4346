"""Airflow: one task captures, its outcome from Combined's exit status.

``docs/python.md`` explains the mapping; ``tests/orchestrators`` runs this DAG
file with ``dag.test()`` against a real project. Put it in the DAGs folder;
``COMBINED_PROJECT`` names the project file, ``COMBINED_DATASETS`` what to
capture (comma-separated ``SOURCE`` or ``SOURCE.DATASET``).
"""

from __future__ import annotations

import logging
import os
from typing import Any

from airflow.sdk import dag, task
from airflow.sdk.exceptions import AirflowException, AirflowFailException

from combined import (
    RECONCILIATION_DISAGREES,
    RUN_FAILED,
    SUCCEEDED,
    Engine,
    disagreements,
    exit_status,
)

PROJECT = os.environ.get("COMBINED_PROJECT", "combined.yaml")
DATASETS = os.environ.get("COMBINED_DATASETS", "shop").split(",")
log = logging.getLogger(__name__)


# Between tries Airflow waits [core] default_task_retry_delay (300 s unless set).
@task(retries=2)
def capture() -> dict[str, Any]:
    engine = Engine.open(PROJECT)
    try:
        runs = engine.capture(DATASETS)
    finally:
        engine.close()
    disagreeing = [name for run in runs for name in disagreements(run.stats)]
    status = exit_status((run.state for run in runs), disagrees=bool(disagreeing))
    errors = "; ".join(run.error or run.state for run in runs if run.state != "succeeded")
    if status == RUN_FAILED:
        raise AirflowException(f"exit {status}: {errors}")  # Airflow retries the task
    if status not in (SUCCEEDED, RECONCILIATION_DISAGREES):
        raise AirflowFailException(f"exit {status}: {errors}")  # 3 or 4: fails, no retry
    if disagreeing:  # 5: published; a person decides whether to close the gap
        log.warning("exit %s: reconciliation disagrees: %s", status, ", ".join(disagreeing))
    return {
        "exit_status": status,
        "publications": [run.publication_id for run in runs],
        "disagreeing": disagreeing,
    }


@dag(dag_id="combined_capture", schedule=None, catchup=False)
def combined_capture() -> None:
    capture()


combined_capture()
