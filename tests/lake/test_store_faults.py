"""An object store that fails requests mid-run (503 SlowDown, 500) through a relay on 127.0.0.1.

The relay (``tests/_s3_faults.py``) sits between Combined and the S3 server
and fails the requests a test names. Before, an upload of a lake file
through Arrow's ``copy_files`` that the store refused returned as if it had
landed (Arrow only printed "Error ignored when destroying file"): a linked
Delivery's table data file was then committed to the Delta log while the
store had no such object (every later read of the table failed), and a
Delivery moved into the raw layer was deleted from staging without being there.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from combined.engine import Engine
from combined.lake import LakeStore, LakeTable

SLOW_DOWN = 503


def _shop(root: Path, tools: Any, s3_faults: Any) -> tuple[Path, str]:
    """The sample shop whose lake is in the bucket behind the relay: (project file, lake)."""
    tools.make(root)
    project = root / "combined.yaml"
    lake = f"s3://{s3_faults.bucket}/lake"
    project.write_text(project.read_text().replace("lake: ./lake", f"lake: {lake}"))
    return project, lake


def test_an_upload_the_store_refuses_raises_and_keeps_the_local_file(
    tmp_path: Path, s3_faults: Any
) -> None:
    store = LakeStore.at(f"s3://{s3_faults.bucket}/lake")
    local = tmp_path / "delivery.parquet"
    local.write_bytes(os.urandom(100_000))
    s3_faults.fail({"method": "PUT", "contains": "/lake/", "status": SLOW_DOWN, "times": -1})
    target = store.join("_deliveries", "s", "d", "delivery.parquet")
    with pytest.raises(OSError, match="SLOW_DOWN"):
        store.move_in(local, target)
    assert s3_faults.faulted() > 0
    assert local.exists()  # not moved: the raw layer does not hold it
    s3_faults.fail()
    assert not store.exists(target)
    store.move_in(local, target)
    assert store.exists(target) and not local.exists()


def test_a_capture_whose_data_file_upload_fails_commits_no_missing_file(
    tmp_path: Path, tools: Any, s3_faults: Any
) -> None:
    project, lake = _shop(tmp_path, tools, s3_faults)
    engine = Engine.open(project)
    try:
        s3_faults.fail(
            {"method": "PUT", "contains": "/lake/shop/orders/part-", "status": 503, "times": -1}
        )
        (run,) = engine.capture(["shop.orders"])
        assert s3_faults.faulted() > 0
        assert run.state == "failed"
        said = " ".join((run.error or "").split())
        assert "the lake refused the commit of combined:shop/orders" in said
        assert "SLOW_DOWN" in said
        assert "hint: the object store failed the write; once it answers, capture again" in said
        table = LakeTable(f"{lake}/shop/orders", "combined:shop/orders")
        for file in table.files() if table.exists() else []:
            assert table.store.exists(file), f"the log names {file}, which the store lacks"
        s3_faults.fail()
        (run,) = engine.capture(["shop.orders"])
        assert run.state == "succeeded", run.error
        rows = engine.sql("SELECT count(*) AS n, sum(id) AS s FROM shop.orders").to_pylist()
        assert rows == [{"n": 200, "s": sum(range(1, 201))}]
    finally:
        engine.close()


def test_a_ledger_the_store_refuses_is_a_lake_error_not_a_bug(
    tmp_path: Path, tools: Any, s3_faults: Any
) -> None:
    """Before, the store's OSError escaped as "internal error ... this is a bug in Combined"."""
    project, lake = _shop(tmp_path, tools, s3_faults)
    assert tools.cli(tmp_path, "capture").returncode == 0
    tools.sql(tmp_path, "UPDATE orders SET status = 'shipped' WHERE id <= 10;")
    s3_faults.fail({"method": "PUT", "contains": "/lake/_combined/", "status": 503, "times": -1})
    refused = tools.cli(tmp_path, "capture")
    assert s3_faults.faulted() > 0
    said = " ".join(refused.stderr.split())
    assert refused.returncode == 1, (
        said
    )  # (a Run is left: retry later, not exit 2's "before a Run")
    assert "is left unfinished" in said, said
    assert "internal error" not in said and "bug in Combined" not in said
    assert f"the lake's ledger ({lake}/_combined/" in said and "SLOW_DOWN" in said
    assert "`combined repair`" in said
    s3_faults.fail()
    again = tools.cli(tmp_path, "capture")
    assert again.returncode == 0, again.stderr
    engine = Engine.open(project)
    try:
        assert [v["updates"] for v in engine.history("shop.orders")] == [0, 10]
        assert all(run.terminal for run in engine.runs())
    finally:
        engine.close()


