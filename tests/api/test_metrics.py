"""``GET /metrics``: Prometheus metrics read from the catalog, whichever process did the work."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from combined.api import create_app

TOKEN = "t0ken-for-the-metrics-tests-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_metrics_count_what_other_processes_did(shop: Path, tools: Any) -> None:
    from tests.conftest import shop_sql

    path = shop / "combined.yaml"
    path.write_text(
        path.read_text().replace(
            "      orders:\n        key: [id]\n",
            "      orders:\n        key: [id]\n        freshness: 1h\n",
        )
    )
    assert tools.cli(shop, "capture").returncode == 0  # another process
    shop_sql(shop, "INSERT INTO orders VALUES (201, 1, 'placed', 3.0)")
    assert tools.cli(shop, "capture", "shop.orders").returncode == 0
    with TestClient(create_app(path, token=TOKEN)) as anon:
        assert anon.get("/metrics").status_code == 401  # the API's bearer token
        answer = anon.get("/metrics", headers=AUTH)
    assert answer.status_code == 200
    assert answer.headers["content-type"].startswith("text/plain")
    got = _samples(answer.text)
    orders = (("dataset", "orders"), ("source", "shop"))
    assert got[("combined_runs", (("source", "shop"), ("state", "succeeded")))] == 2
    assert got[("combined_rows_captured_total", orders)] == 201
    assert got[("combined_bytes_captured_total", orders)] > 0
    assert (
        got[("combined_deliveries_total", (*orders[:1], *orders[1:], ("state", "committed")))] == 2
    )
    assert got[("combined_capture_duration_seconds_count", ())] == 2
    assert got[("combined_commit_duration_seconds_count", ())] == 2
    assert got[("combined_capture_duration_seconds_bucket", (("le", "+Inf"),))] == 2
    assert 0 < got[("combined_freshness_lag_seconds", orders)] < 3600
    assert got[("combined_freshness_target_seconds", orders)] == 3600
    months = [k for k in got if k[0] == "combined_mar" and ("dataset", "orders") in k[1]]
    assert [got[k] for k in months] == [201]
    assert not [k for k in got if k[0] == "combined_quarantine_entries"]


def test_serve_answers_metrics_and_logs_json_lines(shop: Path, tools: Any) -> None:
    import json

    import httpx

    env = {"COMBINED_API_TOKEN": TOKEN, "COMBINED_LOG_FORMAT": "json", "COMBINED_LOG_LEVEL": "INFO"}
    with tools.serving(shop, env=env) as (base, server):
        assert httpx.get(f"{base}/metrics").status_code == 401
        answer = httpx.get(f"{base}/metrics", headers=AUTH)
        assert answer.status_code == 200 and "combined_runs" in answer.text
        lines: list[dict[str, Any]] = []
        while not any("/metrics" in x.get("message", "") for x in lines if x["level"] == "INFO"):
            line = server.stderr.readline()
            assert line, "the server ended"
            if line.startswith("{"):
                lines.append(json.loads(line))
    access = [x for x in lines if x["logger"] == "uvicorn.access"]
    assert access and all({"timestamp", "level", "message"} <= set(x) for x in access)
    assert TOKEN not in json.dumps(lines)
