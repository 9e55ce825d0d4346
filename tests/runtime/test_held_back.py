"""A dataset's failure names the Run's other datasets it held back."""

from __future__ import annotations

from datetime import UTC, datetime

from combined.catalog import Run
from combined.errors import DriftRejected, SchemaMismatch
from combined.runtime._plan import DatasetPlan
from combined.runtime._runner import name_dataset, name_held_back


def _run(*datasets: str) -> Run:
    return Run(
        id="r1",
        source="pg",
        datasets=datasets,
        trigger="manual",
        state="extracting",
        admission_id="a1",
        retry_of=None,
        created_at=datetime.now(UTC),
        started_at=None,
        ended_at=None,
        error=None,
        error_type=None,
        stats=None,
        publication_id=None,
    )


def test_a_name_that_only_begins_like_another_is_not_taken_for_it() -> None:
    exc = DriftRejected("schema drift in pg.ab: drop on field 'v'", hint="review it")
    name_held_back(_run("a", "ab", "a.b"), exc)
    assert exc.hint == (
        "review it; this Run's other datasets (pg.a, pg.a.b) were not committed either (a Run "
        "publishes its datasets together): `combined capture pg.a pg.a.b` captures them meanwhile"
    )


def test_many_held_back_datasets_are_counted_not_all_listed() -> None:
    names = [f"t{i}" for i in range(1, 9)]
    exc = DriftRejected("schema drift in pg.t3: drop on field 'v'")
    name_held_back(_run(*names), exc)
    assert exc.hint is not None
    assert exc.hint.startswith(
        "this Run's other datasets (pg.t1, pg.t2, pg.t4, pg.t5, pg.t6 and 2 more)"
    )
    assert exc.hint.endswith("`combined capture SOURCE.DATASET ...` captures them meanwhile")


def test_an_error_of_the_source_itself_names_no_dataset_and_adds_nothing() -> None:
    exc = DriftRejected("the server refused the connection", hint="start it")
    name_held_back(_run("a", "b"), exc)
    assert exc.hint == "start it"


def _plan(name: str) -> DatasetPlan:
    return DatasetPlan(
        source="maria",
        name=name,
        relation="invoices",
        key=("id",),
        strategy="cursor",
        sync_mode="incremental",
        cursor={"column": "updated_at"},
        columns=None,
        batch_rows=1000,
        max_rows=1000,
        max_bytes=1 << 20,
        drift={},
        quarantine_reader="owner",
        review_every_s=86400,
    )


def test_a_read_error_that_names_only_the_relation_is_given_the_dataset() -> None:
    """Two datasets may read one relation: "2 rows of 'invoices' hold null in cursor
    column 'updated_at'" did not say which dataset's cursor to set `nulls:` on."""
    exc = SchemaMismatch(
        "2 rows of 'invoices' hold null in cursor column 'updated_at'",
        hint="set cursor.nulls; `combined discover SOURCE` lists the columns",
    )
    name_dataset(_plan("invoices_c"), exc)
    assert exc.message == (
        "maria.invoices_c: 2 rows of 'invoices' hold null in cursor column 'updated_at'"
    )
    assert exc.hint == "set cursor.nulls; `combined discover maria` lists the columns"


def test_a_read_error_naming_its_dataset_already_is_not_named_twice() -> None:
    exc = SchemaMismatch("a value of maria.invoices_c does not fit column 'v'")
    name_dataset(_plan("invoices_c"), exc)
    assert exc.message == "a value of maria.invoices_c does not fit column 'v'"
