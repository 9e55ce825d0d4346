"""End-to-end captures of a real SQLite source into a real Delta lake."""

from __future__ import annotations

import subprocess
import sys
import tempfile
from datetime import UTC, timedelta
from pathlib import Path

import pytest

from combined.connectors._subprocess._private import current_owner
from combined.engine import Engine
from combined.errors import NotFoundError, ProtocolViolation


def _count(engine: Engine, table: str) -> int:
    return int(engine.sql(f"SELECT count(*) AS n FROM {table}").column("n")[0].as_py())


def _lake_rows(engine: Engine, table: str, cols: str) -> list[tuple[object, ...]]:
    result = engine.sql(f"SELECT {cols} FROM {table} ORDER BY id")
    return [tuple(r.values()) for r in result.to_pylist()]


def test_first_capture_lands_every_row_with_provenance(shop: Path) -> None:
    engine = Engine.open(shop / "combined.yaml")
    try:
        (run,) = engine.capture()
        assert run.state == "succeeded", run.error
        assert run.trigger == "first_sync"
        assert _count(engine, "shop.orders") == 200
        row = engine.sql("SELECT * FROM shop.orders WHERE id = 7").to_pylist()[0]
        assert row["_combined_op"] == "snapshot"
        assert row["_combined_run_id"] == run.id
        # identity encoding v2: the 16 bytes of each md5 digest
        assert len(row["_combined_id"]) == 16 and len(row["_combined_payload_hash"]) == 16
        assert row["_combined_delivery_id"] and row["_combined_ingested_at"] is not None
        assert row["_combined_observed_at"] is not None
        assert row["_combined_emitted_at"] is None  # a snapshot has no provider emission time
        assert row["_combined_producer"].startswith("sqlite@")
        info = engine.run(run.id)
        assert {d.state for d in info["deliveries"]} == {"committed"}
        assert sum(d.record_count for d in info["deliveries"]) == 220
    finally:
        engine.close()


def test_unchanged_recapture_writes_nothing_and_bills_nothing(shop: Path) -> None:
    engine = Engine.open(shop / "combined.yaml")
    try:
        engine.capture()
        lake = shop / "lake" / "shop" / "orders" / "_delta_log"
        logs_before = sorted(p.name for p in lake.iterdir())
        usage_before = engine.usage()
        (run,) = engine.capture()
        assert run.state == "succeeded"
        assert run.trigger == "manual"
        assert sorted(p.name for p in lake.iterdir()) == logs_before
        assert engine.usage() == usage_before
        assert len(engine.history("shop.orders")) == 1  # the parent version was re-admitted
        assert engine.run(run.id)["deliveries"] == []
    finally:
        engine.close()


def test_null_cursor_rows_included_are_reread_without_changing_or_billing_anything(
    shop: Path, tools
) -> None:
    tools.sql(
        shop,
        "CREATE TABLE log (id INTEGER PRIMARY KEY, seq INT, v TEXT);"
        "INSERT INTO log VALUES (1, 10, 'a'), (2, NULL, 'b'), (3, 30, 'c'), (4, NULL, 'd');",
    )
    project = shop / "combined.yaml"
    project.write_text(
        project.read_text() + "      log:\n        key: [id]\n        strategy: cursor\n"
        "        cursor: {column: seq, trust: 'a sequence', nulls: include}\n"
    )
    engine = Engine.open(project)
    try:
        engine.capture()
        assert _lake_rows(engine, "shop.log", "id, seq") == [(1, 10), (2, None), (3, 30), (4, None)]
        lake = shop / "lake" / "shop" / "log" / "_delta_log"
        logs_before = sorted(p.name for p in lake.iterdir())
        usage_before = engine.usage()
        (run,) = engine.capture(["shop.log"])
        assert run.state == "succeeded", run.error
        assert run.stats is not None and run.stats["log"]["captured"] == 2
        assert sorted(p.name for p in lake.iterdir()) == logs_before
        assert engine.usage() == usage_before
        assert len(engine.history("shop.log")) == 1
        tools.sql(shop, "UPDATE log SET v = 'changed' WHERE id = 4")
        (run,) = engine.capture(["shop.log"])
        assert run.stats is not None and run.stats["log"]["updates"] == 1
        assert _lake_rows(engine, "shop.log", "id, v")[3] == (4, "changed")
    finally:
        engine.close()


