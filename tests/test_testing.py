"""The test doubles shipped in combined.testing behave like real connectors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from combined.connectors import connector_class
from combined.connectors.abc import Extraction, ReadRequest, Source
from combined.errors import (
    AuthRejected,
    ConfigError,
    NotFoundError,
    ProtocolViolation,
    SourceError,
    SourceUnavailable,
)
from combined.protocol import RecordBatchMessage, StateMessage
from combined.testing import InMemorySource, ScriptedSource


def request(dataset: str, **kw: Any) -> ReadRequest:
    kw.setdefault("key", ("id",))
    kw.setdefault("strategy", "snapshot")
    return ReadRequest(dataset=dataset, relation=dataset, **kw)


def drain(extraction: Extraction) -> tuple[list[Any], list[StateMessage]]:
    batches: list[Any] = []
    states: list[StateMessage] = []
    try:
        for message in extraction:
            if isinstance(message, RecordBatchMessage):
                batches.append(message.batch)
            else:
                states.append(message)
    finally:
        extraction.finish("success")
    return batches, states


def rows(source: Source, dataset: str, **kw: Any) -> list[dict[str, Any]]:
    batches, _ = drain(source.read(request(dataset, **kw)))
    return pa.Table.from_batches(batches).to_pylist() if batches else []


# -- InMemorySource ---------------------------------------------------------------


@pytest.fixture
def memory() -> InMemorySource:
    orders = pa.table({"id": [1, 2, 3, 4, 5], "status": ["new", "new", "paid", "paid", "sent"]})
    lines = pa.table({"order": [1, 1, 2], "line": [1, 2, 1], "qty": [5, 6, 7]})
    return InMemorySource(
        datasets={"orders": orders, "lines": lines},
        keys={"orders": ["id"], "lines": ["order", "line"]},
    )


def test_memory_discovers_fields_and_keys(memory: InMemorySource) -> None:
    discovery = memory.discover()
    orders = discovery.dataset("orders")
    assert orders is not None
    assert [(f.name, f.arrow_type) for f in orders.fields] == [
        ("id", "int64"),
        ("status", "string"),
    ]
    assert orders.primary_key == ("id",)
    assert orders.estimated_rows == 5
    lines = discovery.dataset("lines")
    assert lines is not None and lines.primary_key == ("order", "line")
    assert discovery.connector == "memory"


def test_memory_snapshot_read_follows_the_receipt_protocol(memory: InMemorySource) -> None:
    extraction = memory.read(request("orders", batch_rows=2))
    assert not extraction.receipt.acquired
    messages = iter(extraction)
    first = next(messages)
    assert isinstance(first, RecordBatchMessage)
    assert extraction.receipt.acquired and not extraction.receipt.completed
    rest = list(messages)
    assert [m.batch.num_rows for m in rest if isinstance(m, RecordBatchMessage)] == [2, 1]
    assert rest[-1] == StateMessage("orders", {}, final=True)
    assert extraction.receipt.completed and extraction.receipt.rows == 5
    first_decision = extraction.finish("success")
    assert extraction.finish("abort") is first_decision
    with pytest.raises(ProtocolViolation):
        next(iter(extraction))


def test_memory_put_upserts_by_key(memory: InMemorySource) -> None:
    memory.put("orders", [{"id": 2, "status": "paid"}, {"id": 6, "status": "new"}])
    got = {r["id"]: r["status"] for r in rows(memory, "orders")}
    assert got == {1: "new", 2: "paid", 3: "paid", 4: "paid", 5: "sent", 6: "new"}
    memory.put("lines", pa.table({"order": [1], "line": [2], "qty": [60]}))
    assert sorted((r["order"], r["line"], r["qty"]) for r in rows(memory, "lines")) == [
        (1, 1, 5),
        (1, 2, 60),
        (2, 1, 7),
    ]


def test_memory_delete_by_key(memory: InMemorySource) -> None:
    memory.delete("orders", [1, 3])
    assert [r["id"] for r in rows(memory, "orders")] == [2, 4, 5]
    memory.delete("lines", [(1, 2), {"order": 2, "line": 1}])
    assert rows(memory, "lines") == [{"order": 1, "line": 1, "qty": 5}]


def test_memory_replace_and_create(memory: InMemorySource) -> None:
    memory.replace("orders", pa.table({"id": [9], "status": ["gone"]}))
    assert rows(memory, "orders") == [{"id": 9, "status": "gone"}]
    memory.put("fresh", [{"id": 1}])
    assert rows(memory, "fresh") == [{"id": 1}]


def test_memory_read_is_a_snapshot_taken_at_the_first_batch(memory: InMemorySource) -> None:
    before = memory.read(request("orders", batch_rows=1))
    memory.delete("orders", [1])  # before the first batch: the read sees it
    messages = iter(before)
    next(messages)
    memory.put("orders", [{"id": 99, "status": "new"}])  # mid-read: it does not
    seen = [m.batch["id"][0].as_py() for m in messages if isinstance(m, RecordBatchMessage)]
    before.finish("success")
    assert 99 not in seen and 1 not in seen
    assert len(seen) == 3  # ids 3, 4, 5 after the first batch (2)
    assert 99 in [r["id"] for r in rows(memory, "orders")]


def test_memory_from_config_mapping() -> None:
    source = InMemorySource(
        {
            "tables": {"users": [{"id": 1, "name": "ada"}, {"id": 2, "name": "bob"}]},
            "keys": {"users": ["id"]},
        }
    )
    users = source.discover().dataset("users")
    assert users is not None and users.primary_key == ("id",)
    assert rows(source, "users", columns=("name",)) == [{"name": "ada"}, {"name": "bob"}]


def test_memory_refuses_what_it_cannot_do(memory: InMemorySource) -> None:
    with pytest.raises(NotFoundError, match="'ghost'"):
        memory.read(request("ghost"))
    with pytest.raises(ConfigError, match="cursor"):
        memory.read(request("orders", strategy="cursor"))
    with pytest.raises(NotFoundError, match="'colour'"):
        rows(memory, "orders", columns=("colour",))
    with pytest.raises(ConfigError, match="key column 'sku'"):
        InMemorySource(datasets={"t": pa.table({"id": [1]})}, keys={"t": ["sku"]})


# -- ScriptedSource ---------------------------------------------------------------

DATASETS = {"orders": {"fields": {"id": "int64", "name": "string"}, "key": ["id"]}}
ROWS = [{"id": i, "name": f"n{i}"} for i in range(5)]


def test_the_test_doubles_are_found_only_where_the_switch_is_set(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Reproduction: `scripted` was registered among the production connectors.

    Any project could name ``connector: scripted`` and capture a script's rows
    into a real lake; ``combined discover`` listed it beside postgres.
    """
    from combined.connectors import known_connectors
    from combined.errors import ConfigError

    monkeypatch.delenv("COMBINED_TEST_CONNECTORS")
    assert "scripted" not in known_connectors()
    with pytest.raises(ConfigError) as info:
        connector_class("scripted")
    assert "it is found only where COMBINED_TEST_CONNECTORS=1" in (info.value.hint or "")
    monkeypatch.setenv("COMBINED_TEST_CONNECTORS", "1")
    assert "scripted" in known_connectors()


