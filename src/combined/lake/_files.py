"""Writing Delta data files ourselves: streamed, bounded, then committed as add actions.

delta-rs buffers a whole data file in memory before it uploads it, and pulls
its input ahead of the writer, so a large append through ``write_deltalake``
holds memory in proportion to the data. Appends instead stream batches into
Parquet files under the table directory with pyarrow (one row group at a
time), and the commit registers them as add actions with their statistics.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import time
import uuid
from collections.abc import Collection, Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from combined.lake._store import LakeStore

if TYPE_CHECKING:
    import pyarrow.fs as pafs

#: Rows per data file: bounded files keep every reader's memory bounded too.
FILE_ROWS = 1_000_000
ROW_GROUP_ROWS = 65_536
#: Arrow bytes at which a row group closes before its rows (see :class:`RowGroups`).
ROW_GROUP_BYTES = 16 << 20
#: Rows of at least this many Arrow bytes on average are large (see :class:`RowGroups`).
LARGE_ROW_BYTES = 1 << 20
#: Arrow bytes at which a row group of large rows closes (one row at least).
LARGE_GROUP_BYTES = 2 << 20
#: Rows read at a time when a file is rewritten without some of its rows.
REWRITE_BATCH_ROWS = 8_192
#: About the Arrow bytes a batch read from a data file holds, whatever its rows' width.
READ_BATCH_BYTES = 8 << 20


def read_batches(
    pf: pq.ParquetFile, rows: int, *, threads: bool = True
) -> Iterator[pa.RecordBatch]:
    """``pf``'s rows ``rows`` at a time, fewer where they are wide.

    About :data:`READ_BATCH_BYTES` a batch, by the file's uncompressed row
    groups per row. A batch of a row count alone held a whole file of wide
    rows: 8,192 rows of 1 MB texts. Row group by row group: a reader of the
    whole file reads ahead into the next row groups (a file of int[1000]
    rows held 56 MB of Arrow memory at 1 MB batches, 18 MB a row group at a
    time). ``threads``: decode the columns in parallel (each thread's
    buffers on top: false where files are read two at a time).
    """
    meta = pf.metadata
    size = sum(meta.row_group(g).total_byte_size for g in range(meta.num_row_groups))
    if size > 0 and meta.num_rows > 0:
        rows = max(1, min(rows, READ_BATCH_BYTES * int(meta.num_rows) // int(size)))
    for group in range(meta.num_row_groups):
        yield from pf.iter_batches(batch_size=rows, row_groups=[group], use_threads=threads)


def _stat_value(value: Any) -> Any:
    if value is None:
        return None
    if hasattr(value, "isoformat"):
        text = value.isoformat()
        # Delta statistics write timestamps in UTC with a 'Z' and millisecond precision.
        return text.replace("+00:00", "Z")
    if isinstance(value, int | float | bool):
        return value
    return str(value)


def _minmax_type(t: pa.DataType) -> bool:
    # Strings are left out: a truncated maximum would let readers skip files wrongly.
    return bool(
        pa.types.is_integer(t)
        or pa.types.is_floating(t)
        or pa.types.is_date(t)
        or pa.types.is_timestamp(t)
        or pa.types.is_decimal(t)
    )


class FileStats:
    """The Delta statistics of one data file, gathered batch by batch as it is written."""

    def __init__(self, schema: pa.Schema) -> None:
        self.schema = schema
        self.rows = 0
        # A struct's count would have to be nested, per field (a flat one makes
        # delta-rs drop the file's whole stats, its row count included): it is
        # left out, and a reader that needs it counts the rows.
        self.nulls = {f.name: 0 for f in schema if not pa.types.is_struct(f.type)}
        self.mins: dict[str, Any] = {}
        self.maxs: dict[str, Any] = {}
        #: Columns whose bounds cannot be stated (non-finite floats, dates past
        #: Python's range): they get no min/max, only counts, for the whole file.
        self.unbounded: set[str] = set()

    def add(self, batch: pa.RecordBatch) -> None:
        """Count a batch written to the file."""
        self.rows += batch.num_rows
        for field, column in zip(self.schema, batch.columns, strict=True):
            name = field.name
            if name in self.nulls:
                self.nulls[name] += column.null_count
            if (
                not _minmax_type(field.type)
                or column.null_count == len(column)
                or name in self.unbounded
            ):
                continue
            if (
                pa.types.is_floating(field.type)
                and not pc.all(pc.is_finite(column), skip_nulls=True).as_py()
            ):
                self._unbound(name)
                continue
            mm = pc.min_max(column)
            try:
                lo, hi = mm["min"].as_py(), mm["max"].as_py()
            except (OverflowError, ValueError):
                self._unbound(name)
                continue
            if field.name not in self.mins or lo < self.mins[field.name]:
                self.mins[field.name] = lo
            if field.name not in self.maxs or hi > self.maxs[field.name]:
                self.maxs[field.name] = hi

    def _unbound(self, name: str) -> None:
        self.unbounded.add(name)
        self.mins.pop(name, None)
        self.maxs.pop(name, None)

    def to_json(self) -> str:
        """The ``stats`` string of the file's add action."""
        return json.dumps(
            {
                "numRecords": self.rows,
                "minValues": {k: _stat_value(v) for k, v in self.mins.items()},
                "maxValues": {k: _stat_value(v) for k, v in self.maxs.items()},
                "nullCount": self.nulls,
            },
            allow_nan=False,  # delta-rs drops a file's whole stats on invalid JSON
        )


