"""A change stream's fills, held in a Parquet file of small row groups rather than in a table.

A change stream's filled values are held apart, and each window of staged
rows meets the fills of its ordinals (``ord BETWEEN``). DuckDB reads a
table a vector (2,048 rows) at a time, and where a row of a vector passes
the filter it reads every list of the vector whole, elements and all (a
string or a blob is fetched row by row). So 2,000 filled lists of 300 kB,
the fills of 75 windows, were read whole by each window's join (600 MB),
and the capture failed for memory at any ``reduction_memory`` under that.
A table's values also live in the database's buffer pool, which keeps them
up to DuckDB's limit while the windows read them: 40 byte strings of 5-10 MB
left alone by a backlog kept ~100 MB there through every Delivery (the
process peaked at 491-514 MB, and at 435-445 MB with the fills in a file).

Fills are therefore written as they are made (never read back whole) to a
Parquet file whose row groups hold a few MB, and read through a view: a
window's scan reads every row group's ordinals, and the values of the row
groups holding its own. A type Parquet would change keeps its fills in a
table.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from combined.capture._databases import lit
from combined.protocol.identity import quote_ident

if TYPE_CHECKING:
    import duckdb

#: Rows a row group of the fills' file holds at most, and its bytes (about).
_GROUP_ROWS = 2048
_GROUP_BYTES = "2MB"


#: DuckDB types Parquet does not hold exactly (a HUGEINT is written as a DOUBLE, an
#: INTERVAL to the millisecond), or not at all (a STRUCT without fields, a VARIANT
#: inside a STRUCT or a list).
_NOT_IN_PARQUET = re.compile(r"HUGEINT|TIME WITH TIME ZONE|INTERVAL|STRUCT(?!\()|VARIANT")


def in_file(types: Sequence[str]) -> bool:
    """Whether fills of these DuckDB types are held in a file: Parquet holds every one exactly."""
    return not any(_NOT_IN_PARQUET.search(t) for t in types)


def fills_file(spill: Path, name: str) -> Path:
    """The Parquet file the fills of ``name`` are written to (in the spill directory)."""
    return spill / f"{name}.parquet"


def write_fills(
    con: duckdb.DuckDBPyConnection, name: str, select: str, path: Path, types: Mapping[str, str]
) -> None:
    """Write ``select``'s rows to ``path``; ``name``: a view of them, each column of ``types``.

    Executed on one thread, as the fills of a table are. A column reads
    back cast to its type in ``types`` (a ``TIMESTAMP_S`` is written as
    microseconds: the same instants).
    """
    file = lit(str(path))
    with single_thread(con):
        con.execute(
            f"COPY ({select}) TO {file} (FORMAT parquet, COMPRESSION uncompressed, "
            f"ROW_GROUP_SIZE {_GROUP_ROWS}, ROW_GROUP_SIZE_BYTES '{_GROUP_BYTES}')"
        )
    columns = ", ".join(
        f"CAST({quote_ident(c)} AS {t}) AS {quote_ident(c)}" for c, t in types.items()
    )
    con.execute(f"CREATE VIEW {name} AS SELECT {columns} FROM read_parquet({file})")


@contextmanager
def single_thread(con: duckdb.DuckDBPyConnection) -> Iterator[None]:
    """The connection on one thread meanwhile, then on as many as before."""
    (threads,) = con.execute("SELECT current_setting('threads')").fetchall()[0]
    con.execute("SET threads = 1")
    try:
        yield
    finally:
        con.execute(f"SET threads = {int(threads)}")


def one_thread(con: duckdb.DuckDBPyConnection, statement: str) -> None:
    """Execute ``statement`` on one thread, then restore the connection's threads.

    One thread: a lake file's row group of large values is read whole, and
    two of them at once did not fit a small reduction's memory.
    """
    with single_thread(con):
        con.execute(statement)
