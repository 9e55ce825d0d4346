"""The reductions' DuckDB databases: a new one for each, or a small one's kept for the next.

Opening a DuckDB database costs ~15 ms of CPU, more than the whole
reduction of a small table: a capture of 200 small tables spent 3.5 of its
~17 CPU-s on the main thread opening them. A reduction of a small capture
(:data:`KEEP_STAGED_BYTES`) of a local lake hands its database back when it
closes: every table and view it made is dropped, and the next reduction
takes it with its own memory limit and spill directory. DuckDB moves a
database's spill directory only while nothing was ever spilled there: a
database that spilled is closed instead. One database is kept at most.
The SQL literals every reduction module writes (a value, a list of files)
are made here too.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import duckdb

#: Staged bytes up to which a reduction's database is kept for the next reduction.
KEEP_STAGED_BYTES = 16 * 2**20


class KeptDatabase:
    """One DuckDB database a process keeps for its next user (none after a fork).

    Opening one costs ~15 ms of CPU: the reductions keep one here (below),
    the stagers another (``runtime/_stage``).
    """

    def __init__(self) -> None:
        self._held: tuple[int, duckdb.DuckDBPyConnection] | None = None
        self._lock = threading.Lock()

    @property
    def held(self) -> duckdb.DuckDBPyConnection | None:
        """The database kept (None: none)."""
        held = self._held
        return None if held is None else held[1]

    def take(self) -> duckdb.DuckDBPyConnection | None:
        """The database kept, no longer kept; None when none was (or another process's)."""
        with self._lock:
            held, self._held = self._held, None
        return held[1] if held is not None and held[0] == os.getpid() else None

    def give(self, database: duckdb.DuckDBPyConnection) -> bool:
        """Keep ``database`` unless one is kept already; whether it was."""
        with self._lock:
            if self._held is not None:
                return False
            self._held = (os.getpid(), database)
            return True


#: The reductions' kept database.
_KEPT = KeptDatabase()


def lit(value: str | None) -> str:
    """``value`` as a SQL string literal (NULL for None)."""
    if value is None:
        return "NULL"
    return "'" + value.replace("'", "''") + "'"


def files_sql(paths: Sequence[object]) -> str:
    """A SQL list of the file paths ``paths``."""
    return "[" + ", ".join(lit(str(p)) for p in paths) + "]"


def open_database(memory_mb: int, spill_dir: Path) -> duckdb.DuckDBPyConnection:
    """A database holding nothing, in memory, spilling to ``spill_dir`` past ``memory_mb``."""
    import duckdb

    kept = _KEPT.take()
    if kept is not None:
        try:
            _set(kept, memory_mb, spill_dir)
            return kept
        except duckdb.Error:
            kept.close()  # (it spilled: its spill directory cannot move)
    return duckdb.connect(
        ":memory:",
        config={
            "memory_limit": f"{memory_mb}MB",
            "temp_directory": str(spill_dir),
            "threads": 2,
            "preserve_insertion_order": False,
            # Every join here builds its hash table on the side written on
            # its right, chosen for its size: DuckDB knows no row count for
            # the staged parts' stream (it takes it for one row), and would
            # build on the whole capture instead.
            "disabled_optimizers": "build_side_probe_side",
            "allocator_flush_threshold": "32MB",
        },
    )


def _set(database: duckdb.DuckDBPyConnection, memory_mb: int, spill_dir: Path) -> None:
    """The settings :func:`open_database` opens with (a reduction may have changed two)."""
    database.execute(f"SET temp_directory = {lit(str(spill_dir))}")
    database.execute(f"SET memory_limit = '{memory_mb}MB'")
    database.execute("SET threads = 2")


def spill_directory(con: duckdb.DuckDBPyConnection) -> Path | None:
    """Where the reduction's database spills (created now), or None if it does not."""
    (directory,) = con.execute("SELECT current_setting('temp_directory')").fetchall()[0]
    if not directory:
        return None
    Path(directory).mkdir(parents=True, exist_ok=True)
    return Path(directory)


def close_database(database: duckdb.DuckDBPyConnection, keep: bool) -> None:
    """Close ``database``, or with ``keep`` empty it for the next reduction.

    Kept only when it spilled nothing: the next one could not move its spill
    directory, and the files would stay.
    """
    import duckdb

    if keep:
        try:
            _empty(database)
            # DuckDB refuses to set a spill directory again, even the same one,
            # once it was used: what it spilled there is kept with it.
            (spill,) = database.execute("SELECT current_setting('temp_directory')").fetchall()[0]
            _set(database, 64, Path(spill))
        except duckdb.Error:
            keep = False
    if keep and _KEPT.give(database):
        return
    database.close()


#: What a reduction makes: its views, then its tables (a view may read a table).
_MADE = (
    (
        "VIEW",
        "SELECT schema_name, view_name FROM duckdb_views() "
        "WHERE NOT internal AND database_name = 'memory'",
    ),
    ("TABLE", "SELECT schema_name, table_name FROM duckdb_tables() WHERE database_name = 'memory'"),
)


def _empty(database: duckdb.DuckDBPyConnection) -> None:
    """Drop every view, then every table, the reduction made."""
    from combined.protocol.identity import quote_ident

    for kind, listing in _MADE:
        for schema, name in database.execute(listing).fetchall():
            database.execute(f"DROP {kind} IF EXISTS {quote_ident(schema)}.{quote_ident(name)}")
