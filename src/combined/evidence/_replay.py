"""``combined replay``: rebuild a projection from the raw layer alone, and compare.

The raw layer holds every committed Delivery; each lake commit's metadata
lists the Deliveries it committed and the dataset's sync mode says how they
shape the projection. Replaying needs neither the source nor the table: it
is independent evidence that the projection is what the Deliveries say.

- ``incremental``: per identity, its last row in commit order (lake
  version, Delivery sequence, row); a delete, or a truncate after it, leaves
  the identity out.
- ``append``: every row of every Delivery, as delivered.
- ``full_refresh``: the rows of the newest commit that delivered a
  replacement (an emptied source delivers an empty one).

A soft delete (a row its dataset's flag marks deleted) is in the raw layer
as the row read, with the operation ``delete`` the capture gave it: the
replay applies the same rule by reading that operation, so a flag declared
later never rewrites what earlier commits projected.

The comparison is row by row on (identity, payload hash): rows only in the
replay, only in the projection, or with another payload.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from combined._pyrows import python_rows
from combined.errors import ConfigError, LakeError, NotFoundError
from combined.evidence._explain import _Commit, _commits, _raw_files
from combined.protocol import _provenance as prov

if TYPE_CHECKING:
    import duckdb

    from combined.engine import Engine
    from combined.lake._layout import LakeLayout

#: Differences listed in full; the counts cover every one.
SHOWN = 20


@dataclass(frozen=True)
class Replay:
    """What a replay rebuilt, and how it compares with the projection."""

    dataset: str
    sync_mode: str
    lake_version: int
    commits: int
    deliveries: int
    replayed_rows: int
    projection_rows: int
    only_in_replay: int
    only_in_projection: int
    other_payload: int
    differences: list[dict[str, Any]] = field(default_factory=list)
    into: str | None = None
    foreign_versions: list[int] = field(default_factory=list)  # commits not made by Combined
    #: The lake version that now holds the replay (``--replace``), None when none was written.
    replaced_version: int | None = None

    @property
    def equal(self) -> bool:
        """Whether the replay and the projection hold the same rows."""
        return not (self.only_in_replay or self.only_in_projection or self.other_payload)

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dictionary, ``equal`` included."""
        from dataclasses import asdict

        from combined.api._json import jsonable

        return {**dict(jsonable(asdict(self))), "equal": self.equal}


# -- which commits --------------------------------------------------------------------------


def _upto(commits: Sequence[_Commit], to_version: str | None) -> tuple[list[_Commit], int]:
    """The commits up to ``to_version`` (a lake version, or a dataset version id or prefix)."""
    if not commits:
        raise NotFoundError(
            "the dataset has no commit in the lake to replay",
            hint="capture it first: `combined capture SOURCE.DATASET`",
        )
    if to_version is None:
        return list(commits), commits[-1].lake_version
    if to_version.isdigit():
        target = int(to_version)
        known = {c.lake_version for c in commits}
        if target not in known:
            raise ConfigError(
                f"lake version {target} is not a commit of this dataset",
                hint=f"its commits: lake versions {', '.join(str(v) for v in sorted(known))}",
            )
    else:
        found = [
            c
            for c in commits
            if str((c.meta.get("version") or {}).get("id", "")).startswith(to_version)
        ]
        if not found:
            raise ConfigError(
                f"no dataset version starts with {to_version!r}",
                hint="give a lake version, or a dataset version id from `combined history`",
            )
        target = found[0].lake_version
    return [c for c in commits if c.lake_version <= target], target


# -- the replay -----------------------------------------------------------------------------


def _connect(layout: LakeLayout, spill: Path) -> duckdb.DuckDBPyConnection:
    import duckdb

    con = duckdb.connect()
    con.execute("SET memory_limit = '1GB'")
    con.execute("SET temp_directory = ?", [str(spill)])
    con.execute("SET preserve_insertion_order = false")
    layout.store.attach(con)
    return con


def _order_table(
    con: duckdb.DuckDBPyConnection, files: dict[str, tuple[_Commit, dict[str, Any]]]
) -> None:
    """Each raw file's place in commit order, to join onto its rows."""
    import pyarrow as pa

    names = list(files)
    con.register(
        "_files",
        pa.table(
            {
                "filename": names,
                "lake_version": [files[n][0].lake_version for n in names],
                "sequence": [int(files[n][1]["sequence"]) for n in names],
            }
        ),
    )