def test_updates_deletes_and_inserts_propagate(shop: Path, tools) -> None:
    engine = Engine.open(shop / "combined.yaml")
    try:
        engine.capture()
        tools.sql(
            shop,
            "UPDATE orders SET status = 'shipped' WHERE id <= 10;"
            "DELETE FROM orders WHERE id > 195;"
            "INSERT INTO orders VALUES (500, 3, 'placed', 1.0);",
        )
        (run,) = engine.capture(["shop.orders"])
        assert run.state == "succeeded", run.error
        assert run.stats == {
            "orders": {
                "captured": 196,
                "inserts": 1,
                "updates": 10,
                "deletes": 5,
                "deliveries": 1,
                "reconciliation": "reconciled",
            }
        }
        assert _lake_rows(engine, "shop.orders", "id, customer_id, status, total") == [
            tuple(r) for r in tools.rows(shop, "orders")
        ]
        ops = engine.sql(
            "SELECT _combined_op AS op, count(*) AS n FROM shop.orders GROUP BY 1 ORDER BY 1"
        ).to_pylist()
        assert ops == [
            {"op": "insert", "n": 1},
            {"op": "snapshot", "n": 185},
            {"op": "update", "n": 10},
        ]
        (orders,) = [u for u in engine.usage() if u["dataset"] == "orders"]
        # 200 first seen + 1 insert; the 10 updated and 5 deleted were already active
        assert orders["mar"] == 201
        assert (orders["inserts"], orders["updates"], orders["deletes"]) == (201, 10, 5)
    finally:
        engine.close()


def test_as_of_and_publication_select_the_earlier_state(shop: Path, tools) -> None:
    import time

    engine = Engine.open(shop / "combined.yaml")
    try:
        (first,) = engine.capture()
        time.sleep(0.05)
        first_pub = engine.publications(1)[0]
        tools.sql(shop, "DELETE FROM orders WHERE id <= 50;")
        time.sleep(0.05)
        engine.capture()
        assert _count(engine, "shop.orders") == 150
        assert (
            engine.sql("SELECT count(*) AS n FROM shop.orders", as_of=first_pub["published_at"])
            .column("n")[0]
            .as_py()
            == 200
        )
        assert (
            engine.sql("SELECT count(*) AS n FROM shop.orders", publication=first.publication_id)
            .column("n")[0]
            .as_py()
            == 200
        )
    finally:
        engine.close()


def test_a_naive_as_of_is_read_as_utc_like_the_cli_does(shop: Path) -> None:
    # The Python API handed a naive instant to the catalog, which refused it
    # with a database StatementError instead of answering.
    engine = Engine.open(shop / "combined.yaml")
    try:
        engine.capture(["shop.customers"])
        published = engine.publications(1)[0]["published_at"]
        query = "SELECT count(*) AS n FROM shop.customers"
        naive = published.astimezone(UTC).replace(tzinfo=None)
        assert engine.sql(query, as_of=naive).to_pylist() == [{"n": 20}]
        with pytest.raises(NotFoundError, match="nothing was published at or before"):
            engine.sql(query, as_of=naive - timedelta(microseconds=1))
    finally:
        engine.close()


