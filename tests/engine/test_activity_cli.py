"""`combined activity` shows the Activity feed with filters; `run show` a Run's own events."""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

#: A terminal wide enough that no table column is folded.
WIDE = {"COLUMNS": "200"}


def _feed(root: Path, tools: Any, *args: str) -> list[dict[str, Any]]:
    result = tools.cli(root, "activity", "--format", "json", *args)
    assert result.returncode == 0, result.stderr
    events = json.loads(result.stdout)
    assert isinstance(events, list)
    return events


def test_activity_filters_by_dataset_run_kind_since_and_limit(tmp_path: Path, tools: Any) -> None:
    tools.make(tmp_path, orders=20)
    assert tools.cli(tmp_path, "capture", "shop.orders").returncode == 0
    queued = tools.cli(tmp_path, "capture", "--enqueue", "shop.customers")
    assert queued.returncode == 0, queued.stderr
    second = queued.stdout.split()[1]

    everything = _feed(tmp_path, tools, "--limit", "500")
    kinds = {e["kind"] for e in everything}
    assert {"run.queued", "run.succeeded", "publication"} <= kinds, kinds
    assert [e["id"] for e in everything] == sorted((e["id"] for e in everything), reverse=True)

    of_run = _feed(tmp_path, tools, "--run", second)
    assert of_run and {e["run_id"] for e in of_run} == {second}
    assert [e["kind"] for e in of_run] == ["run.queued"]

    orders = _feed(tmp_path, tools, "--dataset", "shop.orders", "--limit", "500")
    assert orders and {(e["source"], e["dataset"]) for e in orders} == {("shop", "orders")}
    assert _feed(tmp_path, tools, "--dataset", "shop.customers") == []

    # a kind names itself and the kinds below it
    runs = _feed(tmp_path, tools, "--kind", "run", "--limit", "500")
    assert runs and all(e["kind"].startswith("run.") for e in runs)
    assert {e["kind"] for e in _feed(tmp_path, tools, "--kind", "run.queued")} == {"run.queued"}

    assert len(_feed(tmp_path, tools, "--limit", "2")) == 2
    newest = datetime.fromisoformat(everything[0]["at"])
    since = (newest + timedelta(seconds=1)).isoformat()
    assert _feed(tmp_path, tools, "--since", since) == []
    assert len(_feed(tmp_path, tools, "--since", "1h", "--limit", "500")) == len(everything)

    table = tools.cli(tmp_path, "activity", "--run", second, env=WIDE)
    assert table.returncode == 0, table.stderr
    assert "run.queued" in table.stdout and second in table.stdout


def test_activity_refuses_a_since_it_cannot_read(tmp_path: Path, tools: Any) -> None:
    tools.make(tmp_path, orders=5)
    result = tools.cli(tmp_path, "activity", "--since", "yesterday")
    assert result.returncode == 2
    assert "--since 'yesterday' is neither an ISO-8601 instant nor a duration" in result.stderr
    assert "hint:" in result.stderr


def test_run_show_lists_the_runs_own_events(tmp_path: Path, tools: Any) -> None:
    tools.make(tmp_path, orders=20)
    first = tools.cli(tmp_path, "capture", "shop.orders")
    assert first.returncode == 0, first.stderr
    run_id = first.stdout.split()[1]
    assert tools.cli(tmp_path, "capture", "shop.customers").returncode == 0
    shown = tools.cli(tmp_path, "run", "show", run_id, env=WIDE)
    assert shown.returncode == 0, shown.stderr
    out = shown.stdout
    for kind in ("run.queued", "run.succeeded"):
        assert kind in out, out
    assert out.index("run.queued") < out.index("run.succeeded")  # oldest first
    assert "shop.orders" in out and "shop.customers" not in out
