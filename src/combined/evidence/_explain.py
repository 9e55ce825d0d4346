"""``combined explain``: every version of one row, read from the raw layer.

The lake's commit metadata lists, for each Delta version of a dataset, the
Deliveries it committed, the Run and admission, the source position and the
extraction receipt. The Deliveries themselves (the raw layer) hold each
version of each row with its operation and provenance columns. Explaining a
key reads those two, then the catalog's publications (when each version
became visible) and the newest publication's projection (is the row there
now), and, for a key that is not, why: deleted, truncated, quarantined, not
yet published, or never captured.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime
from typing import TYPE_CHECKING, Any

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
    """(source, dataset, key columns) of ``SOURCE.DATASET``, or a clear error."""
    source, dataset = split_name(name)
    declared = engine.project.dataset(source, dataset)
    key = list(declared.key or [])
    if not key:
        hint = f"declare `key:` for {name} in combined.yaml"
        if declared.key == [] and declared.sync_mode != "append":
            # (key: [], a mirror: its rows' ids are their contents, section 9 of docs/identity.md)
            hint = (
                f"{name} has no key (key: []): find its rows by their values with "
                f'`combined sql "SELECT * FROM {name} WHERE ..."`'
            )
        raise ConfigError(f"{name} declares no key, and explain finds a row by its key", hint=hint)
    return source, dataset, key


def _check_arity(name: str, key: Sequence[str], values: Sequence[str]) -> None:
    if len(values) != len(key):
        raise ConfigError(
            f"{name}'s key has {len(key)} column{'s' if len(key) > 1 else ''} "
            f"({', '.join(key)}): give one value for each, in that order, "
            f"not {len(values)}",
            hint=f"combined explain {name} " + " ".join(k.upper() for k in key),
        )


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
            con.execute(f"SELECT {literal}").fetchall()
        except duckdb.Error:
            raise ConfigError(
                f"{text!r} is not a {types[column]} value, the type of key column {column!r}",
                hint=f"give {column} as the raw layer holds it",
            ) from None
        out[column] = literal
    return out


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
) -> dict[str, tuple[_Commit, dict[str, Any]]]:
    """Each committed Delivery's raw-layer location, with its commit and record."""
    from combined.runtime._commit import raw_location

    files: dict[str, tuple[_Commit, dict[str, Any]]] = {}
    for commit in commits:
        for d in commit.meta.get("deliveries") or []:
            if int(d.get("records") or 0) == 0:
                continue
            location = raw_location(layout, source, dataset, d["file"])
            if not layout.store.exists(location):
                raise LakeError(
                    f"{source}.{dataset}: Delivery {d['id']} of run {commit.meta['run_id']} "
                    f"is missing from the raw layer ({location})",
                    hint="restore it from a backup, then run `combined repair`",
                )
            files[location] = (commit, d)
    return files


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


def _key_match(literals: Mapping[str, str]) -> str:
    """SQL: the row's key columns equal the given (typed) values."""
    return " AND ".join(f"{quote_ident(c)} = {lit}" for c, lit in literals.items())


def _identities(scan: str, literals: Mapping[str, str]) -> str:
    """SQL: the identities of the key's rows in ``scan``."""
    return f"SELECT {prov.ID} FROM {scan} WHERE {_key_match(literals)}"


def _matching(scan: str, literals: Mapping[str, str]) -> str:
    """The rows of the key in ``scan``, deletes (which carry only the identity) included."""
    return (
        f"SELECT * FROM {scan} WHERE ({_key_match(literals)}) OR {prov.ID} IN "
        f"({_identities(scan, literals)})"
    )


