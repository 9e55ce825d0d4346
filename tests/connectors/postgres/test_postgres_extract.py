"""Snapshot reads: receipts, bounded batches, snapshot isolation, outcomes and cleanup."""

from __future__ import annotations

import pickle
import re
import threading
import time

import pytest

from combined.connectors.abc import Extraction
from combined.connectors.postgres import (
    CURRENT_SNAPSHOT,
    SERVER_CLOCK,
    ControlTotals,
    PostgresExtraction,
    PostgresSource,
)
from combined.connectors.postgres import _connect as pg_connect
from combined.connectors.postgres import _types as pg_types
from combined.errors import ProtocolViolation, SchemaMismatch, SourceUnavailable
from combined.protocol import RecordBatchMessage, StateMessage


def _fill(admin, schema: str, rows: int, table: str = "t") -> None:
    admin.execute(
        f"CREATE TABLE {schema}.{table} (id int PRIMARY KEY, v text, amount numeric(12,2))"
    )
    admin.execute(
        f"INSERT INTO {schema}.{table} SELECT g, md5(g::text), g * 1.25"
        f" FROM generate_series(1, {rows}) g"
    )


def test_receipt_follows_the_read_in_bounded_batches(admin, schema, source, make_request):
    _fill(admin, schema, 1000)
    ext = source.read(make_request("t", batch_rows=128))
    assert isinstance(ext, Extraction)  # the engine's protocol
    ext = source.read(make_request("t", batch_rows=128))
    assert ext.receipt.extraction_started_at is None and ext.backend_pid is None
    it = iter(ext)
    assert ext.receipt.extraction_started_at is None  # building the generator reads nothing

    first = next(it)
    r = ext.receipt
    assert isinstance(first, RecordBatchMessage) and first.batch.num_rows == 128
    assert r.extraction_started_at is not None and r.extraction_completed_at is None
    assert r.clock_authority == SERVER_CLOCK
    assert r.snapshot_authority == CURRENT_SNAPSHOT
    assert r.snapshot_acquired_at == r.extraction_started_at
    assert r.source_token is not None and re.fullmatch(r"[0-9a-f]{32}", r.source_token)
    assert r.rows == 128 and r.bytes == first.batch.nbytes

    rest = []
    for message in it:
        if isinstance(message, StateMessage):
            final = message
            break
        rest.append(message.batch)
        # Not complete while any batch is still in flight, even the last one.
        assert ext.receipt.extraction_completed_at is None
    assert all(b.num_rows <= 128 for b in rest)
    assert sum(b.num_rows for b in rest) + 128 == 1000
    assert final.final and final.state == {}
    done = ext.receipt
    assert done.rows == 1000
    assert done.extraction_started_at is not None and done.extraction_completed_at is not None
    assert done.extraction_started_at <= done.extraction_completed_at
    assert r.extraction_completed_at is None  # the observed receipt never changed
    with pytest.raises(StopIteration):
        next(it)
    terminal = ext.finish("success")
    assert terminal.cleanup_succeeded and terminal.receipt == done


def test_the_whole_lifecycle_commits_before_the_last_message(
    admin, schema, source, make_request, pgt
):
    _fill(admin, schema, 10)
    ext = source.read(make_request("t"))
    it = iter(ext)
    next(it)
    pid = ext.backend_pid
    assert pid is not None
    assert pgt.backend_state(admin, pid) == "idle in transaction"
    final = next(it)
    assert isinstance(final, StateMessage)
    # The read-only transaction is over before the outcome; its session is
    # kept, idle, for the source's next read, and closed with the source.
    assert pgt.wait_transaction_over(admin, pid) and not ext.holds_transaction
    assert ext.finish("success").cleanup_succeeded
    assert pgt.backend_state(admin, pid) == "idle"
    source.close()
    assert pgt.wait_backend_gone(admin, pid)


