"""End-to-end captures of a real HTTP API (a server on 127.0.0.1 in this process) into a lake."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.connectors.http.fake_api import TOKEN, FakeAPI, order, serve_orders

from combined.connectors import known_connectors
from combined.engine import Engine

pytestmark = pytest.mark.skipif(
    "http" not in known_connectors(),
    reason="the installed metadata predates the http entry point: `pip install -e .` again",
)

PROJECT = """\
version: 1
lake: ./lake
sources:
  shop:
    connector: http
    config:
      base_url: {base_url}
      auth: {{type: bearer, token: {{secret: "env:COMBINED_TEST_HTTP_TOKEN"}}}}
      check_path: /me
      max_retry_wait: 2
      endpoints:
        orders:
          path: /orders/cursor
          records: items
          paginate: {{style: cursor, param: cursor, next: next_cursor}}
          since: {{param: updated_since, format: iso}}
        looping:
          path: /orders/loop
          records: items
          paginate: {{style: cursor, param: cursor, next: next_cursor}}
    datasets:
      orders:
        key: [id]
      recent:
        relation: orders
        key: [id]
        strategy: cursor
        cursor: {{column: updated_at, lookback: 1s, trust: "the API filters by updated_at"}}
      looping:
        key: [id]
"""


@pytest.fixture
def api() -> Iterator[FakeAPI]:
    yield from serve_orders()


@pytest.fixture
def engine(api: FakeAPI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Engine]:
    monkeypatch.setenv("COMBINED_TEST_HTTP_TOKEN", TOKEN)
    monkeypatch.setenv("COMBINED_RETRY_BACKOFF_S", "0")
    (tmp_path / "combined.yaml").write_text(PROJECT.format(base_url=api.base_url))
    opened = Engine.open(tmp_path / "combined.yaml")
    try:
        yield opened
    finally:
        opened.close()


def _rows(engine: Engine, table: str = "shop.orders") -> list[tuple[Any, ...]]:
    result = engine.sql(f"SELECT id, status, total FROM {table} ORDER BY id").to_pylist()
    return [(r["id"], r["status"], r["total"]) for r in result]


def _mar(engine: Engine, dataset: str = "orders") -> tuple[int, int, int, int]:
    (u,) = [u for u in engine.usage() if u["dataset"] == dataset]
    return u["mar"], u["inserts"], u["updates"], u["deletes"]


def test_capture_then_recapture_lands_inserts_updates_deletes_and_bills_changes(
    api: FakeAPI, engine: Engine
) -> None:
    (run,) = engine.capture(["shop.orders"])
    assert run.state == "succeeded", run.error
    assert _rows(engine) == [(i, "placed", i * 10) for i in range(1, 6)]
    row = engine.sql("SELECT * FROM shop.orders WHERE id = 1").to_pylist()[0]
    assert row["_combined_producer"].startswith("http@1")
    assert row["customer"] == '{"name":"c1","tags":["a"]}'
    assert _mar(engine) == (5, 5, 0, 0)
    api.orders[2] = order(2, "shipped", day=8)
    del api.orders[4]
    api.orders[6] = order(6, day=9)
    (run,) = engine.capture(["shop.orders"])
    assert run.state == "succeeded", run.error
    assert run.stats is not None
    stats = run.stats["orders"]
    assert (stats["captured"], stats["inserts"], stats["updates"], stats["deletes"]) == (5, 1, 1, 1)
    assert _rows(engine) == [
        (1, "placed", 10),
        (2, "shipped", 20),
        (3, "placed", 30),
        (5, "placed", 50),
        (6, "placed", 60),
    ]
    assert _mar(engine) == (6, 6, 1, 1)  # only the changes bill


def _reordered(api: FakeAPI) -> None:
    """Each order's objects sent again with their keys in another order, values alike."""
    for o in api.orders.values():
        name, tags = o["customer"]["name"], o["customer"]["tags"]
        o["customer"] = {"tags": tags, "name": name, "address": {"zip": "1", "city": "x"}}
        o["customer"] = {k: o["customer"][k] for k in ("address", "tags", "name")}


