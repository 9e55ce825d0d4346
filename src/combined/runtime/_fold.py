"""A snapshot re-capture that the source says is unchanged, confirmed without md5.

Hashing every row's identity and payload (md5 of the canonical texts,
``docs/identity.md``) costs more CPU than reading the rows. A table that did
not change since its last capture needs none of it: it only has to be shown
equal to what that capture committed. So a snapshot mirror's capture also
folds its rows with DuckDB's vectorised 64-bit ``hash()`` (about a
twentieth of the md5's CPU), and the lake commit records the fold
(``capture_fold`` in its metadata) with a marker the source gives of its
own state (PostgreSQL: the table's storage and write counters).

The next capture whose source marker is the recorded one (nothing was
written, as far as the source's statistics tell) stages its rows without
md5 and folds them the same way. Equal folds over the same columns, row
count, DuckDB version and lake table version: the capture is the committed
one, and nothing changes. Any difference (statistics that lag a write, a
changed row, another DuckDB) hashes the staged rows then, and the capture
reduces as any other. The marker only chooses the order of the work; the
fold decides.

The fold is two sums, over every row, of the row's ``hash()`` with its
columns in order and in reverse: order-free (a source returns its rows in
any order), repeats counted. A changed row escapes it only if each of its
changed values hashes as the old value did (a 64-bit collision); the next
capture after any write to the table compares every row's md5 again.
Columns are hashed as DuckDB scans Arrow, after casting the types it would
scan with a loss (durations, ``date64``, ``float16``, 256-bit decimals) to
ones it scans exactly. A decimal DuckDB would hash as a 128-bit integer is
hashed as a 64-bit one where its value fits, else as its text; a text or
bytes twice, 4 bytes apart (DuckDB's hash
of them mixes a change to bytes 7 and 15 into 8 bits: :func:`_terms`).
A list of scalars is hashed with its length (DuckDB hashes a null, an
empty and a ``[null]`` list alike); a struct, a map or a list of lists is
not folded at all: DuckDB's hash of them loses their structure
(:func:`_scalar_list`), and their rows are hashed as they are read.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from combined.delivery import VECTOR_ROWS, scan_weight
from combined.protocol.identity import narrowed_decimal_sql, quote_ident

if TYPE_CHECKING:
    import duckdb

#: Names the fold's encoding: another DuckDB may hash the same value otherwise.
FOLD_KIND = "duckdb-hash-sum3"
#: DuckDB bytes (``scan_weight``: a list's elements 16 bytes each) of rows folded at once.
SLICE_BYTES = 8 * 2**20


def fold_encoding() -> str:
    """The fold's encoding and the DuckDB that computes it: folds compare only within one."""
    import duckdb

    return f"{FOLD_KIND}/{duckdb.__version__}"


