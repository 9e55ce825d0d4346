"""The http connector against a real HTTP server on 127.0.0.1: pages, types, errors, secrets."""

from __future__ import annotations

import pickle
import time
from typing import Any

import pyarrow as pa
import pytest
from tests.connectors.http.fake_api import TOKEN, FakeAPI, order

from combined.connectors import check_config
from combined.connectors.abc import CursorSpec, ReadRequest
from combined.connectors.http import HTTPSource
from combined.connectors.http._client import retry_after
from combined.connectors.http._extraction import since_value
from combined.errors import (
    AuthRejected,
    CombinedError,
    ConfigError,
    SchemaMismatch,
    SourceError,
    SourceUnavailable,
)
from combined.protocol import RecordBatchMessage, StateMessage

ENDPOINTS: dict[str, Any] = {
    "plain": {"path": "/orders/plain"},
    "page": {
        "path": "/orders/page",
        "records": "data.items",
        "paginate": {"style": "page", "param": "page", "size_param": "per_page", "size": 2},
    },
    "offset": {
        "path": "/orders/offset",
        "records": "results",
        "paginate": {"style": "offset", "param": "offset", "size_param": "limit", "size": 2},
    },
    "cursor": {
        "path": "/orders/cursor",
        "records": "items",
        "paginate": {"style": "cursor", "param": "cursor", "next": "next_cursor"},
        "since": {"param": "updated_since", "format": "iso"},
    },
    "link": {"path": "/orders/link", "paginate": "link"},
    "rels": {"path": "/orders/rels", "paginate": "link"},
    "bodylink": {
        "path": "/orders/bodylink",
        "records": "results",
        "paginate": {"style": "link", "next": "links.next"},
    },
    "loop": {
        "path": "/orders/loop",
        "records": "items",
        "paginate": {"style": "cursor", "param": "cursor", "next": "next_cursor"},
    },
    "stuck": {
        "path": "/orders/stuck",
        "records": "data.items",
        "paginate": {"style": "page", "size_param": "per_page", "size": 2},
    },
    "elsewhere": {"path": "/orders/elsewhere", "paginate": "link"},
    "moved": {"path": "/moved"},
    "away": {"path": "/away"},
    "html": {"path": "/html"},
    "latin1": {"path": "/latin1"},
    "bom": {"path": "/bom"},
    "odata": {"path": "/odata"},
    "deep": {"path": "/deep"},
    "missing": {"path": "/nothing-here"},
    "wrong_path": {"path": "/orders/page", "records": "data.rows"},
}


def _source(api: FakeAPI, **extra: Any) -> HTTPSource:
    config = {
        "base_url": api.base_url,
        "auth": {"type": "bearer", "token": api.token},
        "endpoints": ENDPOINTS,
        "max_retry_wait": 2,
        **extra,
    }
    return HTTPSource(config)


def _read(
    source: HTTPSource, relation: str, **request: Any
) -> tuple[pa.Table | None, list[StateMessage], Any]:
    request.setdefault("strategy", "snapshot")
    extraction = source.read(
        ReadRequest(dataset="orders", relation=relation, key=("id",), **request)
    )
    batches, states = [], []
    try:
        for msg in extraction:
            if isinstance(msg, RecordBatchMessage):
                batches.append(msg.batch)
            else:
                assert isinstance(msg, StateMessage)
                states.append(msg)
    finally:
        extraction.finish("success")
    table = pa.Table.from_batches(batches) if batches else None
    return table, states, extraction.receipt


def _ids(table: pa.Table | None) -> list[int]:
    assert table is not None
    return [int(v) for v in table.column("id").to_pylist()]


@pytest.mark.parametrize("relation", ["plain", "page", "offset", "cursor", "link", "bodylink"])
def test_every_paging_style_reads_every_record_once(api: FakeAPI, relation: str) -> None:
    table, states, receipt = _read(_source(api), relation, batch_rows=3)
    assert _ids(table) == [1, 2, 3, 4, 5]
    assert [s.final for s in states] == [True]
    assert receipt.completed and receipt.rows == 5
    assert receipt.snapshot_authority == "http:pages" and receipt.source_token
    assert table is not None and table.schema.field("id").type == pa.int64()
    # nested values are JSON text, as the Singer mapping keeps them
    assert table.column("customer")[0].as_py() == '{"name":"c1","tags":["a"]}'


