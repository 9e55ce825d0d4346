"""Every Attempt has a deadline: a source that never finishes cannot hold a worker and its lease."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest
from tests.connectors.http.drip import dripping
from tests.connectors.singer.fixtures import TAPS, TOKEN, dead

from combined.engine import Engine
from combined.errors import ConfigError

PROJECT = """\
version: 1
lake: ./lake
sources:
  slow:
    connector: http
    config:
      base_url: {base_url}
      timeout: 120
      endpoints:
        orders: {{path: /orders, allow_empty: true}}
    datasets:
      orders:
        key: [id]
"""


def test_an_attempt_past_its_deadline_is_stopped_and_retried_then_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Reproduction: an HTTP API dripping its answer a byte at a time, under a
    request ``timeout`` long enough never to fire (120 s), held the Attempt,
    the worker and the dataset's lease (renewed by the heartbeat all along)
    for as long as the server kept dripping (here 100 s). With
    ``COMBINED_ATTEMPT_TIMEOUT_S=1`` each Attempt's read is stopped after a
    second, the Attempt fails as transient naming the deadline, and the Run
    fails after its attempts, its lease released."""
    monkeypatch.setenv("COMBINED_ATTEMPT_TIMEOUT_S", "1")
    monkeypatch.setenv("COMBINED_RETRY_BACKOFF_S", "0")
    with dripping("body", body_bytes=400, interval=0.25) as drip:
        (tmp_path / "combined.yaml").write_text(PROJECT.format(base_url=drip.base_url))
        stopped_at_each_deadline(tmp_path / "combined.yaml", "slow.orders", 1, within=15)
    assert drip.requests == 3


def stopped_at_each_deadline(project: Path, dataset: str, deadline_s: int, within: float) -> None:
    """Capture ``dataset``: its three Attempts each stopped at the deadline, the Run
    failed within ``within`` seconds, its lease released."""
    engine = Engine.open(project)
    try:
        started = time.monotonic()
        (run,) = engine.capture([dataset])
        elapsed = time.monotonic() - started
        attempts = engine.run(run.id)["attempts"]
        holder = engine.catalog.lease_holder(*dataset.split("."))
    finally:
        engine.close()
    assert elapsed < within, f"the capture ran {elapsed:.0f} s under a {deadline_s} s deadline"
    assert run.state == "failed" and holder is None
    assert [a.outcome for a in attempts] == ["failed"] * 3
    assert all(f"ran past its deadline ({deadline_s} s)" in (a.error or "") for a in attempts)


@pytest.mark.parametrize("bad", ["0", "soon", "inf"])
def test_an_attempt_deadline_that_is_not_a_number_of_seconds_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, bad: str
) -> None:
    monkeypatch.setenv("COMBINED_ATTEMPT_TIMEOUT_S", bad)
    (tmp_path / "combined.yaml").write_text(PROJECT.format(base_url="http://127.0.0.1:9/v1"))
    engine = Engine.open(tmp_path / "combined.yaml")
    try:
        with pytest.raises(ConfigError, match="COMBINED_ATTEMPT_TIMEOUT_S"):
            engine.capture(["slow.orders"])
    finally:
        engine.close()


TAP_PROJECT = """\
version: 1
lake: ./lake
sources:
  tap:
    connector: singer
    config:
      command: [{python}, {tap}]
      config:
        mode: hang
        pid_file: {pids}
        api_token: {{secret: "env:COMBINED_TEST_SINGER_TOKEN"}}
      idle_timeout: 300
    datasets:
      items:
        key: [id]
"""


def test_a_tap_that_hangs_under_a_long_idle_timeout_is_ended_at_the_attempt_deadline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Singer tap that writes its SCHEMA and then sleeps (with a child of its
    own) under ``idle_timeout: 300`` held the Attempt for five minutes a try.
    The Attempt deadline ends the tap's process group and the Run moves on."""
    monkeypatch.setenv("COMBINED_ATTEMPT_TIMEOUT_S", "2")
    monkeypatch.setenv("COMBINED_RETRY_BACKOFF_S", "0")
    monkeypatch.setenv("COMBINED_TEST_SINGER_TOKEN", TOKEN)
    pids = tmp_path / "pids"
    (tmp_path / "combined.yaml").write_text(
        TAP_PROJECT.format(
            python=json.dumps(sys.executable),
            tap=json.dumps(str(TAPS / "bad_tap.py")),
            pids=json.dumps(str(pids)),
        )
    )
    engine = Engine.open(tmp_path / "combined.yaml")
    try:
        started = time.monotonic()
        (run,) = engine.capture(["tap.items"])
        elapsed = time.monotonic() - started
        attempts = engine.run(run.id)["attempts"]
    finally:
        engine.close()
    assert elapsed < 60 and run.state == "failed"
    assert all("ran past its deadline (2 s)" in (a.error or "") for a in attempts)
    tap, child = (int(p) for p in pids.read_text().split())
    assert dead(tap) and dead(child)
