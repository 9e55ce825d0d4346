"""``combined explain``: every version of one row, read from the raw layer.

The lake's commit metadata lists, for each Delta version of a dataset, the
Deliveries it committed, the Run and admission, the source position and the
extraction receipt. The Deliveries themselves (the raw layer) hold each
version of each row with its operation and provenance columns. Explaining a
row (found by its key, or by its identity ``_combined_id``: the only way to
find a row of a table without a key) reads those two, then the catalog's
publications (when each version became visible) and the newest publication's
projection (is the row there now), and, for a row that is not, why: deleted,
truncated, quarantined, not yet published, or never captured.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime
from typing import TYPE_CHECKING, Any

from combined._pyrows import python_rows
from combined.errors import ConfigError, LakeError, NotFoundError
from combined.protocol import _provenance as prov
from combined.protocol.identity import quote_ident

if TYPE_CHECKING:
    import duckdb

    from combined.engine import Engine
    from combined.lake._layout import LakeLayout


@dataclass(frozen=True)
class RowVersion:
    """One version of the row: what a lake commit did to it, with its evidence."""

    op: str
    values: dict[str, Any]
    identity: str | None
    payload_hash: str | None
    run_id: str
    admission_id: str | None
    delivery_id: str | None
    delivery_sequence: int | None
    lake_version: int
    dataset_version: str | None
    source_position: str | None
    observed_at: datetime | None
    accepted_at: datetime | None  # the commit's acceptance (ingest) time
    receipt: dict[str, Any] | None
    publication: str | None = None
    published_at: datetime | None = None
    #: A delete the dataset's soft-delete flag made: the flag and its value
    #: (``deleted_at = 2026-11-30 10:00:00``); its ``values`` are the row as read.
    soft_delete: str | None = None


@dataclass(frozen=True)
class Explanation:
    """Every version of one row of a dataset, and where the row stands now."""

    dataset: str
    key: dict[str, str]
    status: str  # present | deleted | truncated | quarantined | unpublished | absent | never
    reason: str
    versions: list[RowVersion]
    current: list[dict[str, Any]]
    publication: str | None
    quarantined: list[dict[str, Any]] = field(default_factory=list)
    #: The row's identity (``_combined_id``, lowercase hex): the one asked for, or,
    #: for a key, its versions' (None for a key never captured).
    id: str | None = None

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dictionary of the whole explanation."""
        from combined.api._json import jsonable

        return dict(jsonable(asdict(self)))


# -- the key ---------------------------------------------------------------------------


def split_name(name: str) -> tuple[str, str]:
    """(source, dataset) of ``SOURCE.DATASET``, or a clear error."""
    source, dot, dataset = name.partition(".")
    if not dot or not source or not dataset:
        raise ConfigError(
            f"{name!r} does not name a dataset",
            hint="name it SOURCE.DATASET, e.g. shop.orders (see `combined status`)",
        )
    return source, dataset


def _dataset(engine: Engine, name: str) -> tuple[str, str, list[str]]:
    """(source, dataset, key columns) of ``SOURCE.DATASET`` (none: a dataset without a key)."""
    source, dataset = split_name(name)
    return source, dataset, list(engine.project.dataset(source, dataset).key or [])


#: A row's identity as a user sees it: ``_combined_id`` in hex (v2 tables hold its 16
#: bytes, shown in hex; v1 tables hold the 32 hex digits themselves).
_ID = re.compile(r"[0-9a-f]{32}")


def _by_id(name: str) -> str:
    """Where to give a row by its id, and where to read the ids."""
    return (
        f"combined explain {name} --id HEX, with the row's id from the table's _combined_id "
        f'column: combined sql "SELECT _combined_id, * FROM {name} WHERE ..."'
    )