def test_a_snapshot_read_ignores_changes_committed_while_it_runs(
    admin, schema, source, make_request, pgt
):
    _fill(admin, schema, 20_000)
    before = admin.execute(f"SELECT sum(amount) FROM {schema}.t").fetchone()
    ext = source.read(make_request("t", batch_rows=500, options={"batch_bytes": 32 * 1024}))
    it = iter(ext)
    seen = [next(it).batch]
    token = ext.receipt.source_token
    # Another session changes the relation mid-read and commits.
    admin.execute(f"INSERT INTO {schema}.t SELECT g, 'new', 1 FROM generate_series(20001, 20500) g")
    admin.execute(f"DELETE FROM {schema}.t WHERE id > 19000 AND id <= 20000")
    admin.execute(f"UPDATE {schema}.t SET amount = 0, v = 'changed'")
    seen += pgt.batches(it)
    ids = [i for b in seen for i in b.column("id").to_pylist()]
    assert sorted(ids) == list(range(1, 20_001))
    assert all(v != "changed" for b in seen for v in b.column("v").to_pylist())
    assert sum(a for b in seen for a in b.column("amount").to_pylist()) == before[0]
    assert ext.receipt.source_token == token and ext.receipt.rows == 20_000
    ext.finish("success")


def test_streaming_holds_the_transaction_until_the_outcome(
    admin, schema, source, make_request, pgt
):
    _fill(admin, schema, 50)
    ext = source.read(make_request("t", options={"lifecycle": "streaming"}))
    messages = list(ext)
    pid = ext.backend_pid
    assert pid is not None and isinstance(messages[-1], StateMessage)
    assert ext.receipt.completed and ext.holds_transaction
    assert pgt.backend_state(admin, pid) == "idle in transaction"
    terminal = ext.finish("success")
    assert terminal.outcome == "success" and terminal.cleanup_succeeded
    assert terminal.retained_paths == () and pgt.wait_transaction_over(admin, pid)
    # The first decision wins; repeats return the very same receipt.
    assert ext.finish("abort") is terminal


@pytest.mark.parametrize("outcome", ["abort", "retain_commit_unknown"])
def test_abort_and_retain_roll_back_and_close(admin, schema, source, make_request, pgt, outcome):
    _fill(admin, schema, 50)
    ext = source.read(make_request("t", options={"lifecycle": "streaming"}))
    list(ext)
    pid = ext.backend_pid
    terminal = ext.finish(outcome)
    assert terminal.outcome == outcome and terminal.cleanup_succeeded
    assert terminal.retained_paths == ()  # a live transaction is never evidence
    assert pgt.wait_backend_gone(admin, pid)


def test_abort_mid_read_closes_without_draining(admin, schema, source, make_request, pgt):
    _fill(admin, schema, 200_000)
    ext = source.read(make_request("t", batch_rows=1000, options={"batch_bytes": 64 * 1024}))
    it = iter(ext)
    next(it)
    pid = ext.backend_pid
    terminal = ext.finish("abort")
    assert terminal.cleanup_succeeded and terminal.receipt is not None
    assert terminal.receipt.extraction_completed_at is None
    assert pgt.wait_backend_gone(admin, pid)
    with pytest.raises(ProtocolViolation, match="finished"):
        next(it)
    assert ext.finish("success") is terminal


def test_an_abandoned_generator_closes_its_session(admin, schema, source, make_request, pgt):
    _fill(admin, schema, 5000)
    ext = source.read(make_request("t", batch_rows=100))
    it = iter(ext)
    next(it)
    pid = ext.backend_pid
    it.close()  # the consumer walks away (GeneratorExit)
    assert pgt.wait_backend_gone(admin, pid) and not ext.holds_transaction
    assert ext.finish("abort").cleanup_succeeded


def test_a_read_is_read_once(admin, schema, source, make_request):
    _fill(admin, schema, 3)
    ext = source.read(make_request("t"))
    list(ext)
    with pytest.raises(ProtocolViolation, match="already read"):
        list(ext)
    ext.finish("success")
    fresh = source.read(make_request("t"))
    fresh.finish("abort")
    with pytest.raises(ProtocolViolation, match="finished"):
        list(fresh)


def test_a_dropped_connection_is_transient_and_leaves_nothing_open(
    admin, schema, source, make_request, pgt
):
    _fill(admin, schema, 300_000)
    ext = source.read(make_request("t", batch_rows=1000, options={"batch_bytes": 64 * 1024}))
    it = iter(ext)
    next(it)
    pid = ext.backend_pid
    admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
    with pytest.raises(SourceUnavailable) as info:
        for _ in it:
            pass
    assert info.value.transient and info.value.run_state == "failed"
    assert not ext.holds_transaction and pgt.wait_backend_gone(admin, pid)
    assert not ext.receipt.completed
    terminal = ext.finish("abort")
    assert terminal.cleanup_succeeded
    # The retry (a new read) lands every row exactly once.
    retry = source.read(make_request("t", batch_rows=50_000))
    ids = [i for b in pgt.batches(retry) for i in b.column("id").to_pylist()]
    retry.finish("success")
    assert len(ids) == 300_000 and len(set(ids)) == 300_000