def test_scripted_is_registered_and_discovers_the_declared_schema() -> None:
    assert connector_class("scripted") is ScriptedSource
    source = ScriptedSource({"datasets": DATASETS, "script": [{"rows": ROWS}]})
    (orders,) = source.discover().datasets
    assert [(f.name, f.arrow_type) for f in orders.fields] == [("id", "int64"), ("name", "string")]
    assert orders.primary_key == ("id",)


def test_scripted_yields_rows_in_bounded_batches_with_the_step_state() -> None:
    source = ScriptedSource(
        script=[{"rows": ROWS, "state": {"cursor": 4}, "position": "4"}], datasets=DATASETS
    )
    batches, states = drain(source.read(request("orders", batch_rows=2)))
    assert [b.num_rows for b in batches] == [2, 2, 1]
    assert states == [StateMessage("orders", {"cursor": 4}, position="4", final=True)]


def test_scripted_list_shorthand_infers_a_dataset() -> None:
    source = ScriptedSource([{"rows": [{"id": 1, "v": 1.5}]}])
    (items,) = source.discover().datasets
    assert items.name == "items"
    assert [(f.name, f.arrow_type) for f in items.fields] == [("id", "int64"), ("v", "double")]
    assert rows(source, "anything") == [{"id": 1, "v": 1.5}]


def test_scripted_fails_before_the_read_starts() -> None:
    source = ScriptedSource([{"rows": ROWS, "fail": "unavailable"}])
    extraction = source.read(request("orders"))
    with pytest.raises(SourceUnavailable) as caught:
        next(iter(extraction))
    assert caught.value.transient
    assert not extraction.receipt.acquired
    extraction.finish("abort")


def test_scripted_fails_after_n_batches() -> None:
    source = ScriptedSource([{"rows": ROWS, "fail": "auth", "after_batches": 2}])
    extraction = source.read(request("orders", batch_rows=1))
    got = 0
    with pytest.raises(AuthRejected) as caught:
        for message in extraction:
            assert isinstance(message, RecordBatchMessage)
            got += 1
    assert got == 2
    assert caught.value.run_state == "needs_auth"
    assert extraction.receipt.acquired and not extraction.receipt.completed
    assert extraction.receipt.rows == 2
    extraction.finish("abort")


def test_scripted_schema_fault_yields_a_batch_that_does_not_fit() -> None:
    source = ScriptedSource(
        {"datasets": DATASETS, "script": [{"rows": ROWS, "fail": "schema", "after_batches": 1}]}
    )
    declared = {f.name: f.arrow_type for f in source.discover().datasets[0].fields}
    batches, states = drain(source.read(request("orders", batch_rows=2)))
    found = [{f.name: str(f.type) for f in b.schema} for b in batches]
    assert found[0] == declared
    assert found[1] == {"id": "int64", "name": "int64"}  # the misfit, after one batch
    assert all(f == declared for i, f in enumerate(found) if i != 1)
    assert sum(b.num_rows for b in batches) == 6
    assert states[-1].final


