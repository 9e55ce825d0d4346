"""MAR identities billed by reference to the Deliveries that hold them.

A dataset's first usage (its first transition, one row per identity) bills
every row of its Deliveries, and the raw layer keeps those rows with their
``_combined_id`` and ``_combined_op``. Copying the ids into the usage table
doubled what the lake keeps of them: 16 bytes a row that do not compress,
as much as a narrow table's whole row. So the usage table then holds one
row per Delivery instead, a **reference**: ``month`` and the Delivery's
file name in ``delivery``, ``_combined_id`` and ``op`` null. A reader of a
month's billed pairs reads the referenced Deliveries' own ids and operations
(a ``snapshot`` bills as an insert), with the usage table's rows.

A usage table that may hold references is one created with the
``delivery`` column; a table created before it has none and keeps its
copies. Before a retention removes a referenced Delivery from the raw
layer, :func:`keep_billed` copies its ids into the usage table (the rows
carry the Delivery's name, and replace its reference in one maintenance
commit), so no billed identity is ever lost with the raw layer's files.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa

from combined.lake import LakeLayout
from combined.protocol._digest import Digest, as_sql, digest_of, digest_sql_type

#: The usage table's column naming a Delivery (its file name in the raw layer).
REF_COLUMN = "delivery"

#: A Delivery's operation as billed: a baseline's ``snapshot`` is an insert.
BILLED_OP = (
    "CASE WHEN _combined_op = 'snapshot' THEN 'insert' ELSE CAST(_combined_op AS VARCHAR) END"
)

#: The Delivery rows MAR bills: not an event stream's truncate, which names no
#: source row (its id is the same for every truncate); a keyed dataset bills
#: the rows a truncate removes, as the deletes its Deliveries hold.
BILLED_ROWS = "_combined_op <> 'truncate'"


def referencing(schema: pa.Schema | None) -> bool:
    """Whether a usage table of ``schema`` may hold references (None: no table yet, so yes)."""
    return schema is None or REF_COLUMN in schema.names


def names_in_raw_layer(layout: LakeLayout, key: tuple[str, str], files: Sequence[str]) -> list[str]:
    """``files``' names in the dataset's raw layer, or none unless every one is a Delivery there."""
    root = str(layout.deliveries(*key)).rstrip("/")
    names = []
    for f in files:
        parent, _, name = str(f).rpartition("/")
        if parent.rstrip("/") != root or not name:
            return []
        names.append(name)
    return names


def reference_rows(schema: pa.Schema, month: str, names: Sequence[str]) -> pa.RecordBatch:
    """The usage rows that bill the Deliveries ``names`` in ``month``, one a Delivery."""
    n = len(names)
    columns = {
        "month": pa.array([month] * n, pa.string()),
        "_combined_id": pa.nulls(n, schema.field("_combined_id").type),
        "op": pa.nulls(n, pa.string()),
        REF_COLUMN: pa.array(list(names), pa.string()),
    }
    return pa.record_batch([columns[f.name] for f in schema], schema=schema)


def count_ops(store: Any, files: Sequence[str]) -> dict[str, int]:
    """How many rows of each billed operation the Deliveries ``files`` hold."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    counts = {"insert": 0, "update": 0, "delete": 0}
    for f in files:
        with pq.ParquetFile(store.open_input(f), read_dictionary=["_combined_op"]) as pf:
            for batch in pf.iter_batches(batch_size=1 << 20, columns=["_combined_op"]):
                ops = batch.column(0)
                values = ops.dictionary.cast(pa.string()).to_pylist()
                for item in pc.value_counts(ops.indices).to_pylist():
                    op = values[item["values"]]
                    op = "insert" if op == "snapshot" else op
                    if op in counts:  # (an event stream's truncate is no row)
                        counts[op] += item["counts"]
    return counts