def _rows_sql(scan: str) -> str:
    """Every raw row with its place: (lake version, Delivery sequence, row)."""
    return (
        f"SELECT r.* EXCLUDE (filename, file_row_number), f.lake_version AS _lv, "
        f"f.sequence AS _seq, r.file_row_number AS _row "
        f"FROM {scan} r JOIN _files f USING (filename)"
    )


def _replay_sql(sync_mode: str, scan: str, commits: Sequence[_Commit]) -> str:
    """The replayed projection of ``sync_mode`` (with its three ordering columns)."""
    rows = _rows_sql(scan)
    if sync_mode == "append":
        return rows
    if sync_mode == "full_refresh":
        replacements = [c.lake_version for c in commits if c.meta.get("deliveries")]
        last = replacements[-1] if replacements else -1
        return f"SELECT * FROM ({rows}) WHERE _lv = {last} AND {prov.OP} <> 'delete'"
    ordered = "(_lv, _seq, _row)"
    return (
        f"WITH r AS ({rows}), "
        f"cut AS (SELECT max({ordered}) AS at FROM r WHERE {prov.OP} = 'truncate'), "
        f"latest AS (SELECT r.*, row_number() OVER (PARTITION BY {prov.ID} "
        f"ORDER BY _lv DESC, _seq DESC, _row DESC) AS _n FROM r, cut "
        f"WHERE cut.at IS NULL OR {ordered} > cut.at) "
        f"SELECT * EXCLUDE (_n) FROM latest WHERE _n = 1 "
        f"AND {prov.OP} NOT IN ('delete', 'truncate')"
    )


def _projection_sql(
    engine: Engine, con: duckdb.DuckDBPyConnection, source: str, dataset: str, version: int
) -> str:
    """The dataset's Delta table at lake version ``version``, as a FROM item."""
    layout = engine.layout
    table = layout.dataset_table(source, dataset)
    schema = table.schema(version)
    assert schema is not None
    files = table.files(version)
    if not files:
        con.register("_projection", schema.empty_table())
        return "_projection"
    if layout.store.remote:
        return layout.store.arrow_source(con, "_projection", files, schema)
    return layout.store.duck_source(con, files)


# -- the comparison -------------------------------------------------------------------------


def _counts(con: duckdb.DuckDBPyConnection) -> tuple[int, int]:
    (replayed,) = con.execute("SELECT count(*) FROM _replay").fetchall()[0]
    (projected,) = con.execute("SELECT count(*) FROM _current").fetchall()[0]
    return int(replayed), int(projected)


def _differences(con: duckdb.DuckDBPyConnection) -> tuple[dict[str, int], list[dict[str, Any]]]:
    """Counts by kind of difference, and the first :data:`SHOWN` of them."""
    ident, payload = prov.ID, prov.PAYLOAD_HASH
    con.execute(
        "CREATE TEMP TABLE _diff AS "
        f"WITH r AS (SELECT {ident} AS id, {payload} AS h, count(*) AS n "
        "FROM _replay GROUP BY ALL), "
        f"p AS (SELECT {ident} AS id, {payload} AS h, count(*) AS n "
        "FROM _current GROUP BY ALL) "
        "SELECT coalesce(r.id, p.id) AS id, r.h AS replay_hash, p.h AS projection_hash, "
        "coalesce(r.n, 0) AS replay_rows, coalesce(p.n, 0) AS projection_rows "
        "FROM r FULL OUTER JOIN p ON r.id = p.id AND r.h IS NOT DISTINCT FROM p.h "
        "WHERE r.n IS DISTINCT FROM p.n"
    )
    # One identity with a row on each side under other hashes is one changed payload.
    con.execute(
        "CREATE TEMP TABLE _kinds AS SELECT id, CASE "
        "WHEN bool_or(replay_rows > projection_rows) AND bool_or(projection_rows > replay_rows) "
        "THEN 'other_payload' WHEN bool_or(replay_rows > projection_rows) THEN 'only_in_replay' "
        "ELSE 'only_in_projection' END AS kind, "
        "max(replay_hash) AS replay_hash, max(projection_hash) AS projection_hash "
        "FROM _diff GROUP BY id"
    )
    counts = dict(con.execute("SELECT kind, count(*) FROM _kinds GROUP BY kind").fetchall())
    shown = con.sql(f"SELECT * FROM _kinds ORDER BY kind, id LIMIT {SHOWN}").to_arrow_table()
    return {str(k): int(v) for k, v in counts.items()}, python_rows(shown)