def test_a_failed_commit_is_a_cleanup_failure_not_a_read_failure(
    admin, schema, source, make_request, pgt
):
    _fill(admin, schema, 10)
    ext = source.read(make_request("t", options={"lifecycle": "streaming"}))
    list(ext)
    pid = ext.backend_pid
    admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
    assert pgt.wait_backend_gone(admin, pid)
    terminal = ext.finish("success")
    assert terminal.receipt is not None and terminal.receipt.completed
    assert not terminal.cleanup_succeeded
    assert terminal.cleanup_error_code == "SourceUnavailable"


def test_cleanup_failure_never_replaces_the_primary_error(
    admin, schema, source, make_request, monkeypatch
):
    admin.execute(f"CREATE TABLE {schema}.t (id int, at time)")
    admin.execute(f"INSERT INTO {schema}.t VALUES (1, '24:00:00')")
    real_close = pg_connect.Session.close

    def failing_close(self):
        real_close(self)  # resources really close; only the report fails
        return RuntimeError("close failed")

    monkeypatch.setattr(pg_connect.Session, "close", failing_close)
    ext = source.read(make_request("t"))
    with pytest.raises(SchemaMismatch) as info:
        list(ext)
    assert any("cleanup also failed" in n for n in getattr(info.value, "__notes__", []))
    terminal = ext.finish("abort")
    assert not terminal.cleanup_succeeded and terminal.cleanup_error_code == "RuntimeError"


def test_finish_from_another_thread_waits_for_the_batch_in_flight(
    admin, schema, source, make_request, pgt, monkeypatch
):
    # Small driver batches, and the consumer held inside its second one's
    # conversion (under the read's lock): finish is called while a batch is
    # in flight, never after a read that ran to its end first (which would
    # commit and keep its session, as the CI once saw under load).
    _fill(admin, schema, 50_000)
    ext = source.read(make_request("t", batch_rows=500, options={"batch_bytes": 64 << 10}))
    it = iter(ext)
    next(it)
    pid = ext.backend_pid
    inside, done = threading.Event(), threading.Event()
    converted: list[float] = []
    real_convert = pg_types.Layout.convert

    def held_convert(self, raw, relation="table"):
        if threading.current_thread() is worker and not inside.is_set():
            inside.set()
            time.sleep(0.5)
            converted.append(time.monotonic())
        return real_convert(self, raw, relation)

    def consume():
        try:
            for _ in it:
                pass
        except ProtocolViolation:
            pass
        finally:
            done.set()

    monkeypatch.setattr(pg_types.Layout, "convert", held_convert)
    worker = threading.Thread(target=consume)
    worker.start()
    assert inside.wait(10), "the consumer never read a second driver batch"
    terminal = ext.finish("abort")
    finished = time.monotonic()
    worker.join(10)
    assert converted and converted[0] <= finished  # finish waited for the batch in flight
    assert done.is_set() and terminal.cleanup_succeeded and pgt.wait_backend_gone(admin, pid)
    assert not ext.receipt.completed


def test_bounds_columns_and_control_totals(admin, schema, source, make_request, pgt):
    _fill(admin, schema, 100)
    admin.execute(f"INSERT INTO {schema}.t VALUES (101, NULL, NULL)")
    req = make_request(
        "t",
        columns=("id", "amount"),
        bounds={"column": "id", "lower": 10, "upper": "20"},
        options={"control_totals": "amount"},
    )
    ext = source.read(req)
    table = pgt.table_of(list(ext))
    ext.finish("success")
    assert table.column_names == ["id", "amount"]
    assert sorted(table.column("id").to_pylist()) == list(range(10, 20))
    expected_sum = sum(i * 125 for i in range(10, 20)) / 100
    assert ext.control_totals == ControlTotals(10, "amount", f"{expected_sum:.2f}")


def test_control_totals_are_read_in_the_same_snapshot(admin, schema, source, make_request):
    _fill(admin, schema, 100)
    ext = source.read(make_request("t", options={"control_totals": True}))
    it = iter(ext)
    next(it)
    admin.execute(f"DELETE FROM {schema}.t WHERE id <= 50")
    list(it)
    ext.finish("success")
    assert ext.control_totals == ControlTotals(100)


