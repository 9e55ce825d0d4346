"""A source's kept sessions: one connection for its catalog reads and every dataset's read."""

from __future__ import annotations

import gc
import threading
import time

import pytest

from combined.connectors.postgres import PostgresSource
from combined.connectors.postgres import _connect as pg_connect
from combined.errors import SourceError
from combined.protocol import RecordBatchMessage


def _tables(admin, schema: str, names: list[str]) -> None:
    for name in names:
        admin.execute(f"CREATE TABLE {schema}.{name} (id int PRIMARY KEY, v text)")
        admin.execute(
            f"INSERT INTO {schema}.{name} SELECT g, 'v' || g FROM generate_series(1, 5) g"
        )


def _read(source, make_request, table: str, **kw):
    ext = source.read(make_request(table, **kw))
    rows = [r for m in ext if isinstance(m, RecordBatchMessage) for r in m.batch.to_pylist()]
    assert ext.finish("success").cleanup_succeeded
    return ext.backend_pid, rows


def test_reads_of_one_source_share_one_backend_and_close_with_it(
    admin, schema, source, make_request, pgt
):
    _tables(admin, schema, ["a", "b", "c"])
    source.describe_relation(f"{schema}.a")
    pids = set()
    for table in ("a", "b", "c"):
        pid, rows = _read(source, make_request, table)
        assert len(rows) == 5
        pids.add(pid)
        # Each read's transaction is over when it finishes: nothing is held.
        assert pgt.backend_state(admin, pid) == "idle"
    assert len(pids) == 1
    (pid,) = pids
    source.close()
    assert pgt.wait_backend_gone(admin, pid)


def test_a_kept_session_reads_in_a_transaction_of_its_own(admin, schema, source, make_request):
    _tables(admin, schema, ["t"])
    first, rows = _read(source, make_request, "t")
    admin.execute(f"INSERT INTO {schema}.t VALUES (6, 'v6')")
    again, more = _read(source, make_request, "t")
    assert again == first and len(rows) == 5 and len(more) == 6


def test_a_kept_session_whose_backend_ended_is_replaced(admin, schema, source, make_request, pgt):
    _tables(admin, schema, ["t"])
    first, _ = _read(source, make_request, "t")
    admin.execute("SELECT pg_terminate_backend(%s)", (first,))
    assert pgt.wait_backend_gone(admin, first)
    again, rows = _read(source, make_request, "t")
    assert again != first and len(rows) == 5


def test_a_read_stopped_midway_gives_no_session_back(admin, schema, source, make_request, pgt):
    _tables(admin, schema, ["t"])
    admin.execute(f"INSERT INTO {schema}.t SELECT g, 'w' FROM generate_series(6, 50000) g")
    ext = source.read(make_request("t", batch_rows=100, options={"batch_bytes": 16 * 1024}))
    next(iter(ext))
    stopped = ext.backend_pid
    assert stopped is not None
    assert ext.finish("abort").cleanup_succeeded
    assert pgt.wait_backend_gone(admin, stopped)
    again, rows = _read(source, make_request, "t")
    assert again != stopped and len(rows) == 50000


def test_a_session_kept_too_long_is_closed_not_reused(admin, schema, source, make_request, pgt):
    _tables(admin, schema, ["t"])
    source._sessions.IDLE_S = 0.0  # every kept session is already too old
    first, _ = _read(source, make_request, "t")
    again, _ = _read(source, make_request, "t")
    assert again != first and pgt.wait_backend_gone(admin, first)


def test_concurrent_reads_each_have_a_session(admin, schema, source, make_request):
    _tables(admin, schema, ["a", "b"])
    exts = [source.read(make_request(t)) for t in ("a", "b")]
    iters = [iter(e) for e in exts]
    for it in iters:
        next(it)  # both transactions open at once
    assert exts[0].backend_pid != exts[1].backend_pid
    for it in iters:
        list(it)
    results: list[bool] = []
    workers = [
        threading.Thread(target=lambda e=e: results.append(e.finish("success").cleanup_succeeded))
        for e in exts
    ]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert results == [True, True]


