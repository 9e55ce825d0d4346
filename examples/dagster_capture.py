"""Dagster: one asset per captured dataset, its outcome from Combined's exit status.

``docs/python.md`` explains the mapping; ``tests/orchestrators`` materializes
these assets with Dagster itself against a real project. Load it with
``dagster dev -f examples/dagster_capture.py`` beside a ``combined.yaml``.
"""

from __future__ import annotations

from pathlib import Path

import dagster as dg

from combined import (
    RECONCILIATION_DISAGREES,
    RUN_FAILED,
    SUCCEEDED,
    Engine,
    disagreements,
    exit_status,
)

#: A failed capture (exit 1) is retried: a source that was away may be back.
RETRY = dg.RetryPolicy(max_retries=3, delay=60)


def capture_asset(
    project: str | Path, dataset: str, *, retry_policy: dg.RetryPolicy = RETRY
) -> dg.AssetsDefinition:
    """An asset that captures ``dataset`` (``SOURCE.DATASET``) of the project file ``project``."""
    key = dg.AssetKey(dataset.split("."))
    check = dg.AssetCheckSpec("reconciliation", asset=key, description="lake and source agree")

    @dg.asset(key=key, retry_policy=retry_policy, check_specs=[check])
    def _capture() -> dg.MaterializeResult:
        engine = Engine.open(project)
        try:
            runs = engine.capture([dataset])
        finally:
            engine.close()
        disagreeing = [name for run in runs for name in disagreements(run.stats)]
        status = exit_status((run.state for run in runs), disagrees=bool(disagreeing))
        errors = "; ".join(run.error or run.state for run in runs if run.state != "succeeded")
        if status == RUN_FAILED:  # retried by the retry policy
            raise dg.Failure(f"exit {status}: {errors}", metadata={"exit_status": status})
        if status not in (SUCCEEDED, RECONCILIATION_DISAGREES):  # 3 or 4: a person acts first
            raise dg.Failure(
                f"exit {status}: {errors}", metadata={"exit_status": status}, allow_retries=False
            )
        # Published (0 or 5): a disagreeing reconciliation is a failed check, a warning.
        return dg.MaterializeResult(
            metadata={
                "exit_status": status,
                "run": runs[0].id,
                "publication": runs[0].publication_id or "",
            },
            check_results=[
                dg.AssetCheckResult(
                    check_name="reconciliation",
                    passed=not disagreeing,
                    severity=dg.AssetCheckSeverity.WARN,
                    metadata={"disagreeing": ", ".join(disagreeing)},
                )
            ],
        )

    return _capture


defs = dg.Definitions(assets=[capture_asset("combined.yaml", "shop.orders")])