def test_page_paging_stops_on_the_empty_page_and_sends_the_auth_header(api: FakeAPI) -> None:
    _read(_source(api), "page")
    seen = api.seen("/v1/orders/page")
    assert [r.query["page"] for r in seen] == ["1", "2", "3", "4"]  # 2+2+1, then empty
    assert all(r.query["per_page"] == "2" for r in seen)
    assert all(r.headers["authorization"] == f"Bearer {TOKEN}" for r in seen)


def test_a_short_page_does_not_end_the_read(api: FakeAPI) -> None:
    # the API caps pages at 2 even when asked for 3: a short page is not the last
    endpoints = {
        "page": {
            **ENDPOINTS["page"],
            "paginate": {"style": "page", "size_param": "per_page", "size": 3},
        }
    }
    table, _, _ = _read(_source(api, endpoints=endpoints), "page")
    assert _ids(table) == [1, 2, 3, 4, 5]
    assert [r.query["page"] for r in api.seen("/v1/orders/page")] == ["1", "2", "3", "4"]


def test_a_next_link_among_several_relations_is_followed(api: FakeAPI) -> None:
    # RFC 8288: rel="next last" is a link of both relations, and relation names
    # are compared without case: a read that missed either stopped at page 1 or 2
    # (no error), and a snapshot of it would delete the rows it never read.
    api.page_size = 1
    table, _, _ = _read(_source(api), "rels")
    assert _ids(table) == [1, 2, 3, 4, 5]
    assert [r.query.get("from") for r in api.seen("/v1/orders/rels")] == [
        None,
        *(str(i) for i in range(1, 5)),
    ]


def test_a_repeated_next_token_is_a_loop_not_an_endless_read(api: FakeAPI) -> None:
    with pytest.raises(SourceError, match="repeats a next token seen before"):
        _read(_source(api), "loop")
    assert len(api.seen("/v1/orders/loop")) == 2


def test_a_page_parameter_the_api_ignores_is_detected(api: FakeAPI) -> None:
    with pytest.raises(SourceError, match="same records as page 1") as info:
        _read(_source(api), "stuck")
    assert "ignore parameter 'page'" in info.value.message


def test_max_pages_stops_a_long_read_with_a_clear_error(api: FakeAPI) -> None:
    with pytest.raises(SourceError) as info:
        _read(_source(api, max_pages=2), "cursor")
    assert "more than 2 pages" in info.value.message and "max_pages" in (info.value.hint or "")
    assert len(api.seen("/v1/orders/cursor")) == 2


def test_a_next_link_to_another_host_is_refused_before_any_request(api: FakeAPI) -> None:
    with pytest.raises(SourceError, match="another host") as info:
        _read(_source(api), "elsewhere")
    assert "localhost" in info.value.message
    assert len(api.requests) == 1  # the other host got nothing


def test_redirects_are_followed_on_the_same_host_only(api: FakeAPI) -> None:
    table, _, _ = _read(_source(api), "moved")
    assert _ids(table) == [1, 2, 3, 4, 5]
    assert api.seen("/v1/orders/plain")[0].headers["authorization"] == f"Bearer {TOKEN}"
    before = len(api.requests)
    with pytest.raises(SourceError, match="another host"):
        _read(_source(api), "away")
    assert len(api.requests) == before + 1  # the redirect was not followed


def test_401_is_needs_auth_and_carries_no_token(api: FakeAPI) -> None:
    source = _source(api)
    api.token = "a-rotated-token"  # the server no longer takes the source's token
    with pytest.raises(AuthRejected) as info:
        _read(source, "plain")
    error = info.value
    assert error.run_state == "needs_auth" and not error.transient
    assert "401" in error.message and "/v1/orders/plain" in error.message
    assert TOKEN not in error.describe() + repr(error.context) + repr(pickle.dumps(error))


def test_an_api_key_in_the_query_is_masked_in_every_error(api: FakeAPI) -> None:
    key = "qk-5e1d0c9b8a7f"
    source = HTTPSource(
        {
            "base_url": api.base_url,
            "auth": {"type": "api_key", "in": "query", "name": "sig", "api_key": key},
            "endpoints": ENDPOINTS,
        }
    )
    with pytest.raises(AuthRejected) as info:  # the server wants a bearer token
        _read(source, "plain")
    assert api.seen("/v1/orders/plain")[0].query["sig"] == key  # it was sent
    text = info.value.describe() + repr(info.value.context)
    assert key not in text and "/v1/orders/plain" in text
    api.fail("/v1/orders/plain", 500, times=3)
    with pytest.raises(SourceUnavailable) as unavailable:
        _read(source, "plain")
    assert key not in unavailable.value.describe()