def billed_sql(
    con: Any,
    layout: LakeLayout,
    key: tuple[str, str],
    known: Sequence[str],
    month: str,
    want: Digest,
) -> str:
    """SQL of the month's billed (month, _combined_id, op) rows of the usage files ``known``.

    A reference stands for its Delivery's rows, their ids in the usage
    table's digest format ``want``. ``known`` must be of a table that holds
    references (:func:`referencing`).
    """
    store = layout.store
    lit = sql_literal(month)
    usage = store.duck_source(con, known)
    rows = (
        f"SELECT month, _combined_id, op FROM {usage} "
        f"WHERE month = {lit} AND _combined_id IS NOT NULL"
    )
    names = [
        r[0]
        for r in con.execute(
            f"SELECT DISTINCT {REF_COLUMN} FROM {usage} "
            f"WHERE month = {lit} AND _combined_id IS NULL AND {REF_COLUMN} IS NOT NULL"
        ).fetchall()
    ]
    if not names:
        return rows
    files = [store.child(layout.deliveries(*key), n) for n in sorted(names)]
    return rows + (
        f" UNION ALL SELECT {lit} AS month, "
        f"CAST({as_sql('_combined_id', _digest(store, files[0]), want)} "
        f"AS {digest_sql_type(want)}) AS _combined_id, {BILLED_OP} AS op "
        f"FROM {store.duck_source(con, files)} WHERE {BILLED_ROWS}"
    )


def keep_billed(layout: LakeLayout, key: tuple[str, str], names: Sequence[str]) -> int:
    """Copy into the usage table the ids of the Deliveries ``names`` it bills by reference.

    For a retention, before it removes those Deliveries from the raw layer.
    Their rows (month, id, operation, the Delivery's name) replace their
    references in one maintenance commit (a ``replaceWhere`` on the names),
    so a crash leaves either the references or the copies, and running it
    again changes nothing more. Returns how many references it replaced.
    """
    from deltalake import write_deltalake

    from combined.lake._maintain import _properties
    from combined.lake._table import post_commit

    table = layout.usage_table(*key)
    table.forget_shared()
    schema, dt = table.schema(), table.delta()
    if dt is None or schema is None or not referencing(schema) or not names:
        return 0
    store = layout.store
    import duckdb

    con = duckdb.connect(config={"memory_limit": "64MB", "threads": 1})
    try:
        usage = store.duck_source(con, table.files())
        listed = ", ".join(sql_literal(n) for n in names)
        refs = con.execute(
            f"SELECT DISTINCT month, {REF_COLUMN} FROM {usage} "
            f"WHERE _combined_id IS NULL AND {REF_COLUMN} IN ({listed})"
        ).fetchall()
        if not refs:
            return 0
        kept = con.sql(
            f"SELECT * FROM {usage} WHERE {REF_COLUMN} IN ({listed}) AND _combined_id IS NOT NULL"
        ).to_arrow_table()
        write_deltalake(
            dt,
            _copies(con, layout, key, schema, refs, kept),
            mode="overwrite",
            predicate=f"{REF_COLUMN} IN ({listed})",
            commit_properties=_properties("keep_billed", deliveries=sorted(n for _, n in refs)),
            post_commithook_properties=post_commit(),
        )
    finally:
        con.close()
    return len(refs)


def _copies(
    con: Any,
    layout: LakeLayout,
    key: tuple[str, str],
    schema: pa.Schema,
    refs: list[tuple[str, str]],
    kept: pa.Table,
) -> pa.RecordBatchReader:
    """The usage rows that replace ``refs``: each referenced Delivery's ids, with its name."""
    want = digest_of(schema)

    def batches() -> Iterator[pa.RecordBatch]:
        yield from kept.cast(schema).to_batches()  # (copied by an earlier, same decision)
        for month, name in refs:
            path = layout.store.child(layout.deliveries(*key), name)
            sql = (
                f"SELECT {sql_literal(month)} AS month, "
                f"CAST({as_sql('_combined_id', _digest(layout.store, path), want)} "
                f"AS {digest_sql_type(want)}) AS _combined_id, {BILLED_OP} AS op, "
                f"{sql_literal(name)} AS {REF_COLUMN} "
                f"FROM {layout.store.duck_source(con, [path])} WHERE {BILLED_ROWS}"
            )
            for b in con.sql(sql).to_arrow_reader(65_536):
                yield b.cast(schema)

    return pa.RecordBatchReader.from_batches(schema, batches())


def _digest(store: Any, path: str) -> Digest:
    """The digest format of the Delivery at ``path`` (from its footer)."""
    import pyarrow.parquet as pq

    with pq.ParquetFile(store.open_input(path)) as pf:
        return digest_of(pf.schema_arrow)


def sql_literal(text: str) -> str:
    """``text`` as a SQL string literal."""
    return "'" + text.replace("'", "''") + "'"