def test_scripted_fail_times_then_succeed_across_fresh_instances(tmp_path: Path) -> None:
    config = {
        "script": [{"rows": ROWS, "fail": "unavailable", "fail_times": 2}],
        "state_file": str(tmp_path / "reads.json"),
    }
    outcomes: list[int | str] = []
    for _attempt in range(4):
        source = ScriptedSource(config)  # the engine builds one per Attempt
        try:
            outcomes.append(len(rows(source, "orders")))
        except SourceUnavailable:
            outcomes.append("unavailable")
    assert outcomes == ["unavailable", "unavailable", 5, 5]
    assert json.loads((tmp_path / "reads.json").read_text()) == {"reads": {"orders": 4}}
    assert ScriptedSource(config).reads("orders") == 4


def test_without_a_state_file_each_instance_starts_over() -> None:
    config = {"script": [{"rows": ROWS, "fail": "unavailable", "fail_times": 1}]}
    for _attempt in range(2):
        with pytest.raises(SourceUnavailable):
            rows(ScriptedSource(config), "orders")
    source = ScriptedSource(config)
    with pytest.raises(SourceUnavailable):
        rows(source, "orders")
    assert len(rows(source, "orders")) == 5  # the same instance counts its reads
    assert source.reads("orders") == 2


def test_scripted_steps_advance_per_dataset_and_the_last_repeats() -> None:
    source = ScriptedSource(
        {
            "script": {
                "a": [{"rows": [{"id": 1}]}, {"fail": "error"}, {"rows": [{"id": 3}]}],
                "b": [{"rows": [{"id": 10}]}],
            }
        }
    )
    assert rows(source, "a") == [{"id": 1}]
    assert rows(source, "b") == [{"id": 10}]
    with pytest.raises(SourceError):
        rows(source, "a")
    assert rows(source, "a") == [{"id": 3}]
    assert rows(source, "a") == [{"id": 3}]
    assert rows(source, "b") == [{"id": 10}]
    with pytest.raises(NotFoundError):
        source.read(request("c"))
    assert {d.name for d in source.discover().datasets} == {"a", "b"}


def test_scripted_check_can_fail() -> None:
    with pytest.raises(AuthRejected):
        ScriptedSource({"script": [], "check": "auth"}).check()
    ScriptedSource({"script": []}).check()


@pytest.mark.parametrize(
    "config",
    [
        {"script": [{"fail": "explode"}]},
        {"script": [{"rows": [], "after_batches": -1}]},
        {"script": [{"rowz": []}]},
        {"script": ["not a step"]},
        {"script": [], "check": "maybe"},
        {"datasets": {"t": {"fields": {"id": "integer-ish"}}}, "script": []},
    ],
)
def test_scripted_refuses_a_broken_script(config: dict[str, Any]) -> None:
    with pytest.raises(ConfigError):
        ScriptedSource(config)


# -- the conformance suite ------------------------------------------------------------


def _memory_case(connector: type[InMemorySource]) -> Any:
    from combined.testing.conformance import ConformanceCase

    rows = [{"id": i, "name": f"n{i}"} for i in range(40)]
    return ConformanceCase(
        connector=connector,
        config={"tables": {"t": rows}, "keys": {"t": ["id"]}},
        relation="t",
        key=("id",),
        rows=40,
        secrets=("tok-leaky-0a1b2c",),
        # Only the leaky double refuses a credential; the in-memory source takes none.
        bad_config={"tables": {"t": rows}, "keys": {"t": ["id"]}} if connector is _Leaky else None,
    )


def test_the_in_memory_source_passes_the_conformance_suite() -> None:
    from combined.testing.conformance import SourceConformance

    suite, case = SourceConformance(), _memory_case(InMemorySource)
    for name in dir(suite):
        if name.startswith("test_"):
            getattr(suite, name)(case)


class _Unbounded(InMemorySource):
    """Hands the whole table over as one batch, whatever ``batch_rows`` says."""

    def read(self, request: Any) -> Any:
        from dataclasses import replace

        return super().read(replace(request, batch_rows=1_000_000))


class _Leaky(InMemorySource):
    """Refuses every credential, quoting the token in its message."""

    def check(self) -> None:
        from combined.errors import AuthRejected

        raise AuthRejected("the API refused tok-leaky-0a1b2c")


@pytest.mark.parametrize(
    ("connector", "test", "says"),
    [
        (_Unbounded, "test_a_read_follows_the_extraction_protocol", "a batch over the bound"),
        (_Leaky, "test_refused_credentials_leave_no_secret_in_any_text", "credential value"),
    ],
)
def test_the_conformance_suite_fails_a_connector_that_breaks_the_contract(
    connector: type[InMemorySource], test: str, says: str
) -> None:
    from combined.testing.conformance import SourceConformance

    with pytest.raises(AssertionError, match=says):
        getattr(SourceConformance(), test)(_memory_case(connector))