def test_429_with_retry_after_is_waited_out_within_the_read(api: FakeAPI) -> None:
    api.fail("/v1/orders/plain", 429, times=2, headers={"Retry-After": "0"})
    table, _, _ = _read(_source(api), "plain")
    assert _ids(table) == [1, 2, 3, 4, 5]
    assert len(api.seen("/v1/orders/plain")) == 3


def test_a_retry_after_beyond_the_bound_is_transient_for_the_next_attempt(api: FakeAPI) -> None:
    api.fail("/v1/orders/plain", 503, headers={"Retry-After": "3600"})
    started = time.monotonic()
    with pytest.raises(SourceUnavailable) as info:
        _read(_source(api), "plain")
    assert time.monotonic() - started < 2  # not waited
    assert info.value.transient and "503" in info.value.message
    assert TOKEN not in info.value.describe()


def test_a_negative_retry_after_is_no_wait_and_the_server_is_not_asked_again_at_once(
    api: FakeAPI,
) -> None:
    # 'Retry-After: -5' was read as 0: the read asked the busy server again
    # at once, five times in a row, inside the Attempt.
    api.fail("/v1/orders/plain", 503, times=5, headers={"Retry-After": "-5"})
    with pytest.raises(SourceUnavailable) as info:
        _read(_source(api), "plain")
    assert len(api.seen("/v1/orders/plain")) == 1  # the next Attempt's backoff asks again
    assert info.value.transient and "retry_after_s" not in info.value.context
    assert retry_after("-5") is None and retry_after("-0.5") is None


def test_retry_after_reads_seconds_and_http_dates() -> None:
    from datetime import UTC, datetime

    now = datetime(2024, 5, 1, 12, 0, 0, tzinfo=UTC)
    assert retry_after("7") == 7.0
    assert retry_after("Wed, 01 May 2024 12:00:30 GMT", now) == 30.0
    assert retry_after("Wed, 01 May 2024 11:00:00 GMT", now) == 0.0
    assert retry_after("soon") is None and retry_after(None) is None
    assert (
        retry_after("inf") is None and retry_after("NaN") is None and retry_after("1e400") is None
    )
    assert retry_after("1e12") == retry_after("Fri, 31 Dec 9999 23:59:59 GMT", now) == 7 * 86400


def test_404_names_the_url_and_is_terminal(api: FakeAPI) -> None:
    with pytest.raises(SourceError) as info:
        _read(_source(api), "missing")
    assert type(info.value) is SourceError and not info.value.transient
    assert f"{api.base_url}/nothing-here" in info.value.message
    assert "does not exist" in info.value.message


def test_a_connection_failure_is_transient(api: FakeAPI) -> None:
    source = HTTPSource({"base_url": "http://127.0.0.1:9/v1", "endpoints": ENDPOINTS})
    with pytest.raises(SourceUnavailable, match="failed: ConnectError"):
        _read(source, "plain")


def test_a_body_that_is_not_json_names_type_and_length_never_the_body(api: FakeAPI) -> None:
    with pytest.raises(SchemaMismatch) as info:
        _read(_source(api), "html")
    assert "not JSON (content type text/html, 18 bytes)" in info.value.message
    assert "hello" not in info.value.describe()


def test_a_body_is_read_in_its_declared_charset_and_past_a_byte_order_mark(
    api: FakeAPI,
) -> None:
    """Both were "a body that is not JSON"."""
    table, _, _ = _read(_source(api), "latin1")
    assert table is not None and table.to_pylist() == [{"id": 1, "name": "Zoë"}]
    table, _, _ = _read(_source(api), "bom")
    assert table is not None and table.column("name").to_pylist() == ["a"]
    # a content type's other parameters are not its charset (a review found "minimal" taken)
    table, _, _ = _read(_source(api), "odata")
    assert table is not None and table.column("name").to_pylist() == ["é"]