def test_a_commit_the_credentials_may_not_write_says_what_to_grant(
    tmp_path: Path, tools: Any, s3_faults: Any
) -> None:
    """Credentials that expire or lose their permission mid-run (403 AccessDenied).

    Before, the Run's error was the store's answer alone, with no hint.
    """
    project, lake = _shop(tmp_path, tools, s3_faults)
    engine = Engine.open(project)
    try:
        s3_faults.fail(
            {"method": "PUT", "contains": "/lake/shop/orders/", "status": 403, "times": -1}
        )
        (run,) = engine.capture(["shop.orders"])
        said = " ".join((run.error or "").split())
        assert run.state == "failed"
        assert "the lake refused the commit of combined:shop/orders" in said
        assert "ACCESS_DENIED" in said
        assert "the credentials lack permission to write" in said
        assert "hint: grant the credentials' principal write and delete permission" in said
        assert "the next capture (or `combined repair`) projects the commit if it landed" in said
    finally:
        engine.close()


def test_a_raw_layer_the_store_fails_after_the_commit_says_the_commit_landed(
    tmp_path: Path, tools: Any, s3_faults: Any
) -> None:
    """The lake commit landed; putting its Delivery into the raw layer failed.

    Before, the Run's error was the store's message alone ("When uploading
    part for key ...: SLOW_DOWN"), no word that the commit had landed nor of
    what completes it. (Inserts: their Deliveries become table files, and
    are put into the raw layer after the commit. A merge's are put before
    it, so the same refusal stops it uncommitted.)
    """
    project, _ = _shop(tmp_path, tools, s3_faults)
    engine = Engine.open(project)
    raw = "/lake/_deliveries/shop/orders/"
    try:
        (run,) = engine.capture(["shop.orders"])
        assert run.state == "succeeded", run.error
        tools.sql(tmp_path, "UPDATE orders SET status = 'shipped' WHERE id <= 10;")
        s3_faults.fail({"method": "PUT", "contains": raw, "status": SLOW_DOWN, "times": -1})
        (run,) = engine.capture(["shop.orders"])
        said = " ".join((run.error or "").split())
        assert run.state == "failed", said
        assert "could not be put into the raw layer" in said and "before the lake commit" in said
        assert "nothing was committed" in said
        assert [v["updates"] for v in engine.history("shop.orders")] == [0]
        s3_faults.fail()
        (run,) = engine.capture(["shop.orders"])
        assert run.state == "succeeded", run.error
        tools.sql(tmp_path, "INSERT INTO orders VALUES (900, 1, 'new', 2.5);")
        s3_faults.fail({"method": "PUT", "contains": raw, "status": SLOW_DOWN, "times": -1})
        (run,) = engine.capture(["shop.orders"])
        said = " ".join((run.error or "").split())
        assert run.state == "failed"
        assert "shop.orders: lake version 2 was committed, but its Delivery" in said
        assert "could not be put into the raw layer" in said and "SLOW_DOWN" in said
        assert "the next capture (or `combined repair`) puts them there" in said
        s3_faults.fail()
        (again,) = engine.capture(["shop.orders"])
        assert again.state == "succeeded", again.error
        changes = [(v["inserts"], v["updates"]) for v in engine.history("shop.orders")]
        assert changes[1:] == [(0, 10), (1, 0)]
        for d in engine.run(run.id)["deliveries"]:
            assert d.state == "committed" and engine.layout.store.exists(d.path)
    finally:
        engine.close()


