"""What an object-store lake is asked: each table loaded once a step, each file's facts once.

The requests are the S3 server's own record of them (moto's recorder), so
every request counts, whichever library (Arrow's S3 client, delta-rs'
object_store) made it. On S3 each request is a round trip of 10-50 ms: a
small capture that asks hundreds of them takes seconds doing nothing else.
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

from combined.engine import Engine
from combined.lake._store import LakeStore
from combined.lake._table import LakeTable


@contextmanager
def recorded(endpoint: str) -> Iterator[list[tuple[str, str]]]:
    """The (method, path) of every request the S3 server answers within the block."""

    def call(action: str) -> bytes:
        method = "GET" if action == "download-recording" else "POST"
        request = urllib.request.Request(f"{endpoint}/moto-api/recorder/{action}", method=method)
        with urllib.request.urlopen(request, timeout=30) as answer:
            body: bytes = answer.read()
            return body

    call("reset-recording")
    call("start-recording")
    requests: list[tuple[str, str]] = []
    try:
        yield requests
    finally:
        call("stop-recording")
        for line in call("download-recording").decode().splitlines():
            if line.strip():
                entry = json.loads(line)
                requests.append((entry["method"], urlsplit(entry["url"]).path))


def _write(store: LakeStore, names: list[str]) -> list[str]:
    files = [store.join(name) for name in names]
    for n, location in enumerate(files):
        with store.fs.open_output_stream(store.path(location)) as out:
            pq.write_table(pa.table({"n": list(range(n * 10, n * 10 + 10))}), out)
    return files


def test_duckdb_asks_the_store_about_each_parquet_file_once(
    s3_endpoint: str, s3_bucket: str
) -> None:
    # DuckDB opens each file of a query several times, globs each path it is
    # given and asks each open file's modification time: each a HEAD request
    # (60 of a small capture's ~260 after the sizes were remembered).
    store = LakeStore.at(f"s3://{s3_bucket}/lake")
    files = _write(store, [f"part-{n}.parquet" for n in range(3)])

    def query() -> None:
        con = duckdb.connect()
        sql = f"SELECT sum(n), count(*) FROM {store.duck_source(con, files)}"
        assert con.execute(sql).fetchall() == [(sum(range(30)), 30)]
        con.close()

    with recorded(s3_endpoint) as first:
        query()
    with recorded(s3_endpoint) as later:
        query()
        query()
    heads = [path for method, path in first if method == "HEAD"]
    assert sorted(set(heads)) == sorted(f"/{store.path(f)}" for f in files)
    assert len(heads) <= 3 * len(files), heads  # whether it is there, its size, its time
    assert [r for r in later if r[0] == "HEAD"] == []
    reads = [path for method, path in later if method == "GET"]
    assert len(reads) >= 2 * len(files)  # the rows were read from the store, not from a cache


def test_a_pinned_table_is_loaded_once_for_all_its_reads(s3_endpoint: str, s3_bucket: str) -> None:
    store = LakeStore.at(f"s3://{s3_bucket}/lake")
    table = LakeTable(store.join("t"), "combined:test/t", store)
    for sequence in (1, 2, 3):
        table.append_batches(
            pa.schema([("n", pa.int64())]),
            iter([pa.record_batch({"n": [sequence]})]),
            create=sequence == 1,
            metadata={"sequence": sequence},
        )

    def reads(t: LakeTable) -> tuple[Any, ...]:
        newest = t.version()
        assert newest is not None
        return (t.exists(), newest, t.schema(), t.files(), t.files(newest), t.newest_commit())

    def listings(requests: list[tuple[str, str]]) -> int:
        return sum(1 for m, p in requests if m == "GET" and p.strip("/") == s3_bucket)

    with recorded(s3_endpoint) as load:  # one load, and the log's newest entries
        view = table.pinned()
        assert view.exists() and view.newest_commit() is not None
    with recorded(s3_endpoint) as once:
        pinned = reads(table.pinned())
    with recorded(s3_endpoint) as each:
        fresh = reads(table)
    assert pinned == fresh
    assert listings(load) >= 1
    assert listings(once) == listings(load), once
    assert listings(each) >= listings(once) + 5, each  # each of six reads its own load


def test_a_pinned_table_commits_on_a_fresh_load(s3_bucket: str) -> None:
    # A view holds the version it first read; a commit through it is still
    # checked and written on the table's newest version.
    store = LakeStore.at(f"s3://{s3_bucket}/lake")
    schema = pa.schema([("n", pa.int64())])
    table = LakeTable(store.join("t"), "combined:test/t", store)
    table.append_batches(schema, iter([pa.record_batch({"n": [1]})]), create=True, metadata={})
    view = table.pinned()
    assert view.version() == 0
    table.append_batches(schema, iter([pa.record_batch({"n": [2]})]), create=False, metadata={})
    assert view.version() == 0  # (what the view read)
    view.append_batches(schema, iter([pa.record_batch({"n": [3]})]), create=False, metadata={})
    assert table.version() == 2
    rows = [n for f in table.files() for n in store.read_table(f).column("n").to_pylist()]
    assert sorted(rows) == [1, 2, 3]


def test_a_small_recapture_on_s3_asks_the_store_a_bounded_number_of_things(
    tmp_path: Path, tools: Any, s3_endpoint: str, s3_bucket: str
) -> None:
    # The second capture of a 200-row shop on S3 made 295 requests, the third
    # 374: each dataset table loaded ~15 times (a listing of the log and every
    # log entry each time) and ~108 HEAD requests of Parquet files; later 215,
    # each table still loaded ten times.
    tools.make(tmp_path)
    project = tmp_path / "combined.yaml"
    project.write_text(project.read_text().replace("lake: ./lake", f"lake: s3://{s3_bucket}/lake"))
    engine = Engine.open(project)
    try:
        (first,) = engine.capture()
        assert first.state == "succeeded", first.error
        tools.sql(tmp_path, "UPDATE orders SET status = 'shipped' WHERE id <= 10")
        with recorded(s3_endpoint) as requests:
            (second,) = engine.capture()
        assert second.state == "succeeded", second.error
        rows = engine.sql("SELECT count(*) AS n FROM shop.orders WHERE status = 'shipped'")
        assert rows.to_pylist() == [{"n": 10}]
    finally:
        engine.close()
    heads = [p for m, p in requests if m == "HEAD" and p.endswith(".parquet")]
    assert len(heads) <= 30, heads
    assert len(requests) <= 170, sorted(requests)

    def loads(dataset: str) -> int:  # each load of a table reads its last checkpoint's pointer
        return sum(
            1 for m, p in requests if p.endswith(f"/lake/{dataset}/_delta_log/_last_checkpoint")
        )

    # Each step of the Run read its own load of each table: ten a dataset.
    # Now the Run's steps share one until it writes: one before the Run
    # takes its leases, one under them, and the commit's own.
    assert loads("shop/customers") <= 2, sorted(requests)  # unchanged: nothing written
    assert loads("shop/orders") <= 3, sorted(requests)


def test_a_long_lived_store_forgets_file_facts_past_its_limit_and_still_reads(
    s3_endpoint: str, s3_bucket: str, monkeypatch: Any
) -> None:
    # A worker following a stream for weeks reads ever newer files: the store's
    # facts about them (size, time, open handle) must not grow without end.
    from combined.lake import _store

    monkeypatch.setattr(_store, "_FACTS_MAX", 4)
    monkeypatch.setattr(_store, "_OPENED_MAX", 4)
    store = LakeStore.at(f"s3://{s3_bucket}/bounded")
    files = _write(store, [f"part-{n}.parquet" for n in range(10)])
    con = duckdb.connect()
    for n, location in enumerate(files):
        sql = f"SELECT sum(n) FROM {store.duck_source(con, [location])}"
        assert con.execute(sql).fetchall() == [(sum(range(n * 10, n * 10 + 10)),)]
        assert len(store.sizes) <= 4 and len(store.stamps) <= 4 and len(store.opened) <= 4
    con.close()
    assert store.size(files[0]) == store.fs.get_file_info(store.path(files[0])).size
