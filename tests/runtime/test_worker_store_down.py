"""A worker started while the lake's object store is down waits for it, and says so.

It exited with status 2 before it took a Run: under systemd or Kubernetes a
restart loop, or after a reboot nothing running and nobody told. Real S3
(moto) on 127.0.0.1; the store "down" is a port nothing listens on, or a
server that accepts and never answers.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO, Any

import pytest
from tests.conftest import S3_ENV, S3_FAULTS_RELAY, _emulator, _free_port

WORKER = "from combined.cli import main; main()"


def _lines(stream: IO[str]) -> list[str]:
    """The lines ``stream`` gives, read in the background as they come (until it ends)."""
    seen: list[str] = []
    reader = threading.Thread(target=lambda: seen.extend(iter(stream.readline, "")), daemon=True)
    _READERS[stream] = reader
    reader.start()
    return seen


#: Each stream's reader, joined before the stream is closed.
_READERS: dict[IO[str], threading.Thread] = {}


def _until(seen: list[str], text: str, seconds: float, process: subprocess.Popen[str]) -> None:
    """Wait until a line holds ``text``; fail, with what was said, after ``seconds``."""
    deadline = time.monotonic() + seconds
    while not any(text in line for line in seen):
        if process.poll() is not None:
            time.sleep(0.5)  # (the rest of its output)
            pytest.fail(f"exited {process.returncode} before saying {text!r}: {''.join(seen)}")
        if time.monotonic() > deadline:
            pytest.fail(f"did not say {text!r} in {seconds} s: {''.join(seen)}")
        time.sleep(0.1)


def _worker(root: Path, endpoint: str, *args: str) -> subprocess.Popen[str]:
    env = {**os.environ, **S3_ENV, "AWS_ENDPOINT_URL": endpoint, "COMBINED_RETRY_BACKOFF_S": "0"}
    env.pop("AWS_MAX_ATTEMPTS", None)
    return subprocess.Popen(
        [sys.executable, "-c", WORKER, "worker", "--poll", "0.2", *args],
        cwd=root,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def _shop(root: Path, tools: Any, bucket: str) -> None:
    tools.make(root)
    project = root / "combined.yaml"
    project.write_text(project.read_text().replace("lake: ./lake", f"lake: s3://{bucket}/lake"))


def _stop(worker: subprocess.Popen[str]) -> None:
    if worker.poll() is None:
        worker.kill()
        worker.wait()
    if worker.stderr is not None:
        if (reader := _READERS.pop(worker.stderr, None)) is not None:
            reader.join(10)
        worker.stderr.close()


def test_a_worker_started_while_the_store_is_unreachable_waits_then_runs_the_queue(
    tmp_path: Path, tools: Any, s3_bucket: str, s3_endpoint: str
) -> None:
    _shop(tmp_path, tools, s3_bucket)
    assert tools.cli(tmp_path, "capture", "--enqueue", "shop.orders").returncode == 0
    port = _free_port()  # the store's address: nothing listens there yet
    worker = _worker(tmp_path, f"http://127.0.0.1:{port}", "--max-runs", "1")
    try:
        assert worker.stderr is not None
        said = _lines(worker.stderr)
        _until(said, "the store could not be reached", 60, worker)
        _until(said, "trying again in", 5, worker)
        # Told where an operator looks, with what to check.
        status = tools.cli(tmp_path, "status")
        assert status.returncode == 0, status.stderr
        told = " ".join(status.stderr.split())
        assert "the lake's store has not answered since" in told, told
        assert "waits for it" in told and "AWS_ENDPOINT_URL" in told, told
        assert S3_ENV["AWS_SECRET_ACCESS_KEY"] not in status.stdout + status.stderr
        # The store comes back (a relay to the S3 server on its address).
        rules, log = tmp_path / "rules.json", tmp_path / "requests.log"
        rules.write_text("[]")
        relay = [sys.executable, str(S3_FAULTS_RELAY), str(port), s3_endpoint, str(rules)]
        with _emulator([*relay, str(log)], port, tmp_path / "relay.out"):
            worker.wait(timeout=120)
            time.sleep(0.5)
        assert worker.returncode == 0, "".join(said)
        assert any("the lake's store answers again" in line for line in said), said
        (run,) = [r for r in tools.cli(tmp_path, "runs", "--format", "csv").stdout.splitlines()[1:]]
        assert ",succeeded," in run, run
    finally:
        _stop(worker)
    status = tools.cli(tmp_path, "status")
    assert "has not answered" not in status.stderr, status.stderr
    from combined.engine import Engine

    engine = Engine.open(tmp_path / "combined.yaml")
    try:  # an alert (sent to the notification targets), and what resolved it
        (alert,) = engine.activity(kind="alert.lake_unreachable")
        (back,) = engine.activity(kind="lake.reachable")
        assert "the store could not be reached" in alert["body"]["error"], alert
        assert back["id"] > alert["id"] and back["body"]["waited_s"] >= 0, back
    finally:
        engine.close()
    # The store's secret is in the worker's environment: never in what it said or kept.
    secret = S3_ENV["AWS_SECRET_ACCESS_KEY"]
    assert secret not in "".join(said) and secret not in repr(alert), said


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_worker_waiting_for_a_store_that_never_answers_stops_at_once(
    tmp_path: Path, tools: Any, s3_bucket: str, silent_server: Any, sig: signal.Signals
) -> None:
    # Its probe of a store that never answers takes a minute (three tries of 20 s):
    # the signal stopped the worker only after it, and then it exited 2 anyway.
    _shop(tmp_path, tools, s3_bucket)
    port = silent_server.dsn.split("port=")[1].split()[0]
    worker = _worker(tmp_path, f"http://127.0.0.1:{port}")
    try:
        assert worker.stderr is not None
        said = _lines(worker.stderr)
        _until(said, "worker started", 60, worker)
        time.sleep(1.5)  # (its probe is waiting for an answer)
        worker.send_signal(sig)
        sent = time.monotonic()
        worker.wait(timeout=60)
        took = time.monotonic() - sent
        assert took < 5, (took, "".join(said))
        assert worker.returncode == (143 if sig == signal.SIGTERM else 130), "".join(said)
    finally:
        _stop(worker)


def test_a_worker_whose_bucket_does_not_exist_exits_saying_it_does_not_wait(
    tmp_path: Path, tools: Any, s3_bucket: str, s3_endpoint: str
) -> None:
    # A configuration to fix, not a wait: the worker exits (systemd/k8s shows the
    # failure) and says why it did not wait.
    _shop(tmp_path, tools, f"{s3_bucket}-missing")
    worker = _worker(tmp_path, s3_endpoint)
    try:
        _, err = worker.communicate(timeout=120)
        said = " ".join(err.split())
        assert worker.returncode == 2, said
        assert "its bucket or container does not exist" in said, said
        assert "the worker does not wait for this (the store answered and refused)" in said, said
    finally:
        _stop(worker)


def test_a_worker_outlives_a_store_that_stops_answering_while_it_idles(
    tmp_path: Path, tools: Any, s3_bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An idle worker repairs (probing the store) when a dead worker's Run awaits recovery:
    a store down then ended the worker (LakeUnreachable out of its loop)."""
    from combined.engine import Engine
    from combined.runtime._worker import work

    _shop(tmp_path, tools, s3_bucket)
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{_free_port()}")  # (down)
    engine = Engine.open(tmp_path / "combined.yaml")
    try:
        idled: list[int] = []

        def idle() -> None:  # what the idle recovery does: the engine's own repair
            idled.append(1)
            engine._ready()

        ran = work(
            lambda: None,
            engine.execute_taken,
            lambda: len(idled) >= 2,
            lambda: False,
            poll_s=0.01,
            idle=idle,
        )
        assert list(ran) == []
        assert len(idled) == 2  # it went on after the store did not answer
    finally:
        engine.close()
