"""Materialize the Dagster example's asset with Dagster itself; print what Dagster recorded.

Run by the orchestrator environment's Python (``envs.py``) as
``run_dagster.py SCENARIOS``, a JSON list of ``{"project", "datasets"}``: one
materialization each, in order; on stdout a JSON list of what each recorded.
"""

from __future__ import annotations

import json
import runpy
import sys
from pathlib import Path
from typing import Any

import dagster as dg

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "dagster_capture.py"


def _error(event: dg.DagsterEvent) -> str:
    data = event.event_specific_data
    error = getattr(data, "error", None)
    messages = []
    while error is not None:
        messages.append(error.message.strip())
        error = error.cause
    return " | ".join(messages)


def _failure_metadata(event: dg.DagsterEvent) -> dict[str, Any]:
    user = event.step_failure_data.user_failure_data
    return {k: v.value for k, v in (user.metadata if user else {}).items()}


def materialize(capture_asset: Any, project: str, dataset: str) -> dict[str, Any]:
    """Materialize one capture asset; what Dagster recorded of it."""
    # The example's own retry policy, without its minute between tries.
    asset = capture_asset(project, dataset, retry_policy=dg.RetryPolicy(max_retries=1))
    result = dg.materialize([asset], raise_on_error=False)
    events = [e for e in result.all_events if e.is_step_event]
    failures = [e for e in events if e.is_step_failure]
    return {
        "success": result.success,
        "events": [e.event_type_value for e in events],
        "errors": [_error(e) for e in events if e.is_step_failure or e.is_step_up_for_retry],
        "failure_metadata": [_failure_metadata(e) for e in failures],
        "metadata": [
            {k: v.value for k, v in m.metadata.items()}
            for m in result.asset_materializations_for_node(asset.op.name)
        ],
        "checks": [
            {
                "name": c.check_name,
                "passed": c.passed,
                "severity": c.severity.value,
                "metadata": {k: v.value for k, v in c.metadata.items()},
            }
            for c in result.get_asset_check_evaluations()
        ],
    }


def main(scenarios: list[dict[str, str]]) -> list[dict[str, Any]]:
    example = runpy.run_path(str(EXAMPLE))
    dg.Definitions.validate_loadable(example["defs"])  # what ``dagster dev -f`` loads
    capture_asset = example["capture_asset"]
    return [materialize(capture_asset, s["project"], s["datasets"]) for s in scenarios]


if __name__ == "__main__":
    print(json.dumps(main(json.loads(sys.argv[1])), default=str))
