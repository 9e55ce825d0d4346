"""A page token that expires mid-read: the read starts its pages over, handing no key twice."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
from tests.connectors.http.fake_api import FakeAPI, order
from tests.connectors.http.test_http_read import ENDPOINTS, _ids, _read, _source

from combined.connectors._subprocess._rows import DECODER
from combined.connectors.http import HTTPSource
from combined.connectors.http._restart import Delivered
from combined.errors import ConfigError, SourceError, SourceUnavailable

CURSOR = "/v1/orders/cursor"


def _endpoints(**paginate: Any) -> dict[str, Any]:
    cursor = ENDPOINTS["cursor"]
    return {**ENDPOINTS, "cursor": {**cursor, "paginate": {**cursor["paginate"], **paginate}}}


def test_a_410_mid_read_starts_the_pages_over_and_hands_each_key_once(api: FakeAPI) -> None:
    """Reproduction: cursor paging over 5 orders, 2 a page; the API answers
    the second page's token with 410 Gone (expired). The read failed with
    "the API refused the request: check the endpoint's path and params",
    advice that cannot help. It must start over from the read's start and
    hand over orders 1 to 5 exactly once."""
    api.fail(CURSOR, 410, query={"cursor": "2"})
    table, states, receipt = _read(_source(api), "cursor")
    assert _ids(table) == [1, 2, 3, 4, 5]
    assert receipt.completed and states[-1].final
    assert [r.query.get("cursor") for r in api.seen(CURSOR)] == [None, "2", None, "2", "4"]


def test_a_cursor_read_restarts_from_its_checkpoint_and_holds_it_when_a_record_changed(
    api: FakeAPI,
) -> None:
    api.fail(CURSOR, 410, query={"cursor": "2"})

    def change() -> None:  # order 1 changes between the expiry and the restart
        api.orders[1] = order(1, "shipped", day=9)

    api.on_fault = change
    checkpoint = {"cursor": "2024-05-01T00:00:00Z"}
    table, states, _ = _read(
        _source(api), "cursor", strategy="cursor", state=checkpoint, cursor=_cursor()
    )
    assert _ids(table) == [1, 2, 3, 4, 5]
    assert table is not None and table.column("status").to_pylist()[0] == "placed"
    since = [r.query.get("updated_since") for r in api.seen(CURSOR)]
    assert since[0] == since[2] == "2024-05-01T00:00:00Z"  # the restart asked from the checkpoint
    # the first version of order 1 went out: the checkpoint stays, so the next read asks again
    assert states[-1].state["cursor"] == "2024-05-01T00:00:00Z"
    table, states, _ = _read(
        _source(api), "cursor", strategy="cursor", state=states[-1].state, cursor=_cursor()
    )
    assert table is not None and table.column("status").to_pylist()[0] == "shipped"
    assert states[-1].state["cursor"] == "2024-05-09T00:00:01Z"


def _cursor() -> Any:
    from combined.connectors.abc import CursorSpec

    return CursorSpec(column="updated_at", trust="the API filters by updated_at")


def test_an_expiry_the_endpoint_declares_in_the_body_restarts_too(api: FakeAPI) -> None:
    declared = {"status": [400], "field": "error", "values": ["injected"]}
    api.fail(CURSOR, 400, query={"cursor": "2"})
    table, _, _ = _read(_source(api, endpoints=_endpoints(expired=declared)), "cursor")
    assert _ids(table) == [1, 2, 3, 4, 5]
    api.fail(CURSOR, 400, query={"cursor": "2"})  # undeclared, a 400 is a refusal
    with pytest.raises(SourceError, match="refused the request"):
        _read(_source(api), "cursor")


def test_restarts_are_bounded_and_the_failure_says_so_not_check_the_path(api: FakeAPI) -> None:
    api.fail(CURSOR, 410, times=2, query={"cursor": "2"})
    with pytest.raises(SourceUnavailable) as info:
        _read(_source(api, endpoints=_endpoints(restarts=1)), "cursor")
    error = info.value
    assert error.transient and "expired before the read ended" in error.message
    assert "starting over 1 times" in error.message
    assert "paginate.restarts" in (error.hint or "") and "path" not in (error.hint or "")


@pytest.mark.parametrize(
    ("expired", "message"),
    [
        ({"status": 500}, "4xx status"),
        ({"status": 400, "field": "error"}, "go together"),
        ({"status": 400, "values": ["x"]}, "go together"),
        ({"code": 400}, "code"),
    ],
)
def test_a_bad_expiry_declaration_is_refused(expired: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        HTTPSource({"base_url": "http://127.0.0.1:9", "endpoints": _endpoints(expired=expired)})


def _page(records: int) -> str:
    """A page body of ``records`` orders: numbers with decimals, text, a null, a time."""

    def order(i: int) -> str:
        note = "null" if i % 10 == 0 else f'"note {i}"'
        return (
            f'{{"id":{i},"customer_id":{i % 1000},"status":"status{i % 7}",'
            f'"total":{i % 997}.{i % 100:02d},"note":{note},'
            f'"updated_at":"2024-01-01T00:00:{i % 60:02d}Z"}}'
        )

    return "[" + ",".join(map(order, range(records))) + "]"


def _cpu(work: Callable[[], object]) -> float:
    """The least CPU-seconds of three runs of ``work`` (another process's load inflates some)."""
    spent = []
    for _ in range(3):
        started = time.process_time()
        work()
        spent.append(time.process_time() - started)
    return min(spent)


def test_remembering_the_keys_handed_over_costs_less_than_four_decodings_of_the_page() -> None:
    """Cursor paging remembers a digest of each record's key and of the record, for a restart
    that may come at any page. Each digest's ``json.dumps`` built its encoder anew: 5 to 5.5
    times the CPU of decoding the records (a third of an HTTP capture's); one encoder built
    once: about 3 to 4 times."""
    body = _page(100_000)
    records = DECODER.decode(body)
    settings = HTTPSource({"base_url": "http://127.0.0.1:9", "endpoints": ENDPOINTS}).settings
    cursor = settings.endpoint("cursor")

    def remember() -> None:
        delivered = Delivered(("id",), cursor)
        assert delivered.tracking
        for record in records:
            delivered.admit(record)
        delivered.close()

    decoding, remembering = _cpu(lambda: DECODER.decode(body)), _cpu(remember)
    # (3.5-3.9x on a 2-core EPYC, 4.5x once under a loaded CI: the encoder built at each
    # call was 5-5.5x; the bound sits between)
    assert remembering < 4.75 * decoding, f"{remembering:.2f} CPU-s, decoding {decoding:.2f}"


def _delivered() -> Delivered:
    settings = HTTPSource({"base_url": "http://127.0.0.1:9", "endpoints": ENDPOINTS}).settings
    return Delivered(("id",), settings.endpoint("cursor"))


def test_the_keys_handed_over_are_remembered_outside_memory_until_a_restart() -> None:
    """A dictionary of every key's digest took ~100 bytes a record: an API of 1M
    records held ~100 MB more at its read's end (427-436 MB peak, bench/taps.py)."""
    import tracemalloc

    records = [{"id": n, "v": f"value {n}"} for n in range(200_000)]
    delivered = _delivered()
    tracemalloc.start()
    try:
        assert all(delivered.admit(r) for r in records)
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        delivered.close()
    assert held < 1_000_000, f"{held:,} bytes held for 200,000 records"


def test_each_restart_skips_every_key_handed_over_before_it_and_notes_a_change() -> None:
    expired = SourceUnavailable("410 Gone")
    settings = HTTPSource({"base_url": "http://127.0.0.1:9", "endpoints": ENDPOINTS}).settings
    endpoint = settings.endpoint("cursor")
    delivered = _delivered()
    try:
        first: list[dict[str, Any]] = [{"id": n, "v": n} for n in range(5)]
        assert [delivered.admit(r) for r in [*first, first[1]]] == [
            True
        ] * 6  # (a repeat: the engine's)
        delivered.restart(endpoint, expired, 3)
        # pass 2: the five again (one changed meanwhile), then two new ones
        second: list[dict[str, Any]] = [*first[:3], {"id": 3, "v": "changed"}, first[4]]
        second += [{"id": 5}, {"id": 6}]
        assert [delivered.admit(r) for r in second] == [False] * 5 + [True, True]
        assert delivered.changed
        delivered.restart(endpoint, expired, 4)
        # pass 3: keys of both passes are skipped; id 3 compares with its first version
        assert [delivered.admit(r) for r in [first[3], {"id": 6}, {"id": 7}]] == [
            False,
            False,
            True,
        ]
    finally:
        delivered.close()


def test_keys_whose_digests_share_a_first_half_are_told_apart() -> None:
    from combined.connectors.http._restart import _Known

    rows = b"".join(
        bytes.fromhex(high) + bytes.fromhex(low) + body.to_bytes(8, "big")
        for high, low, body in [
            ("00" * 7 + "01", "00" * 8, 10),
            ("00" * 7 + "01", "ff" * 8, 11),
            ("ff" * 8, "00" * 8, 12),
            ("00" * 7 + "01", "00" * 8, 13),  # (a key again: its first record is kept)
        ]
    )
    known = _Known.of(rows, None)
    assert known.body(bytes.fromhex("00" * 7 + "01" + "00" * 8)) == 10
    assert known.body(bytes.fromhex("00" * 7 + "01" + "ff" * 8)) == 11
    assert known.body(bytes.fromhex("ff" * 16)) is None
    assert known.body(bytes.fromhex("ff" * 8 + "00" * 8)) == 12
