"""MAR: distinct stable identities with a committed change, per calendar month.

The month's identity set lives in the lake (one Delta table per dataset under
``_usage/``), merged with set semantics: inserting an identity that is already
there changes nothing, so a retried, duplicated or re-projected commit can
never bill twice. Counts are read back from that table. A dataset's first
usage bills its Deliveries by reference, not by a copy of their ids
(:mod:`combined.usage._refs`).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pyarrow as pa

from combined.lake import LakeLayout, LakeTable, constant_dictionary, with_dictionaries
from combined.protocol._digest import Digest, as_sql, digest_of, digest_sql_type, digest_type
from combined.usage._refs import (
    BILLED_OP,
    BILLED_ROWS,
    REF_COLUMN,
    billed_sql,
    count_ops,
    names_in_raw_layer,
    reference_rows,
    referencing,
    sql_literal,
)


def record_usage(
    layout: LakeLayout,
    source: str,
    dataset: str,
    changes: str | Path | Sequence[str | Path],
    *,
    month: str,
    unique: bool = False,
    deliveries: bool = False,
) -> dict[str, dict[str, int]]:
    """Add a transition's (id, op) set to the month's identities; return the month's counts.

    ``changes`` is the transition's change list (``_combined_id``, ``op``),
    or with ``deliveries`` its Delivery files, when they hold exactly its
    changes: their ``_combined_op`` is the operation (a baseline's
    ``snapshot`` bills as an insert).

    Only identities not already billed for that month and operation are
    appended (an anti-join in DuckDB, streamed into new data files), so
    running it twice for the same commit changes nothing. The month's counts
    travel in the same usage commit as the rows they count (cumulative, in its
    metadata), so they are read back, not recounted, and a crash between the
    usage commit and the catalog cannot lose them. ``unique`` says the file
    holds each identity once (a keyed transition, not an event stream).

    The usage commit lands on the version its new pairs were computed from,
    or not at all: a process of another catalog sharing the lake that bills
    the dataset meanwhile fails it, and the pairs are computed again from
    the newer version (else both would bill what the other just billed, and
    the later counts would drop the other's).
    """
    from deltalake.exceptions import DeltaError

    files = [str(changes)] if isinstance(changes, str | Path) else [str(f) for f in changes]
    for left in reversed(range(_RACES)):
        # One load serves every read of an attempt (the commit loads that version).
        table = layout.usage_table(source, dataset).pinned()
        version = table.version()
        try:
            return _bill(
                layout, (source, dataset), table, version, files, month, unique, deliveries
            )
        except DeltaError:
            if left == 0 or layout.usage_table(source, dataset).version() == version:
                raise  # not a race lost to another writer: the store's own error
    raise AssertionError("unreachable")


#: How many times a usage commit is computed again after another writer's landed first.
_RACES = 5


def _bill(
    layout: LakeLayout,
    key: tuple[str, str],
    table: LakeTable,
    version: int | None,
    files: list[str],
    month: str,
    unique: bool,
    deliveries: bool,
) -> dict[str, dict[str, int]]:
    """One attempt of :func:`record_usage` on ``key``'s usage table as of ``version``."""
    store = layout.store
    # The identities keep the usage table's digest format (the dataset's own
    # when it was first billed); a v1 id is exactly the hex of its v2 id.
    have = _files_digest(store, files)
    existing_schema = table.schema() if table.exists() else None
    want = have if existing_schema is None else digest_of(existing_schema)
    refs = referencing(existing_schema)
    schema = _schema(want, refs)
    # The billed identities and their counts from one table version: counts
    # newer than the identities they were read with would count again
    # whatever a concurrent usage commit added in between.
    known = table.files(version)  # none before the first usage commit
    counts = _committed_counts(table, version)
    if month not in counts and known:
        counts[month] = month_counts(layout, *key, month)  # written before counts
    current = counts[month] if month in counts else _no_usage()
    if unique and not known:
        # The dataset's first usage, one row per identity: every row is new.
        names = names_in_raw_layer(layout, key, files) if deliveries and refs else []
        if names:
            return {month: _by_reference(table, version, schema, files, names, month, counts)}
        billed = _first_usage(table, version, schema, files, month, deliveries, counts, current)
        return {month: billed}
    with _duck(store, files) as con:
        month_lit = sql_literal(month)
        new = _new_pairs(con, store, files, month_lit, deliveries, (have, want))
        existing = _billed(con, layout, key, known, month, want, refs)
        row = _count_added(con, new, existing)
        if row[4]:
            current = counts[month] = _plus(current, row)
            columns = f", NULL::VARCHAR AS {REF_COLUMN}" if refs else ""
            reader = con.sql(f"SELECT month, _combined_id, op{columns} FROM added").to_arrow_reader(
                65_536
            )
            table.append_batches(
                schema,
                (b.cast(schema) for b in reader),
                create=version is None,
                metadata={"counts": counts},
                read_at=version,
            )
    return {month: current}


def _plus(current: dict[str, int], row: Any) -> dict[str, int]:
    """The month's counts with the added pairs' (inserts, updates, deletes, new ids)."""
    return {
        "mar": current["mar"] + int(row[3]),
        "inserts": current["inserts"] + int(row[0]),
        "updates": current["updates"] + int(row[1]),
        "deletes": current["deletes"] + int(row[2]),
    }


def _schema(want: Digest, refs: bool) -> pa.Schema:
    """The usage table's schema: ids in ``want`` format; ``refs``: with its references' column."""
    fields = [("month", pa.string()), ("_combined_id", digest_type(want)), ("op", pa.string())]
    return pa.schema(fields + ([(REF_COLUMN, pa.string())] if refs else []))


def _new_pairs(
    con: Any,
    store: Any,
    files: list[str],
    month_lit: str,
    deliveries: bool,
    digests: tuple[Digest, Digest],
) -> str:
    """SQL of the transition's (month, id, op) pairs.

    ``digests``: the changes' identity format, and the usage table's.
    """
    have, want = digests
    op = BILLED_OP if deliveries else "CAST(op AS VARCHAR)"
    return (
        f"SELECT {month_lit} AS month, "
        f"CAST({as_sql('_combined_id', have, want)} AS {digest_sql_type(want)}) AS _combined_id, "
        f"{op} AS op FROM {store.duck_source(con, files)}"
        + (f" WHERE {BILLED_ROWS}" if deliveries else "")
    )


def _billed(
    con: Any,
    layout: LakeLayout,
    key: tuple[str, str],
    known: list[str],
    month: str,
    want: Digest,
    refs: bool,
) -> str:
    """SQL of the month's billed (month, id, op) pairs: the usage files ``known`` hold them.

    ``refs``: the table may hold references to Deliveries, which stand for their rows.
    """
    if refs and known:
        return billed_sql(con, layout, key, known, month, want)
    if known:
        month_lit = sql_literal(month)
        return (
            "SELECT month, _combined_id, op FROM "
            f"{layout.store.duck_source(con, known)} WHERE month = {month_lit}"
        )
    t = digest_sql_type(want)
    return (
        f"SELECT NULL::VARCHAR AS month, NULL::{t} AS _combined_id, NULL::VARCHAR AS op WHERE false"
    )


def _count_added(con: Any, new: str, existing: str) -> Any:
    """Table ``added``: the pairs not billed yet; (inserts, updates, deletes, new ids, pairs)."""
    # The month's rows for the identities this transition touches (a semi
    # join: a hash table of the transition's ids, not of the month's),
    # then the pairs not billed yet; repeated pairs fold. (Temporary: the
    # connection's own, where it is a cursor of a database others use too.)
    con.execute(f"CREATE TEMP TABLE pairs AS SELECT DISTINCT * FROM ({new})")
    con.execute(
        f"CREATE TEMP TABLE seen AS SELECT e._combined_id, e.op FROM ({existing}) e "
        "SEMI JOIN pairs n ON e._combined_id IS NOT DISTINCT FROM n._combined_id"
    )
    con.execute(
        "CREATE TEMP TABLE added AS SELECT * FROM pairs n ANTI JOIN seen s "
        "ON n._combined_id IS NOT DISTINCT FROM s._combined_id "
        "AND n.op IS NOT DISTINCT FROM s.op"
    )
    # The new ids apart first: a distinct count over the join's output held
    # both hash tables at once, and 2M new ids of a 2M-row re-snapshot ran out
    # of the connection's 64 MB (made distinct before the join instead, a
    # transition of 2M updates took 0.4 CPU-s more).
    con.execute(
        "CREATE TEMP TABLE fresh AS SELECT a._combined_id FROM added a ANTI JOIN seen e "
        "ON a._combined_id IS NOT DISTINCT FROM e._combined_id"
    )
    fresh = "SELECT count(DISTINCT _combined_id) FROM fresh"
    return con.execute(
        "SELECT count(*) FILTER (WHERE op = 'insert'), count(*) FILTER (WHERE op = 'update'), "
        f"count(*) FILTER (WHERE op = 'delete'), ({fresh}), count(*) FROM added"
    ).fetchall()[0]


#: The usage rows' columns of few values, written from dictionaries.
_CONSTANT_COLUMNS = ("month", "op")


def _first_usage(
    table: LakeTable,
    version: int | None,
    schema: pa.Schema,
    files: list[str],
    month: str,
    deliveries: bool,
    counts: dict[str, dict[str, int]],
    current: dict[str, int],
) -> dict[str, int]:
    """Bill a dataset's first transition: each of its (distinct) ids is new to the month.

    The rows stream from the files as they are (no join, nothing to compare
    with), in two streams written at once; the counts are tallied on the way
    and travel in the commit that adds the rows.
    """
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    store = table.store
    if not sum(pq.ParquetFile(store.open_input(f)).metadata.num_rows for f in files):
        return current  # nothing to bill
    op_column = "_combined_op" if deliveries else "op"
    tally: dict[str, int] = {"insert": 0, "update": 0, "delete": 0}
    lock = threading.Lock()
    month_value = pa.scalar(month, pa.string())
    # The month and the operation travel as dictionaries (the operation as
    # the file's own): the writer takes them as they are, where strings
    # would each be hashed into its dictionary again.
    written = with_dictionaries(schema, _CONSTANT_COLUMNS)

    def rows(paths: list[str]) -> Iterator[pa.RecordBatch]:
        for path in paths:
            with pq.ParquetFile(store.open_input(path), read_dictionary=[op_column]) as pf:
                columns = ["_combined_id", op_column]
                for b in pf.iter_batches(batch_size=65_536, columns=columns):
                    ops = _billed_ops(b.column(1), deliveries)
                    found = pc.value_counts(ops.indices).to_pylist()
                    with lock:
                        for item in found:
                            op = ops.dictionary[item["values"]].as_py()
                            tally[op] = tally.get(op, 0) + item["counts"]
                    ids = b.column(0).cast(schema.field("_combined_id").type)
                    months = constant_dictionary(month_value, b.num_rows)
                    refs = [pa.nulls(b.num_rows, pa.string())] if REF_COLUMN in schema.names else []
                    yield pa.record_batch([months, ids, ops, *refs], schema=written)

    def metadata() -> dict[str, Any]:
        counts[month] = {
            "mar": sum(tally.values()),
            "inserts": tally["insert"],
            "updates": tally["update"],
            "deletes": tally["delete"],
        }
        return {"counts": counts}

    streams = [rows(files[n::2]) for n in range(min(2, len(files)))]
    table.append_streams(
        schema,
        streams,
        create=version is None,
        metadata=metadata,
        dictionaries=_CONSTANT_COLUMNS,
        read_at=version,
    )
    return counts[month]


def _by_reference(
    table: LakeTable,
    version: int | None,
    schema: pa.Schema,
    files: list[str],
    names: list[str],
    month: str,
    counts: dict[str, dict[str, int]],
) -> dict[str, int]:
    """Bill a dataset's first transition by a reference to each of its Deliveries.

    Its rows are the Deliveries' own (one row per identity): the usage
    table keeps their names, not a copy of their ids. The counts come
    from the Deliveries' operations and travel in the commit that adds
    the references.
    """
    ops = count_ops(table.store, files)
    if not sum(ops.values()):
        return _no_usage()  # nothing to bill
    counts[month] = {
        "mar": sum(ops.values()),
        "inserts": ops["insert"],
        "updates": ops["update"],
        "deletes": ops["delete"],
    }
    table.append_batches(
        schema,
        iter([reference_rows(schema, month, names)]),
        create=version is None,
        metadata={"counts": counts},
        read_at=version,
    )
    return counts[month]


def _billed_ops(ops: pa.DictionaryArray, deliveries: bool) -> pa.DictionaryArray:
    """A file's operations (a dictionary array) as billed: a Delivery's ``snapshot`` as an insert.

    Mapped on the dictionary's few values, not on the rows.
    """
    import pyarrow.compute as pc

    values = ops.dictionary.cast(pa.string())
    if deliveries:  # a baseline's rows bill as inserts
        values = pc.if_else(pc.equal(values, "snapshot"), "insert", values)
    indices = ops.indices.cast(pa.int32())
    if len(set(values.to_pylist())) < len(values):  # (snapshots beside inserts: one value each)
        return values.take(indices).dictionary_encode()
    return pa.DictionaryArray.from_arrays(indices, values)


def _files_digest(store: Any, files: list[str]) -> Digest:
    """The digest format of the change list or Deliveries ``files`` (from the first footer)."""
    import pyarrow.parquet as pq

    with pq.ParquetFile(store.open_input(files[0])) as pf:
        return digest_of(pf.schema_arrow)


def _committed_counts(table: LakeTable, version: int | None) -> dict[str, dict[str, int]]:
    """The cumulative counts carried by the usage commit at ``version``."""
    if version is None:
        return {}
    meta = table.newest_commit(lambda m: m["lake_version"] <= version)
    if not meta or "counts" not in meta:
        return {}
    return {m: dict(c) for m, c in meta["counts"].items()}


#: A transition whose change files hold at most this many bytes is billed on a
#: local lake's shared DuckDB database (:meth:`LakeStore.duck`): its pairs are
#: a few MB at most, and a database of its own costs ~20 ms of CPU to open and
#: close, more than billing a small table's change (a re-capture of 200 small
#: tables, one row changed in each, spent ~4 of its ~34 CPU-s there). The
#: shared database's memory is not bounded: at 16 MB, the 5 MB of Deliveries
#: of a 500k-row CDC re-snapshot (200k rows, 300k deletes) were billed there,
#: and its hash tables made the capture's peak (388 MB; 1 MB of them holds
#: ~30,000 rows of ids and hashes at most).
SHARED_BYTES = 1 * 2**20


@contextmanager
def _duck(store: Any, files: Sequence[str]) -> Iterator[Any]:
    """A DuckDB connection with bounded memory that spills to a private temp directory.

    Or, for a small transition of a local lake (:data:`SHARED_BYTES`), a
    cursor of the lake's shared database.

    The directory is this connection's own (a :class:`PrivateDir`: created
    0700 under a new name nobody else can have prepared or linked elsewhere),
    removed with the connection, and swept by the next Run if this process
    is killed first. A shared, fixed name could be a symlink another user
    planted, and the spilled identities would land where they chose.
    """
    import duckdb

    from combined.connectors._subprocess._private import PrivateDir

    if not store.remote and sum(store.size(f) for f in files) <= SHARED_BYTES:
        with store.duck() as shared:
            yield shared
        return
    spill = PrivateDir("combined-usage-")
    try:
        con = duckdb.connect(
            config={
                # narrow (month, id, op) rows that spill cheaply: at 128 MB, MAR of
                # a 500k-row CDC backlog held ~40 MB more at the capture's peak
                "memory_limit": "64MB",
                "threads": 2,
                "temp_directory": str(spill.path),
                "preserve_insertion_order": False,
            }
        )
        try:
            yield con
        finally:
            con.close()
    finally:
        spill.remove()


def _no_usage() -> dict[str, int]:
    """A month's counts before anything is billed in it."""
    return {"mar": 0, "inserts": 0, "updates": 0, "deletes": 0}


def month_counts(layout: LakeLayout, source: str, dataset: str, month: str) -> dict[str, int]:
    """MAR and its per-operation breakdown for one dataset and month."""
    table = layout.usage_table(source, dataset)
    files = table.files()
    if not files:
        return _no_usage()
    schema = table.schema()
    key = (source, dataset)
    with _duck(layout.store, files) as con:
        billed = _billed(con, layout, key, files, month, digest_of(schema), referencing(schema))
        row = con.execute(
            "SELECT count(DISTINCT _combined_id), "
            "count(DISTINCT _combined_id) FILTER (WHERE op = 'insert'), "
            "count(DISTINCT _combined_id) FILTER (WHERE op = 'update'), "
            "count(DISTINCT _combined_id) FILTER (WHERE op = 'delete') "
            f"FROM ({billed})"
        ).fetchall()[0]
    return {"mar": row[0], "inserts": row[1], "updates": row[2], "deletes": row[3]}
