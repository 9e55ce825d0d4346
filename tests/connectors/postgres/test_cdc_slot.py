"""Change capture against a real slot: streaming, acknowledging, bounds, failures.

Needs ``COMBINED_TEST_PG_DSN`` and ``wal_level=logical``; each test creates its
own tables, publication and slot and drops the slot in teardown. The batcher
and assembler offline are in ``test_cdc.py``.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg
import pytest

from combined.connectors.abc import Extraction
from combined.connectors.postgres import _cdc
from combined.connectors.postgres._cdc import (
    OP_TRUNCATE,
    UNCHANGED_COLUMN,
    CdcExtraction,
)
from combined.connectors.postgres._connect import Settings
from combined.connectors.postgres._pgoutput import (
    lsn_to_text,
    text_to_lsn,
)
from combined.connectors.postgres._publication import drop_publication, ensure_publication
from combined.connectors.postgres._replication import (
    ReplicationStream,
    SlotLost,
    create_slot,
    drop_slot,
    slot_status,
)
from combined.errors import (
    ConfigError,
    ProtocolViolation,
)
from combined.protocol import (
    EMITTED_AT_COLUMN,
    OP_COLUMN,
    POSITION_COLUMN,
    Message,
    RecordBatchMessage,
    StateMessage,
)


@dataclass
class Env:
    """One test's tables, publication and slot."""

    dsn: str
    conn: psycopg.Connection[Any]
    a: str
    b: str
    pub: str
    slot: str
    start: int
    opened: list[CdcExtraction] = field(default_factory=list)

    @property
    def pg(self) -> Settings:
        """The source settings the extraction connects with."""
        return Settings(self.dsn)

    def run(self, *statements: str, params: Any = None) -> None:
        with self.conn.transaction():
            for s in statements:
                self.conn.execute(s.format(a=self.a, b=self.b), params)

    def extraction(self, **kw: Any) -> CdcExtraction:
        kw.setdefault("start_lsn", self.start)
        kw.setdefault("end_lsn", "current")
        kw.setdefault("datasets", {"a": self.a, "b": self.b})
        ex = CdcExtraction(self.pg, slot=self.slot, publication=self.pub, **kw)
        self.opened.append(ex)
        return ex

    def confirmed(self) -> int | None:
        return slot_status(self.pg, self.slot).confirmed_flush_lsn

    def wait_confirmed(self, lsn: int, timeout: float = 5.0) -> int | None:
        deadline = time.monotonic() + timeout
        while (got := self.confirmed()) != lsn and time.monotonic() < deadline:
            time.sleep(0.05)
        return got


@pytest.fixture
def env(dsn: str) -> Iterator[Env]:
    sfx = f"{os.getpid()}_{uuid.uuid4().hex[:8]}"
    a, b, pub, slot = f"cdc_a_{sfx}", f"cdc_b_{sfx}", f"cdc_pub_{sfx}", f"cdc_slot_{sfx}"
    pg = Settings(dsn)
    conn = psycopg.connect(dsn, autocommit=True)
    conn.execute(f"CREATE TABLE {a} (id int PRIMARY KEY, name text, big text, n numeric(10,2))")
    conn.execute(f"CREATE TABLE {b} (id int PRIMARY KEY, v text)")
    try:
        ensure_publication(pg, pub, [a, b])
        with create_slot(pg, slot) as handle:
            start = handle.consistent_point
        e = Env(dsn, conn, a, b, pub, slot, start)
        yield e
        for ex in e.opened:
            ex.finish("abort")  # a failed test may leave its stream open
    finally:
        conn.execute(
            "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots "
            "WHERE slot_name = %s AND active_pid IS NOT NULL",
            (slot,),
        )
        drop_slot(pg, slot)
        drop_publication(pg, pub)
        conn.execute(f"DROP TABLE IF EXISTS {a}, {b}")
        conn.close()


def _consume(ex: Extraction) -> tuple[list[Message], dict[str, list[dict[str, Any]]]]:
    out = list(ex)
    rows: dict[str, list[dict[str, Any]]] = {}
    for m in out:
        if isinstance(m, RecordBatchMessage):
            rows.setdefault(m.dataset, []).extend(m.batch.to_pylist())
    return out, rows


def _states(out: list[Message], dataset: str) -> list[StateMessage]:
    return [m for m in out if isinstance(m, StateMessage) and m.dataset == dataset]