def write_data_files(
    table: str | Path,
    schema: pa.Schema,
    batches: Iterable[pa.RecordBatch],
    store: LakeStore | None = None,
    dictionaries: Collection[str] = (),
) -> list[Any]:
    """Stream ``batches`` into new data files of ``table``; return their add actions.

    The files are invisible until a commit adds them; a crash before it leaves
    only unreferenced files, which ``vacuum`` removes. ``dictionaries``: string
    columns of ``schema`` the batches give as dictionary arrays (see
    :func:`parquet_writer`).
    """
    store = store or LakeStore.at(table)
    store.makedirs(table)
    actions: list[Any] = []
    writer: pq.ParquetWriter | None = None
    groups: RowGroups | None = None
    stats: FileStats | None = None
    name = ""

    dense: set[str] = set()

    def close() -> None:
        nonlocal writer, groups, stats
        if writer is None or groups is None or stats is None:
            return
        groups.close()
        writer.close()
        size = store.size(store.child(table, name))
        actions.append(_add_action(name, size, stats.to_json()))
        writer, groups, stats = None, None, None

    for batch in batches:
        offset = 0
        while offset < batch.num_rows:
            if writer is None:
                name = _data_file_name()
                writer = parquet_writer(
                    store.path(store.child(table, name)),
                    schema,
                    sample=batch.slice(offset),
                    filesystem=store.fs if store.remote else None,
                    dictionaries=dictionaries,
                )
                groups, stats = RowGroups(writer), FileStats(schema)
                dense = set(dictionaries) - dictionary_columns_taken(writer)
            assert groups is not None and stats is not None
            # A file ends at FILE_ROWS rows exactly, whatever the batches' sizes.
            chunk = batch.slice(offset, FILE_ROWS - stats.rows)
            if dense:  # (given as dictionaries, written as strings)
                chunk = chunk.cast(_with_strings(chunk.schema, dense))
            groups.add(chunk)
            stats.add(chunk)
            offset += chunk.num_rows
            if stats.rows >= FILE_ROWS:
                close()
    close()
    return actions


#: Digests: every value differs, so a dictionary page only costs time.
_NO_DICTIONARY = frozenset({"_combined_id", "_combined_payload_hash"})
#: Rows of the first batch that decide which columns get a dictionary (counting
#: distinct values costs ~2 us a row: 16k-row samples cost ~30 ms a file).
DICTIONARY_SAMPLE_ROWS = 2_048
#: A column gets a dictionary when its sample holds at most this share of distinct values.
DICTIONARY_MAX_DISTINCT = 0.25