@pytest.mark.parametrize(("json_keys", "changed"), [("as_sent", 5), ("sorted", 0)])
def test_json_keys_sorted_changes_no_row_whose_objects_only_moved_their_keys(
    api: FakeAPI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, json_keys: str, changed: int
) -> None:
    """An API that serialises a map in another key order each time (Go's maps) made
    every row holding one an update, billed again, on every capture."""
    monkeypatch.setenv("COMBINED_TEST_HTTP_TOKEN", TOKEN)
    project = PROJECT.format(base_url=api.base_url)
    project = project.replace(
        "check_path: /me\n", f"check_path: /me\n      json_keys: {json_keys}\n"
    )
    (tmp_path / "combined.yaml").write_text(project)
    engine = Engine.open(tmp_path / "combined.yaml")
    try:
        for o in api.orders.values():
            o["customer"] = {"tags": ["a"], "name": o["customer"]["name"]}
        (run,) = engine.capture(["shop.orders"])
        assert run.state == "succeeded", run.error
        row = engine.sql("SELECT customer FROM shop.orders WHERE id = 1").to_pylist()[0]
        sent = '{"tags":["a"],"name":"c1"}'
        assert row["customer"] == (sent if json_keys == "as_sent" else '{"name":"c1","tags":["a"]}')
        _reordered(api)
        engine.capture(["shop.orders"])  # (the new nested object: every row changes once)
        usage = _mar(engine)
        for o in api.orders.values():  # the same values, every object's keys moved
            c = o["customer"]
            o["customer"] = {
                "name": c["name"],
                "address": {"city": "x", "zip": "1"},
                "tags": c["tags"],
            }
        (run,) = engine.capture(["shop.orders"])
        assert run.state == "succeeded", run.error
        assert run.stats is not None
        assert run.stats["orders"]["updates"] == changed
        if json_keys == "sorted":
            assert _mar(engine) == usage  # nothing billed again
            assert engine.run(run.id)["deliveries"] == []
            row = engine.sql("SELECT customer FROM shop.orders WHERE id = 1").to_pylist()[0]
            assert row["customer"] == '{"address":{"city":"x","zip":"1"},"name":"c1","tags":["a"]}'
    finally:
        engine.close()


def test_an_unchanged_recapture_writes_nothing(api: FakeAPI, engine: Engine) -> None:
    engine.capture(["shop.orders"])
    log = Path(engine.project.root) / "lake" / "shop" / "orders" / "_delta_log"
    before = sorted(p.name for p in log.iterdir())
    usage = engine.usage()
    (run,) = engine.capture(["shop.orders"])
    assert run.state == "succeeded", run.error
    assert sorted(p.name for p in log.iterdir()) == before
    assert engine.usage() == usage
    assert engine.run(run.id)["deliveries"] == []
    receipt = engine.run(run.id)["run"]
    assert receipt is not None


def test_a_cursor_capture_resumes_from_its_committed_checkpoint(
    api: FakeAPI, engine: Engine
) -> None:
    (run,) = engine.capture(["shop.recent"])
    assert run.state == "succeeded", run.error
    checkpoint = engine.committed_checkpoint("shop", "recent")
    assert checkpoint is not None and checkpoint["cursor"] == "2024-05-05T00:00:05Z"
    assert checkpoint["trust"] == "the API filters by updated_at"
    api.orders[3] = order(3, "shipped", day=7)
    api.orders[7] = order(7, day=8)
    (run,) = engine.capture(["shop.recent"])
    assert run.state == "succeeded", run.error
    # the checkpoint less the 1s lookback went out as the API's filter
    assert api.seen("/v1/orders/cursor")[-1].query["updated_since"] == "2024-05-05T00:00:04Z"
    assert run.stats is not None
    assert (run.stats["recent"]["inserts"], run.stats["recent"]["updates"]) == (1, 1)
    assert _rows(engine, "shop.recent")[2] == (3, "shipped", 30)
    assert engine.committed_checkpoint("shop", "recent")["cursor"] == "2024-05-08T00:00:07Z"  # type: ignore[index]
    # an omitted field keeps its column and type: no drift, no review
    api.orders[8] = {"id": 8, "updated_at": "2024-05-09T00:00:00Z"}
    (run,) = engine.capture(["shop.recent"])
    assert run.state == "succeeded", run.error
    row = engine.sql("SELECT status, total FROM shop.recent WHERE id = 8").to_pylist()[0]
    assert row == {"status": None, "total": None}


def test_a_429_is_waited_out_within_one_attempt(api: FakeAPI, engine: Engine) -> None:
    api.fail("/v1/orders/cursor", 429, headers={"Retry-After": "0"})
    (run,) = engine.capture(["shop.orders"])
    assert run.state == "succeeded", run.error
    assert len(engine.run(run.id)["attempts"]) == 1