@pytest.mark.postgres
def test_changes_stream_in_commit_order(env: Env) -> None:
    big = secrets.token_hex(2500)  # 5000 random bytes of text: stored out of line
    env.run("INSERT INTO {a} VALUES (1, 'one', %s, 1.5), (2, 'two', 'small', 2)", params=(big,))
    env.run("UPDATE {a} SET name = 'uno' WHERE id = 1")  # big is not in the SET list
    env.run("DELETE FROM {a} WHERE id = 2")
    env.run("INSERT INTO {b} VALUES (1, 'x')", "INSERT INTO {a} VALUES (3, 'three', NULL, 3)")
    env.run("TRUNCATE {a}")
    env.run(
        "ALTER TABLE {a} ADD COLUMN extra int", "INSERT INTO {a} VALUES (4, 'four', NULL, 4, 44)"
    )

    ex = env.extraction()
    out, rows = _consume(ex)
    a = [(r[OP_COLUMN], r["id"]) for r in rows["a"]]
    assert a == [
        *(("insert", 1), ("insert", 2), ("update", 1), ("delete", 2)),
        *(("insert", 3), (OP_TRUNCATE, None), ("insert", 4)),
    ]
    update = rows["a"][2]
    assert update["name"] == "uno" and update["big"] is None
    assert update[UNCHANGED_COLUMN] == ["big"]  # never a null overwriting the lake's value
    assert rows["a"][0]["big"] == big and rows["a"][0]["n"] == Decimal("1.50")
    assert rows["a"][-1]["extra"] == 44 and "extra" not in rows["a"][0]
    assert [r["v"] for r in rows["b"]] == ["x"]

    # The new column arrives in a batch of its own shape.
    a_batches = [m.batch for m in out if isinstance(m, RecordBatchMessage) and m.dataset == "a"]
    assert "extra" in a_batches[-1].schema.names and "extra" not in a_batches[0].schema.names
    marker = next(b for b in a_batches if b.column(OP_COLUMN)[0].as_py() == OP_TRUNCATE)
    assert marker.num_rows == 1

    # Every state follows the rows it covers; positions only grow.
    states = _states(out, "a")
    lsns = [text_to_lsn(s.state["lsn"]) for s in states]
    assert lsns == sorted(lsns) and states[-1].final
    seen: set[str] = set()
    for m in out:
        if isinstance(m, RecordBatchMessage):
            seen.update(m.batch.column(POSITION_COLUMN).to_pylist())
        elif m.position and m.emitted_at:
            covered = {p for p in seen if text_to_lsn(p) <= text_to_lsn(m.position)}
            assert m.position in covered
    for r in rows["a"]:
        assert r[EMITTED_AT_COLUMN].tzinfo is not None
    assert ex.receipt.completed and ex.receipt.rows == 7  # the truncate marker is no record
    ex.finish("success")


@pytest.mark.postgres
def test_acknowledge_confirms_only_what_was_acknowledged(env: Env) -> None:
    env.run("INSERT INTO {a} VALUES (1, 'one', NULL, 1)")
    env.run("INSERT INTO {a} VALUES (2, 'two', NULL, 2)")
    before = env.confirmed()
    ex = env.extraction(datasets={"a": env.a}, status_interval=1, flush_interval=0)
    out, _ = _consume(ex)
    first, second, final = _states(out, "a")
    assert final.final and final.state["lsn"] >= second.state["lsn"]
    time.sleep(1.2)  # past a status interval: nothing was acknowledged yet
    assert env.confirmed() == before

    ex.acknowledge(first.state)
    assert env.wait_confirmed(text_to_lsn(first.state["lsn"])) == text_to_lsn(first.state["lsn"])
    time.sleep(1.2)
    assert env.confirmed() == text_to_lsn(first.state["lsn"])  # never ahead of the lake
    ex.acknowledge(first.state)  # a repeat changes nothing
    with pytest.raises(ProtocolViolation, match="ahead of the stream"):
        ex.acknowledge({"lsn": lsn_to_text(text_to_lsn(final.state["lsn"]) + 1), "dataset": "a"})
    with pytest.raises(ProtocolViolation):
        ex.acknowledge({"lsn": first.state["lsn"], "dataset": "nope"})

    # A crash: the second transaction was yielded but never acknowledged.
    ex.finish("abort")
    again = env.extraction(datasets={"a": env.a}, start_lsn=first.state["lsn"])
    out2, rows2 = _consume(again)
    assert [(r[OP_COLUMN], r["id"]) for r in rows2["a"]] == [("insert", 2)]
    # Acknowledged after the stream closed: confirmed on the idle slot instead.
    last = _states(out2, "a")[-1]
    again.finish("success")
    again.acknowledge(last.state)
    assert env.wait_confirmed(text_to_lsn(last.state["lsn"])) == text_to_lsn(last.state["lsn"])