def test_returning_to_an_earlier_state_is_a_new_version(shop: Path, tools) -> None:
    engine = Engine.open(shop / "combined.yaml")
    try:
        engine.capture(["shop.customers"])
        tools.sql(shop, "UPDATE customers SET city = 'Oslo' WHERE id = 1;")
        engine.capture(["shop.customers"])
        tools.sql(shop, "UPDATE customers SET city = 'Lyon' WHERE id = 1;")
        engine.capture(["shop.customers"])
        versions = engine.history("shop.customers")
        assert len(versions) == 3
        assert len({v["id"] for v in versions}) == 3
        # same content as the first version, different identity, chained by parent
        assert versions[2]["content_digest"] == versions[0]["content_digest"]
        assert versions[2]["parent_id"] == versions[1]["id"]
        assert versions[1]["parent_id"] == versions[0]["id"]
    finally:
        engine.close()


def test_retry_executes_under_the_original_admission(shop: Path, tools) -> None:
    import os
    import shutil

    engine = Engine.open(shop / "combined.yaml")
    try:
        engine.capture()
        tools.sql(shop, "INSERT INTO orders VALUES (900, 1, 'placed', 2.0);")
        shutil.move(shop / "shop.db", shop / "away.db")
        os.environ["COMBINED_RETRY_BACKOFF_S"] = "0"
        (failed,) = Engine.open(shop / "combined.yaml").capture(["shop.orders"])
        assert failed.state == "failed"
        assert "shop.db" in (failed.error or "")
        attempts = Engine.open(shop / "combined.yaml").run(failed.id)["attempts"]
        assert len(attempts) == 3  # a missing file is transient: retried as Attempts
        shutil.move(shop / "away.db", shop / "shop.db")
        # the project file now points elsewhere: the retry must not follow it
        text = (shop / "combined.yaml").read_text().replace("./shop.db", "./elsewhere.db")
        (shop / "combined.yaml").write_text(text)
        retried = Engine.open(shop / "combined.yaml").retry(failed.id)
        assert retried.state == "succeeded", retried.error
        assert retried.trigger == "retry" and retried.retry_of == failed.id
        assert retried.admission_id == failed.admission_id
        assert _count(engine, "shop.orders") == 201
    finally:
        engine.close()