def _write_into(con: duckdb.DuckDBPyConnection, into: str, own: str) -> str:
    """The replayed rows as a new Delta table at ``into`` (which must not hold one).

    ``own`` is the dataset's table: never written here (``--replace`` does).
    """
    from deltalake import DeltaTable, write_deltalake

    from combined.lake._store import LakeStore
    from combined.lake._table import post_commit

    store = LakeStore.at(into if "://" in into else Path(into).resolve())
    target = str(store.root)
    if target == own or ("://" not in own and target == str(Path(own).resolve())):
        raise ConfigError(
            f"{into} is the dataset's own table: --into writes only a new table",
            hint="give --replace instead, to write the replay as a new version of the table",
        )
    if DeltaTable.is_deltatable(target, storage_options=store.storage_options()):
        raise ConfigError(
            f"{into} already holds a Delta table: replay writes only a new one",
            hint="give another --into, or remove that table first",
        )
    reader = con.sql("SELECT * EXCLUDE (_lv, _seq, _row) FROM _replay").to_arrow_reader(65_536)
    write_deltalake(
        target,
        reader,
        storage_options=store.storage_options(),
        post_commithook_properties=post_commit(),
    )
    return target


def replay(
    engine: Engine,
    name: str,
    *,
    to_version: str | None = None,
    into: str | None = None,
    replace: bool = False,
    compared: Callable[[Replay], None] | None = None,
) -> Replay:
    """Rebuild ``SOURCE.DATASET``'s projection from its raw Deliveries and compare it.

    ``replace`` then writes the replay as a new version of the dataset's own
    table (:func:`_replace`), once ``compared`` was told the comparison.
    """
    from combined.evidence._explain import _scan, split_name

    if replace and (into is not None or to_version is not None):
        raise _replace_takes_neither()
    source, dataset = split_name(name)
    sync_mode = engine.project.dataset(source, dataset).sync_mode
    layout = engine.layout
    commits, version = _upto(_commits(layout, source, dataset), to_version)
    table = layout.dataset_table(source, dataset)
    if to_version is None:
        version = table.version() or version  # the table as readers see it now
    foreign = [v for v in table.foreign_versions(None) if v <= version]
    files, expired = _raw_files(layout, source, dataset, commits)
    if expired:
        raise LakeError(
            f"{name}: {expired} of its committed Deliveries left the raw layer under its "
            "retention.raw (`combined activity` lists each maintenance.raw_removed): a replay "
            "rebuilds the table from every Delivery, and cannot without them",
            hint="a replay needs the raw layer from the dataset's first Delivery on: keep it "
            "with a longer retention.raw; `combined explain` still shows what remains",
        )
    spill = layout.staging_area() / f"replay-{uuid.uuid4().hex[:12]}"
    spill.mkdir(parents=True, mode=0o700)
    con = _connect(layout, spill)
    try:
        replay_sql = None
        if files:
            _order_table(con, files)
            replay_sql = _replay_sql(sync_mode, _scan(list(files)), commits)
        _load(con, replay_sql, _projection_sql(engine, con, source, dataset, version))
        done = _compare(con, name, sync_mode, version, len(commits), len(files))
        target = _write_into(con, into, layout.table(source, dataset)) if into else None
        done = dataclasses.replace(done, into=target, foreign_versions=foreign)
        if compared is not None:
            compared(done)
        if replace and not done.equal:
            done = dataclasses.replace(
                done, replaced_version=_replace(engine, con, source, dataset, done)
            )
    except OSError as exc:
        raise LakeError(f"the replay of {name} could not read or write: {exc}") from exc
    finally:
        con.close()
        shutil.rmtree(spill, ignore_errors=True)
    return done


def _replace_takes_neither() -> ConfigError:
    """``--replace`` with ``--into`` or ``--to-version``: refused."""
    return ConfigError(
        "--replace writes the replay of every commit as the table's newest version: "
        "it takes neither --into nor --to-version",
        hint="drop --into or --to-version (replay --to-version V --into PATH "
        "writes an older state to a table of its own)",
    )


