"""Queries over a published basis, in DuckDB.

Each member is opened at its recorded lake table version. Its data files are
read directly with ``read_parquet`` (tables are written without deletion
vectors or column mapping, so a version's files are exactly its rows); no
pyarrow dataset is left open, so the process exits cleanly. An object-store
lake's files are handed to DuckDB as Arrow datasets over the store instead
(DuckDB itself opens no file of it).

A query reads the published basis and nothing else: it is one ``SELECT``
(a ``COPY ... TO`` could overwrite a lake file, an ``ATTACH`` create one),
and DuckDB may open no file but the basis's own, locked so that the query
cannot lift that (no ``read_csv('/etc/...')``, no unpublished Deliveries).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from combined.catalog import Member
from combined.errors import CombinedError
from combined.lake._layout import LakeLayout
from combined.lake._table import LakeTable
from combined.protocol.identity import quote_ident

if TYPE_CHECKING:
    import pyarrow as pa


#: The schema holding each member's (empty) table of its version's columns.
_SHAPES = "_combined_shapes"


class QueryError(CombinedError):
    """DuckDB rejected the query."""


def run_query(layout: LakeLayout, members: Sequence[Member], query: str) -> pa.Table:
    """Expose each member as ``<source>.<dataset>`` and run ``query``, a single SELECT."""
    import duckdb

    _check_read_only(query)
    con = duckdb.connect()
    try:
        allowed: list[str] = []
        con.execute(f"CREATE SCHEMA {_SHAPES}")
        for m in members:
            con.execute(f"CREATE SCHEMA IF NOT EXISTS {quote_ident(m.source)}")
            name = f"{quote_ident(m.source)}.{quote_ident(m.dataset)}"
            if m.lake_version is None:
                continue
            table = LakeTable(layout.table(m.source, m.dataset), "", layout.store)
            files = table.files(m.lake_version)
            schema = table.schema(m.lake_version)
            assert schema is not None
            # The version's schema, not its files', is the member's shape: a
            # column the table evolved to is there before any file holds it.
            shape = name if not files else f"{_SHAPES}.{quote_ident(f'{m.source}.{m.dataset}')}"
            con.register("_empty", schema.empty_table())
            con.execute(f"CREATE TABLE {shape} AS SELECT * FROM _empty")
            con.unregister("_empty")
            if files:
                if layout.store.remote:
                    scan = layout.store.arrow_source(
                        con, f"_lake_{m.source}.{m.dataset}", files, schema
                    )
                else:
                    allowed.extend(files)
                    scan = layout.store.duck_source(con, files)
                con.execute(
                    f"CREATE VIEW {name} AS SELECT * FROM {shape} UNION ALL BY NAME "
                    f"SELECT * FROM {scan}"
                )
        # From here DuckDB opens only the basis's files, extensions included,
        # and the query cannot change that.
        con.execute("SET allowed_paths = ?", [allowed])
        con.execute("SET enable_external_access = false")
        con.execute("SET autoinstall_known_extensions = false")
        con.execute("SET autoload_known_extensions = false")
        con.execute("SET lock_configuration = true")
        try:
            return con.sql(query).to_arrow_table()
        except duckdb.Error as exc:
            raise QueryError(
                f"the query failed: {exc}",
                hint="tables are named <source>.<dataset>; list them with `combined status`",
            ) from exc
    finally:
        con.close()


_READ_ONLY_HINT = (
    "write one SELECT (WITH, FROM, DESCRIBE and SHOW read too) over tables named "
    "<source>.<dataset>; the lake changes only through `combined capture`"
)


def _check_read_only(query: str) -> None:
    """Refuse anything but one statement that only reads."""
    import duckdb

    try:
        statements = duckdb.extract_statements(query)
    except duckdb.Error as exc:
        raise QueryError(
            f"the query failed: {exc}",
            hint="tables are named <source>.<dataset>; list them with `combined status`",
        ) from None
    if not statements:
        raise QueryError("the query is empty", hint=_READ_ONLY_HINT)
    if len(statements) > 1:
        raise QueryError(
            f"the query holds {len(statements)} statements; one is run at a time",
            hint=_READ_ONLY_HINT,
        )
    kind = statements[0].type
    if kind != duckdb.StatementType.SELECT:
        raise QueryError(f"only a query that reads is run, not {kind.name}", hint=_READ_ONLY_HINT)