def test_a_500_is_retried_as_another_attempt(api: FakeAPI, engine: Engine) -> None:
    api.fail("/v1/orders/cursor", 500)
    (run,) = engine.capture(["shop.orders"])
    assert run.state == "succeeded", run.error
    attempts = engine.run(run.id)["attempts"]
    assert [a.outcome for a in attempts] == ["failed", "succeeded"]
    assert attempts[0].error is not None and "500" in attempts[0].error
    assert TOKEN not in attempts[0].error  # the server echoed it in its body


def test_an_expired_page_token_restarts_the_pages_within_the_attempt(
    api: FakeAPI, engine: Engine
) -> None:
    """Reproduction: the API expires the second page's token (410 Gone). The
    Run failed, its error telling to check the endpoint's path. Now the read
    starts its pages over inside the one Attempt and lands each order once."""
    api.fail("/v1/orders/cursor", 410, query={"cursor": "2"})
    (run,) = engine.capture(["shop.orders"])
    assert run.state == "succeeded", run.error
    assert len(engine.run(run.id)["attempts"]) == 1
    assert _rows(engine) == [(i, "placed", i * 10) for i in range(1, 6)]
    assert _mar(engine) == (5, 5, 0, 0)


def test_a_refused_token_needs_auth_and_is_not_retried(api: FakeAPI, engine: Engine) -> None:
    engine.capture(["shop.orders"])
    api.token = "rotated-by-the-provider"
    (run,) = engine.capture(["shop.orders"])
    assert run.state == "needs_auth"
    assert len(engine.run(run.id)["attempts"]) == 1
    assert run.error is not None and "401" in run.error and TOKEN not in run.error
    assert len(_rows(engine)) == 5


def test_an_empty_first_page_is_refused_and_deletes_nothing(api: FakeAPI, engine: Engine) -> None:
    engine.capture(["shop.orders"])
    api.orders.clear()
    (run,) = engine.capture(["shop.orders"])
    assert run.state == "failed"
    assert run.error is not None and "empty snapshot would delete every row" in run.error
    assert len(engine.run(run.id)["attempts"]) == 1
    assert len(_rows(engine)) == 5


def test_a_paging_loop_fails_the_run_instead_of_reading_forever(
    api: FakeAPI, engine: Engine
) -> None:
    (run,) = engine.capture(["shop.looping"])
    assert run.state == "failed"
    assert run.error is not None and "repeats a next token" in run.error
    assert len(api.seen("/v1/orders/loop")) == 2


def test_the_token_is_nowhere_in_the_catalog_the_lake_or_any_record(
    api: FakeAPI, engine: Engine
) -> None:
    engine.check("shop")
    engine.discover("shop")
    engine.capture(["shop.orders", "shop.recent"])
    api.fail("/v1/orders/cursor", 500, times=3)  # echoes the token three times
    engine.capture(["shop.orders"])
    api.token = "rotated"
    engine.capture(["shop.orders"])
    root = Path(engine.project.root)
    assert any(api.seen("/v1/orders/cursor"))  # the token was really sent
    stored = [root / ".combined" / "catalog.db", *(root / "lake").rglob("*")]
    files = [p for p in stored if p.is_file()]
    assert any(p.suffix == ".json" for p in files)
    for path in files:
        assert TOKEN.encode() not in path.read_bytes(), path
    for run in engine.runs(20):
        assert TOKEN not in repr(engine.run(run.id))


def test_check_and_discover_go_through_the_engine(api: FakeAPI, engine: Engine) -> None:
    engine.check("shop")
    assert len(api.seen("/v1/me")) == 1
    found = engine.discover("shop")
    orders = found.dataset("orders")
    assert orders is not None and orders.strategies == ("snapshot", "cursor")
    assert ("id",) in [k.columns for k in orders.key_candidates]
    # a capture does not spend requests on discovery: one page per page read
    before = len(api.seen("/v1/orders/loop"))
    engine.capture(["shop.orders"])
    assert len(api.seen("/v1/orders/loop")) == before


def test_records_without_a_value_of_the_key_are_refused_naming_it(
    api: FakeAPI, engine: Engine
) -> None:
    """A key field the API leaves out or null on every record: the capture failed with an
    internal error ("column 'id' is not in the schema (..., _combined_ordinal)")."""
    with api.lock:
        api.orders.clear()
        api.orders.update({1: {"id": None, "v": 1}, 2: {"v": 2}})
    (run,) = engine.capture(["shop.orders"])
    assert run.state == "needs_review"
    assert run.error is not None and "hold no value of 'id', a column of its key" in run.error
    assert "_combined_ordinal" not in run.error and "`key:`" in run.error