def _scans(admin, schema: str, table: str) -> int:
    row = admin.execute(
        "SELECT coalesce(seq_scan, 0) + coalesce(idx_scan, 0) FROM pg_stat_user_tables "
        "WHERE schemaname = %s AND relname = %s",
        (schema, table),
    ).fetchone()
    return int(row[0])


def test_a_snapshots_row_count_comes_from_its_own_read_without_a_second_scan(
    admin, schema, source, make_request, pgt
):
    _fill(admin, schema, 300)
    before = _scans(admin, schema, "t")
    ext = source.read(make_request("t", batch_rows=64, options={"control_totals": True}))
    rows = sum(m.batch.num_rows for m in ext if isinstance(m, RecordBatchMessage))
    pid = ext.backend_pid
    ext.finish("success")
    assert ext.control_totals == ControlTotals(300) and rows == 300
    # A backend flushes its table statistics when it exits: every scan of
    # the read arrives at once (the source keeps the session till it closes).
    source.close()
    assert pid is not None and pgt.wait_backend_gone(admin, pid)
    deadline = time.monotonic() + 10
    while _scans(admin, schema, "t") == before and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _scans(admin, schema, "t") - before == 1  # the read itself, no count(*)


def test_a_control_sum_still_reads_its_own_totals(admin, schema, source, make_request):
    _fill(admin, schema, 40)
    ext = source.read(make_request("t", options={"control_totals": "amount"}))
    assert sum(m.batch.num_rows for m in ext if isinstance(m, RecordBatchMessage)) == 40
    ext.finish("success")
    assert ext.control_totals == ControlTotals(40, "amount", f"{sum(range(1, 41)) * 1.25:.2f}")


def test_the_source_keeps_no_secret_and_errors_pickle(pg_dsn, schema):
    src = PostgresSource({"dsn": pg_dsn, "password": "s3cret-pw", "schemas": [schema]})
    assert src.config["password"] == "***"
    assert "s3cret-pw" not in repr(src.settings)
    err = SourceUnavailable("x", hint="y", detail="z")
    assert pickle.loads(pickle.dumps(err)).context == {"detail": "z"}


def test_source_close_releases_unfinished_reads(pg_dsn, schema, admin, make_request, pgt):
    _fill(admin, schema, 10)
    src = PostgresSource({"dsn": pg_dsn, "schemas": [schema]})
    ext = src.read(make_request("t", options={"lifecycle": "streaming"}))
    assert isinstance(ext, PostgresExtraction)
    list(ext)
    pid = ext.backend_pid
    src.close()
    assert pgt.wait_backend_gone(admin, pid)
    assert ext.finish("success").outcome == "abort"


def test_stopping_after_the_last_message_keeps_a_streaming_transaction(
    admin, schema, source, make_request, pgt
):
    _fill(admin, schema, 5)
    ext = source.read(make_request("t", options={"lifecycle": "streaming"}))
    it = iter(ext)
    for message in it:
        if isinstance(message, StateMessage):
            break
    it.close()
    pid = ext.backend_pid
    assert pid is not None and pgt.backend_state(admin, pid) == "idle in transaction"
    assert ext.finish("retain_commit_unknown").cleanup_succeeded
    assert pgt.wait_backend_gone(admin, pid)


def test_a_read_of_many_columns_asks_the_driver_for_half_the_bytes_a_batch(
    admin, schema, source, make_request, monkeypatch
):
    """A 300-column table's read held each batch several times over (read,
    converted, waiting for the stager, hashed) and peaked at 406-431 MB;
    half the bytes a batch: 350-388 MB (bench/RESULTS.md)."""
    asked: list[int] = []
    stream = pg_connect.Session.stream

    def recorded(self, query, batch_bytes, doing):
        asked.append(batch_bytes)
        return stream(self, query, batch_bytes, doing)

    monkeypatch.setattr(pg_connect.Session, "stream", recorded)
    _fill(admin, schema, 10)
    columns = ", ".join(f"c{i} int DEFAULT {i}" for i in range(120))
    admin.execute(f"CREATE TABLE {schema}.w (id int PRIMARY KEY, {columns})")
    admin.execute(f"INSERT INTO {schema}.w (id) SELECT generate_series(1, 10)")
    for table in ("t", "w"):
        rows = sum(
            m.batch.num_rows
            for m in source.read(make_request(table))
            if isinstance(m, RecordBatchMessage)
        )
        assert rows == 10
    assert asked == [pg_connect.DEFAULT_BATCH_BYTES, pg_connect.DEFAULT_BATCH_BYTES // 2]