def _given_id(
    name: str, key: Sequence[str], values: Sequence[str], row_id: str | None
) -> str | None:
    """The id asked for (lowercase), once the row is asked for soundly: by its key's
    values or by its id, not both."""
    if row_id is not None:
        if values:
            by_key = f"combined explain {name} {' '.join(k.upper() for k in key)}, or "
            raise ConfigError(
                f"give the row of {name} by its key values or by its id (--id), not both",
                hint=f"{by_key if key else ''}combined explain {name} --id HEX",
            )
        if not _ID.fullmatch(row_id.lower()):
            raise ConfigError(
                f"{row_id!r} is not a row id: an id (_combined_id) is 32 hex digits",
                hint=_by_id(name),
            )
        return row_id.lower()
    if not key:
        # (key: [], a mirror: its rows' ids are their contents, section 9 of docs/identity.md)
        raise ConfigError(f"{name} has no key: give the row by its id (--id)", hint=_by_id(name))
    if len(values) != len(key):
        raise ConfigError(
            f"{name}'s key has {len(key)} column{'s' if len(key) > 1 else ''} "
            f"({', '.join(key)}): give one value for each, in that order, "
            f"not {len(values)}; or the row's id (--id)",
            hint=f"combined explain {name} " + " ".join(k.upper() for k in key),
        )
    return None