@dataclass
class Fold:
    """A running fold of a capture's rows (see the module's docstring)."""

    #: The folded columns as ``name: Arrow type`` (the first group's; None once invalid).
    columns: list[str] | None = None
    rows: int = 0
    forward: int = 0
    backward: int = 0

    def add(self, con: duckdb.DuckDBPyConnection, table: pa.Table) -> None:
        """Fold ``table``'s rows (its ``_combined_`` columns left out) into this fold."""
        if self.columns == []:
            return  # invalid: a group could not be folded, or its columns moved
        columns = capture_columns(table.schema)
        if self.columns is None:
            self.columns = columns
        prepared = _foldable(table)
        if columns != self.columns or prepared is None:
            self.columns = []
            return
        if prepared.num_rows == 0:
            return
        terms = _terms(prepared.schema)
        # Slices of ``SLICE_BYTES`` as DuckDB holds them where its vector of
        # rows would weigh more: a group of 286 rows of three lists of 5,000
        # strings, folded whole, held ~100 MB of vectors. (Narrower rows go
        # whole: their vectors are small, and slices cost a tenth more.)
        weight = sum(scan_weight(b) for b in prepared.to_batches())
        step = max(1, SLICE_BYTES * prepared.num_rows // max(weight, 1))
        step = prepared.num_rows if step >= VECTOR_ROWS else step
        for offset in range(0, prepared.num_rows, step):
            con.register("_fold_rows", prepared.slice(offset, step))
            try:
                rows, forward, backward = con.execute(
                    f"SELECT count(*), sum(hash({', '.join(terms)}))::HUGEINT, "
                    f"sum(hash({', '.join(reversed(terms))}))::HUGEINT FROM _fold_rows"
                ).fetchall()[0]
            finally:
                con.unregister("_fold_rows")
            self.rows += int(rows)
            self.forward += int(forward)
            self.backward += int(backward)

    def record(self, marker: str) -> dict[str, Any] | None:
        """What the lake commit keeps of this fold (None if it is not valid)."""
        if not self.columns:
            return None
        return {
            "encoding": fold_encoding(),
            "marker": marker,
            "columns": self.columns,
            "rows": self.rows,
            "forward": str(self.forward),
            "backward": str(self.backward),
        }

    def matches(self, recorded: Mapping[str, Any]) -> bool:
        """Whether this fold is the recorded one: same columns, rows and sums."""
        return bool(self.columns) and (
            recorded.get("columns") == self.columns
            and recorded.get("rows") == self.rows
            and recorded.get("forward") == str(self.forward)
            and recorded.get("backward") == str(self.backward)
        )


def capture_columns(schema: pa.Schema) -> list[str]:
    """A capture's payload columns as its commit records them: ``name: Arrow type``.

    The next capture compares its rows with the lake by value only where its
    own are these (``capture._values``): the canonical text of a value
    depends on its staged type, which the lake's type may not tell.
    """
    return [f"{f.name}: {f.type}" for f in schema if not _control(f.name)]


def expected_fold(
    last: Mapping[str, Any] | None,
    marker: str | None,
    rows_kept_since: Callable[[int], bool],
    kept: Mapping[str, Any] | None = None,
) -> Mapping[str, Any] | None:
    """The recorded fold a capture with source ``marker`` may be checked against, or None.

    It is the newest Combined commit's, in this fold encoding, under the same
    source marker, on a table no commit changed since (``rows_kept_since``
    its version: only compactions and vacuums after it). ``kept`` is the
    fold of a later capture that changed nothing (:func:`kept_fold`): it
    is taken under its own marker, on a table no commit changed since the
    version that capture read.
    """
    if not (last and marker):
        return None
    own = (last.get("capture_fold"), last.get("lake_version"))
    for recorded, version in (own, (kept, _read_at(kept, last))):
        if (
            isinstance(recorded, Mapping)
            and recorded.get("encoding") == fold_encoding()
            and recorded.get("marker") == marker
            and isinstance(version, int)
            and rows_kept_since(version)
        ):
            return recorded
    return None


def kept_fold(
    fold: Mapping[str, Any] | None, last: Mapping[str, Any] | None, version: int | None
) -> dict[str, Any] | None:
    """What the catalog keeps of a capture that changes nothing: its fold, and where.

    Such a capture's rows are the ones the table held at lake ``version``
    (the one it read, after Combined's commit ``last``), so its fold under
    its own marker is that version's. None without a fold or a commit.
    """
    if fold is None or not last or version is None:
        return None
    return {**fold, "read": {"after_run": last.get("run_id"), "lake_version": version}}


def _read_at(kept: Mapping[str, Any] | None, last: Mapping[str, Any]) -> int | None:
    """The lake version a kept fold was read at, where it followed commit ``last``."""
    read = kept.get("read") if isinstance(kept, Mapping) else None
    if not isinstance(read, Mapping) or read.get("after_run") != last.get("run_id"):
        return None  # (folded on another table, or before another commit)
    version = read.get("lake_version")
    return version if isinstance(version, int) else None


def _control(name: str) -> bool:
    return name.startswith("_combined_")


def _foldable(table: pa.Table) -> pa.Table | None:
    """``table``'s payload columns in types DuckDB scans exactly, or None if one has none."""
    arrays, names = [], []
    for f, col in zip(table.schema, table.columns, strict=True):
        if _control(f.name):
            continue
        exact = _exact(col, f.type)
        if exact is None:
            return None
        arrays.append(exact)
        names.append(f.name)
    return pa.Table.from_arrays(arrays, names=names)


def _exact(col: pa.ChunkedArray, t: pa.DataType) -> pa.ChunkedArray | None:
    """``col`` as a column DuckDB scans without losing a value's difference."""
    if isinstance(t, pa.BaseExtensionType):  # (a UUID as its 16 bytes: see _terms)
        return _exact(
            pa.chunked_array([c.storage for c in col.chunks], t.storage_type), t.storage_type
        )
    if pa.types.is_dictionary(t):
        return _exact(col.cast(t.value_type), t.value_type)
    if pa.types.is_duration(t) or pa.types.is_date64(t):
        return pc.cast(col, pa.int64())  # (DuckDB: an INTERVAL of microseconds; a DATE)
    if pa.types.is_float16(t):
        return pc.cast(col, pa.float32())
    if isinstance(t, pa.Decimal256Type):
        return pc.cast(col, pa.string())
    return col if _scalar(t) or _scalar_list(t) else None


def _terms(schema: pa.Schema) -> list[str]:
    """SQL: the values a row's hash covers: each column, and each list's length.

    DuckDB hashes a list as the combination of its elements' hashes: a null
    list, an empty one and one holding a single null hash alike. Its
    length tells them apart (null, 0, 1).

    DuckDB hashes a 128-bit integer (a decimal of 19 to 38 digits, a UUID)
    as its two halves' hashes xor-ed: -1 (both halves all ones) as 0, ``x``
    as ``x * 2**64``. Such decimals are hashed apart from their halves
    (:func:`_wide_hash`).

    DuckDB hashes a text or bytes 8 bytes at a time, xor-ing each into a
    state it then multiplies: a byte's change reaches only the state's bits
    above it, and changes to the last byte of two 8-byte words (bytes 7 and
    15) meet in 8 bits (one such change in 256 hashes as the value did).
    Such a value is hashed twice, the second time 4 bytes further on, where
    those bytes are mixed into 40 bits or more.
    """
    terms = []
    for f in schema:
        name, listed = quote_ident(f.name), _scalar_list(f.type)
        inner = f.type.value_type if listed else f.type
        if _wide(inner):
            term = _wide_hash(inner, "v" if listed else name)
            terms.append(f"list_transform({name}, lambda v: {term})" if listed else term)
        else:
            terms.append(name)
        shift = _shifted(inner)
        if shift is not None:
            v = shift.format("v")
            terms.append(f"list_transform({name}, lambda v: {v})" if listed else shift.format(name))
        if listed:
            terms.append(f"len({name})")
    return terms


def _shifted(t: pa.DataType) -> str | None:
    """SQL (a format of the value) of a text or bytes 4 bytes further on; None for others."""
    if any(is_text(t) for is_text in _TEXT):
        return "('fold' || {})"
    if any(is_bytes(t) for is_bytes in _BYTES):
        return "(CAST('fold' AS BLOB) || {})"
    return None


def _wide_hash(t: pa.Decimal128Type, value: str) -> str:
    """SQL: the hash of a decimal of 19 to 38 digits, ``value``, apart from its two halves.

    A value that fits 18 digits at its scale is hashed as that 64-bit
    decimal (DuckDB mixes a 64-bit integer fully), any other as its text,
    which costs ~15 times more to produce. A value always takes the same
    branch, and a null the second.
    """
    text = f"hash(CAST({value} AS VARCHAR))"
    narrowed = narrowed_decimal_sql(value, t.scale)
    if narrowed is None:
        return text
    fits, narrow = narrowed
    return f"CASE WHEN {fits} THEN hash({narrow}) ELSE {text} END"


def _wide(t: pa.DataType) -> bool:
    """Whether DuckDB scans ``t`` as a 128-bit integer: a decimal of more than 18 digits."""
    return isinstance(t, pa.Decimal128Type) and t.precision > 18


_TEXT = (pa.types.is_string, pa.types.is_large_string, pa.types.is_string_view)
_BYTES = (
    pa.types.is_binary,
    pa.types.is_large_binary,
    pa.types.is_binary_view,
    pa.types.is_fixed_size_binary,
)

#: The scalar types DuckDB scans as Arrow holds them (a 128-bit decimal: to 38 digits).
_EXACT = (
    pa.types.is_integer,
    pa.types.is_boolean,
    pa.types.is_float32,
    pa.types.is_float64,
    *_TEXT,
    *_BYTES,
    pa.types.is_date32,
    pa.types.is_timestamp,
    pa.types.is_time,
    pa.types.is_null,
    lambda t: isinstance(t, pa.Decimal128Type),
)


def _scalar(t: pa.DataType) -> bool:
    """Whether DuckDB scans every value of scalar type ``t`` as a value of its own."""
    return any(exact(t) for exact in _EXACT)


def _scalar_list(t: pa.DataType) -> bool:
    """Whether ``t`` is a list of such scalars (hashed with its length: :func:`_terms`).

    A struct, a map or a list of lists is not folded: DuckDB's hash of a
    nested value combines its leaves' hashes and loses where one list ends
    and the next begins (``[[1], [2]]`` hashes as ``[[1, 2]]``), and a null
    struct as one whose fields are all null.
    """
    lists = (pa.types.is_list, pa.types.is_large_list, pa.types.is_fixed_size_list)
    return any(is_list(t) for is_list in lists) and _scalar(t.value_type)