def _versions(
    con: duckdb.DuckDBPyConnection,
    files: Mapping[str, tuple[_Commit, dict[str, Any]]],
    scan: str,
    literals: Mapping[str, str],
    flag: Mapping[str, Any] | None = None,
) -> list[RowVersion]:
    """The key's rows in ``scan`` (the raw ``files``), in commit order, with each commit's
    evidence (``flag``: the dataset's soft-delete flag)."""
    query = f"{_matching(scan, literals)} UNION ALL BY NAME "
    query += f"SELECT * FROM {scan} WHERE {prov.OP} = 'truncate'"
    found: list[tuple[int, int, int, RowVersion]] = []
    for row in con.sql(query).to_arrow_table().to_pylist():
        commit, delivery = files[str(row["filename"])]
        op = str(row.get(prov.OP) or "put")
        order = (commit.lake_version, int(delivery["sequence"]), int(row["file_row_number"]))
        found.append((*order, _version(commit, delivery, op, row, flag)))
    found.sort(key=lambda f: f[:3])
    versions = [f[3] for f in found]
    first = next((i for i, v in enumerate(versions) if v.op != "truncate"), len(versions))
    return versions[first:]  # a truncate before the key's first version is not its own


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
    query of the key's identities.
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
    engine: Engine, source: str, dataset: str, literals: Mapping[str, str]
) -> tuple[list[dict[str, Any]], str | None]:
    """The rows in the newest publication's projection (if any), and that publication."""
    with engine.catalog.begin() as conn:
        from combined.catalog import _data as cat

        pub = cat.get_publication(conn, publication_id=None, as_of=None)
    if pub is None:
        return [], None
    try:
        table = engine.sql(
            f"SELECT * FROM {quote_ident(source)}.{quote_ident(dataset)} "
            f"WHERE {_key_match(literals)}",
            publication=pub.id,
        )
    except NotFoundError:
        return [], str(pub.id)  # not in that publication's basis yet
    return table.to_pylist(), str(pub.id)


# -- quarantine ---------------------------------------------------------------------------


def _quarantined(
    engine: Engine,
    con: duckdb.DuckDBPyConnection,
    source: str,
    dataset: str,
    key: Sequence[str],
    values: Sequence[str],
) -> list[dict[str, Any]]:
    """Quarantine entries of the dataset holding the key, with the quarantined rows."""
    import duckdb

    from combined.quality import quarantine

    found = []
    for entry in quarantine.entries(engine.catalog, source=source, include_decided=True):
        if entry["dataset"] != dataset:
            continue
        path = str(entry["path"])
        if not engine.layout.store.exists(path):
            continue  # discarded: the decision is in the Activity feed
        match = " AND ".join(
            f"CAST({quote_ident(c)} AS VARCHAR) = {_sql_text(v)}"
            for c, v in zip(key, values, strict=True)
        )
        try:
            rows = (
                con.sql(f"SELECT * FROM read_parquet({_sql_text(path)}) WHERE {match}")
                .to_arrow_table()
                .to_pylist()
            )
        except duckdb.Error:
            continue  # the entry's records do not carry the key columns
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
    """Why a key never came: how far the dataset's captures read."""
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


def explain(engine: Engine, name: str, values: Sequence[str]) -> Explanation:
    """Every version of the row of ``name`` whose key is ``values``, and where it stands."""
    import duckdb

    from combined.capture._soft import spec_of

    source, dataset, key = _dataset(engine, name)
    _check_arity(name, key, values)
    layout = engine.layout
    commits = _commits(layout, source, dataset)
    files = _raw_files(layout, source, dataset, commits)
    con = duckdb.connect()
    try:
        layout.store.attach(con)
        if files:
            scan = _scan(list(files))
            literals = _typed_literals(con, _describe(con, scan), key, values)
            flag = spec_of(engine.project.dataset(source, dataset).deletes)
            versions = _versions(con, files, scan, literals, flag)
            ids = _identities(scan, literals)
            versions = _replacements(con, layout, source, dataset, commits, versions, ids)
            current, publication = _current(engine, source, dataset, literals)
        else:
            versions, current, publication = [], [], None
        quarantined = _quarantined(engine, con, source, dataset, key, values)
    finally:
        con.close()
    versions = _published(engine, source, dataset, versions)
    status, reason = _standing(versions, current, publication, quarantined)
    if status == "never":
        reason = _never(engine, source, dataset)
    return Explanation(
        dataset=name,
        key=dict(zip(key, values, strict=True)),
        status=status,
        reason=reason,
        versions=versions,
        current=current,
        publication=publication,
        quarantined=quarantined,
    )