def test_json_nested_too_deep_is_refused_not_an_internal_error(api: FakeAPI) -> None:
    """It failed with Python's RecursionError and no hint."""
    with pytest.raises(SchemaMismatch, match="nested too deep to read") as info:
        _read(_source(api), "deep")
    assert info.value.hint is not None and "nothing was committed" in info.value.hint


def test_a_missing_records_path_names_the_path_and_the_keys(api: FakeAPI) -> None:
    with pytest.raises(SchemaMismatch) as info:
        _read(_source(api), "wrong_path")
    assert "records path 'data.rows'" in info.value.message
    assert "its keys: data, meta" in info.value.message


def test_an_object_body_without_records_asks_for_the_path(api: FakeAPI) -> None:
    source = _source(api, endpoints={"p": {"path": "/orders/page"}})
    with pytest.raises(SchemaMismatch, match="not a list of records"):
        _read(source, "p")


def test_an_empty_first_page_is_refused_unless_allowed(api: FakeAPI) -> None:
    api.orders.clear()
    with pytest.raises(SourceError, match="empty snapshot would delete every row"):
        _read(_source(api), "page")
    endpoints = {"page": {**ENDPOINTS["page"], "allow_empty": True}}
    table, states, receipt = _read(_source(api, endpoints=endpoints), "page")
    assert table is None and states[-1].final and receipt.completed


def test_declared_fields_hold_their_types(api: FakeAPI) -> None:
    api.orders[1]["total"] = 10
    api.orders[2]["total"] = "12.50"  # a decimal written as text is refused, not coerced
    endpoints = {
        "plain": {
            "path": "/orders/plain",
            "fields": {"total": "decimal(2)", "updated_at": "timestamp"},
        }
    }
    with pytest.raises(SchemaMismatch) as info:
        _read(_source(api, endpoints=endpoints), "plain")
    assert "field 'total' holds text of 5 characters on page 1" in info.value.message
    api.orders[2]["total"] = 12.5
    table, _, _ = _read(_source(api, endpoints=endpoints), "plain")
    assert table is not None
    assert table.schema.field("total").type == pa.decimal128(38, 2)
    assert table.schema.field("updated_at").type == pa.timestamp("us", tz="UTC")
    assert str(table.column("total")[1].as_py()) == "12.50"


def test_an_inferred_integer_meeting_a_fraction_later_names_the_fix(api: FakeAPI) -> None:
    api.orders[5]["total"] = 50.5
    with pytest.raises(SchemaMismatch) as info:
        _read(_source(api), "page", batch_rows=2)
    assert "field 'total' holds a number of 4 characters on page 3" in info.value.message
    assert "fields: {total: number}" in (info.value.hint or "")
    table, _, _ = _read(_source(api), "page")  # one batch sees both: a double
    assert table is not None and table.schema.field("total").type == pa.float64()


def test_an_integer_a_double_would_round_is_refused_naming_an_exact_type(api: FakeAPI) -> None:
    """Beside a fraction in one batch, 12345678901234567890123 was a double: ...568e+22."""
    huge = 12345678901234567890123
    api.orders[1]["total"] = huge
    api.orders[2]["total"] = 0.5
    with pytest.raises(SchemaMismatch) as info:
        _read(_source(api), "page")
    assert "field 'total' holds a number of 23 characters" in info.value.message
    assert "fields: {total: decimal(N)}" in (info.value.hint or "")
    api.orders[2]["total"] = 5  # integers alone: inferred int64, which it does not fit
    with pytest.raises(SchemaMismatch) as info:
        _read(_source(api), "page")
    assert "fields: {total: decimal(0)}" in (info.value.hint or "")
    endpoints = {"plain": {"path": "/orders/plain", "fields": {"total": "decimal(0)"}}}
    table, _, _ = _read(_source(api, endpoints=endpoints), "plain")
    assert table is not None and huge in table.column("total").to_pylist()


