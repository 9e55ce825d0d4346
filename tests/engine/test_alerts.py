"""Alerts that reach people: raised once per condition, sent signed, retried, never blocking.

Targets are real HTTP servers on 127.0.0.1 (issue 21 item 3).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import socket
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from combined.catalog import data as cat
from combined.engine import Engine
from combined.protocol import utcnow

KEY = "hook-signing-key-5f1c"
#: One webhook target, its URL and key from the environment.
OPS = (
    "notifications:\n"
    "  - {name: ops, type: webhook, url: {secret: env:HOOK_URL}, secret: {secret: env:HOOK_KEY}}\n"
)


class Receiver:
    """A webhook receiver on 127.0.0.1: records each POST; answers 503 to the first ``fail``.

    With ``hold``, the first POST is held (``arrived`` set) until ``hold`` is
    set, then answered 503.
    """

    def __init__(
        self, fail: int = 0, hold: threading.Event | None = None, delay: float = 0.0
    ) -> None:
        self.received: list[tuple[str, dict[str, str], bytes]] = []
        self.fail = fail
        self.arrived = threading.Event()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if hold is not None and not outer.arrived.is_set():
                    outer.arrived.set()
                    hold.wait(60)
                    self.send_response(503)
                elif outer.fail > 0:
                    outer.fail -= 1
                    self.send_response(503)
                else:
                    outer.received.append((self.path, dict(self.headers), body))
                    time.sleep(delay)  # (a slow receiver: answered after ``delay`` s)
                    self.send_response(200)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}{path}"

    def posts(self, path: str) -> list[tuple[dict[str, str], bytes]]:
        return [(h, b) for p, h, b in self.received if p == path]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver(fail=1)
    try:
        yield r
    finally:
        r.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _project(root: Path, notifications: str, extra: str = "") -> Path:
    from tests.conftest import make_shop

    path = make_shop(root)
    text = path.read_text().replace(
        "      orders:\n        key: [id]\n",
        "      orders:\n        key: [id]\n        freshness: 1h\n" + extra,
    )
    path.write_text(text + notifications)
    return path


def _events(engine: Engine, kind: str) -> list[Any]:
    with engine.catalog.begin() as conn:
        return list(reversed(cat.activity(conn, kind=kind, limit=500)))


def test_a_command_that_ends_at_once_sends_its_alert_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Cron mode (`schedule --once && worker --once`): closing the engine stopped the drain
    before it claimed the alert it had just raised (never sent), and released the claim
    of a request still in flight (sent again by every command after)."""
    from combined.runtime._notify import drain

    receiver = Receiver(delay=3.0)  # answers after the close's first wait
    monkeypatch.setenv("HOOK_URL", receiver.url("/hook"))
    monkeypatch.setenv("HOOK_KEY", KEY)
    path = _project(tmp_path, OPS)
    try:
        engine = Engine.open(path)
        try:
            (run,) = engine.capture(["shop.orders"])
            assert run.state == "succeeded", run.error
            assert engine.check_alerts(slots=False, now=utcnow() + timedelta(hours=2))
        finally:
            engine.close()  # at once, as a command run from cron ends
        assert len(receiver.posts("/hook")) == 1
        engine = Engine.open(path)
        try:
            assert drain(engine) == 0  # sent and recorded: nothing is pending
        finally:
            engine.close()
        assert len(receiver.posts("/hook")) == 1
    finally:
        receiver.close()