def dictionary_columns(schema: pa.Schema, sample: pa.RecordBatch | None) -> bool | list[str]:
    """The (leaf) columns worth a dictionary page, judged on ``sample`` (the file's first rows).

    A dictionary pays for repeated values (a status, the provenance columns
    constant over a Delivery) and costs time and bytes on nearly unique ones
    (keys, amounts, instants, digests): Parquet writers try it on every column
    and fall back page by page, encoding those twice. Without a sample, every
    column but the digests gets one, as before. A nested field's leaves keep
    the writer's default (a dictionary each); its flat neighbours are judged
    like any: on a 100k-row file of the bench's wide table, dictionaries tried
    everywhere cost ~35% more CPU to write and ~17% more bytes.
    """
    leaves = _leaf_paths(schema)
    if leaves is None:
        return True  # (a dotted name: leaf paths would be ambiguous; writer default)
    if sample is None or sample.num_rows == 0 or sample.schema.names != schema.names:
        return [
            p
            for f, paths in zip(schema, leaves, strict=True)
            for p in paths
            if f.name not in _NO_DICTIONARY
        ]
    sample = sample.slice(0, DICTIONARY_SAMPLE_ROWS)
    limit = max(1, int(sample.num_rows * DICTIONARY_MAX_DISTINCT))
    chosen = []
    for field, paths, column in zip(schema, leaves, sample.columns, strict=True):
        if field.name in _NO_DICTIONARY or pa.types.is_boolean(column.type):
            continue
        if pa.types.is_nested(field.type):
            chosen.extend(paths)
        elif pa.types.is_dictionary(column.type):  # given as a dictionary already
            chosen.append(field.name)
        elif pc.count_distinct(column, mode="all").as_py() <= limit:
            chosen.append(field.name)
    return chosen


#: The longest min or max a Parquet writer stores (pyarrow's max_statistics_size):
#: a column holding longer values is computed statistics it drops.
STATISTICS_MAX_BYTES = 4096


def _large(sample: pa.RecordBatch | None) -> list[str]:
    """The string and binary columns of ``sample`` holding a value over ``STATISTICS_MAX_BYTES``."""
    if sample is None:
        return []
    return [
        f.name
        for f, column in zip(sample.schema, sample.columns, strict=True)
        if (pa.types.is_string(f.type) or pa.types.is_binary(f.type))
        and (pc.max(pc.binary_length(column)).as_py() or 0) > STATISTICS_MAX_BYTES
    ]


def without_large_statistics(
    schema: pa.Schema, statistics: bool | list[str], large: Collection[str]
) -> bool | list[str]:
    """``statistics`` (the columns given them) less the columns ``large``.

    pyarrow computes a column chunk's min and max by copying its values,
    then drops any longer than ``STATISTICS_MAX_BYTES``: one 50 MB string
    held ~300 MB more while its row group was written (~84 MB more without
    statistics), for statistics no reader ever saw.
    """
    leaves = _leaf_paths(schema)
    if not large or leaves is None:
        return statistics
    paths = [(f.name, p) for f, group in zip(schema, leaves, strict=True) for p in group]
    kept = statistics if isinstance(statistics, list) else [p for _, p in paths]
    return [p for name, p in paths if p in kept and name not in large]


def _leaf_paths(schema: pa.Schema) -> list[list[str]] | None:
    """Each field's Parquet leaf columns, as the writer's options name them (``tags.list.element``).

    A flat field is its own leaf. None when a name holds a dot (a leaf's
    path would not tell its field).
    """
    if any("." in f.name for f in schema):
        return None
    if not any(pa.types.is_nested(f.type) for f in schema):
        return [[f.name] for f in schema]
    # The writer's own naming of nested leaves, from an empty file of the schema.
    sink = pa.BufferOutputStream()
    try:
        pq.write_table(schema.empty_table(), sink)
    except (pa.ArrowNotImplementedError, pa.ArrowInvalid):
        return None  # (the file's own writer says why, with the writer default)
    parquet = pq.read_metadata(pa.BufferReader(sink.getvalue())).schema
    paths = [parquet.column(i).path for i in range(len(parquet))]
    return [[p for p in paths if p == f.name or p.startswith(f.name + ".")] for f in schema]