def test_a_json_field_keeps_the_digits_of_a_number_a_double_would_round(api: FakeAPI) -> None:
    """A nested 0.99999999999999999 was written 1.0 in the json column, and
    12345678901234567890.5 as 1.2345678901234567e+19: another value than the API's."""
    api.orders[1]["customer"] = {
        "balance": "@raw:0.99999999999999999",
        "limit": ["@raw:12345678901234567890.5", "@raw:1.5e+30"],
        "price": "@raw:19.90",
    }
    table, _, _ = _read(_source(api), "page")
    assert table is not None
    customers = dict(zip(_ids(table), table.column("customer").to_pylist(), strict=True))
    assert customers[1] == (
        '{"balance":0.99999999999999999,"limit":[12345678901234567890.5,'
        '1500000000000000000000000000000],"price":19.9}'
    )  # (19.90, which a double holds, is written as before: the lake's texts stay)


def test_cursor_read_passes_the_checkpoint_less_the_lookback_and_advances(api: FakeAPI) -> None:
    cursor = CursorSpec("updated_at", lookback=None, trust="the API sorts and filters by it")
    table, states, _ = _read(_source(api), "cursor", strategy="cursor", cursor=cursor)
    assert _ids(table) == [1, 2, 3, 4, 5]
    (final,) = states
    assert (
        final.state["cursor"] == "2024-05-05T00:00:05Z" and final.position == final.state["cursor"]
    )
    assert "updated_since" not in api.seen("/v1/orders/cursor")[0].query
    api.orders[3] = order(3, "shipped", day=9)
    table, states, _ = _read(
        _source(api), "cursor", strategy="cursor", cursor=cursor, state=final.state
    )
    assert api.seen("/v1/orders/cursor")[-1].query["updated_since"] == "2024-05-05T00:00:05Z"
    assert _ids(table) == [3, 5]  # the API's filter is inclusive: 5 again, merged by key
    assert states[-1].state["cursor"] == "2024-05-09T00:00:03Z"
    nothing_new = {**states[-1].state}
    api.orders.clear()
    table, states, _ = _read(
        _source(api), "cursor", strategy="cursor", cursor=cursor, state=nothing_new
    )
    assert table is None and states[-1].state == nothing_new  # an empty delta keeps it


def test_cursor_nulls_follow_the_policy(api: FakeAPI) -> None:
    api.orders[6] = {**order(6), "updated_at": None}
    spec = CursorSpec("updated_at", trust="t")
    with pytest.raises(SchemaMismatch, match="holds no value of cursor 'updated_at'"):
        _read(_source(api), "cursor", strategy="cursor", cursor=spec)
    excluded = CursorSpec("updated_at", trust="t", nulls="exclude")
    table, _, _ = _read(_source(api), "cursor", strategy="cursor", cursor=excluded)
    assert _ids(table) == [1, 2, 3, 4, 5]
    included = CursorSpec("updated_at", trust="t", nulls="include")
    table, states, _ = _read(_source(api), "cursor", strategy="cursor", cursor=included)
    assert _ids(table) == [1, 2, 3, 4, 5, 6]
    assert states[-1].state["cursor"] == "2024-05-05T00:00:05Z"


def test_a_cursor_read_needs_a_since_parameter(api: FakeAPI) -> None:
    spec = CursorSpec("updated_at", trust="t")
    with pytest.raises(ConfigError, match="declares no `since` parameter"):
        _source(api).read(ReadRequest("orders", "page", ("id",), "cursor", cursor=spec))


def test_since_values_apply_the_lookback_in_the_checkpoints_shape() -> None:
    from datetime import timedelta

    spec = CursorSpec("u", lookback=timedelta(minutes=5), trust="t")
    assert since_value(spec, "2024-05-01T00:10:00Z", "raw") == "2024-05-01T00:05:00Z"
    assert since_value(spec, "2024-05-01T02:10:00+02:00", "iso") == "2024-05-01T00:05:00Z"
    numbers = CursorSpec("v", lookback=10, trust="t")
    assert since_value(numbers, 1000, "raw") == "990"
    with pytest.raises(ConfigError):
        since_value(numbers, 1000, "iso")


def test_a_fractional_cursor_is_kept_exact_in_the_checkpoint() -> None:
    """It went through a float: a checkpoint of 0.99999999999999999 became 1.0, and the
    next read asked for rows past 1.0, never reading 0.999999999999999995."""
    import json
    from decimal import Decimal

    from combined.connectors.http._extraction import cursor_state, cursor_value

    exact = Decimal("0.99999999999999999")
    kept = json.loads(json.dumps(cursor_state(exact)))  # as a checkpoint is stored
    assert kept == {"decimal": "0.99999999999999999"}
    assert cursor_value(kept) == exact
    assert since_value(CursorSpec("u", trust="t"), cursor_value(kept), "raw") == str(exact)
    assert cursor_state(Decimal("12.000")) == 12 and cursor_value(12) == 12
    assert cursor_value(1.5) == 1.5  # a checkpoint written before: as it was
    assert cursor_value("2024-05-01T00:00:00Z") == "2024-05-01T00:00:00Z"