@pytest.mark.postgres
def test_a_crash_between_lake_commit_and_acknowledge_lands_each_change_once(env: Env) -> None:
    env.run("INSERT INTO {a} VALUES (1, 'one', NULL, 1)")
    env.run("UPDATE {a} SET name = 'uno' WHERE id = 1")
    ex = env.extraction(datasets={"a": env.a}, flush_interval=0)
    out, _ = _consume(ex)
    first, second = _states(out, "a")[:2]
    ex.acknowledge(first.state)
    ex.finish("abort")  # the lake committed `second`, then the process died before acknowledging
    assert env.wait_confirmed(text_to_lsn(first.state["lsn"])) == text_to_lsn(first.state["lsn"])

    env.run("DELETE FROM {a} WHERE id = 1")
    again = env.extraction(datasets={"a": env.a}, start_lsn={"a": second.state["lsn"]})
    out2, rows = _consume(again)
    # The server resends the update (the slot is behind); the lake's checkpoint skips it.
    assert [(r[OP_COLUMN], r["id"]) for r in rows["a"]] == [("delete", 1)]
    assert rows["a"][0][POSITION_COLUMN] == _states(out2, "a")[0].position
    again.finish("success")


@pytest.mark.postgres
def test_the_slot_moves_only_when_every_dataset_acknowledged(env: Env) -> None:
    env.run("INSERT INTO {a} VALUES (1, 'one', NULL, 1)")
    env.run("INSERT INTO {b} VALUES (1, 'x')")
    before = env.confirmed()
    ex = env.extraction()
    out, _ = _consume(ex)
    a_final, b_final = _states(out, "a")[-1], _states(out, "b")[-1]
    assert a_final.state["lsn"] == b_final.state["lsn"]
    ex.acknowledge(a_final.state)
    time.sleep(0.3)
    assert env.confirmed() == before  # b's rows are not in the lake yet
    ex.acknowledge(b_final.state)
    target = text_to_lsn(b_final.state["lsn"])
    assert env.wait_confirmed(target) == target
    assert ex.confirmed_lsn == target
    ex.finish("success")


@pytest.mark.postgres
def test_a_bounded_run_stops_at_its_end_and_leaves_later_commits(env: Env) -> None:
    env.run("INSERT INTO {a} VALUES (1, 'one', NULL, 1)")
    ex = env.extraction()
    it = iter(ex)
    first = next(it)
    env.run("INSERT INTO {a} VALUES (2, 'late', NULL, 2)")  # after the run's end
    rest = [first, *it]
    ids = [r["id"] for m in rest if isinstance(m, RecordBatchMessage) for r in m.batch.to_pylist()]
    assert ids == [1]
    ex.finish("success")
    nxt = env.extraction(start_lsn=_states(rest, "a")[-1].state["lsn"])
    _, rows = _consume(nxt)
    assert [r["id"] for r in rows["a"]] == [2]
    nxt.finish("success")


@pytest.mark.postgres
def test_follow_mode_heartbeats_quiet_datasets_until_stopped(env: Env) -> None:
    stop = threading.Event()
    ex = env.extraction(end_lsn=None, stop=stop.is_set, heartbeat_interval=0.2, timeout=30)
    writer_done = threading.Event()

    def writer() -> None:
        with psycopg.connect(env.dsn, autocommit=True) as c:
            for i in range(3):
                c.execute(f"INSERT INTO {env.a} VALUES (%s, 'w', NULL, 1)", (i,))
                time.sleep(0.3)
        writer_done.set()

    threading.Thread(target=writer, daemon=True).start()
    out: list[Message] = []
    for m in ex:
        out.append(m)
        a_rows = sum(x.batch.num_rows for x in out if isinstance(x, RecordBatchMessage))
        if writer_done.is_set() and a_rows == 3 and len(_states(out, "b")) >= 2:
            stop.set()
    b_states = _states(out, "b")
    assert all(s.emitted_at is None for s in b_states)  # heartbeats: no commit of b
    assert text_to_lsn(b_states[-1].state["lsn"]) > env.start and b_states[-1].final
    a_final = _states(out, "a")[-1]
    assert a_final.final and ex.receipt.completed
    ex.acknowledge(a_final.state)
    ex.acknowledge(b_states[-1].state)
    target = min(text_to_lsn(a_final.state["lsn"]), text_to_lsn(b_states[-1].state["lsn"]))
    assert env.wait_confirmed(target) == target
    ex.finish("success")


