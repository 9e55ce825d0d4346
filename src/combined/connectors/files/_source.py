"""The files source: check, discover and read file sets under one directory."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

import pyarrow as pa

from combined.connectors.abc import (
    BaseSource,
    CursorCandidate,
    DatasetDiscovery,
    Discovery,
    Extraction,
    FieldInfo,
    KeyCandidate,
    ReadRequest,
    refuse_bounds,
)
from combined.connectors.files import _scan
from combined.connectors.files._extraction import FilesExtraction
from combined.connectors.files._listing import Listing, check_root, list_files
from combined.connectors.files._settings import SOURCE_KEYS, FileSet, Settings
from combined.errors import ConfigError

#: Rows discovery reads to look for key candidates: evidence, never proof.
KEY_SAMPLE_ROWS = 100_000

_CURSOR_TYPES = ("int", "uint", "timestamp", "date", "decimal")


class FilesSource(BaseSource):
    """Local files (CSV, Parquet, JSON) under one directory, read with DuckDB.

    Configuration:

    ``path``
        The directory (relative to the project file); it must exist.
    ``format``, ``delimiter``, ``header``, ``quote``, ``encoding`` (optional)
        Defaults for every file set: the format (``csv``, ``parquet``,
        ``json``; a glob's extension overrides it, and it is inferred from
        the files' extension when unset) and the CSV
        dialect (``,``, a header line, ``"``, ``utf-8``; ``utf-16`` and
        ``latin-1`` are read too).
    ``files`` (optional)
        Named file sets: ``{orders: {glob: "orders/*.csv", columns: {id:
        BIGINT}, allow_empty: false, ...}}``. A dataset's ``relation``
        names a set (it defaults to the dataset's name), or is a glob read
        with the source's defaults.
    ``follow_symlinks`` (optional)
        ``within`` (the default) reads a file a symbolic link leads to only
        when it lies inside ``path``; ``never`` refuses every linked file.

    Strategy: ``snapshot`` only. Every read lists the matched files, reads
    exactly them and checks them unchanged afterwards; see ``docs/files.md``.
    """

    name: ClassVar[str] = "files"
    revision: ClassVar[str] = "1"
    SUPPORTS_SNAPSHOT: ClassVar[bool] = True
    SUPPORTS_CURSOR: ClassVar[bool] = False
    SUPPORTS_CDC: ClassVar[bool] = False
    SUPPORTS_PARTITIONS: ClassVar[bool] = False
    SUPPORTS_CONTROL_TOTALS: ClassVar[bool] = True
    #: Discovery samples every file set and scans rows for key evidence: not
    #: spent before each capture, where one set's bad file would also fail
    #: the others' captures. A read types its own rows (declared or inferred).
    DISCOVERY_READS_RECORDS: ClassVar[bool] = True
    CONFIG_KEYS: ClassVar[tuple[str, ...] | None] = SOURCE_KEYS

    def __init__(self, config: Mapping[str, Any]) -> None:
        super().__init__(config)
        self.settings = Settings.parse(self.config)
        for file_set in self.settings.file_sets.values():
            _check_types(file_set)

    def _root(self) -> Path:
        return check_root(self.settings.path)

    def check(self) -> None:
        """The directory exists and can be listed."""
        root = self._root()
        try:
            next(root.iterdir(), None)
        except OSError as exc:
            raise ConfigError(
                f"the files directory {self.settings.path!r} cannot be listed: "
                f"{exc.strerror or type(exc).__name__}",
                hint="grant read permission on it to the user Combined runs as",
            ) from None

    def discover(self) -> Discovery:
        """Report each declared file set: its files, fields, types and candidates."""
        root = self._root()
        datasets = []
        for name in self.settings.file_sets:
            datasets.append(self._describe(root, self.settings.file_set(name)))
        return Discovery(connector=self.name, revision=self.revision, datasets=tuple(datasets))

    def _describe(self, root: Path, file_set: FileSet) -> DatasetDiscovery:
        listing = list_files(root, file_set.glob, file_set.name, self.settings.follow_symlinks)
        fmt = file_set.format_for([e.name for e in listing.entries]) if listing.entries else None
        if fmt is not None:
            listing = listing.readable(fmt)  # as a read does
        if fmt is None or not listing.entries:
            fields = tuple(FieldInfo(n, str(_arrow_of(t)), t) for n, t in file_set.columns)
            return DatasetDiscovery(
                name=file_set.name,
                relation=file_set.name,
                kind="files",
                fields=fields,
                strategies=("snapshot",),
                notes=(
                    f"{file_set.glob!r} matches no file"
                    + ("" if file_set.allow_empty else ": a capture would be refused"),
                ),
            )
        con = _scan.connect()
        try:
            rows = _scan.check_parquet(listing, file_set.name) if fmt == "parquet" else None
            typed = _scan.infer(con, file_set, fmt, listing)
            query = _scan.select(file_set, fmt, listing, typed=typed)
            schema = _scan.arrow_schema(con, query)
            types = dict(typed if typed is not None else _scan.describe(con, query))
            keys = _key_candidates(con, query, schema, rows)
        except _scan.DUCKDB_ERRORS as exc:
            raise _scan.translate(exc, listing, file_set.name) from exc
        finally:
            con.close()
        declared = file_set.types
        fields = tuple(
            FieldInfo(
                f.name,
                str(f.type),
                declared.get(f.name, types.get(f.name, str(f.type)))
                + ("" if f.name in declared else " (inferred)"),
            )
            for f in schema
        )
        cursors = tuple(
            CursorCandidate(
                f.name,
                f"{types.get(f.name)} column: orderable, but files declare no ordering; "
                "say in cursor.trust why it only grows",
            )
            for f in schema
            if str(f.type).startswith(_CURSOR_TYPES)
        )
        return DatasetDiscovery(
            name=file_set.name,
            relation=file_set.name,
            kind=f"{fmt} files",
            fields=fields,
            cursor_candidates=cursors,
            key_candidates=keys,
            strategies=("snapshot",),
            estimated_rows=rows,
            notes=(_files_note(file_set, listing),),
        )

    def read(self, request: ReadRequest) -> Extraction:
        """Prepare a snapshot read of one file set; nothing is read until it is iterated."""
        if request.strategy != "snapshot":
            raise ConfigError(
                f"the files connector cannot read with strategy {request.strategy!r}",
                hint="use strategy: snapshot (each capture reads every matched file)",
                dataset=request.dataset,
            )
        refuse_bounds(self.name, request, "drop the bounds: a files read covers the whole set")
        if request.batch_rows < 1:
            raise ConfigError(
                f"batch_rows must be positive, not {request.batch_rows}",
                hint="request at least one row per batch",
                dataset=request.dataset,
            )
        control = request.options.get("control_totals", False)
        if not isinstance(control, bool | str):
            raise ConfigError("`control_totals` must be true or a column name", hint="true")
        file_set = self.settings.file_set(request.relation)
        _check_types(file_set)
        return FilesExtraction(
            root=self._root(),
            file_set=file_set,
            request=request,
            control=control,
            follow_symlinks=self.settings.follow_symlinks,
        )


def _check_types(file_set: FileSet) -> None:
    """Refuse a declared type DuckDB does not know, before anything is read."""
    if not file_set.columns:
        return
    con = _scan.connect()
    try:
        for name, type_ in file_set.columns:
            try:
                con.execute(f"SELECT CAST(NULL AS {type_})")
            except _scan.DUCKDB_ERRORS:
                raise ConfigError(
                    f"files.{file_set.name}.columns.{name} is {type_!r}, which DuckDB does "
                    "not know",
                    hint="use a DuckDB type: BIGINT, DOUBLE, VARCHAR, DATE, TIMESTAMP, "
                    "TIMESTAMPTZ, BOOLEAN, DECIMAL(12,2)",
                    relation=file_set.name,
                    column=name,
                ) from None
    finally:
        con.close()


def _arrow_of(type_: str) -> pa.DataType:
    con = _scan.connect()
    try:
        reader: pa.RecordBatchReader = con.sql(
            f"SELECT CAST(NULL AS {type_}) AS v"
        ).to_arrow_reader()
        return reader.schema.field("v").type
    finally:
        con.close()


def _key_candidates(
    con: Any, query: str, schema: pa.Schema, rows: int | None
) -> tuple[KeyCandidate, ...]:
    """Single columns unique and never null in the first rows: evidence, never a constraint."""
    names = [
        f.name for f in schema if not (pa.types.is_floating(f.type) or pa.types.is_nested(f.type))
    ][:64]
    if not names:
        return ()
    q = _scan.quote_ident
    checks = ", ".join(f"count(DISTINCT {q(n)}), count({q(n)})" for n in names)
    sample = f"SELECT * FROM ({query}) LIMIT {KEY_SAMPLE_ROWS}"
    try:
        row = con.execute(f"SELECT count(*), {checks} FROM ({sample})").fetchone()
    except _scan.DUCKDB_ERRORS:
        return ()  # evidence only: the read reports a bad file itself
    if row is None:
        return ()
    total = int(row[0])
    if total == 0:
        return ()
    whole = total < KEY_SAMPLE_ROWS or (rows is not None and total >= rows)
    seen = "every row" if whole else f"the first {total} rows"
    out = []
    for i, name in enumerate(names):
        distinct, present = int(row[1 + 2 * i]), int(row[2 + 2 * i])
        if distinct == total and present == total:
            out.append(
                KeyCandidate(
                    (name,),
                    f"unique and never null in {seen} read now ({total}); "
                    "files enforce no key, so a later file may repeat it",
                )
            )
    return tuple(out)


def _files_note(file_set: FileSet, listing: Listing) -> str:
    names = [e.name for e in listing.entries]
    shown = ", ".join(names[:5]) + (f", ... ({len(names) - 5} more)" if len(names) > 5 else "")
    size = listing.bytes
    unit = "B"
    value = float(size)
    for u in ("KiB", "MiB", "GiB", "TiB"):
        if value < 1024:
            break
        value /= 1024
        unit = u
    amount = f"{size} B" if unit == "B" else f"{value:.1f} {unit}"
    return f"{file_set.glob!r} matches {len(names)} files ({amount}): {shown}"


__all__ = ["FilesSource"]