def parquet_writer(
    path: str | Path,
    schema: pa.Schema,
    compression: str = "zstd",
    sample: pa.RecordBatch | None = None,
    filesystem: pafs.FileSystem | None = None,
    dictionaries: Collection[str] = (),
    large_values: Collection[str] = (),
) -> pq.ParquetWriter:
    """A Parquet writer for lake and staging files, dictionaries only where they pay.

    ``sample`` (the first batch the file will hold) decides which columns get
    a dictionary (see :func:`dictionary_columns`). ``path`` is a path of
    ``filesystem`` when one is given (an object store's ``bucket/key``).
    The digest columns are neither compressed nor given statistics
    (:func:`digest_settings`). ``dictionaries`` name string columns the
    batches may give as dictionary arrays (a constant as one value, see
    :func:`constant_dictionary`): the writer takes their dictionary as it
    is, where a column of strings has each value hashed into a dictionary
    and compared for its statistics (the provenance constants cost half of
    a narrow Delivery's encoding). The file's Arrow schema still says
    ``schema``. Which ones the writer takes as dictionaries:
    :func:`dictionary_columns_taken` (the batches give the others as strings).
    ``large_values``: columns that may hold values of megabytes, written
    without statistics (:func:`without_large_statistics`).
    """
    dictionary = dictionary_columns(schema, sample)
    encoding = digest_encoding(schema, dictionary)
    codecs, statistics = digest_settings(schema, compression, encoding)
    statistics = without_large_statistics(schema, statistics, {*large_values, *_large(sample)})
    taken = [n for n in dictionaries if pa.types.is_string(schema.field(n).type)]
    if not taken or isinstance(dictionary, bool) or schema.metadata:
        return pq.ParquetWriter(
            str(path),
            schema,
            compression=codecs,
            use_dictionary=dictionary,
            column_encoding=encoding,
            write_statistics=statistics,
            filesystem=filesystem,
        )
    return _DictionaryWriter(
        str(path),
        schema,
        taken,
        compression=codecs,
        use_dictionary=sorted({*dictionary, *taken}),
        column_encoding=encoding,
        write_statistics=statistics,
        filesystem=filesystem,
    )


class _DictionaryWriter(pq.ParquetWriter):  # type: ignore[misc]  # (pyarrow: no types)
    """A writer whose ``taken`` columns arrive as dictionary arrays of ``schema``'s strings.

    Its batches' schema types them as dictionaries; the file's Arrow schema
    (``ARROW:schema``, added as it closes) is ``schema``'s own, byte for byte
    what a writer of ``schema`` stores, so every reader sees strings.
    """

    def __init__(
        self, where: str, schema: pa.Schema, taken: Collection[str], **options: Any
    ) -> None:
        self._stored = base64.b64encode(schema.serialize().to_pybytes()).decode()
        self.taken = frozenset(taken)
        super().__init__(where, with_dictionaries(schema, taken), store_schema=False, **options)

    def close(self) -> None:
        if self.is_open:
            self.add_key_value_metadata({"ARROW:schema": self._stored})
        super().close()


def dictionary_columns_taken(writer: pq.ParquetWriter) -> frozenset[str]:
    """The columns ``writer`` (from :func:`parquet_writer`) takes as dictionary arrays."""
    return writer.taken if isinstance(writer, _DictionaryWriter) else frozenset()


