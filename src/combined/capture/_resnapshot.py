"""An event stream's new snapshot, against each id's newest event: only what differs.

A ``sync_mode: append`` dataset keeps the events of its rows, not its rows.
Its first snapshot appends each row as a ``snapshot`` event; a new one
(``combined cdc teardown``, then ``combined cdc setup``) reads the whole table
again after a gap no stream carries. Appending it whole, every row again as an
``insert``, counted each row once more a snapshot. It is compared instead with
each id's newest event (docs/cdc.md, "A new snapshot of an event stream"):

- an id no event holds, or whose newest event is a delete (or older than the
  newest truncate): an ``insert`` event;
- an id whose newest event holds other values (payload hashes): an ``update``;
- an id whose newest event holds the snapshot's values: nothing (``same``);
- an id whose newest event (not a delete) the snapshot lacks: a ``delete``
  event, holding the key as that event held it (the row was deleted in the
  gap).

Only ids, hashes, ops, ranks and the key's values are kept: the lake's events
(scanned once) are written to a file per bucket of their id (a partitioned
write spills), each bucket ranked in a pass of its own sized by DuckDB's
memory (a window holds its rows: one over 500k events peaked ~130 MB over the
rest, and a sort of 2M events by bucket ran out of 64 MB), into a table of
each id's newest event, joined with the snapshot's ``keys``.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from combined.capture._databases import files_sql, lit, spill_directory
from combined.capture._lake_fills import (
    EventLake,
    lake_events,
    lake_numbers_rows,
    register_sequences,
)
from combined.protocol import _provenance as prov
from combined.protocol.identity import quote_ident

if TYPE_CHECKING:
    import duckdb

#: The table of the lake's events whose ids a new snapshot lacks: their keys
#: (``_kid`` and the key's columns), which the delete events take.
GONE = "gone"
#: DuckDB memory a pass gives each event it ranks (id, hash, key, op and
#: rank, whose file name is a path): a window holds its rows, and at 64 MB
#: (the default's share) one of 100k events ran out of it where 50k did not;
#: a pass of ~32k events leaves room for the tables it spills beside.
EVENT_BYTES = 2048


def against_events(
    con: duckdb.DuckDBPyConnection,
    lake: EventLake,
    keys: str,
    key: Sequence[str],
    sql_type: str,
    memory: int,
) -> None:
    """Create the transition ``tr`` of a new snapshot (``keys``: its (ord, _cid, _chash))
    against each id's newest event in ``lake``, and table ``gone``; ``memory``:
    DuckDB's, in bytes."""
    _newest(con, lake, key, memory)
    con.execute(
        "CREATE TABLE tr AS SELECT k._cid AS id, CASE WHEN e._kid IS NULL THEN 'insert' "
        "WHEN e._khash IS NOT DISTINCT FROM k._chash THEN 'same' ELSE 'update' END AS op, "
        f"k._chash AS new_hash, NULL::{sql_type} AS old_hash, k.ord "
        f"FROM {keys} k LEFT JOIN live e ON e._kid = k._cid"
    )
    kept = ", ".join(f"e.{quote_ident(c)}" for c in key)
    con.execute(
        f"CREATE TABLE {GONE} AS SELECT e._kid, {kept} FROM live e "
        f"ANTI JOIN {keys} k ON k._cid = e._kid"
    )
    con.execute(
        f"INSERT INTO tr SELECT _kid, 'delete', NULL, NULL, NULL FROM {GONE}; DROP TABLE live"
    )


def _newest(
    con: duckdb.DuckDBPyConnection, lake: EventLake, key: Sequence[str], memory: int
) -> None:
    """Table ``live``: each id's newest event that is not a delete, nor older than
    the newest truncate (which emptied the table), with its hash and key."""
    held = f"SELECT DISTINCT name FROM parquet_schema({files_sql(lake.files)})"
    columns = [name for (name,) in con.execute(held).fetchall()]
    numbered = lake_numbers_rows(columns)
    sequenced = prov.DELIVERY_ID in columns
    if sequenced:
        register_sequences(con, lake.sequences)
    keep = [f"{prov.ID} AS _kid", f"{prov.PAYLOAD_HASH} AS _khash"]
    keep += [quote_ident(c) for c in key]
    count = f"SELECT sum(num_rows) FROM parquet_file_metadata({files_sql(lake.files)})"
    (rows,) = con.execute(count).fetchall()[0]
    passes = max(1, -(-int(rows or 0) * EVENT_BYTES // memory))
    spill = spill_directory(con)  # (the run's staging; else a directory of its own)
    parts = spill / "resnapshot" if spill else Path(tempfile.mkdtemp(prefix="combined-"))
    shutil.rmtree(parts, ignore_errors=True)
    try:
        _rank_in_passes(con, lake, keep, numbered, sequenced, passes, parts)
    finally:
        shutil.rmtree(parts, ignore_errors=True)


def _rank_in_passes(
    con: duckdb.DuckDBPyConnection,
    lake: EventLake,
    keep: Sequence[str],
    numbered: bool,
    sequenced: bool,
    passes: int,
    parts: Path,
) -> None:
    """Table ``live`` (:func:`_newest`): the lake's events written once, each to
    the file of its bucket of ids under ``parts`` (a partitioned write spills),
    then each bucket ranked in a pass of its own."""
    events = lake_events(lake.files, keep, numbered=numbered, sequenced=sequenced)
    con.execute(
        f"COPY (SELECT *, hash(_kid) % {passes} AS _b FROM ({events})) TO {lit(str(parts))} "
        "(FORMAT parquet, PARTITION_BY (_b))"
    )
    every = lit(str(parts / "*" / "*.parquet"))
    cut = (
        f"max(_rank) FROM read_parquet({every}, hive_partitioning = false) WHERE _kop = 'truncate'"
    )
    alive = ""
    if parts.exists() and con.execute(f"SELECT 1, {cut} HAVING count(*) > 0").fetchall():
        con.execute(f"CREATE TABLE cut AS SELECT {cut.replace(' FROM', ' AS r FROM', 1)}")
        alive = " AND _rank > (SELECT r FROM cut)"  # (ranked newer than the newest truncate)
    con.execute(f"CREATE TABLE live AS SELECT * EXCLUDE (_kop, _rank) FROM ({events}) LIMIT 0")
    for n in range(passes):
        bucket = parts / f"_b={n}"
        if bucket.exists():  # (a bucket no id fell in has no file)
            con.execute(
                "INSERT INTO live SELECT * EXCLUDE (_kop, _rank) FROM (SELECT * FROM "
                f"read_parquet({lit(str(bucket / '*.parquet'))}, hive_partitioning = false) "
                "WHERE _kop IS DISTINCT FROM 'truncate' QUALIFY row_number() OVER "
                f"(PARTITION BY _kid ORDER BY _rank DESC) = 1) WHERE _kop <> 'delete'{alive}"
            )
    con.execute("DROP TABLE IF EXISTS cut")