def _sql_text(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _typed_literals(
    con: duckdb.DuckDBPyConnection,
    types: Mapping[str, str],
    key: Sequence[str],
    values: Sequence[str],
) -> dict[str, str]:
    """Each key value as a SQL literal of its column's type, or a clear error."""
    import duckdb

    out = {}
    for column, text in zip(key, values, strict=True):
        if column not in types:
            raise LakeError(
                f"the raw layer holds no key column {column!r}",
                hint="the key was changed after these Deliveries were written",
            )
        literal = f"CAST({_sql_text(text)} AS {types[column]})"
        try:
            (held,) = con.execute(f"SELECT {literal}").fetchall()[0]
        except duckdb.Error:
            held = None
        if held is None or not _exactly(text, types[column], held):
            read = "" if held is None else f" (it would be read as {held}, another value)"
            raise ConfigError(
                f"{text!r} is not a {types[column]} value, the type of key column {column!r}{read}",
                hint=f"give {column} as the raw layer holds it",
            )
        out[column] = literal
    return out


_INTEGERS = ("TINYINT", "SMALLINT", "INTEGER", "BIGINT", "HUGEINT")
_INTEGER_TEXT = re.compile(r"\s*[+-]?\d+\s*")
_NUMBER_TEXT = re.compile(r"\s*[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?\s*")
#: The digits of a second's fraction each time type holds.
_FRACTION_DIGITS = {
    "TIMESTAMP_S": 0,
    "TIMESTAMP_MS": 3,
    "TIMESTAMP": 6,
    "TIMESTAMP WITH TIME ZONE": 6,
    "TIME": 6,
    "TIMESTAMP_NS": 9,
}
_FRACTION = re.compile(r"\d:\d\d\.(\d+)")
_ZONED = re.compile(r"\d:\d\d(?::\d\d(?:\.\d*)?)?\s*(?:[zZ]|[+-]\d|[A-Za-z])")


def _exactly(text: str, kind: str, held: Any) -> bool:
    """Whether ``held`` (``text`` cast to ``kind`` by DuckDB) is the value ``text`` writes.

    DuckDB's cast rounds and truncates: ``'1.5'`` is the BIGINT 2, ``'0x1'``
    1, ``'1.005'`` the DECIMAL(10,2) 1.01; a timestamp without a time zone
    drops an offset, and a fraction past the type's digits. Explained, such
    a value told the history of another row than the one asked about.
    """
    from decimal import Decimal

    if kind.removeprefix("U") in _INTEGERS:
        return _INTEGER_TEXT.fullmatch(text) is not None
    if kind.startswith("DECIMAL"):
        return _NUMBER_TEXT.fullmatch(text) is not None and Decimal(text.strip()) == held
    if kind == "DOUBLE":
        return _NUMBER_TEXT.fullmatch(text) is not None and float(text) == held
    if kind in _FRACTION_DIGITS:
        fraction = _FRACTION.search(text)
        if fraction is not None and fraction.group(1)[_FRACTION_DIGITS[kind] :].strip("0"):
            return False
        return "ZONE" in kind or _ZONED.search(text) is None
    if kind == "DATE":
        return re.search(r"\d:\d\d", text) is None  # (a time of day: not a date)
    return True


# -- the raw layer ---------------------------------------------------------------------


@dataclass(frozen=True)
class _Commit:
    """One Combined commit of the dataset's table, from its metadata."""

    meta: dict[str, Any]

    @property
    def lake_version(self) -> int:
        return int(self.meta["lake_version"])

    @property
    def accepted_at(self) -> datetime | None:
        at = self.meta.get("ingested_at")
        return datetime.fromisoformat(at) if at else None


def _commits(layout: LakeLayout, source: str, dataset: str) -> list[_Commit]:
    table = layout.dataset_table(source, dataset)
    return sorted((_Commit(m) for m in table.commits()), key=lambda c: c.lake_version)


def _raw_files(
    layout: LakeLayout, source: str, dataset: str, commits: Sequence[_Commit]
) -> tuple[dict[str, tuple[_Commit, dict[str, Any]]], int]:
    """Each committed Delivery's raw-layer location, with its commit and record; and how
    many a ``retention.raw`` removed (the lake's ledger records which)."""
    from combined.lake._ledger import Ledger
    from combined.runtime._commit import raw_location

    files: dict[str, tuple[_Commit, dict[str, Any]]] = {}
    expired: set[str] | None = None
    gone = 0
    for commit in commits:
        for d in commit.meta.get("deliveries") or []:
            if int(d.get("records") or 0) == 0:
                continue
            location = raw_location(layout, source, dataset, d["file"])
            if not layout.store.exists(location):
                if expired is None:
                    expired = Ledger(layout).expired(source, dataset)
                if d["file"] in expired:
                    gone += 1
                    continue
                raise LakeError(
                    f"{source}.{dataset}: Delivery {d['id']} of run {commit.meta['run_id']} "
                    f"is missing from the raw layer ({location})",
                    hint="restore it from a backup, then run `combined repair`",
                )
            files[location] = (commit, d)
    return files, gone


def _scan(files: Sequence[str]) -> str:
    listing = ", ".join(_sql_text(str(f)) for f in files)
    return (
        f"read_parquet([{listing}], union_by_name = true, filename = true, file_row_number = true)"
    )


def _describe(con: duckdb.DuckDBPyConnection, scan: str) -> dict[str, str]:
    return {str(r[0]): str(r[1]) for r in con.execute(f"DESCRIBE SELECT * FROM {scan}").fetchall()}


def _version(
    commit: _Commit,
    delivery: Mapping[str, Any] | None,
    op: str,
    row: Mapping[str, Any],
    flag: Mapping[str, Any] | None = None,
) -> RowVersion:
    """One version of the row; ``flag`` is the dataset's soft-delete flag, if any."""
    from combined.capture._soft import says_deleted

    values = {k: v for k, v in row.items() if not k.startswith("_combined_")}
    values.pop("filename", None)
    values.pop("file_row_number", None)
    meta = commit.meta
    # A delete its flag made is the row as read, flag included; any other has no values.
    column = str(flag["flag"]) if flag else ""
    soft = op == "delete" and flag is not None and says_deleted(flag, values.get(column))
    return RowVersion(
        op=op,
        soft_delete=f"{column} = {values[column]}" if soft else None,
        values=values if op not in ("delete", "truncate") or soft else {},
        identity=_text(row.get(prov.ID)),
        payload_hash=_text(row.get(prov.PAYLOAD_HASH)),
        run_id=str(meta["run_id"]),
        admission_id=meta.get("admission_id"),
        delivery_id=delivery["id"] if delivery else None,
        delivery_sequence=int(delivery["sequence"]) if delivery else None,
        lake_version=commit.lake_version,
        dataset_version=(meta.get("version") or {}).get("id"),
        source_position=row.get(prov.SOURCE_POSITION) or meta.get("source_position"),
        observed_at=row.get(prov.OBSERVED_AT),
        accepted_at=row.get(prov.INGESTED_AT) or commit.accepted_at,
        receipt=meta.get("extraction_receipt"),
    )


def _text(value: Any) -> str | None:
    if value is None:
        return None
    return value.hex() if isinstance(value, bytes) else str(value)


@dataclass(frozen=True)
class _Asked:
    """The row asked for, as given: its dataset, and its key's values or its id."""

    source: str
    dataset: str
    key: dict[str, str]  # column -> value as given (none: by id)
    id: str | None  # 32 lowercase hex digits


def _id_literal(row_id: str, id_type: str) -> str:
    """SQL: the id (32 hex digits) as a column of ``id_type`` holds it (BLOB: encoding v2)."""
    return f"unhex({_sql_text(row_id)})" if id_type == "BLOB" else _sql_text(row_id)


@dataclass(frozen=True)
class _Sought:
    """The row asked for, in SQL: by its key's values (typed literals), or by its id."""

    literals: Mapping[str, str]  # key column -> a literal of its type (none: by id)
    id: str | None = None  # 32 lowercase hex digits
    id_type: str = "BLOB"  # the raw layer's type of _combined_id (VARCHAR: encoding v1)

    def match(self) -> str:
        """SQL: a row is the one asked for."""
        if self.id is not None:
            return f"{prov.ID} = {_id_literal(self.id, self.id_type)}"
        return " AND ".join(f"{quote_ident(c)} = {lit}" for c, lit in self.literals.items())

    def identities(self, scan: str) -> str:
        """SQL: the row's identities in ``scan``."""
        if self.id is not None:
            return f"SELECT {_id_literal(self.id, self.id_type)}"
        return f"SELECT {prov.ID} FROM {scan} WHERE {self.match()}"

    def matching(self, scan: str) -> str:
        """The row's rows in ``scan``, deletes (which carry only the identity) included."""
        if self.id is not None:
            return f"SELECT * FROM {scan} WHERE {self.match()}"
        return (
            f"SELECT * FROM {scan} WHERE ({self.match()}) OR {prov.ID} IN ({self.identities(scan)})"
        )


def _versions(
    con: duckdb.DuckDBPyConnection,
    files: Mapping[str, tuple[_Commit, dict[str, Any]]],
    scan: str,
    sought: _Sought,
    flag: Mapping[str, Any] | None = None,
) -> list[RowVersion]:
    """The row's rows in ``scan`` (the raw ``files``), in commit order, with each commit's
    evidence (``flag``: the dataset's soft-delete flag)."""
    query = f"{sought.matching(scan)} UNION ALL BY NAME "
    query += f"SELECT * FROM {scan} WHERE {prov.OP} = 'truncate'"
    found: list[tuple[int, int, int, RowVersion]] = []
    for row in python_rows(con.sql(query).to_arrow_table()):
        commit, delivery = files[str(row["filename"])]
        op = str(row.get(prov.OP) or "put")
        order = (commit.lake_version, int(delivery["sequence"]), int(row["file_row_number"]))
        found.append((*order, _version(commit, delivery, op, row, flag)))
    found.sort(key=lambda f: f[:3])
    versions = [f[3] for f in found]
    first = next((i for i, v in enumerate(versions) if v.op != "truncate"), len(versions))
    return versions[first:]  # a truncate before the row's first version is not its own


def _replacements(
    con: duckdb.DuckDBPyConnection,
    layout: LakeLayout,
    source: str,
    dataset: str,
    commits: Sequence[_Commit],
    versions: list[RowVersion],
    ids: str,
) -> list[RowVersion]:
    """A full refresh's versions, with their operation from its change list.

    A replacement delivers every row, changed or not: its change list (id, op)
    says which changed. Unchanged observations are left out; a delete, which
    the replacement holds no row for, is added from the list. ``ids`` is a
    query of the row's identities.
    """
    from combined.runtime._commit import raw_location

    out: list[RowVersion] = []
    for commit in commits:
        changes = commit.meta.get("changes_file")
        mine = [v for v in versions if v.lake_version == commit.lake_version]
        location = raw_location(layout, source, dataset, changes) if changes else None
        if location is None or not layout.store.exists(location):
            out.extend(mine)
            continue
        rows = con.sql(
            f"SELECT {prov.ID}, op FROM read_parquet({_sql_text(location)}) "
            f"WHERE {prov.ID} IN ({ids})"
        ).fetchall()
        ops = {_text(i): str(op) for i, op in rows}
        for v in mine:
            if v.identity in ops:
                out.append(replace(v, op=ops.pop(v.identity)))
        for identity, op in ops.items():
            if op == "delete":
                out.append(_version(commit, None, "delete", {prov.ID: identity}))
    return out


# -- publications and the projection -----------------------------------------------------


def _published(
    engine: Engine, source: str, dataset: str, versions: list[RowVersion]
) -> list[RowVersion]:
    """Each version with the first publication whose basis holds it."""
    import sqlalchemy as sa

    from combined.catalog import _schema as t

    m, p = t.publication_members, t.publications
    with engine.catalog.begin() as conn:
        members = conn.execute(
            sa.select(m.c.publication_id, m.c.lake_version, p.c.published_at)
            .join(p, p.c.id == m.c.publication_id)
            .where(m.c.source == source, m.c.dataset == dataset, m.c.lake_version.is_not(None))
            .order_by(p.c.seq)
        ).all()
    out = []
    for v in versions:
        first = next((r for r in members if int(r.lake_version) >= v.lake_version), None)
        out.append(
            replace(v, publication=first.publication_id, published_at=first.published_at)
            if first is not None
            else v
        )
    return out


def _current(
    engine: Engine, source: str, dataset: str, match: str
) -> tuple[list[dict[str, Any]], str | None]:
    """The rows ``match`` (SQL) finds in the newest publication's projection (if any), and
    that publication."""
    with engine.catalog.begin() as conn:
        from combined.catalog import _data as cat

        pub = cat.get_publication(conn, publication_id=None, as_of=None)
    if pub is None:
        return [], None
    try:
        table = engine.sql(
            f"SELECT * FROM {quote_ident(source)}.{quote_ident(dataset)} WHERE {match}",
            publication=pub.id,
        )
    except NotFoundError:
        return [], str(pub.id)  # not in that publication's basis yet
    return python_rows(table), str(pub.id)


# -- quarantine ---------------------------------------------------------------------------


def _held(con: duckdb.DuckDBPyConnection, path: str, asked: _Asked) -> str:
    """SQL: a record of the quarantine file ``path`` is the row asked for (its key's
    values, as text, or its id, when the records carry ids)."""
    if asked.id is None:
        return " AND ".join(
            f"CAST({quote_ident(c)} AS VARCHAR) = {_sql_text(v)}" for c, v in asked.key.items()
        )
    id_type = _describe(con, f"read_parquet({_sql_text(path)})").get(prov.ID)
    return f"{prov.ID} = {_id_literal(asked.id, id_type)}" if id_type else "false"


def _quarantined(
    engine: Engine, con: duckdb.DuckDBPyConnection, asked: _Asked
) -> list[dict[str, Any]]:
    """Quarantine entries of the dataset holding the row asked for, with its records."""
    import duckdb

    from combined.quality import quarantine

    found = []
    for entry in quarantine.entries(engine.catalog, source=asked.source, include_decided=True):
        if entry["dataset"] != asked.dataset:
            continue
        path = str(entry["path"])
        if not engine.layout.store.exists(path):
            continue  # discarded: the decision is in the Activity feed
        try:
            match = _held(con, path, asked)
            rows = python_rows(
                con.sql(
                    f"SELECT * FROM read_parquet({_sql_text(path)}) WHERE {match}"
                ).to_arrow_table()
            )
        except duckdb.Error:
            continue  # the entry's records do not carry the key columns (or cannot be read)
        if rows:
            keep = ("id", "run_id", "delivery_id", "reason", "decision", "decided_by", "created_at")
            found.append({**{k: entry[k] for k in keep}, "rows": rows})
    return found


# -- where the row stands -------------------------------------------------------------------


def _standing(
    versions: Sequence[RowVersion],
    current: Sequence[dict[str, Any]],
    publication: str | None,
    quarantined: Sequence[dict[str, Any]],
) -> tuple[str, str]:
    """(status, reason): why the row is, or is not, in the published projection."""
    last = versions[-1] if versions else None
    if current:
        return "present", f"in the projection of publication {publication}"
    if last is not None and last.op in ("delete", "truncate"):
        what = "deleted" if last.op == "delete" else "truncated"
        where = f" at source position {last.source_position}" if last.source_position else ""
        flagged = f" (soft-delete flag {last.soft_delete})" if last.soft_delete else ""
        return what, (
            f"{what}{flagged} by run {last.run_id}{where}, accepted at {last.accepted_at} "
            f"(lake version {last.lake_version})"
        )
    if last is not None and last.publication is None:
        return "unpublished", (
            f"captured by run {last.run_id} (lake version {last.lake_version}), "
            "which no publication holds yet"
        )
    if quarantined:
        q = quarantined[-1]
        decided = (
            f", {q['decision']} by {q['decided_by']}" if q["decision"] else ", awaiting review"
        )
        return (
            "quarantined",
            f"quarantined in {q['id']} by run {q['run_id']}: {q['reason']}{decided}",
        )
    if last is not None:
        return "absent", (
            f"last written by run {last.run_id} (lake version {last.lake_version}) and not "
            f"in the projection of publication {publication}: a replacement left it out"
        )
    return "never", "never captured"


def _never(engine: Engine, source: str, dataset: str) -> str:
    """Why a row never came: how far the dataset's captures read."""
    from combined.catalog import _data as cat

    with engine.catalog.begin() as conn:
        try:
            row = cat.get_dataset(conn, source, dataset)
        except NotFoundError:
            return "never captured: the dataset has no published capture yet"
    if row.published_at is None:
        return "never captured: the dataset has no published capture yet"
    position = f" (source position {row.source_position})" if row.source_position else ""
    return (
        f"never captured: no capture up to the newest publication, at "
        f"{row.published_at:%Y-%m-%d %H:%M:%S}{position}, delivered it"
    )


def _from_raw_layer(
    engine: Engine, con: duckdb.DuckDBPyConnection, asked: _Asked
) -> tuple[list[RowVersion], list[dict[str, Any]], str | None, int]:
    """The row's versions, its rows in the newest publication and that publication; and
    how many of the dataset's Deliveries a ``retention.raw`` removed."""
    from combined.capture._soft import spec_of

    layout, source, dataset = engine.layout, asked.source, asked.dataset
    commits = _commits(layout, source, dataset)
    files, expired = _raw_files(layout, source, dataset, commits)
    if not files:  # (every Delivery expired: the row may still be published)
        return [], *_published_alone(engine, con, asked), expired
    scan = _scan(list(files))
    sought = _sought(con, _describe(con, scan), asked)
    flag = spec_of(engine.project.dataset(source, dataset).deletes)
    versions = _versions(con, files, scan, sought, flag)
    ids = sought.identities(scan)
    versions = _replacements(con, layout, source, dataset, commits, versions, ids)
    return (versions, *_current(engine, source, dataset, sought.match()), expired)


def _sought(con: duckdb.DuckDBPyConnection, types: Mapping[str, str], asked: _Asked) -> _Sought:
    """The row asked for, by its id or its key's values typed as ``types`` type them."""
    if asked.id is not None:
        return _Sought({}, asked.id, types.get(prov.ID, "BLOB"))
    return _Sought(_typed_literals(con, types, list(asked.key), list(asked.key.values())))


def _published_alone(
    engine: Engine, con: duckdb.DuckDBPyConnection, asked: _Asked
) -> tuple[list[dict[str, Any]], str | None]:
    """The row in the newest publication, typed as the published table types its key: no
    Delivery of the dataset is left to say (a present row was told "never captured")."""
    name = f"{quote_ident(asked.source)}.{quote_ident(asked.dataset)}"
    try:
        con.register("_published_columns", engine.sql(f"SELECT * FROM {name} LIMIT 0"))
    except NotFoundError:
        return [], None
    sought = _sought(con, _describe(con, "_published_columns"), asked)
    return _current(engine, asked.source, asked.dataset, sought.match())


def _found_key(key: Sequence[str], versions: Sequence[RowVersion]) -> dict[str, str]:
    """The key's values of a row found by its id, from its versions (none without a key)."""
    for v in versions:
        if key and all(k in v.values for k in key):
            return {k: str(v.values[k]) for k in key}
    return {}


def explain(
    engine: Engine, name: str, values: Sequence[str] = (), *, row_id: str | None = None
) -> Explanation:
    """Every version of one row of ``name``, and where it stands: the row whose key is
    ``values``, or whose identity (``_combined_id`` in hex) is ``row_id``."""
    import duckdb

    source, dataset, key = _dataset(engine, name)
    row_id = _given_id(name, key, values, row_id)
    given = {} if row_id is not None else dict(zip(key, values, strict=True))
    asked = _Asked(source, dataset, given, row_id)
    con = duckdb.connect()
    try:
        engine.layout.store.attach(con)
        versions, current, publication, expired = _from_raw_layer(engine, con, asked)
        quarantined = _quarantined(engine, con, asked)
    finally:
        con.close()
    versions = _published(engine, source, dataset, versions)
    status, reason = _standing(versions, current, publication, quarantined)
    if status == "never":
        reason = _never(engine, source, dataset)
    if expired:
        reason += (
            f" ({expired} earlier Deliveries of the dataset left the raw layer under "
            "its retention.raw: the row's versions they held are not shown)"
        )
    return Explanation(
        dataset=name,
        key=given or _found_key(key, versions),
        status=status,
        reason=reason,
        versions=versions,
        current=current,
        publication=publication,
        quarantined=quarantined,
        id=row_id or next((v.identity for v in versions if v.op != "truncate"), None),
    )