def constant_dictionary(value: pa.Scalar, rows: int) -> pa.DictionaryArray:
    """``rows`` times the string ``value``, as a dictionary array of that one value."""
    indices = pa.nulls(rows, pa.int32()).fill_null(0)
    return pa.DictionaryArray.from_arrays(indices, pa.array([value.as_py()], value.type))


def with_dictionaries(schema: pa.Schema, names: Collection[str]) -> pa.Schema:
    """``schema`` with its columns ``names`` typed as dictionaries (int32 indices) of their type."""
    return pa.schema(
        [f.with_type(pa.dictionary(pa.int32(), f.type)) if f.name in names else f for f in schema]
    )


def _with_strings(schema: pa.Schema, names: Collection[str]) -> pa.Schema:
    """``schema`` with its dictionary columns ``names`` typed as their values."""
    return pa.schema(
        [f.with_type(f.type.value_type) if f.name in names else f for f in schema],
        metadata=schema.metadata,
    )


def _byte_array(t: pa.DataType) -> bool:
    """Whether Parquet stores ``t`` as BYTE_ARRAY (the only type DELTA_LENGTH_BYTE_ARRAY takes)."""
    return bool(
        pa.types.is_string(t)
        or pa.types.is_large_string(t)
        or pa.types.is_binary(t)
        or pa.types.is_large_binary(t)
    )


def digest_encoding(schema: pa.Schema, dictionary: bool | list[str]) -> dict[str, str] | None:
    """The digest columns' Parquet encoding: DELTA_LENGTH_BYTE_ARRAY (None: writer default).

    PLAIN stores a 4-byte length before each 16-byte digest, which zstd then
    works to squeeze out of random bytes; DELTA_LENGTH_BYTE_ARRAY stores the
    lengths apart, delta-coded to almost nothing, and the digests back to
    back. On 500k rows of both digest columns: 16.0 instead of 17.1 MB,
    ~20% less CPU to write and ~40% less to read (a copy-on-write reads
    and writes every digest of the files it rewrites). Every Parquet reader
    the lake serves (DuckDB, delta-rs, pyarrow, Spark) decodes it. Not with
    ``dictionary`` True (every column, nested schemas): the two are exclusive.
    """
    if dictionary is True:
        return None
    chosen = {
        f.name: "DELTA_LENGTH_BYTE_ARRAY"
        for f in schema
        if f.name in _NO_DICTIONARY and _byte_array(f.type)
    }
    return chosen or None


def digest_settings(
    schema: pa.Schema, compression: str, encoding: dict[str, str] | None
) -> tuple[str | dict[str, str], bool | list[str]]:
    """Each leaf column's codec, and the columns given statistics: all but the digests.

    Binary digests (identity encoding v2) are random bytes: zstd spends its
    time on them for nothing (on a narrow Delivery, 16.00 MB either way);
    hex ones (v1) stay compressed, their text holding half the bits. No
    digest's min/max, compared value by value, lets a reader skip anything
    (every row group spans nearly the whole range). ``encoding`` names the
    digests (see :func:`digest_encoding`); without it, the writer's defaults.
    """
    leaves = _leaf_paths(schema) if encoding else None
    if not encoding or leaves is None:
        return compression, True
    paths = [p for group in leaves for p in group]
    raw = {n for n in encoding if pa.types.is_binary(schema.field(n).type)}
    codecs = {p: "none" if p in raw else compression for p in paths}
    return codecs, [p for p in paths if p not in encoding]


