"""A Run retried by itself, whether its worker died or its source asked to wait: bounded.

Real ``combined worker`` processes capture from a real HTTP API (a server in
the test process) that answers 503 with a ``Retry-After`` past the source's
ceiling on cue (``RetryLater``: the Run fails and a retry is queued for that
time), and kill themselves (SIGKILL, ``COMBINED_FAULT``) at a chosen point.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from tests.connectors.http.fake_api import TOKEN, FakeAPI, serve_orders
from tests.engine.test_retries import PATH, PROJECT
from tests.runtime.test_worker_requeue import _cli

from combined.catalog import Trigger
from combined.engine import Engine
from combined.protocol import utcnow
from combined.runtime import _requeue
from combined.runtime._admit import admit, freeze_admission


@pytest.fixture
def api() -> Iterator[FakeAPI]:
    yield from serve_orders()


@pytest.fixture
def project(api: FakeAPI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A project capturing ``shop.orders`` from ``api``, asked to wait past 0.5 s: deferred."""
    monkeypatch.setenv("COMBINED_TEST_HTTP_TOKEN", TOKEN)  # (the workers inherit it)
    (tmp_path / "combined.yaml").write_text(PROJECT.format(base_url=api.base_url, ceiling=0.5))
    return tmp_path


def _asked_to_wait(api: FakeAPI, root: Path) -> None:
    """A worker executes the Run queued next; the API asks it to come back in a second."""
    api.fail(PATH, 503, headers={"Retry-After": "1"})
    worked = _cli(root, "worker", "--once")
    assert worked.returncode == 0, worked.stderr
    assert " failed" in worked.stderr and "retry " in worked.stderr, worked.stderr


def _until_due(engine: Engine) -> None:
    """Wait until the retry the source deferred may be taken."""
    (deferred,) = engine.queued()
    assert deferred.not_before is not None
    while utcnow() < deferred.not_before:
        time.sleep(0.1)


def _killed(engine: Engine, root: Path) -> None:
    """Once its time came, a worker takes the retry the source deferred and dies in it."""
    _until_due(engine)
    worker = _cli(root, "worker", "--once", fault="after_staging")
    assert worker.returncode == -signal.SIGKILL, (worker.returncode, worker.stderr)


def _chain(engine: Engine) -> list[Any]:
    return sorted(engine.runs(100), key=lambda r: r.created_at)


def test_a_run_whose_worker_dies_between_deferrals_stays_failed_at_its_third_death(
    api: FakeAPI, project: Path
) -> None:
    """Reproduction: only the deaths since the last ``RetryLater`` were counted (1 each
    time), so a Run whose workers died between a source's deferrals was retried forever."""
    assert _cli(project, "capture", "--enqueue", "shop.orders").returncode == 0
    engine = Engine.open(project / "combined.yaml")
    try:
        _asked_to_wait(api, project)
        for _ in range(2):
            _killed(engine, project)
            # the next worker ends the dead Run, retries it, and the API asks to wait
            _asked_to_wait(api, project)
        _killed(engine, project)
        worked = _cli(project, "worker", "--once")  # it ends the third dead Run: not retried
        assert worked.returncode == 0, worked.stderr
        runs = _chain(engine)
        assert [r.retry_of for r in runs[1:]] == [r.id for r in runs[:-1]]
        assert [r.trigger for r in runs] == ["first_sync"] + ["retry", "recovery"] * 2 + ["retry"]
        assert [r.state for r in runs] == ["failed"] * 6 and engine.queued() == []
        last = runs[-1]
        error = last.error or ""
        assert "its worker died 3 times over this run and the automatic retries" in error
        assert "its source also asked 3 times to wait" in error, error
        assert f"`combined run retry {last.id}`" in error
        (event,) = engine.activity(kind="run.interrupted", run_id=last.id)
        body = event["body"]
        assert (body["retry"], body["deaths"], body["budget"], body["deferred"]) == (None, 3, 3, 3)
        (alert,) = engine.activity(kind="alert.run_retries_exhausted")  # told once
        assert alert["run_id"] == last.id and alert["body"]["deaths"] == 3
        # a person who mended the cause retries it by hand: a new chain, captured
        assert _cli(project, "run", "retry", "--enqueue", last.id).returncode == 0
        assert _cli(project, "worker", "--once").returncode == 0
        assert _chain(engine)[-1].state == "succeeded"
    finally:
        engine.close()


def test_a_source_that_keeps_asking_to_wait_is_retried_as_long_as_it_asks(
    api: FakeAPI, project: Path
) -> None:
    """Deferrals alone are not deaths: a rate limit longer than the death budget, with a
    worker death among them, still ends in a capture."""
    assert _cli(project, "capture", "--enqueue", "shop.orders").returncode == 0
    engine = Engine.open(project / "combined.yaml")
    try:
        _asked_to_wait(api, project)
        _killed(engine, project)
        for _ in range(4):  # more deferrals than the budget
            _asked_to_wait(api, project)
            _until_due(engine)
        worked = _cli(project, "worker", "--once")
        assert worked.returncode == 0, worked.stderr
        runs = _chain(engine)
        assert [r.trigger for r in runs] == ["first_sync", "retry", "recovery"] + ["retry"] * 4
        assert runs[-1].state == "succeeded", runs[-1].error
        assert not engine.activity(kind="alert.run_retries_exhausted")
    finally:
        engine.close()


@pytest.mark.parametrize(
    "backend", ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)]
)
def test_the_deaths_are_counted_back_through_automatic_retries_only(
    tmp_path: Path, tools: Any, backend: str, request: pytest.FixtureRequest
) -> None:
    """The chain is read in one recursive query on either catalog; a retry by hand (no
    ``not_before``) starts a new chain, as the exhausted Run's error promises."""
    catalog = {"catalog": request.getfixturevalue("pg_database")} if backend != "sqlite" else {}
    engine = Engine.open(tools.make(tmp_path, **catalog))
    admission = freeze_admission(engine.project, "shop")
    chain: list[Any] = []

    def then(trigger: Trigger, not_before: datetime | None = None) -> None:
        chain.append(
            admit(
                engine.catalog,
                source="shop",
                datasets=["orders"],
                trigger=trigger,
                admission=admission,
                enqueue=True,
                retry_of=chain[-1].id if chain else None,
                not_before=not_before,
            )
        )

    try:
        then("schedule")
        then("recovery")  # the schedule's Run died
        then("retry", utcnow())  # the retry asked to wait (RetryLater)
        then("recovery")  # the deferred retry died
        then("retry")  # retried by hand
        with engine.catalog.begin() as conn:
            counted = [_requeue._chain(conn, run) for run in chain]
        assert counted == [(1, 0), (2, 0), (2, 1), (3, 1), (1, 0)]
    finally:
        engine.close()
