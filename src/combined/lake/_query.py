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

A query is bounded: DuckDB's ``memory_limit`` (spilling to a private
temporary directory, removed afterwards) and a timeout after which the
query is interrupted. It runs in a thread of its own while the calling
thread waits, so a signal (SIGINT, SIGTERM) is handled at once: DuckDB is
interrupted and the signal's exception goes on unwinding the caller.
"""

from __future__ import annotations

import difflib
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from combined.catalog import Member
from combined.errors import CombinedError, ConfigError
from combined.lake._layout import LakeLayout
from combined.lake._maintain import reading_version
from combined.lake._table import LakeTable
from combined.protocol.identity import quote_ident

if TYPE_CHECKING:
    import duckdb
    import pyarrow as pa


#: The schema holding each member's (empty) table of its version's columns.
_SHAPES = "_combined_shapes"


class QueryError(CombinedError):
    """DuckDB rejected the query."""


class FilesRemoved(QueryError):
    """A member of the basis reads files the lake no longer holds (a vacuum removed them).

    Its context names the member (``source``, ``dataset``, ``lake_version``);
    the engine says which retention removed them.
    """


#: Seconds a query may run before it is interrupted (``combined sql --timeout``).
DEFAULT_TIMEOUT_S = 600.0
#: DuckDB's memory limit for a query (``combined sql --memory-limit``).
DEFAULT_MEMORY_LIMIT = "2GB"


def run_query(
    layout: LakeLayout,
    members: Sequence[Member],
    query: str,
    publication: Any = None,
    *,
    timeout_s: float | None = DEFAULT_TIMEOUT_S,
    memory_limit: str = DEFAULT_MEMORY_LIMIT,
    unread: Sequence[QueryError] = (),
) -> pa.Table:
    """Expose each member as ``<source>.<dataset>`` and run ``query``, a single SELECT.

    ``publication`` (its ``id`` and ``published_at``) names the basis in errors.
    ``timeout_s`` (None or 0: none) bounds how long it runs, ``memory_limit``
    (DuckDB's form: ``2GB``, ``512MB``) how much memory it holds. ``unread``:
    why each dataset of the basis not in ``members`` is not read (its
    ``source`` and ``dataset`` in its context), said if the query names it.
    """
    from combined.connectors._subprocess._private import PrivateDir

    _check_read_only(query)
    spill = PrivateDir("combined-sql-")  # 0700, removed after; swept if this process is killed
    try:
        con = _connect(memory_limit, str(spill.path))
        try:
            exposed = _Exposed(gone=list(unread))
            return _run(con, layout, members, query, publication, timeout_s, memory_limit, exposed)
        finally:
            con.close()
    finally:
        spill.remove()


def _connect(memory_limit: str, spill: str) -> Any:
    """A DuckDB connection under ``memory_limit`` that spills to ``spill``."""
    import duckdb

    try:
        return duckdb.connect(config={"memory_limit": memory_limit, "temp_directory": spill})
    except duckdb.Error:
        raise ConfigError(
            f"the memory limit {memory_limit!r} is not a size DuckDB reads",
            hint="give a number and a unit, e.g. --memory-limit 2GB or 512MB",
        ) from None


@dataclass
class _Exposed:
    """What the members' exposure gave: the files DuckDB may open, and what went missing."""

    allowed: list[str] = field(default_factory=list)
    #: Each member read, with its version's files.
    read: list[tuple[Member, list[str]]] = field(default_factory=list)
    #: Members whose files were gone (told only if the query names them).
    gone: list[QueryError] = field(default_factory=list)
    #: The ``<source>.<dataset>__history`` tables exposed.
    histories: list[str] = field(default_factory=list)


def _run(
    con: Any,
    layout: LakeLayout,
    members: Sequence[Member],
    query: str,
    publication: Any,
    timeout_s: float | None,
    memory_limit: str,
    exposed: _Exposed,
) -> pa.Table:
    """Expose the members, lock DuckDB to their files, and run ``query``."""
    import duckdb

    con.execute(f"CREATE SCHEMA {_SHAPES}")
    for m in members:
        _expose(con, layout, m, exposed)
    _lock(con, exposed.allowed)
    try:
        return _interruptible(con, query, timeout_s)
    except duckdb.OutOfMemoryException:
        raise QueryError(
            f"the query needs more memory than its limit of {memory_limit}",
            hint="narrow the query (fewer columns or rows), or raise --memory-limit",
        ) from None
    except duckdb.CatalogException as exc:
        found = _absent(con, query, members, publication, exposed.gone, exposed.histories)
        raise found or QueryError(
            f"the query failed: {exc}",
            hint="tables are named <source>.<dataset>; list them with `combined status`",
        ) from exc
    except (duckdb.Error, OSError) as exc:
        hint = "tables are named <source>.<dataset>; list them with `combined status`"
        if isinstance(exc, duckdb.PermissionException):  # (a file, a setting: locked away)
            hint = (
                "a query reads the published tables only, named <source>.<dataset> (no "
                "file, setting or extension); list them with `combined status`"
            )
        raise _gone(layout, exposed.read) or QueryError(
            f"the query failed: {exc}", hint=hint
        ) from exc


def _expose(con: Any, layout: LakeLayout, m: Member, exposed: _Exposed) -> None:
    """Expose member ``m`` as the view ``<source>.<dataset>`` (and its history, if kept)."""
    import duckdb

    con.execute(f"CREATE SCHEMA IF NOT EXISTS {quote_ident(m.source)}")
    name = f"{quote_ident(m.source)}.{quote_ident(m.dataset)}"
    if m.lake_version is None:
        return
    table = layout.reading_table(m.source, m.dataset)
    # The same rows in fewer files, once a compaction followed the publication.
    version = reading_version(table, m.lake_version, reading=True)
    files, schema = _version_files(table, m, version)
    exposed.read.append((m, files))
    # The version's schema, not its files', is the member's shape: a
    # column the table evolved to is there before any file holds it.
    shape = name if not files else f"{_SHAPES}.{quote_ident(f'{m.source}.{m.dataset}')}"
    con.register("_empty", schema.empty_table())
    con.execute(f"CREATE TABLE {shape} AS SELECT * FROM _empty")
    con.unregister("_empty")
    if files:
        if layout.store.remote:
            try:
                scan = layout.store.arrow_source(
                    con, f"_lake_{m.source}.{m.dataset}", files, schema
                )
            except FileNotFoundError:
                raise _removed(m) from None
        else:
            exposed.allowed.extend(files)
            scan = layout.store.duck_source(con, files)
        try:
            con.execute(
                f"CREATE VIEW {name} AS SELECT * FROM {shape} UNION ALL BY NAME "
                f"SELECT * FROM {scan}"
            )
        except duckdb.IOException:
            # Said only if the query reads it: no view, a FilesRemoved when named.
            exposed.gone.append(_gone(layout, [(m, files)]) or _unreadable(m))
    history = _expose_history(con, layout, m)
    if history is not None:
        exposed.allowed.extend(history)
        exposed.histories.append(f"{m.source}.{m.dataset}__history")


def _lock(con: Any, allowed: list[str]) -> None:
    """From here DuckDB opens only ``allowed`` files, and a query cannot change that."""
    # Extensions included: none is installed or loaded on demand.
    con.execute("SET allowed_paths = ?", [allowed])
    con.execute("SET enable_external_access = false")
    con.execute("SET autoinstall_known_extensions = false")
    con.execute("SET autoload_known_extensions = false")
    con.execute("SET lock_configuration = true")


def _expose_history(con: Any, layout: LakeLayout, m: Member) -> list[str] | None:
    """Expose the member's history as ``<source>.<dataset>__history``, at its publication.

    The history version read is the one mirroring the member's lake version,
    so the history shows what the publication does and nothing later.
    Returns the files DuckDB may open for it (none from an object store),
    or None when the dataset keeps no history at that version.
    """
    import duckdb

    from combined.lake._history import SUFFIX, history_table, history_version

    assert m.lake_version is not None
    version = history_version(layout, m.source, m.dataset, m.lake_version)
    if version is None:
        return None
    table = history_table(layout, m.source, m.dataset)
    version = reading_version(table, version)  # past its compactions: the same versions
    files, schema = table.files(version), table.schema(version)
    assert schema is not None
    key = f"{m.source}.{m.dataset}{SUFFIX}"
    name = f"{quote_ident(m.source)}.{quote_ident(m.dataset + SUFFIX)}"
    shape = f"{_SHAPES}.{quote_ident(key)}"
    con.register("_empty", schema.empty_table())
    con.execute(f"CREATE TABLE {shape} AS SELECT * FROM _empty")
    con.unregister("_empty")
    if not files:
        con.execute(f"CREATE VIEW {name} AS SELECT * FROM {shape}")
        return []
    if layout.store.remote:
        scan = layout.store.arrow_source(con, f"_lake_{key}", files, schema)
    else:
        scan = layout.store.duck_source(con, files)
    try:
        con.execute(
            f"CREATE VIEW {name} AS SELECT * FROM {shape} UNION ALL BY NAME SELECT * FROM {scan}"
        )
    except duckdb.IOException:
        return None  # its files are gone (vacuumed): no history at this basis
    return [] if layout.store.remote else files


def _version_files(table: LakeTable, m: Member, version: int) -> tuple[list[str], pa.Schema]:
    """The data files and schema of a member's table version; FilesRemoved when it is gone."""
    try:
        files = table.files(version)
        schema = table.schema(version)
    except Exception:  # noqa: BLE001 - a version whose log the lake no longer holds
        if table.version() is None:
            raise
        raise _removed(m) from None
    if schema is None:  # no table there at all: the lake's directory was removed
        raise _removed(m, table.path)
    return files, schema


def _removed(m: Member, missing: str | None = None) -> FilesRemoved:
    """``m``'s files gone; ``missing``: its whole table, at that location."""
    return FilesRemoved(
        f"{m.source}.{m.dataset} at lake version {m.lake_version}: its files are no "
        "longer in the lake",
        source=m.source,
        dataset=m.dataset,
        lake_version=m.lake_version,
        **({"missing": missing} if missing else {}),
    )


def _gone(layout: LakeLayout, read: list[tuple[Member, list[str]]]) -> FilesRemoved | None:
    """The first member whose files are not all in the lake any more, said as such."""
    for m, files in read:
        if not all(layout.store.exists(f) for f in files):
            return _removed(m)
    return None


def _unreadable(m: Member) -> QueryError:
    return QueryError(
        f"the files of {m.source}.{m.dataset} at lake version {m.lake_version} cannot be read",
        hint="check the lake's storage; `combined repair` reconciles the catalog with it",
        source=m.source,
        dataset=m.dataset,
    )


def _interruptible(con: Any, query: str, timeout_s: float | None) -> pa.Table:
    """``query``'s result, run in a thread that a timeout or a signal interrupts.

    This thread only waits, so Python runs signal handlers in it at once; an
    exception they raise (KeyboardInterrupt, SIGTERM's) interrupts DuckDB,
    waits for it to stop, and goes on.
    """
    outcome: list[Any] = []
    # An Event, not Thread.join: a signal raised inside join() marks the
    # thread stopped while it still runs (bpo-45274), and DuckDB would go on.
    done = threading.Event()

    def work() -> None:
        try:
            outcome.append(con.sql(query).to_arrow_table())
        except BaseException as exc:  # handed to the waiting thread
            outcome.append(exc)
        finally:
            done.set()

    deadline = time.monotonic() + timeout_s if timeout_s else None
    threading.Thread(target=work, name="combined-sql", daemon=True).start()
    try:
        while not done.wait(0.1):
            if deadline is not None and time.monotonic() > deadline:
                con.interrupt()
                done.wait()
                raise QueryError(
                    f"the query ran longer than its timeout of {timeout_s:g} s and was stopped",
                    hint="narrow the query, or give a longer --timeout (0: no limit)",
                )
    except BaseException:
        if not done.is_set():
            con.interrupt()
            done.wait()
        raise
    (result,) = outcome
    if isinstance(result, BaseException):
        raise result
    return result


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


def _absent(
    con: duckdb.DuckDBPyConnection,
    query: str,
    members: Sequence[Member],
    publication: Any,
    gone: Sequence[QueryError] = (),
    histories: Sequence[str] = (),
) -> QueryError | None:
    """A ``<source>.<dataset>`` the query names that the basis does not hold, said as such.

    DuckDB would suggest an unrelated system table ("Did you mean
    information_schema.schemata"): a dataset first published after the
    basis (an ``--as-of`` before it existed) is simply not in it.
    """
    try:
        names = con.get_table_names(query, qualified=True)
    except Exception:  # noqa: BLE001 - the query's own error stands
        return None
    held = {f"{m.source}.{m.dataset}" for m in members if m.lake_version is not None}
    held.update(histories)
    unreadable = {f"{e.context['source']}.{e.context['dataset']}": e for e in gone}
    for raw in sorted(names):
        name = raw.split(" AS ")[0].replace('"', "")
        if name in unreadable:
            return unreadable[name]
        if name.endswith("__history") and name.removesuffix("__history") in held:
            return QueryError(
                f"{name.removesuffix('__history')} keeps no history at the published basis "
                "read: `history: true` was not set for it when that publication was made",
                hint="set `history: true` on the dataset and capture it (docs/history.md); "
                "its history is then backfilled from the raw layer",
                dataset=name,
            )
        if "." in name and name not in held:
            when = (
                ""
                if publication is None
                else f" ({publication.id}, published {publication.published_at.isoformat()})"
            )
            return QueryError(
                f"{name} is not in the published basis read{when}: it had no publication "
                "at that time (or is no dataset)",
                hint=_did_you_mean(name, held)
                + "query a later instant or publication (`combined publications` lists "
                "them; `combined history SOURCE.DATASET` shows when a dataset was published)",
                dataset=name,
            )
    return None


def _did_you_mean(name: str, held: set[str]) -> str:
    """``"did you mean shop.orders? or "`` for a name one typo from a held dataset, else ``""``."""
    close = difflib.get_close_matches(name, sorted(held), n=1, cutoff=0.8)
    return f"did you mean {close[0]}? or " if close else ""