def test_a_source_dropped_unclosed_closes_what_it_kept(admin, schema, pg_dsn, make_request, pgt):
    _tables(admin, schema, ["t"])
    source = PostgresSource({"dsn": pg_dsn, "schemas": [schema]})
    pid, _ = _read(source, make_request, "t")
    assert pgt.backend_state(admin, pid) == "idle"
    del source
    gc.collect()
    assert pgt.wait_backend_gone(admin, pid)


def test_catalog_reads_and_reads_outlive_a_server_that_ends_idle_sessions(
    admin, schema, pg_dsn, make_request
):
    """A kept session the server ended (``idle_session_timeout``) fails its reset: it is
    closed and a new one serves the catalog's reads as it serves the rows'."""
    _tables(admin, schema, ["t"])
    sep = "&" if "?" in pg_dsn else "?"
    dsn = f"{pg_dsn}{sep}options=-c%20idle_session_timeout%3D200"
    source = PostgresSource({"dsn": dsn, "schemas": [schema]})
    try:
        calls = [
            lambda: source.describe_relation(f"{schema}.t"),
            source.discover,
            source.check,
            lambda: _read(source, make_request, "t"),
        ]
        for call in calls * 2:
            call()
            time.sleep(0.5)  # the server ends the kept session meanwhile
    finally:
        source.close()


def test_what_a_read_set_in_its_session_is_not_kept_for_the_next(
    admin, schema, source, make_request
):
    """A view's function may set the session's settings (or take an advisory lock): the
    next read of a kept session starts from the settings every session starts with."""
    admin.execute(
        f"CREATE FUNCTION {schema}.meddle() RETURNS int LANGUAGE sql VOLATILE AS $$"
        " SELECT set_config('DateStyle', 'SQL, DMY', false),"
        " set_config('extra_float_digits', '0', false), pg_advisory_lock(4242); SELECT 1 $$"
    )
    admin.execute(f"CREATE VIEW {schema}.meddling AS SELECT {schema}.meddle() AS id")
    admin.execute(
        f"CREATE VIEW {schema}.settings AS SELECT 1 AS id,"
        " current_setting('DateStyle') AS datestyle,"
        " current_setting('extra_float_digits') AS digits,"
        " (SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'"
        "  AND pid = pg_backend_pid()) AS locks"
    )
    first, _ = _read(source, make_request, "meddling")
    # Released as the session is kept, not when the next read takes it.
    (free,) = admin.execute("SELECT pg_try_advisory_lock(4242)").fetchone()
    admin.execute("SELECT pg_advisory_unlock_all()")
    assert free
    again, rows = _read(source, make_request, "settings")
    assert again == first  # the same kept session
    assert rows == [{"id": 1, "datestyle": "ISO, YMD", "digits": "3", "locks": 0}]


def test_a_read_whose_transaction_cannot_begin_closes_its_session(
    admin, schema, source, make_request, pgt, monkeypatch
):
    _tables(admin, schema, ["t"])
    kept, _ = _read(source, make_request, "t")
    run = pg_connect.Session.run

    def refusing(self, query, doing):
        if query.startswith("BEGIN"):
            raise SourceError("refused", hint="a test")
        return run(self, query, doing)

    monkeypatch.setattr(pg_connect.Session, "run", refusing)
    ext = source.read(make_request("t"))
    with pytest.raises(SourceError, match="refused") as info:
        list(ext)
    assert ext.finish("abort").cleanup_succeeded
    # Neither kept nor left open (closed, not collected: the error is still held).
    assert pgt.wait_backend_gone(admin, kept) and info.value is not None
    monkeypatch.setattr(pg_connect.Session, "run", run)
    again, rows = _read(source, make_request, "t")
    assert again != kept and len(rows) == 5