def test_a_run_whose_retry_succeeded_is_not_retried_again(
    shop: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import shutil

    monkeypatch.setenv("COMBINED_RETRY_BACKOFF_S", "0")
    engine = Engine.open(shop / "combined.yaml")
    try:
        shutil.move(shop / "shop.db", shop / "away.db")
        (failed,) = engine.capture(["shop.orders"])
        assert failed.state == "failed"
        # a retry that fails too leaves the run to retry again
        first = engine.retry(failed.id)
        assert first.state == "failed"
        shutil.move(shop / "away.db", shop / "shop.db")
        second = engine.retry(failed.id)
        assert second.state == "succeeded", second.error
        for again in (failed.id, first.id):
            with pytest.raises(ProtocolViolation, match=f"retried by run {second.id}, which succ"):
                engine.retry(again)
        assert len(engine.runs(limit=10)) == 3
    finally:
        engine.close()


def test_a_retry_whose_process_died_does_not_block_retrying_again(
    shop: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A retry stopped by SIGTERM (or killed) stays "extracting", its leases
    # released, until a repair closes it. `run retry` then refused the
    # original failure, "retried by run ..., which is extracting", for a run
    # that nothing was running.
    import shutil

    from combined.catalog import runs as runs_repo
    from combined.runtime._admit import admit

    monkeypatch.setenv("COMBINED_RETRY_BACKOFF_S", "0")
    engine = Engine.open(shop / "combined.yaml")
    try:
        shutil.move(shop / "shop.db", shop / "away.db")
        (failed,) = engine.capture(["shop.orders"])
        assert failed.state == "failed"
        shutil.move(shop / "away.db", shop / "shop.db")
        with engine.catalog.begin() as conn:
            admission = runs_repo.get_admission(conn, failed.admission_id)
        dead = admit(
            engine.catalog,
            source=failed.source,
            datasets=failed.datasets,
            trigger="retry",
            admission=admission,
            retry_of=failed.id,
        )
        with engine.catalog.begin() as conn:
            runs_repo.move_run(conn, dead.id, "extracting")  # then its process died
        retried = engine.retry(failed.id)
        assert retried.state == "succeeded", retried.error
        assert engine.run(dead.id)["run"].state == "failed"
        assert _count(engine, "shop.orders") == 200
    finally:
        engine.close()


def test_duplicate_keys_go_to_quarantine_and_commit_nothing(tmp_path: Path, tools) -> None:
    tools.make(tmp_path)
    tools.sql(
        tmp_path,
        "CREATE TABLE people (id INTEGER, name TEXT);"
        "INSERT INTO people VALUES (1, 'a'), (2, 'b'), (2, 'c'), (3, 'd');",
    )
    text = (tmp_path / "combined.yaml").read_text() + "      people:\n        key: [id]\n"
    (tmp_path / "combined.yaml").write_text(text)
    engine = Engine.open(tmp_path / "combined.yaml")
    try:
        (run,) = engine.capture(["shop.people"])
        assert run.state == "needs_review"
        assert "duplicate key" in (run.error or "")
        assert not (tmp_path / "lake" / "shop" / "people").exists()
        # A first baseline's Deliveries are encoded while its ids are checked:
        # none outlives the refusal (the Attempt's staging is erased).
        assert not [f for f in (tmp_path / "lake" / "_staging").rglob("*") if f.is_file()]
        from combined.catalog import data as cat

        with engine.catalog.begin() as conn:
            (q,) = cat.quarantined(conn)
        assert q.record_count == 2 and q.reason.startswith("duplicate key")
        assert Path(q.path).exists()
    finally:
        engine.close()


def test_a_repeated_commit_never_changes_the_lake_twice(shop: Path) -> None:
    import pyarrow as pa

    from combined.lake import LakeTable

    table = LakeTable(shop / "lake" / "t", "combined:s/t")
    data = pa.table({"_combined_id": ["a"], "_combined_op": ["insert"], "v": [1]})

    def reader() -> pa.RecordBatchReader:
        return pa.RecordBatchReader.from_batches(data.schema, data.to_batches())

    meta = {"ingested_at": "2026-01-01T00:00:00+00:00", "first_sequence": 1, "last_sequence": 1}
    first = table.commit(
        first_sequence=1, last_sequence=1, mode="append", data=reader, metadata=meta
    )
    again = table.commit(
        first_sequence=1, last_sequence=1, mode="append", data=reader, metadata=meta
    )
    assert not first.skipped and again.skipped
    assert again.lake_version == first.lake_version == table.version() == 0
    with pytest.raises(ProtocolViolation, match="does not follow"):
        table.commit(first_sequence=3, last_sequence=3, mode="append", data=reader, metadata=meta)


def test_an_unwritable_lake_is_a_clear_error(shop: Path, tools) -> None:
    (shop / "lake").write_text("not a directory")
    result = tools.cli(shop, "capture")
    assert result.returncode == 2
    assert "not writable" in result.stderr


def test_a_first_capture_commits_its_raw_deliveries_as_the_table_files(shop: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq
    from deltalake import DeltaTable

    engine = Engine.open(shop / "combined.yaml")
    try:
        (run,) = engine.capture(["shop.orders"])
        assert run.state == "succeeded", run.error
        deliveries = {d.id: Path(d.path) for d in engine.run(run.id)["deliveries"]}
    finally:
        engine.close()
    table = DeltaTable(str(shop / "lake" / "shop" / "orders"))
    files = [Path(uri.removeprefix("file://")) for uri in table.file_uris()]
    assert files and len(files) == len(deliveries)
    raw = {p.stat().st_ino: p for p in deliveries.values()}
    for file in files:
        # The same bytes under two names: encoded once, for the raw layer and the table.
        source = raw[file.stat().st_ino]
        ids = set(pq.read_table(file, columns=["_combined_delivery_id"]).column(0).to_pylist())
        assert ids == {next(i for i, p in deliveries.items() if p == source)}
    stats = pa.table(table.get_add_actions(flatten=True)).column("num_records").to_pylist()
    assert sum(stats) == 200
    # Removing a table file (a VACUUM, say) leaves the raw Delivery readable.
    files[0].unlink()
    assert all(pq.read_metadata(p).num_rows > 0 for p in deliveries.values())


def test_a_first_baselines_digests_failing_on_their_side_thread_fail_the_capture(
    shop: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from combined.runtime import _deliver

    def broken(*args: object, **kwargs: object) -> None:
        raise OSError("disk full while spilling the digests")

    monkeypatch.setattr(_deliver, "_digests", broken)
    engine = Engine.open(shop / "combined.yaml")
    try:
        (run,) = engine.capture(["shop.orders"])
        assert run.state != "succeeded"
        assert "disk full" in str(run.error)
        assert not (shop / "lake" / "shop" / "orders" / "_delta_log").exists()
        monkeypatch.undo()
        (run,) = engine.capture(["shop.orders"])
        assert run.state == "succeeded", run.error
        assert _count(engine, "shop.orders") == 200
    finally:
        engine.close()


def test_a_dataset_named_like_a_credential_keeps_its_settings_in_the_admission(
    shop: Path,
) -> None:
    project = shop / "combined.yaml"
    original = project.read_text()
    digests = []
    for rows in (1000, 2000):
        declared = (
            f"      secrets:\n        relation: orders\n        key: [id]\n"
            f"        batch_rows: {rows}\n"
        )
        project.write_text(original.replace("      orders:\n        key: [id]\n", declared))
        engine = Engine.open(project)
        try:
            (run,) = engine.capture(["shop.secrets"])
            assert run.state == "succeeded", run.error
            admission = engine.run(run.id)["admission"]
        finally:
            engine.close()
        assert admission.config["datasets"]["secrets"]["relation"] == "orders"
        digests.append(admission.config_digest)
    assert digests[0] != digests[1]  # a dataset's name is not a credential's


@pytest.mark.parametrize("column", ["_combined_note", "_combined_op", "_combined_id"])
def test_a_source_column_named_like_provenance_is_refused_not_dropped(
    tmp_path: Path, tools, column: str
) -> None:
    # Names starting with `_combined_` are Combined's own: such a source
    # column was left out of the payload hash and the lake without a word.
    # (A first capture's is refused before its Run, as `combined check` does;
    # a column that appears later, the Run holds for review.)
    from combined.errors import ConfigError

    tools.make(tmp_path)
    tools.sql(tmp_path, f"ALTER TABLE customers ADD COLUMN {column} TEXT DEFAULT 'kept';")
    engine = Engine.open(tmp_path / "combined.yaml")
    try:
        with pytest.raises(ConfigError) as info:
            engine.capture(["shop.customers"])
        said = info.value.describe()
        assert repr(column) in said and "_combined_" in said and "view" in said
        assert "`columns:`" in said
        assert engine.runs() == [] and engine.publications(1) == []
    finally:
        engine.close()


def test_columns_differing_only_in_case_are_refused_clearly(tmp_path: Path, tools) -> None:
    # SQLite cannot hold such a pair: a renamed column meets the lake's old
    # name (Delta and DuckDB compare column names without case). It is named a
    # rename, with the ways out that work: before, the hint was to leave one of
    # the two out of `columns:`, though the source held only the renamed one.
    tools.make(tmp_path)
    engine = Engine.open(tmp_path / "combined.yaml")
    try:
        engine.capture(["shop.customers"])
        tools.sql(tmp_path, "ALTER TABLE customers RENAME COLUMN city TO City;")
        (run,) = engine.capture(["shop.customers"])
        assert run.state == "needs_review"
        assert run.error is not None and "'city' and 'City'" in run.error
        assert "differ only in case" in run.error
        assert len(engine.publications(10)) == 1
        assert "'city' is the lake's, no longer read" in run.error
        assert "rename the source column back to 'city'" in run.error
        assert "combined reset shop.customers --drop-table" in run.error
        tools.sql(tmp_path, "ALTER TABLE customers RENAME COLUMN City TO city;")
        (run,) = engine.capture(["shop.customers"])
        assert run.state == "succeeded", run.error
    finally:
        engine.close()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads owners in /proc")
def test_a_capture_first_removes_the_private_files_a_killed_combined_left(
    shop: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A Singer or Airbyte read's resolved configuration, left by a process killed
    # outright: any later Run on the machine removes it, whatever it captures.
    ended = subprocess.Popen(["true"])
    ended.wait()
    me = current_owner()
    private = tmp_path / "tmp"
    left = private / f"combined-singer-{ended.pid}-{me.start}-{me.host}-left0001"
    left.mkdir(parents=True)
    (left / "config.json").write_text('{"token": "left-behind"}')
    mine = private / f"combined-singer-{me.tag()}-mine0001"
    mine.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(private))
    engine = Engine.open(shop / "combined.yaml")
    try:
        (run,) = engine.capture()
        assert run.state == "succeeded", run.error
    finally:
        engine.close()
    assert list(private.iterdir()) == [mine]  # its owner (this process) is alive


def test_a_keyless_event_table_keeps_equal_rows_in_every_snapshot(tmp_path: Path, tools) -> None:
    # An append stream replaces nothing: two equal rows are two events, not a
    # key that cannot choose between them.
    tools.make(tmp_path)
    tools.sql(
        tmp_path,
        "CREATE TABLE clicks (page TEXT, n INTEGER);"
        "INSERT INTO clicks VALUES ('home', 1), ('home', 1), ('cart', 2);",
    )
    project = tmp_path / "combined.yaml"
    project.write_text(project.read_text() + "      clicks:\n        sync_mode: append\n")
    engine = Engine.open(project)
    try:
        for _ in range(2):
            (run,) = engine.capture(["shop.clicks"])
            assert run.state == "succeeded", run.error
        rows = engine.sql(
            "SELECT page, count(*) AS n FROM shop.clicks GROUP BY page ORDER BY page"
        ).to_pylist()
        # every snapshot appended whole: a history of what each capture saw
        assert rows == [{"page": "cart", "n": 2}, {"page": "home", "n": 4}]
        (usage,) = [u for u in engine.usage() if u["dataset"] == "clicks"]
        assert usage["mar"] == 2  # two distinct identities, billed once in the month
    finally:
        engine.close()


def test_a_keyed_snapshot_appended_keeps_every_capture_whole(tmp_path: Path, tools) -> None:
    # A snapshot dataset in append mode is a periodic snapshot: each capture's
    # rows are kept, unchanged ones included (a change stream's new snapshot
    # appends only what differs from each id's newest event: docs/cdc.md).
    tools.make(tmp_path)
    tools.sql(
        tmp_path,
        "CREATE TABLE balances (id INTEGER PRIMARY KEY, amount INTEGER);"
        "INSERT INTO balances VALUES (1, 10), (2, 20), (3, 30);",
    )
    project = tmp_path / "combined.yaml"
    extra = "      balances:\n        key: [id]\n        sync_mode: append\n"
    project.write_text(project.read_text() + extra)
    engine = Engine.open(project)
    try:
        for change in ("", "UPDATE balances SET amount = 21 WHERE id = 2;"):
            if change:
                tools.sql(tmp_path, change)
            (run,) = engine.capture(["shop.balances"])
            assert run.state == "succeeded", run.error
        rows = engine.sql(
            "SELECT id, amount, count(*) AS n FROM shop.balances GROUP BY ALL ORDER BY ALL"
        ).to_pylist()
        assert [(r["id"], r["amount"], r["n"]) for r in rows] == [
            (1, 10, 2),
            (2, 20, 1),
            (2, 21, 1),
            (3, 30, 2),
        ]
    finally:
        engine.close()