@pytest.mark.postgres
def test_a_quiet_dataset_beats_while_another_streams_without_a_pause(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A reader drains and beats when the stream pauses (it waits a little for
    # the next message first: small transactions). A stream that never pauses
    # (here: no pause counts, shorter than 3 s) still beats, at its commits,
    # for a quiet dataset, whose acknowledgement lets the slot move on.
    monkeypatch.setattr(_cdc, "_BUSY_WAIT", 3.0)
    read = ReplicationStream.read

    def unpaused(self: ReplicationStream, timeout: float) -> tuple[bytes, int] | None:
        # (a read that waits returns at its first wake without a whole message: here
        # it reads on until one comes or the time is up, as a stream never paused)
        ends = time.monotonic() + timeout
        while True:
            got = read(self, max(ends - time.monotonic(), 0.0))
            if got is not None or time.monotonic() >= ends:
                return got

    monkeypatch.setattr(ReplicationStream, "read", unpaused)
    stop = threading.Event()
    ex = env.extraction(end_lsn=None, stop=stop.is_set, heartbeat_interval=0.2, timeout=60)

    def writer() -> None:  # single-row transactions, for 8 s, as fast as the server commits
        with psycopg.connect(env.dsn, autocommit=True) as c:
            c.execute(
                "DO $$ DECLARE i int := 0; ends timestamptz := clock_timestamp() + interval "
                f"'8 s'; BEGIN WHILE clock_timestamp() < ends LOOP i := i + 1; INSERT INTO "
                f"{env.a} VALUES (i, 'w', NULL, 1); COMMIT; END LOOP; END $$"
            )

    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    started = time.monotonic()
    beats: list[float] = []  # when each state of b came, from the start
    for m in ex:
        if isinstance(m, StateMessage) and m.dataset == "b":
            beats.append(time.monotonic() - started)
        if not thread.is_alive():
            stop.set()
    thread.join(30)
    assert len([t for t in beats if t < 6.0]) >= 3, f"b's states came at {beats} s"
    ex.finish("success")


@pytest.mark.postgres
def test_a_lost_slot_fails_loudly(env: Env) -> None:
    drop_slot(env.pg, env.slot)
    with pytest.raises(SlotLost, match="does not exist") as info:
        list(env.extraction())
    assert "teardown" in (info.value.hint or "")


@pytest.mark.postgres
def test_a_slot_dropped_while_streaming_fails_loudly(env: Env) -> None:
    env.run("INSERT INTO {a} VALUES (1, 'one', NULL, 1)")
    ex = env.extraction(end_lsn=None, timeout=20)
    it = iter(ex)
    next(it)
    pid = slot_status(env.pg, env.slot).active_pid
    env.conn.execute("SELECT pg_terminate_backend(%s)", (pid,))
    drop_slot(env.pg, env.slot)
    with pytest.raises(SlotLost):
        list(it)
    ex.finish("abort")


@pytest.mark.postgres
def test_configuration_errors(env: Env) -> None:
    with pytest.raises(ConfigError):
        env.extraction(start_lsn={"a": env.start})  # no start for b
    with pytest.raises(ConfigError):
        CdcExtraction(env.pg, slot=env.slot, publication=env.pub, datasets={}, start_lsn=0)


@pytest.mark.postgres
@pytest.mark.slow
def test_a_million_row_transaction_streams_in_bounded_memory(env: Env) -> None:
    rows = 1_000_000
    env.run(f"INSERT INTO {{b}} SELECT g, repeat('x', 200) FROM generate_series(1, {rows}) g")

    def rss() -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    ex = env.extraction(datasets={"b": env.b}, batch_rows=20_000)
    base, peak, seen, max_batch = rss(), 0, 0, 0
    states_before_end = 0
    for m in ex:
        if isinstance(m, RecordBatchMessage):
            seen += m.batch.num_rows
            max_batch = max(max_batch, m.batch.num_rows)
            peak = max(peak, rss() - base)
        elif seen < rows:
            states_before_end += 1
    assert seen == rows and max_batch <= 20_000
    assert states_before_end == 0  # the checkpoint comes only after the commit
    # The transaction holds over 200 MB of text; the stream holds a few batches.
    assert peak < 120 * 1024 * 1024, f"rss grew by {peak / 2**20:.0f} MiB"
    ex.finish("success")


@pytest.mark.postgres
def test_values_of_every_mapped_type_arrive_typed(env: Env) -> None:
    mood = f"cdc_mood_{env.a[6:]}"
    env.conn.execute(f"CREATE TYPE {mood} AS ENUM ('happy', 'sad')")
    try:
        env.run(
            f"ALTER TABLE {{a}} ADD COLUMN m {mood}, ADD COLUMN span interval,"
            " ADD COLUMN ints int[], ADD COLUMN tags text[], ADD COLUMN at timestamptz,"
            " ADD COLUMN day date, ADD COLUMN t time, ADD COLUMN raw bytea, ADD COLUMN doc jsonb,"
            " ADD COLUMN ok bool, ADD COLUMN r real, ADD COLUMN local timestamp"
        )
        env.conn.execute(
            f"INSERT INTO {env.a} (id, n, m, span, ints, tags, at, day, t, raw, doc, ok, r, local)"
            " VALUES (1, 12345678.91, 'sad', '1 year 2 mons 3 days -04:05:06.5', '{1,NULL,3}',"
            " '{\"x y\",z}', '2024-02-29 23:59:59.999999-08', '2024-02-29', '13:14:15.5',"
            " '\\x00ff', '{\"k\": [1]}', true, 1.5, '2024-01-01 00:00:00')"
        )
        ex = env.extraction(datasets={"a": env.a})
        _, rows = _consume(ex)
        (row,) = rows["a"]
        assert row["n"] == Decimal("12345678.91") and row["m"] == "sad"
        span = row["span"]
        assert (span.months, span.days, span.nanoseconds) == (14, 3, -14_706_500_000_000)
        assert row["ints"] == [1, None, 3] and row["tags"] == ["x y", "z"]
        assert row["at"] == datetime(2024, 3, 1, 7, 59, 59, 999999, tzinfo=UTC)
        assert str(row["day"]) == "2024-02-29" and str(row["t"]) == "13:14:15.500000"
        assert row["raw"] == b"\x00\xff" and row["doc"] == '{"k": [1]}'
        assert row["ok"] is True and row["r"] == 1.5
        assert row["local"] == datetime(2024, 1, 1)
        ex.finish("success")
    finally:
        env.conn.execute(f"DROP TABLE IF EXISTS {env.a}")
        env.conn.execute(f"DROP TYPE IF EXISTS {mood}")


def test_a_first_capture_waiting_for_an_open_transaction_stops_at_sigint(
    tmp_path: Path, cdc_db: Any, tools: Any
) -> None:
    """Creating the slot waits for every open transaction to end, and psycopg2
    waited in C: a capture behind a session idle in transaction ignored Ctrl-C
    (and SIGTERM) until that session ended. It now stops at once, and the
    cancelled statement leaves no slot behind."""
    with psycopg.connect(cdc_db.dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY)")
        conn.execute("CREATE TABLE other (id int)")
    (tmp_path / "combined.yaml").write_text(
        tools.pg_cdc_project(cdc_db.dsn, cdc_db.prefix, "public.t", ["id"])
    )
    slot = cdc_db.slot("public.t")
    waiting = (
        "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'walsender'"
        " AND datname = current_database() AND wait_event IS NOT NULL AND state = 'active'"
    )
    with psycopg.connect(cdc_db.dsn) as held, psycopg.connect(cdc_db.dsn, autocommit=True) as look:
        held.execute("INSERT INTO other VALUES (1)")  # a transaction with an xid, left open
        capture = subprocess.Popen(
            [sys.executable, "-c", "from combined.cli import main; main()", "capture"],
            cwd=tmp_path,
            env={**os.environ, "COMBINED_RETRY_BACKOFF_S": "0"},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            deadline = time.monotonic() + 60
            while look.execute(waiting).fetchone() != (1,):
                assert capture.poll() is None and time.monotonic() < deadline, capture.stderr
                time.sleep(0.2)
            capture.send_signal(signal.SIGINT)
            _, err = capture.communicate(timeout=15)  # before: waited as long as `held`
        finally:
            if capture.poll() is None:
                capture.kill()
                capture.communicate()
        assert capture.returncode == 130, err
        found = look.execute("SELECT 1 FROM pg_replication_slots WHERE slot_name = %s", (slot,))
        assert found.fetchone() is None