def test_a_worker_that_ends_a_dead_run_sends_its_alert_while_idle(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The alert.run_failed a worker raised closing a dead Run waited for the worker's
    next Run: with the queue empty, for as long as it stayed empty."""
    import signal

    from tests.conftest import cli

    receiver = Receiver()
    monkeypatch.setenv("HOOK_URL", receiver.url("/hook"))
    monkeypatch.setenv("HOOK_KEY", KEY)
    path = _project(tmp_path, OPS)
    killed = cli(tmp_path, "capture", "shop.orders", env={"COMBINED_FAULT": "after_commit"})
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    engine = Engine.open(path)
    try:
        assert list(engine.work(lambda: False, poll_s=0.1, once=True)) == []  # none queued
        engine.sender.wait(60)  # (before the close, which would send it anyway)
        kinds = [json.loads(body)["kind"] for _, body in receiver.posts("/hook")]
        assert kinds == ["alert.run_failed"]
    finally:
        engine.close()
        receiver.close()


def test_each_alert_is_raised_once_and_sent_signed(
    tmp_path: Path, receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    hook, slack = "/hooks/combined", "/services/T000/B000/xyzzy"
    monkeypatch.setenv("HOOK_URL", receiver.url(hook))
    monkeypatch.setenv("HOOK_KEY", KEY)
    monkeypatch.setenv("SLACK_URL", receiver.url(slack))
    path = _project(
        tmp_path,
        "notifications:\n"
        "  - {name: ops, type: webhook, url: {secret: env:HOOK_URL},"
        " secret: {secret: env:HOOK_KEY}}\n"
        "  - {name: chat, type: slack, url: {secret: env:SLACK_URL}, kinds: [run_failed]}\n",
    )
    engine = Engine.open(path)
    try:
        (run,) = engine.capture(["shop.orders"])
        assert run.state == "succeeded", run.error
        assert engine.check_alerts(slots=False) == []  # fresh: nothing to tell
        later = utcnow() + timedelta(hours=2)
        (note,) = engine.check_alerts(slots=False, now=later)
        assert "shop.orders is stale" in note
        # the age in whole seconds, as the target is given (not "2h0.31536s")
        assert re.search(r"data is 2h(\d+s)? old, past its freshness target of 1h$", note), note
        assert engine.check_alerts(slots=False, now=later + timedelta(minutes=5)) == []
        (fresh,) = _events(engine, "alert.freshness")
        assert fresh.body["target_s"] == 3600 and fresh.body["age_s"] >= 7200

        from tests.conftest import shop_sql

        shop_sql(tmp_path, "DROP TABLE orders")
        (failed,) = engine.capture(["shop.orders"])
        assert failed.state == "failed"
        engine.sender.wait(60)

        (alert,) = _events(engine, "alert.run_failed")
        assert alert.run_id == failed.id
        # the webhook: every alert, signed; the first POST answered 503 and retried
        bodies = receiver.posts(hook)
        kinds = [json.loads(b)["kind"] for _, b in bodies]
        assert kinds == ["alert.freshness", "alert.run_failed"]
        for headers, body in bodies:
            want = hmac.new(KEY.encode(), body, hashlib.sha256).hexdigest()
            assert headers["X-Combined-Signature"] == f"sha256={want}"
        # Slack: the run failure only, as text
        (only,) = receiver.posts(slack)
        text = json.loads(only[1])["text"]
        assert "alert.run_failed" in text and failed.id in text
        sent = _events(engine, "notification.sent")
        assert sorted((e.body["target"], e.body["alert"]) for e in sent) == [
            ("chat", "alert.run_failed"),
            ("ops", "alert.freshness"),
            ("ops", "alert.run_failed"),
        ]
        assert [e.body["attempts"] for e in sent if e.body["target"] == "ops"] == [2, 1]
        # sent once: another drain sends nothing more
        from combined.runtime._notify import drain

        assert drain(engine) == 0
        with engine.catalog.begin() as conn:
            feed = json.dumps(
                [dict(e._mapping) for e in cat.activity(conn, limit=500)], default=str
            )
        assert "xyzzy" not in feed and KEY not in feed and "/hooks/" not in feed
    finally:
        engine.close()


def test_an_unreachable_target_is_retried_recorded_and_never_blocks_a_capture(
    tmp_path: Path, silent_server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    port = silent_server.dsn.split("port=")[1].split()[0]
    monkeypatch.setenv("HOOK_URL", f"http://127.0.0.1:{port}/hang")
    monkeypatch.setenv("HOOK_KEY", KEY)
    path = _project(
        tmp_path,
        "notifications:\n"
        "  - {name: ops, type: webhook, url: {secret: env:HOOK_URL},"
        " secret: {secret: env:HOOK_KEY}, attempts: 2}\n",
    )
    from tests.conftest import shop_sql

    shop_sql(tmp_path, "DROP TABLE customers")
    engine = Engine.open(path)
    try:
        started = time.monotonic()
        (run,) = engine.capture(["shop.customers"])  # fails: an alert to send
        took = time.monotonic() - started
        assert run.state == "failed"
        thread = engine.sender._thread
        assert thread is not None and thread.is_alive()  # still waiting on the silent target
        assert took < 8, f"the capture waited for the notification ({took:.1f} s)"
        (run,) = engine.capture(["shop.orders"])  # the next capture is not held up either
        assert run.state == "succeeded", run.error
        silent_server.close()  # hangs up: the attempt fails, the retry finds nothing listening
        engine.sender.wait(60)
        assert not thread.is_alive()
        (failed,) = _events(engine, "notification.failed")
        assert failed.body["attempts"] == 2 and failed.body["target"] == "ops"
        assert failed.body["alert"] == "alert.run_failed"
        assert str(port) not in json.dumps(failed.body)
        assert _events(engine, "notification.sent") == []
    finally:
        engine.close()


def test_an_alert_a_closed_sender_was_sending_is_sent_at_once_by_the_next(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A process ends (its engine closed) while its sender thread waits on a target
    # that never answers: the close waits out the request's time limit (an answer
    # within it is recorded: released sooner, a late answer sent it again each
    # minute), then the next sender (here a second engine, as `combined alerts`)
    # sends the alert now, not once the first claim has expired (10 minutes).
    hold = threading.Event()
    receiver = Receiver(hold=hold)
    monkeypatch.setenv("HOOK_URL", receiver.url("/hook"))
    monkeypatch.setenv("HOOK_KEY", KEY)
    path = _project(tmp_path, OPS)
    from tests.conftest import shop_sql

    shop_sql(tmp_path, "DROP TABLE customers")
    first, second = Engine.open(path), Engine.open(path)
    try:
        (run,) = first.capture(["shop.customers"])
        assert run.state == "failed"
        assert receiver.arrived.wait(60)  # the sender thread is in its POST
        sender, started = first.sender, time.monotonic()
        first.close()
        assert time.monotonic() - started < 20  # the grace and the request's time limit
        from combined.runtime._notify import drain

        assert drain(second) == 1
        ((_, body),) = receiver.posts("/hook")
        assert json.loads(body)["kind"] == "alert.run_failed"
        (sent,) = _events(second, "notification.sent")
        assert sent.body["attempts"] == 1
        hold.set()
        sender.wait(30)  # its held POST answered 503: a failure after close is no outcome
        assert sender._thread is not None and not sender._thread.is_alive()
        assert _events(second, "notification.failed") == []
        assert first.sender is not sender  # an engine used after close sends again
    finally:
        hold.set()
        first.close()
        second.close()
        receiver.close()


def test_a_cli_capture_exits_at_once_when_the_target_hangs(
    tmp_path: Path, silent_server: Any, tools: Any
) -> None:
    port = silent_server.dsn.split("port=")[1].split()[0]
    path = _project(tmp_path, OPS)
    from tests.conftest import shop_sql

    shop_sql(tmp_path, "DROP TABLE customers")
    env = {"HOOK_URL": f"http://127.0.0.1:{port}/hang", "HOOK_KEY": KEY}
    started = time.monotonic()
    result = tools.cli(path.parent, "capture", "shop.customers", env=env)
    took = time.monotonic() - started
    assert result.returncode == 1, result.stderr
    # five attempts of ten seconds each would take close to a minute
    assert took < 20, f"the capture waited for the notification ({took:.1f} s)"
    assert "Traceback" not in result.stderr


def test_an_overdue_review_and_a_needs_review_run_alert_once(tmp_path: Path) -> None:
    from tests.conftest import shop_sql

    path = _project(tmp_path, "", "        quarantine: {reader: ana, review_every: 2d}\n")
    shop_sql(  # a duplicate key: quarantined, the Run needs review
        tmp_path,
        "CREATE TABLE o2 (id INTEGER, customer_id INTEGER, status TEXT, total REAL);"
        "INSERT INTO o2 SELECT * FROM orders; INSERT INTO o2 VALUES (1, 1, 'dup', 1.0);"
        "DROP TABLE orders; ALTER TABLE o2 RENAME TO orders;",
    )
    engine = Engine.open(path)
    try:
        (run,) = engine.capture(["shop.orders"])
        assert run.state == "needs_review", run.error
        (alert,) = _events(engine, "alert.run_needs_review")
        assert alert.run_id == run.id
        soon = utcnow() + timedelta(days=3)
        notes = engine.check_alerts(slots=False, now=soon)
        assert any("awaits review by ana" in n for n in notes)
        assert not [n for n in engine.check_alerts(slots=False, now=soon) if "awaits review" in n]
        assert len(_events(engine, "alert.quarantine_overdue")) == 1
    finally:
        engine.close()


def test_freshness_is_the_age_of_the_published_source_position(tmp_path: Path) -> None:
    path = _project(tmp_path, "")
    engine = Engine.open(path)
    try:
        (run,) = engine.capture(["shop.orders"])
        (row,) = [r for r in engine.status(slots=False) if r["dataset"] == "shop.orders"]
        assert row["position_at"] is not None
        assert row["position_at"] < row["published_at"]
        now = utcnow()
        (row,) = [r for r in engine.status(slots=False) if r["dataset"] == "shop.orders"]
        assert row["age"] >= now - row["position_at"] - timedelta(seconds=1)
        assert row["age"] > utcnow() - row["published_at"]
    finally:
        engine.close()


def test_a_bad_notification_target_is_refused_at_load(tmp_path: Path, tools: Any) -> None:
    path = _project(
        tmp_path,
        "notifications:\n  - {name: ops, type: webhook, url: {secret: env:HOOK_URL}}\n",
    )
    result = tools.cli(path.parent, "status")
    assert result.returncode == 2
    assert "needs a signing secret" in result.stderr
    path.write_text(
        path.read_text().replace(
            "url: {secret: env:HOOK_URL}", "url: https://hooks.example/x, kinds: [nope]"
        )
    )
    result = tools.cli(path.parent, "status")
    assert result.returncode == 2 and "hooks.example" not in result.stderr


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


def test_a_capture_whose_reconciliation_disagrees_says_so_and_exits_5(
    tmp_path: Path, pg_database: str, tools: Any
) -> None:
    import psycopg

    with psycopg.connect(pg_database, autocommit=True) as pg:
        pg.execute("CREATE TABLE events (id int PRIMARY KEY, v text)")
        pg.execute("INSERT INTO events SELECT g, 'e' || g FROM generate_series(1, 20) g")
    (tmp_path / "combined.yaml").write_text(CURSOR_PROJECT.format(dsn=pg_database))
    first = tools.cli(tmp_path, "capture")
    assert first.returncode == 0, first.stderr
    assert "disagrees" not in first.stderr
    with psycopg.connect(pg_database, autocommit=True) as pg:
        pg.execute("DELETE FROM events WHERE id <= 3")
    result = tools.cli(tmp_path, "capture")
    assert result.returncode == 5, result.stderr
    assert "succeeded" in result.stdout
    assert "reconciliation disagrees: pg.events: the lake holds 20 rows, the source 17" in (
        result.stderr
    )
    assert "3 rows the source deleted" in result.stderr


SLOT_PROJECT = """\
version: 1
lake: ./lake
alerts: {{slot_max_lag: 1}}
sources:
  pg:
    connector: postgres
    config:
      dsn: {dsn}
      slot_prefix: {prefix}
    datasets:
      items:
        relation: public.items
        key: [id]
        strategy: cdc
"""


def test_a_cdc_slot_at_risk_alerts_once_and_says_how_long_the_source_keeps_it(
    tmp_path: Path, cdc_db: Any
) -> None:
    import psycopg

    from combined.config._models import AlertSettings
    from combined.runtime._alerts import slot_risk

    with psycopg.connect(cdc_db.dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE items (id bigint PRIMARY KEY, qty int)")
        conn.execute("INSERT INTO items SELECT g, g FROM generate_series(1, 50) g")
    cdc_db.slot("public.items")
    path = tmp_path / "combined.yaml"
    path.write_text(SLOT_PROJECT.format(dsn=cdc_db.dsn, prefix=cdc_db.prefix))
    engine = Engine.open(path)
    try:
        (run,) = engine.capture()
        assert run.state == "succeeded", run.error
        with psycopg.connect(cdc_db.dsn, autocommit=True) as conn:
            conn.execute("INSERT INTO items SELECT g, g FROM generate_series(51, 500) g")
        # raised by the capture (it checks the stream it read) or by this check: once
        engine.check_alerts()
        assert not [n for n in engine.check_alerts() if "at risk" in n]
        (alert,) = _events(engine, "alert.cdc_slot_at_risk")
        assert "until its disk fills" in alert.body["why"]
        body = alert.body
        assert body["lag_bytes"] > 1 and body["wal_keep_limit"] is None
        assert body["wal_rate"] is not None and body["wal_rate"] > 0  # pg_stat_wal, PG 14+
        # the same status under a max_slot_wal_keep_size: how long the source keeps it
        limited = {**body, "wal_keep_limit": 64 << 20, "safe_wal_size": 1 << 20}
        limited["keeps_for_seconds"] = (1 << 20) / body["wal_rate"]
        why = slot_risk(limited, AlertSettings(slot_horizon=timedelta(days=3650)))
        assert why is not None and "keeps this slot's WAL for about" in why
        assert slot_risk({**body, "wal_status": "unreserved"}, AlertSettings()) is not None
        # caught up: cleared, so the next breach is told again
        (run,) = engine.capture()
        assert run.state == "succeeded", run.error
    finally:
        engine.close()


def test_the_scheduler_checks_freshness_each_round_and_tells_each_change_once(
    tmp_path: Path,
) -> None:
    from combined.runtime._scheduler import Scheduler

    engine = Engine.open(_project(tmp_path, ""))
    try:
        (run,) = engine.capture(["shop.orders"])
        assert run.state == "succeeded", run.error
        later = utcnow() + timedelta(hours=2)
        for _ in range(2):
            Scheduler(engine).run(lambda: False, clock=lambda: later, once=True)
        assert len(_events(engine, "alert.freshness")) == 1
        Scheduler(engine).run(lambda: False, clock=utcnow, once=True)  # fresh again
        assert len(_events(engine, "freshness.restored")) == 1
        Scheduler(engine).run(lambda: False, clock=lambda: later, once=True)
        assert len(_events(engine, "alert.freshness")) == 2  # a new breach, told again
    finally:
        engine.close()


def test_a_source_failing_capture_after_capture_is_alerted_once_per_incident(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A scheduled capture of a source that stays broken fails at every tick:
    # one alert for the incident, not one a Run (a storm of webhooks all
    # night); a failure after the source came back is a new incident.
    receiver = Receiver()
    monkeypatch.setenv("HOOK_URL", receiver.url("/hook"))
    monkeypatch.setenv("HOOK_KEY", KEY)
    path = _project(tmp_path, OPS)
    from tests.conftest import shop_sql

    engine = Engine.open(path)
    try:
        shop_sql(tmp_path, "ALTER TABLE customers RENAME TO gone")
        failed = [engine.capture(["shop.customers"])[0] for _ in range(3)]
        assert [r.state for r in failed] == ["failed"] * 3
        shop_sql(tmp_path, "ALTER TABLE gone RENAME TO customers")
        (run,) = engine.capture(["shop.customers"])
        assert run.state == "succeeded", run.error
        shop_sql(tmp_path, "ALTER TABLE customers RENAME TO gone")
        (again,) = engine.capture(["shop.customers"])
        assert again.state == "failed"
        engine.sender.wait(60)
        alerts = _events(engine, "alert.run_failed")
        assert [a.run_id for a in alerts] == [failed[0].id, again.id]
        assert len(_events(engine, "run.failed")) == 4  # every failure is still in the feed
        sent = [json.loads(body) for _, body in receiver.posts("/hook")]
        # ... and the incident's end: the Run that succeeded, the alert it resolves
        assert [(p["kind"], p["run_id"]) for p in sent] == [
            ("alert.run_failed", failed[0].id),
            ("run.recovered", run.id),
            ("alert.run_failed", again.id),
        ]
        assert [p["resolves"] for p in sent] == [None, "alert.run_failed", None]
        assert sent[1]["body"]["datasets"] == ["customers"]
        assert sent[1]["summary"].startswith("Combined resolved alert.run_failed on shop")
    finally:
        engine.close()
        receiver.close()


def test_the_end_of_an_alert_reaches_the_targets_that_were_sent_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A person paged when a source went down, or its data went stale, hears when it is back."""
    receiver = Receiver()
    monkeypatch.setenv("STALE_URL", receiver.url("/stale"))
    monkeypatch.setenv("RUNS_URL", receiver.url("/runs"))
    path = _project(
        tmp_path,
        "notifications:\n"
        "  - {name: stale, type: slack, url: {secret: env:STALE_URL}, kinds: [freshness]}\n"
        "  - {name: runs, type: slack, url: {secret: env:RUNS_URL},"
        " kinds: [run_needs_review]}\n",
    )
    from tests.conftest import shop_sql

    engine = Engine.open(path)
    try:
        (run,) = engine.capture(["shop.orders"])
        assert run.state == "succeeded", run.error
        assert engine.check_alerts(slots=False, now=utcnow() + timedelta(hours=2))
        assert engine.check_alerts(slots=False) == []  # fresh again: told, not a note
        shop_sql(tmp_path, "ALTER TABLE customers RENAME TO gone")
        (failed,) = engine.capture(["shop.customers"])
        assert failed.state == "failed"  # run_failed: no target wants it, nor its end
        shop_sql(tmp_path, "ALTER TABLE gone RENAME TO customers")
        (back,) = engine.capture(["shop.customers"])
        assert back.state == "succeeded", back.error
        engine.sender.wait(60)
        stale = [json.loads(b)["text"] for _, b in receiver.posts("/stale")]
        assert len(stale) == 2, stale
        assert stale[0].startswith("Combined alert.freshness on shop.orders")
        # what a person paged needs: how stale, against which target (it said only the above)
        assert re.search(
            r"on shop\.orders: its published data is 2h(\d+s)? old, past its "
            r"freshness target of 1h$",
            stale[0],
        ), stale[0]
        assert stale[1].startswith("Combined resolved alert.freshness on shop.orders")
        assert "within its freshness target of 1h" in stale[1], stale[1]
        assert receiver.posts("/runs") == []
        (recovered,) = _events(engine, "run.recovered")
        assert recovered.body["resolves"] == "alert.run_failed"
        assert recovered.run_id == back.id
    finally:
        engine.close()
        receiver.close()


def test_combined_alerts_says_what_it_sent_and_exits_1_when_a_send_failed(
    tmp_path: Path, tools: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """It printed "no new alert" and exited 0 whether it had just sent the pending alerts
    or every send had failed."""
    from tests.conftest import shop_sql

    with socket.socket() as s:  # a port nothing listens on: refused at once
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    path = _project(
        tmp_path,
        "notifications:\n  - {name: ops, type: webhook, url: {secret: env:HOOK_URL},"
        " secret: {secret: env:HOOK_KEY}, attempts: 1}\n",
    )
    monkeypatch.setenv("HOOK_URL", f"http://127.0.0.1:{port}/hook")
    monkeypatch.setenv("HOOK_KEY", KEY)

    def failed_run(table: str, dataset: str) -> None:
        """A failed Run whose alert waits to be sent (this engine sends nothing)."""
        shop_sql(tmp_path, f"ALTER TABLE {table} RENAME TO gone_{table}")
        engine = Engine.open(path)
        try:
            engine.sender.soon = lambda: None  # type: ignore[method-assign]
            (run,) = engine.capture([f"shop.{dataset}"])
            assert run.state == "failed"
        finally:
            engine.close()

    failed_run("customers", "customers")
    refused = tools.cli(tmp_path, "alerts", "--no-slots")
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert "0 alert(s) sent, 1 failed" in refused.stdout and "not sent to ops" in refused.stdout
    receiver = Receiver()
    try:
        failed_run("orders", "orders")
        env = {"HOOK_URL": receiver.url("/hook")}
        sent = tools.cli(tmp_path, "alerts", "--no-slots", env=env)
        assert sent.returncode == 0, sent.stdout + sent.stderr
        assert "1 alert(s) sent, 0 failed" in sent.stdout
        assert len(receiver.posts("/hook")) == 1
    finally:
        receiver.close()