def test_discover_reports_types_and_candidates_from_the_first_page(api: FakeAPI) -> None:
    source = _source(api, endpoints={"cursor": ENDPOINTS["cursor"]})
    (found,) = source.discover().datasets
    types = {f.name: (f.arrow_type, f.source_type) for f in found.fields}
    assert types["id"] == ("int64", "integer (inferred)")
    assert types["customer"] == ("string", "json (inferred)")
    keys = [k.columns for k in found.key_candidates]
    assert ("id",) in keys and ("status",) not in keys and ("customer",) not in keys
    assert all("first page" in k.evidence for k in found.key_candidates)
    cursors = {c.column: c.evidence for c in found.cursor_candidates}
    assert "updated_at" in cursors and "weak evidence" in cursors["updated_at"]
    assert found.strategies == ("snapshot", "cursor")
    assert len(api.seen("/v1/orders/cursor")) == 1  # one page only


def test_check_makes_one_request_and_reports_a_refused_token(api: FakeAPI) -> None:
    _source(api, check_path="/me").check()
    assert len(api.seen("/v1/me")) == 1
    source = _source(api, check_path="/me")
    api.token = "another"
    with pytest.raises(AuthRejected) as info:
        source.check()
    assert TOKEN not in info.value.describe()


def test_a_rate_limit_spaces_the_requests(api: FakeAPI) -> None:
    started = time.monotonic()
    _read(_source(api, rate_limit=20), "page")  # 4 requests at 20/s: 3 gaps of 50 ms
    assert time.monotonic() - started >= 0.15


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({}, "needs a base_url"),
        ({"base_url": "ftp://x"}, "is not an http(s) URL"),
        ({"base_url": "https://x", "auth": {"type": "oauth"}}, "must be none, bearer"),
        (
            {"base_url": "https://x", "endpoints": {"o": {"paginate": {"style": "cursor"}}}},
            "names no `param`",
        ),
        (
            {"base_url": "https://x", "endpoints": {"o": {"paginate": {"style": "offset"}}}},
            "sets no `size`",
        ),
        (
            {"base_url": "https://x", "endpoints": {"o": {"fields": {"a": "money"}}}},
            "not a field type",
        ),
        ({"base_url": "https://x", "endpoints": {"o": {"path": "https://evil/x"}}}, "full URL"),
        ({"base_url": "https://x", "endpoints": {"o": {"pth": "/o"}}}, "did you mean"),
        ({"base_url": "https://x", "json_keys": "alphabetical"}, "one of as_sent, sorted"),
        # (a header cannot carry it: every request failed, retried as a transient failure)
        ({"base_url": "https://x", "auth": {"type": "bearer", "token": "ab\ncd"}}, "line break"),
        (
            {"base_url": "https://x", "auth": {"type": "api_key", "name": "K", "api_key": "a\r"}},
            "control character",
        ),
    ],
)
def test_bad_configurations_are_refused_with_a_hint(config: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        HTTPSource(config)
    assert message in info.value.message or message in (info.value.hint or "")


@pytest.mark.parametrize("key", ["headers", "endpoints", "base_url"])
def test_a_secret_reference_outside_auth_is_refused(key: str) -> None:
    ref = {"secret": "env:API_KEY"}
    value: Any = {
        "headers": {"X-Api-Key": ref},
        "endpoints": {"o": {"params": {"key": ref}}},
        "base_url": ref,
    }[key]
    with pytest.raises(ConfigError) as info:
        check_config(HTTPSource, {"base_url": "https://x", key: value}, where="sources.a.config")
    assert "holds a secret reference" in info.value.message
    assert "auth" in (info.value.hint or "")


def test_errors_pickle_cleanly(api: FakeAPI) -> None:
    with pytest.raises(CombinedError) as info:
        _read(_source(api), "loop")
    again = pickle.loads(pickle.dumps(info.value))
    assert type(again) is type(info.value) and again.message == info.value.message