def _load(con: duckdb.DuckDBPyConnection, replay_sql: str | None, current: str) -> None:
    """The replayed rows as ``_replay`` (none without raw files), the projection as ``_current``."""
    query = replay_sql or (
        f"SELECT NULL::VARCHAR AS {prov.ID}, NULL::VARCHAR AS {prov.PAYLOAD_HASH} LIMIT 0"
    )
    con.execute(f"CREATE TEMP TABLE _replay AS {query}")
    con.execute(
        f"CREATE TEMP TABLE _current AS SELECT {prov.ID}, {prov.PAYLOAD_HASH} FROM {current}"
    )


def _compare(
    con: duckdb.DuckDBPyConnection,
    name: str,
    sync_mode: str,
    version: int,
    commits: int,
    deliveries: int,
) -> Replay:
    """Compare ``_replay`` with ``_current``: the counts and the differences shown."""
    replayed, projected = _counts(con)
    counts, shown = _differences(con)
    return Replay(
        dataset=name,
        sync_mode=sync_mode,
        lake_version=version,
        commits=commits,
        deliveries=deliveries,
        replayed_rows=replayed,
        projection_rows=projected,
        only_in_replay=counts.get("only_in_replay", 0),
        only_in_projection=counts.get("only_in_projection", 0),
        other_payload=counts.get("other_payload", 0),
        differences=shown,
    )


# -- the replacement ------------------------------------------------------------------------


def _replace(
    engine: Engine, con: duckdb.DuckDBPyConnection, source: str, dataset: str, done: Replay
) -> int:
    """Write the replay as the dataset's newest table version; returns that version.

    Under the dataset's lease (no capture commits meanwhile), and only onto
    the version the replay was compared with. The commit carries the
    replacement's evidence, no checkpoint and no Delivery: the dataset's
    checkpoint stays its last capture's, and publications keep the versions
    they pinned. Recorded in Activity as ``dataset.replaced``.
    """
    from datetime import timedelta

    from combined.catalog import data as cat

    holder = f"replay-{uuid.uuid4().hex[:12]}"
    if not engine.catalog.acquire_lease(source, dataset, holder, timedelta(minutes=10)):
        raise LakeError(
            f"{done.dataset} is being captured (run {engine.catalog.lease_holder(source, dataset)})"
            ": its table was not replaced",
            hint="run `combined replay --replace` again once that run has ended",
        )
    try:
        table = engine.layout.dataset_table(source, dataset)
        dt = table.delta()
        if int(dt.version()) != done.lake_version:
            raise LakeError(
                f"{done.dataset} moved to lake version {dt.version()} after the replay compared "
                f"it at {done.lake_version}: its table was not replaced",
                hint="run `combined replay --replace` again",
            )
        evidence = _evidence(done)
        _overwrite(con, dt, evidence)
        version = int(table.version() or 0)
        with engine.catalog.begin() as conn:
            cat.emit(
                conn,
                "dataset.replaced",
                source=source,
                dataset=dataset,
                lake_version=version,
                **evidence,
            )
        return version
    finally:
        engine.catalog.release_lease(source, dataset, holder)


def _evidence(done: Replay) -> dict[str, Any]:
    """What the replacement's commit and its Activity event record of the replay."""
    return {
        "replaced_version": done.lake_version,
        "replayed_rows": done.replayed_rows,
        "only_in_replay": done.only_in_replay,
        "only_in_projection": done.only_in_projection,
        "other_payload": done.other_payload,
        "commits": done.commits,
        "deliveries": done.deliveries,
    }


def _overwrite(con: duckdb.DuckDBPyConnection, dt: Any, evidence: dict[str, Any]) -> None:
    """Overwrite table ``dt`` with ``_replay``'s rows in its schema, ``evidence`` committed."""
    import pyarrow as pa
    from deltalake import CommitProperties, write_deltalake

    from combined.lake import METADATA_KEY, to_lake
    from combined.lake._table import REPLACED, post_commit

    schema = pa.schema(dt.schema().to_arrow())
    rows = con.sql("SELECT * EXCLUDE (_lv, _seq, _row) FROM _replay").to_arrow_reader(65_536)
    write_deltalake(
        dt,
        pa.RecordBatchReader.from_batches(schema, (to_lake(b, schema) for b in rows)),
        mode="overwrite",
        commit_properties=CommitProperties(
            custom_metadata={METADATA_KEY: json.dumps({REPLACED: evidence})}
        ),
        post_commithook_properties=post_commit(),
    )