def test_a_store_slowing_down_a_few_times_in_a_row_is_waited_out(
    tmp_path: Path, tools: Any, s3_faults: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Five SlowDowns in a row on one upload of a lake file written through Arrow.

    delta-rs retries a request ten times; Arrow's S3 filesystem tried three
    times, so a burst of throttling that a commit waits out failed the Run at
    its next lake file (here its publication's ledger record, after the commit).
    """
    project, _ = _shop(tmp_path, tools, s3_faults)
    monkeypatch.delenv("AWS_MAX_ATTEMPTS")  # Combined's own number of tries
    engine = Engine.open(project)
    try:
        ledger = "/lake/_combined/publications/part-"
        s3_faults.fail({"method": "PUT", "contains": ledger, "status": SLOW_DOWN, "times": 5})
        (run,) = engine.capture(["shop.orders"])
        assert s3_faults.faulted() == 5
        assert run.state == "succeeded", run.error
    finally:
        engine.close()


def _signature_refused(tmp_path: Path, tools: Any, s3_faults: Any) -> tuple[str, str]:
    """A capture whose table load S3 refuses as ``SignatureDoesNotMatch``, naming the key id.

    Returns the key id and what the capture, ``runs`` and ``activity`` said.
    delta-rs quotes the store's body whole, on lines it marks in colour.
    """
    _shop(tmp_path, tools, s3_faults)
    assert tools.cli(tmp_path, "capture").returncode == 0
    key_id = os.environ["AWS_ACCESS_KEY_ID"]
    s3_faults.fail(
        {
            "method": "GET",
            "contains": "/lake/shop/orders/_delta_log",
            "status": 403,
            "times": -1,
            "code": "SignatureDoesNotMatch",
            "message": "The request signature we calculated does not match.",
            "extra": f"<AWSAccessKeyId>{key_id}</AWSAccessKeyId>",
        }
    )
    refused = tools.cli(tmp_path, "capture")
    assert s3_faults.faulted() > 0 and refused.returncode != 0
    assert "SignatureDoesNotMatch" in refused.stdout + refused.stderr
    s3_faults.fail()
    shown = [tools.cli(tmp_path, *args) for args in (["runs"], ["activity", "--json"])]
    return key_id, refused.stdout + refused.stderr + "".join(r.stdout + r.stderr for r in shown)


def test_a_store_error_echoing_the_access_key_id_is_kept_masked(
    tmp_path: Path, tools: Any, s3_faults: Any
) -> None:
    """S3 names the access key id in the body of a ``SignatureDoesNotMatch``; delta-rs quotes it.

    Before, it reached the Run's error, the Activity feed, the catalog and the
    terminal as it was: only the write probe masked the store's credentials.
    """
    key_id, said = _signature_refused(tmp_path, tools, s3_faults)
    assert key_id not in said
    kept = [p for p in tmp_path.rglob("*") if p.is_file() and key_id.encode() in p.read_bytes()]
    assert kept == []


def test_a_store_errors_terminal_colours_are_neither_kept_nor_shown(
    tmp_path: Path, tools: Any, s3_faults: Any
) -> None:
    """delta-rs marks each line of an error's chain in red (``ESC[31m↳ESC[0m``).

    Before, the escape sequences were kept in the Run's error and its Activity
    and sent to the terminal from there (``combined runs`` showed ``[31m↳[0m``):
    a remote server's text driving the terminal.
    """
    _, said = _signature_refused(tmp_path, tools, s3_faults)
    assert "403 Forbidden" in said
    assert "\x1b" not in said and "\\u001b" not in said and "[31m" not in said


def test_a_store_failing_a_maintenance_skips_that_dataset_and_exits_1(
    tmp_path: Path, tools: Any, s3_faults: Any
) -> None:
    """Before, maintain ended "internal error (OSError) ... this is a bug in Combined", exit 70."""
    _shop(tmp_path, tools, s3_faults)
    assert tools.cli(tmp_path, "capture").returncode == 0
    tools.sql(tmp_path, "UPDATE orders SET status = 'shipped' WHERE id <= 10;")
    assert tools.cli(tmp_path, "capture").returncode == 0
    s3_faults.fail(
        {"method": "HEAD", "contains": "/lake/shop/orders/_delta_log", "status": 503, "times": -1}
    )
    failed = tools.cli(tmp_path, "maintain", "--json")
    assert s3_faults.faulted() > 0
    said = " ".join(failed.stderr.split())
    assert failed.returncode == 1, said
    assert "internal error" not in said and "bug in Combined" not in said
    reports = {r["dataset"]: r for r in json.loads(failed.stdout)}
    orders = reports["shop.orders"]
    assert orders.get("failed") and "the lake's store failed" in orders["skipped"], orders
    assert all("failed" not in r for name, r in reports.items() if name != "shop.orders")
    s3_faults.fail()
    again = tools.cli(tmp_path, "maintain")
    assert again.returncode == 0, again.stderr


def test_a_store_failing_the_reductions_read_of_the_lake_is_told_as_the_stores(
    tmp_path: Path, tools: Any, s3_faults: Any
) -> None:
    """Before, the Run's error was a Python traceback with DuckDB's SQL around the store's
    words (error type "Error"), with no hint."""
    project, _ = _shop(tmp_path, tools, s3_faults)
    assert tools.cli(tmp_path, "capture").returncode == 0
    tools.sql(tmp_path, "UPDATE orders SET status = 'shipped' WHERE id <= 10;")
    s3_faults.fail(
        {"method": "HEAD", "contains": "/lake/shop/orders/part-", "status": 503, "times": -1}
    )
    engine = Engine.open(project)
    try:
        (run,) = engine.capture(["shop.orders"])
        assert s3_faults.faulted() > 0
        assert run.state == "failed"
        error = run.error or ""
        assert "the reduction could not read the lake's table" in error, error
        assert "Traceback" not in error and "nothing was committed" in error, error
        s3_faults.fail()
        (run,) = engine.capture(["shop.orders"])
        assert run.state == "succeeded", run.error
        assert [v["updates"] for v in engine.history("shop.orders")] == [0, 10]
    finally:
        engine.close()


def test_a_worker_outlives_a_lake_the_store_refuses_before_a_run(
    tmp_path: Path, tools: Any, s3_faults: Any
) -> None:
    """An unattended worker whose lake's store refused the probe before a Run it took (the
    store down, its credentials expired) exited, `error: the lake ... cannot be written`:
    every capture stopped, no alert said so, until someone restarted it. The Run now ends
    failed with that error, alerted once, and the worker captures again once the store
    answers."""
    project, lake = _shop(tmp_path, tools, s3_faults)
    assert tools.cli(tmp_path, "capture").returncode == 0
    engine = Engine.open(project)
    try:
        engine.enqueue_dataset("shop", "orders", "schedule")
        engine.enqueue_dataset("shop", "customers", "schedule")

        def refused_once_started() -> bool:  # (a worker that starts on a refused lake exits 2)
            s3_faults.fail({"contains": "/", "status": 403, "times": -1})
            return False

        ended = list(engine.work(refused_once_started, once=True))  # raised LakeNotWritable
        assert [r.state for r in ended] == ["failed", "failed"]
        assert s3_faults.faulted() > 0
        assert all(f"the lake at {lake} cannot be written" in (r.error or "") for r in ended)
        with engine.catalog.begin() as conn:
            from combined.catalog import data as cat

            alerts = cat.activity(conn, kind="alert.run_failed", limit=10, exact=True)
        assert sorted(a.run_id for a in alerts) == sorted(r.id for r in ended)  # each told
        s3_faults.fail()
        engine.enqueue_dataset("shop", "orders", "schedule")
        (back,) = engine.work(lambda: False, once=True)
        assert back.state == "succeeded", back.error
    finally:
        engine.close()