class RowGroups:
    """Gathers a writer's batches into full row groups of ``rows`` rows, or ``max_bytes``.

    Each ``write_table`` call is a row group of its own, so batches written
    as they come make as many row groups as batches. Here small batches wait
    until a whole row group is there (memory holds at most one row group of
    them); ``close`` writes the remainder. Wide rows close a row group at
    ``max_bytes`` of Arrow data before its ``rows``: two writers each
    gathering 65,536 rows of a wide table held ~60 MB more at a Deliveries'
    peak (a CDC backlog of 500k wide rows). Rows of megabytes
    (``LARGE_ROW_BYTES`` on average) close it at ``LARGE_GROUP_BYTES``: a
    row group of 5-10 MB byte strings held three of them (22 MB) and their
    encoding, in the Deliveries' writer and in a commit's rewrite alike
    (bench/RESULTS.md, forty-eighth session).
    """

    def __init__(
        self, writer: pq.ParquetWriter, rows: int | None = None, max_bytes: int | None = None
    ) -> None:
        self.writer = writer
        self.rows = rows or ROW_GROUP_ROWS
        self.max_bytes = max_bytes or ROW_GROUP_BYTES
        self._group: list[pa.RecordBatch] = []
        self._grouped = 0
        self._bytes = 0

    def add(self, batch: pa.RecordBatch) -> None:
        """Take ``batch``; write every row group it completes."""
        self._group.append(batch)
        self._grouped += batch.num_rows
        self._bytes += batch.nbytes
        if self._grouped >= self.rows:
            self._write(self._grouped - self._grouped % self.rows)
        elif self._bytes >= self.max_bytes or (
            self._bytes >= LARGE_GROUP_BYTES and self._bytes >= LARGE_ROW_BYTES * self._grouped
        ):
            self._write(self._grouped)

    def close(self) -> None:
        """Write what is left (a last, shorter row group)."""
        if self._grouped:
            self._write(self._grouped)

    def _write(self, rows: int) -> None:
        table = pa.Table.from_batches(self._group)
        self.writer.write_table(table.slice(0, rows), row_group_size=self.rows)
        self._group = table.slice(rows).to_batches()
        self._grouped -= rows
        self._bytes = sum(b.nbytes for b in self._group)


def _data_file_name() -> str:
    return f"part-{uuid.uuid4()}-c000.zstd.parquet"


#: A linked file: (path, Delta statistics JSON), and the sha256 of its bytes when known.
LinkedFile = tuple[Path, str] | tuple[Path, str, str]


def linked_name(content_hash: str) -> str:
    """The table's name for a linked file whose bytes have the sha256 ``content_hash``.

    Named after its bytes, the table file of a Delivery is found by name: the
    raw layer copies it (server-side on an object store) instead of uploading
    the same bytes again, and a Delivery lost from the raw layer is restored
    from it without reading every table file.
    """
    return f"part-{content_hash[:32]}-c000.zstd.parquet"


def link_data_files(
    table: str | Path, files: Sequence[LinkedFile], store: LakeStore | None = None
) -> list[Any]:
    """Register finished Parquet files as new data files of ``table``; return their add actions.

    Each ``(file, stats_json[, sha256])`` is hard-linked into the table
    directory, so its rows are neither read nor rewritten; across filesystems
    it is copied, and to an object store uploaded as it is. A file given its
    sha256 is named after it (:func:`linked_name`). Files without rows are
    skipped: an add action for them would only cost readers.
    """
    store = store or LakeStore.at(table)
    store.makedirs(table)
    actions: list[Any] = []
    for file, stats, *digest in files:
        if json.loads(stats)["numRecords"] == 0:
            continue
        name = linked_name(digest[0]) if digest else _data_file_name()
        target = store.child(table, name)
        # (named after its bytes: a retried commit's upload is already there)
        if not (digest and store.exists(target) and store.size(target) == file.stat().st_size):
            store.put(file, target)
        actions.append(_add_action(name, os.path.getsize(file), stats))
    return actions


def link_or_copy(source: Path, target: Path) -> None:
    """``target`` as a hard link of ``source`` (the same bytes, not written again), else a copy.

    A copy where a link is refused (another filesystem, a store without links).
    """
    try:
        os.link(source, target)
    except OSError:
        shutil.copyfile(source, target)


def _add_action(name: str, size: int, stats: str) -> Any:
    from deltalake.transaction import AddAction

    return AddAction(
        path=name,
        size=size,
        partition_values={},
        modification_time=int(time.time() * 1000),
        data_change=True,
        stats=stats,
    )
