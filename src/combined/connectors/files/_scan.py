"""Reading a listed file set with DuckDB: the scan, its schema, and its failures named.

The CSV dialect is pinned (header, delimiter, quote, escape, no comment
lines, no skipped lines) instead of sniffed: a sniffer that guesses may
read a malformed file as another dialect and lose rows without an error.
Column types are inferred once per read over every listed file
(``union_by_name``), unless declared.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
from duckdb.sqltypes import DuckDBPyType

from combined.connectors.files._instants import refuse_finer_than_microseconds
from combined.connectors.files._listing import Listing
from combined.connectors.files._settings import FileSet, Format
from combined.errors import CombinedError, NotFoundError, SchemaMismatch, SourceError

#: Errors DuckDB raises while binding or scanning files.
DUCKDB_ERRORS: tuple[type[BaseException], ...] = (duckdb.Error,)


def quote_ident(name: str) -> str:
    """``name`` as a DuckDB identifier."""
    return '"' + name.replace('"', '""') + '"'


def literal(text: str) -> str:
    """``text`` as a DuckDB string literal."""
    return "'" + text.replace("'", "''") + "'"


#: The most memory DuckDB's buffers take for one read. Unbounded, DuckDB takes up
#: to 80% of the host's memory: the capture of a 2.2 GB CSV file (inferring its
#: types from every row, then reading it) peaked at 3.5 GB; bounded, at 515 MB,
#: in the same time: DuckDB drops buffers it can read from the file again.
READ_MEMORY = "256MB"


def connect() -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB for one read: UTC session, no extension downloads, bounded
    memory, nothing spilled (to a ``.tmp`` directory in the working directory)."""
    con = duckdb.connect(
        config={
            "autoinstall_known_extensions": False,
            "memory_limit": READ_MEMORY,
            # Each thread holds buffers of a row's longest (64 MiB): two threads
            # need more than READ_MEMORY, and read a 2.2 GB CSV capture no faster.
            "threads": 1,
            "temp_directory": "",
        }
    )
    # Past 2 s, DuckDB draws a progress bar on stdout, even into a pipe.
    con.execute("SET enable_progress_bar_print = false")
    # Zoned timestamps come out in UTC whatever the host's zone.
    con.execute("SET TimeZone = 'UTC'")
    return con


# DuckDB would otherwise detect key=value directory names (year=2024/) and
# add them as columns, overriding a file's own column of that name and
# appearing or vanishing with the layout of the other files listed.
_NO_HIVE = "hive_partitioning = false"

# Types (and JSON keys) are inferred from every row, not DuckDB's first
# 20,480: past the sample a JSON key is dropped without a word, and a CSV
# value is cast leniently to the sampled type ('01234' read as 1234 and
# '1.5e0' as 2 in a BIGINT column). The price is one more parse per file.
_WHOLE_SAMPLE = "sample_size = -1"


#: The longest CSV row read (64 MiB): DuckDB's default, 2,000,000 bytes, refused a
#: valid file holding a document or an image's base64 text in one field.
MAX_CSV_ROW = 64 * 1024 * 1024


def _type_map(pairs: Sequence[tuple[str, str]]) -> str:
    """Column names and DuckDB types as a DuckDB map literal."""
    return "{" + ", ".join(f"{literal(n)}: {literal(t)}" for n, t in pairs) + "}"


def scan(
    file_set: FileSet,
    fmt: Format,
    listing: Listing,
    typed: Sequence[tuple[str, str]] | None = None,
    wide: bool = False,
) -> str:
    """The DuckDB table expression reading exactly ``listing``'s files.

    ``typed`` (from :func:`infer`) gives every column's type, so the read
    parses each file once instead of inferring the types again from every row.
    ``wide`` infers every JSON object as a struct, never a MAP.
    """
    files = "[" + ", ".join(literal(p) for p in listing.paths()) + "]"
    d = file_set.dialect
    if fmt == "csv":
        tab = file_set.glob.lower().removesuffix(".gz").removesuffix(".zst").endswith(".tsv")
        delimiter = d.delimiter or ("\t" if tab else ",")
        quote = d.quote or '"'
        opts = [
            f"header = {'true' if d.header is not False else 'false'}",
            f"delim = {literal(delimiter)}",
            f"quote = {literal(quote)}",
            f"escape = {literal(quote)}",
            "comment = ''",
            "skip = 0",
            "strict_mode = true",
            "null_padding = false",
            f"max_line_size = {MAX_CSV_ROW}",
            # DuckDB's buffers default to 16 times the longest row (1 GiB each),
            # which no bounded memory (READ_MEMORY) holds.
            f"buffer_size = {MAX_CSV_ROW}",
            "union_by_name = true",
            _NO_HIVE,
        ]
        if d.encoding:
            opts.append(f"encoding = {literal(d.encoding)}")
        if typed is not None:
            opts.append(f"types = {_type_map(typed)}")
        else:
            opts.append(_WHOLE_SAMPLE)
            if file_set.columns:
                opts.append(f"types = {_type_map(file_set.columns)}")
        return f"read_csv({files}, {', '.join(opts)})"
    if fmt == "json":
        how = _WHOLE_SAMPLE if typed is None else f"columns = {_type_map(typed)}"
        how += ", map_inference_threshold = -1" if wide else ""
        return (
            f"read_json({files}, format = 'auto', records = true, union_by_name = true, "
            f"{how}, {_NO_HIVE})"
        )
    return f"read_parquet({files}, union_by_name = true, {_NO_HIVE})"


def infer(
    con: duckdb.DuckDBPyConnection, file_set: FileSet, fmt: Format, listing: Listing
) -> list[tuple[str, str]] | None:
    """Each column of the files and its DuckDB type, from every row, declared types as declared.

    One parse of the files, once per read: the read then parses them once
    more with these types (:func:`scan`), where it inferred them again. A JSON
    column inferred DOUBLE that holds an integer no double keeps exactly
    (beyond 2**53) reads as DECIMAL(38, 0), or is refused (:func:`_exact_numbers`);
    so does a CSV column inferred DOUBLE.
    A Parquet nanosecond column holding a value finer than a microsecond is
    refused (:func:`refuse_finer_than_microseconds`).
    ``None`` for Parquet, whose footers type the columns, and for JSON keys
    DuckDB renamed (:func:`_renamed`): such reads infer their types again.
    """
    source = scan(file_set, fmt, listing)
    try:
        found = describe(con, f"SELECT * FROM {source}")
    except DUCKDB_ERRORS as exc:
        if fmt != "json" or "non-record" not in str(exc):
            raise
        # DuckDB infers an object of 200 keys or more as a MAP, then refuses such
        # records as 'non-record JSON': they are inferred as objects (structs).
        found = describe(con, f"SELECT * FROM {scan(file_set, fmt, listing, wide=True)}")
    if fmt == "parquet":
        refuse_finer_than_microseconds(con, file_set, found, source, quote_ident)
        return None
    if fmt == "json" and _renamed([n for n, _ in found]):
        _refuse_rounded_beside_case(con, file_set, listing, found)
        return None
    declared = file_set.types
    typed = [(n, declared.get(n, t)) for n, t in found]
    huge = next((n for n, t in typed if t in ("BIGNUM", "VARINT") and n not in declared), None)
    huge = huge or _past_38_digits(con, file_set, fmt, listing, typed, declared)
    if huge is not None:
        raise SchemaMismatch(
            f"column {huge!r} of file set {file_set.name!r} holds integers of more than 38 "
            "digits, which no number type of the lake holds, so nothing was read",
            hint=f"declare the column's type under `columns:` ({huge}: VARCHAR keeps the "
            "text); nothing was committed",
            relation=file_set.name,
            column=huge,
        )
    doubles = [n for n, t in typed if t == "DOUBLE" and n not in declared]
    if doubles:
        exact = _exact_numbers(con, file_set, fmt, listing, typed, doubles)
        typed = [(n, exact.get(n, t)) for n, t in typed]
    if fmt == "json":
        nested = {n: paths for n, t in found if n not in declared and (paths := _double_paths(t))}
        if nested:
            _refuse_rounded(con, file_set, listing, nested)
    return typed


#: 10**38: a HUGEINT at or past it has 39 digits, more than any lake decimal holds.
_DIGITS_38 = "'100000000000000000000000000000000000000'::HUGEINT"


def _past_38_digits(
    con: duckdb.DuckDBPyConnection,
    file_set: FileSet,
    fmt: Format,
    listing: Listing,
    typed: Sequence[tuple[str, str]],
    declared: Mapping[str, str],
) -> str | None:
    """The first column inferred HUGEINT that holds an integer of 39 digits (DuckDB's
    HUGEINT reaches 2**127; the lake's decimal, 38 digits), else None."""
    huge = [n for n, t in typed if t == "HUGEINT" and n not in declared]
    if not huge:
        return None
    tests = ", ".join(
        f"bool_or({quote_ident(n)} >= {_DIGITS_38} OR {quote_ident(n)} <= -{_DIGITS_38})"
        for n in huge
    )
    (row,) = con.execute(f"SELECT {tests} FROM {scan(file_set, fmt, listing, typed)}").fetchall()
    return next((n for n, past in zip(huge, row, strict=True) if past), None)


def _renamed(names: Sequence[str]) -> bool:
    """Whether DuckDB may have renamed a JSON key: ``name_1`` beside ``Name`` or ``name``.

    Keys that differ only in case are one column name to DuckDB, so it names
    the second ``name_1``: a read given that name as a type would look for a
    key ``name_1`` and read NULLs. Such files are read as inferred, without
    ``columns`` (their numbers unchecked, :func:`_exact_numbers`).
    """
    lower = {n.lower() for n in names}
    return any(
        (m := re.fullmatch(r"(.+)_\d+", n)) is not None and m.group(1).lower() in lower
        for n in names
    )


#: A number's text in digits, with a fraction or an exponent (not ``inf`` or ``nan``).
_NUMBER = r"[-+]?([0-9]+[.]?[0-9]*|[.][0-9]+)([eE][-+]?[0-9]+)?"


def _exact_numbers(
    con: duckdb.DuckDBPyConnection,
    file_set: FileSet,
    fmt: Format,
    listing: Listing,
    typed: Sequence[tuple[str, str]],
    doubles: list[str],
) -> dict[str, str]:
    """The type each number column inferred DOUBLE needs to keep its values as written.

    DuckDB reads a JSON integer beyond 64 bits, or a CSV one beyond 64 bits
    or beside a fraction in another row or file, as a double: it rounded
    12345678901234567890123 to 1.2345678901234568e+22, and 9007199254740993
    to 9007199254740992, without a word, and 1e400 became infinity. Their
    text is read here (one more parse, paid only where a column is DOUBLE):
    integers only, up to 38 digits, read as DECIMAL(38, 0); an integer a
    double cannot keep beside fractions, of more than 38 digits, or a number
    past a double's range is refused.
    """
    # A CSV read is given every column's type (the rest as inferred); JSON reads the keys named.
    as_text = [(n, "VARCHAR") for n in doubles]
    if fmt == "csv":
        as_text = [(n, "VARCHAR" if n in doubles else t) for n, t in typed]
    exact: dict[str, str] = {}
    facts = _number_facts(con, scan(file_set, fmt, listing, as_text), doubles)
    for n, (inexact, fractions, digits, overflow) in zip(doubles, facts, strict=True):
        if not inexact and not overflow:
            continue
        if not overflow and not fractions and digits <= 38:
            exact[n] = "DECIMAL(38, 0)"
            continue
        raise SchemaMismatch(
            f"column {n!r} of file set {file_set.name!r} holds "
            + (
                "numbers past a double's range"
                if overflow
                else "integers beyond 2**53 beside fractions"
                if fractions
                else "integers of more than 38 digits"
            )
            + ": read as numbers they would be rounded, so nothing was read",
            hint=f"declare the column's type under `columns:` ({n}: VARCHAR keeps the text"
            + (", DECIMAL(38, s) keeps both when they fit" if fractions else "")
            + "); nothing was committed",
            relation=file_set.name,
            column=n,
        )
    return exact


def _number_facts(
    con: duckdb.DuckDBPyConnection, texts: str, columns: Sequence[str]
) -> list[tuple[bool, bool, int, bool]]:
    """For each of ``columns`` read as text by the scan ``texts``: whether an integer
    a double would round is there, whether a fraction is, the most digits, and
    whether a number is past a double's range."""
    parts = []
    for n in columns:
        c = quote_ident(n)
        whole = f"regexp_full_match({c}, '-?[0-9]+')"
        finite = f"regexp_full_match(trim({c}), '{_NUMBER}')"
        parts += [
            f"bool_or({_rounded(c)})",
            f"bool_or(NOT {whole})",
            f"max(length(ltrim({c}, '-')))",
            f"bool_or({finite} AND isinf(TRY_CAST(trim({c}) AS DOUBLE)))",
        ]
    (row,) = con.execute(f"SELECT {', '.join(parts)} FROM {texts}").fetchall()
    return [
        (bool(row[i]), bool(row[i + 1]), int(row[i + 2] or 0), bool(row[i + 3]))
        for i in range(0, len(row), 4)
    ]


def _refuse_rounded_beside_case(
    con: duckdb.DuckDBPyConnection,
    file_set: FileSet,
    listing: Listing,
    found: Sequence[tuple[str, str]],
) -> None:
    """Refuse a JSON number a double would round in files whose keys differ only in case.

    Such files are read as inferred (:func:`_renamed`): a DOUBLE column is read
    as a double, declared or not (a declared type is cast from it), so an
    integer a double rounds, or a number past its range, cannot be kept
    exactly. Each key that does not clash is read as text to find one; one that
    clashes cannot be named to DuckDB apart from its twin, and is not checked.
    """
    clash = _clashing([n for n, _ in found])
    doubles = [n for n, t in found if t == "DOUBLE" and n not in clash]
    texts = scan(file_set, "json", listing, [(n, "VARCHAR") for n in doubles])
    facts = _number_facts(con, texts, doubles) if doubles else []
    column = next((n for n, f in zip(doubles, facts, strict=True) if f[0] or f[3]), None)
    if column is None:
        nested = {n: paths for n, t in found if n not in clash and (paths := _double_paths(t))}
        column = _first_rounded(con, file_set, listing, nested) if nested else None
    if column is not None:
        raise SchemaMismatch(
            f"column {column!r} of file set {file_set.name!r} holds numbers a double would "
            "round, and its files hold keys that differ only in case "
            f"({', '.join(sorted(clash))}), which keeps the read from reading them as "
            "written, so nothing was read",
            hint="write the keys that differ only in case under distinct names, or the "
            f"numbers of {column!r} as text; nothing was committed",
            relation=file_set.name,
            column=column,
        )


def _clashing(names: Sequence[str]) -> set[str]:
    """The columns of keys that differ only in case (``Name``, ``name_1``)."""
    twins = {
        m.group(1).lower()
        for n in names
        if (m := re.fullmatch(r"(.+)_\d+", n)) is not None
        and m.group(1).lower() in {o.lower() for o in names if o != n}
    }
    return {
        n
        for n in names
        if n.lower() in twins
        or ((m := re.fullmatch(r"(.+)_\d+", n)) is not None and m.group(1).lower() in twins)
    }


def _double_paths(duckdb_type: str) -> list[str]:
    """The JSONPaths of the DOUBLE values inside a nested type (none for a plain one).

    ``STRUCT(a DOUBLE, b STRUCT(c DOUBLE[]))`` has ``$."a"`` and ``$."b"."c"[*]``.
    """
    if duckdb_type == "DOUBLE" or "DOUBLE" not in duckdb_type:
        return []
    paths: list[str] = []

    def walk(t: object, path: str) -> None:
        if not isinstance(t, DuckDBPyType):
            return  # (an array's size, an enum's values)
        if t.id == "double":
            paths.append(path)
        elif t.id == "struct":
            for name, child in t.children:
                walk(child, path + "." + json.dumps(name))
        elif t.id in ("list", "array"):
            walk(t.children[0][1], path + "[*]")
        elif t.id == "map":
            walk(t.children[1][1], path + ".*")

    walk(duckdb.sqltype(duckdb_type), "$")
    return paths


def _first_rounded(
    con: duckdb.DuckDBPyConnection,
    file_set: FileSet,
    listing: Listing,
    nested: Mapping[str, list[str]],
) -> str | None:
    """The first of the ``nested`` columns holding, inside its objects or arrays, an
    integer a double would round (each read as JSON text), else None."""
    texts = scan(file_set, "json", listing, [(n, "JSON") for n in nested])
    checks = []
    for n, paths in nested.items():
        # A path through an array gives a list of its values, any other one value.
        extracted = [f"json_extract({quote_ident(n)}, {_literal(p)})" for p in paths]
        values = ", ".join(
            e if "*" in p else f"[{e}]" for e, p in zip(extracted, paths, strict=True)
        )
        checks.append(
            f"(SELECT {_literal(n)} AS name FROM (SELECT unnest(flatten([{values}]))::VARCHAR "
            f"AS v FROM {texts}) WHERE {_rounded('v')} LIMIT 1)"
        )
    found = con.execute(" UNION ALL ".join(checks)).fetchall()
    return str(found[0][0]) if found else None


def _refuse_rounded(
    con: duckdb.DuckDBPyConnection,
    file_set: FileSet,
    listing: Listing,
    nested: Mapping[str, list[str]],
) -> None:
    """Refuse JSON numbers inside objects or arrays that a double would round.

    As :func:`_exact_numbers` for a nested value's DOUBLE fields: each is
    read as written (the column as JSON text, each path's values drawn from
    it), and an integer a double cannot keep fails the read, naming the column.
    """
    column = _first_rounded(con, file_set, listing, nested)
    if column is not None:
        raise SchemaMismatch(
            f"column {column!r} of file set {file_set.name!r} holds, inside its objects or "
            "arrays, integers beyond 2**53: read as numbers they would be rounded, so nothing "
            "was read",
            hint=f"declare the column's type under `columns:` ({column}: JSON keeps the value "
            "exactly as written); nothing was committed",
            relation=file_set.name,
            column=column,
        )


def _rounded(text: str) -> str:
    """SQL: whether the number text ``text`` is an integer a double would round."""
    digits = f"length(ltrim({text}, '-'))"
    exact = f"TRY_CAST({text} AS HUGEINT)"
    return (
        f"regexp_full_match({text}, '-?[0-9]+') AND {digits} > 15 AND ({digits} > 38 OR "
        f"{exact} IS DISTINCT FROM TRY_CAST(TRY_CAST({text} AS DOUBLE) AS HUGEINT))"
    )


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def select(
    file_set: FileSet,
    fmt: Format,
    listing: Listing,
    columns: Sequence[str] | None = None,
    typed: Sequence[tuple[str, str]] | None = None,
) -> str:
    """The query of a read: the scan, declared types cast, the named columns only."""
    source = scan(file_set, fmt, listing, typed)
    cast = {n: t for n, t in file_set.columns} if fmt != "csv" else {}
    if columns is None:
        if not cast:
            return f"SELECT * FROM {source}"
        replaced = ", ".join(
            f"CAST({quote_ident(n)} AS {t}) AS {quote_ident(n)}" for n, t in cast.items()
        )
        return f"SELECT * REPLACE ({replaced}) FROM {source}"
    items = [
        f"CAST({quote_ident(c)} AS {cast[c]}) AS {quote_ident(c)}" if c in cast else quote_ident(c)
        for c in columns
    ]
    return f"SELECT {', '.join(items)} FROM {source}"


def declared_schema(
    con: duckdb.DuckDBPyConnection, file_set: FileSet, columns: Sequence[str] | None = None
) -> pa.Schema:
    """The Arrow schema of ``file_set``'s declared columns (those of ``columns``, if named)."""
    items = [
        f"CAST(NULL AS {t}) AS {quote_ident(n)}"
        for n, t in file_set.columns
        if columns is None or n in columns
    ]
    return arrow_schema(con, f"SELECT {', '.join(items)}")


def describe(con: duckdb.DuckDBPyConnection, query: str) -> list[tuple[str, str]]:
    """The (column, DuckDB type) pairs ``query`` returns, without reading its rows."""
    rows = con.execute(f"DESCRIBE {query}").fetchall()
    return [(str(r[0]), str(r[1])) for r in rows]


def arrow_schema(con: duckdb.DuckDBPyConnection, query: str) -> pa.Schema:
    """The Arrow schema ``query``'s batches will have (binds the scan, reads no row)."""
    reader: pa.RecordBatchReader = con.sql(f"SELECT * FROM ({query}) LIMIT 0").to_arrow_reader()
    return reader.schema


def check_parquet(
    listing: Listing, relation: str, refuse_wide_in: Sequence[str] | None = ()
) -> int:
    """Check the Parquet footers agree on each shared column's type; return their rows.

    DuckDB would unify a column that is BIGINT in one file and VARCHAR in
    another into VARCHAR, silently changing every value's type. The footer
    row counts are the read's control total: counted by another reader than
    the one that reads the rows. A decimal of more than 38 digits among the
    columns ``refuse_wide_in`` names (None: every column) is refused: DuckDB
    reads it as a double.
    """
    seen: dict[str, tuple[pa.DataType, str]] = {}
    rows = 0
    for entry, path in zip(listing.entries, listing.paths(), strict=True):
        try:
            meta = pq.read_metadata(path)
        except (OSError, pa.ArrowException) as exc:
            raise SchemaMismatch(
                f"file {entry.name!r} of {relation!r} is not a readable parquet file: "
                f"{_first_line(exc)}",
                hint="replace or remove the file; nothing was committed",
                relation=relation,
                file=entry.name,
            ) from None
        rows += meta.num_rows
        for f in meta.schema.to_arrow_schema():
            if refuse_wide_in is None or f.name in refuse_wide_in:
                _refuse_wide_decimal(f, entry.name, relation)
            first = seen.setdefault(f.name, (f.type, entry.name))
            if first[0] != f.type:
                raise SchemaMismatch(
                    f"column {f.name!r} is {f.type} in file {entry.name!r} but {first[0]} in "
                    f"{first[1]!r} (file set {relation!r})",
                    hint="rewrite the odd file with the set's schema, or narrow the glob; "
                    "nothing was committed",
                    relation=relation,
                    file=entry.name,
                    column=f.name,
                )
    return rows


def _wide_decimal(t: pa.DataType) -> pa.DataType | None:
    """The first decimal of more than 38 digits in ``t`` (nested fields included)."""
    if pa.types.is_decimal(t) and t.precision > 38:
        return t
    children = [t.field(i).type for i in range(t.num_fields)]
    return next((w for w in map(_wide_decimal, children) if w is not None), None)


def _refuse_wide_decimal(f: pa.Field, name: str, relation: str) -> None:
    wide = _wide_decimal(f.type)
    if wide is None:
        return
    raise SchemaMismatch(
        f"column {f.name!r} of file {name!r} holds {wide}: DuckDB, which reads the files, "
        "keeps at most 38 digits and would read it as a double, losing digits, so nothing "
        "was read",
        hint="write the column as decimal(38, s) or as text in the files, or leave it out of "
        f"the dataset's `columns:`; nothing was committed (file set {relation!r})",
        relation=relation,
        file=name,
        column=f.name,
    )


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


_FILE_PATTERNS = (
    re.compile(r"^\s*file = (.+?)\s*$", re.MULTILINE),
    re.compile(r'file "([^"]+)"'),
    re.compile(r"[Ff]ile '([^']+)'"),
    re.compile(r"GZIP [^:\n]*: (/\S+)"),
)
_LINE_PATTERNS = (
    re.compile(r"CSV Error on Line: (\d+)"),
    re.compile(r"\bin line (\d+)"),
    re.compile(r"\bLine: (\d+)"),
)


def _find(patterns: Sequence[re.Pattern[str]], text: str) -> str | None:
    for p in patterns:
        m = p.search(text)
        if m:
            return m.group(1)
    return None


_KIND = re.compile(r"^\s*([A-Za-z ]+?) Error: ", re.MULTILINE)


def translate(exc: BaseException, listing: Listing, relation: str) -> CombinedError:
    """The Combined error for a DuckDB failure reading ``listing``, naming file and line.

    Failures met while streaming reach Python as Arrow's ``OSError`` with
    DuckDB's text, so the kind is read from the text (``Conversion Error:``),
    not from the exception's type.
    """
    if isinstance(exc, CombinedError):
        return exc
    text = str(exc)
    found = _KIND.search(text)
    kind = found.group(1).lower() if found else ""
    where, context = _where(text, listing, relation)
    detail = _detail(text.replace(str(listing.root).rstrip("/") + "/", ""))
    if kind == "binder" and "do not exist" in text:
        return NotFoundError(
            f"{where}: a declared column is not in the files: {detail}",
            hint="fix the column names under `columns:` (run `combined discover`)",
            **context,
        )
    if kind == "binder" and "Referenced column" in text:
        return NotFoundError(
            f"a column the read needs is not in the files of {relation!r}: {detail}",
            hint="run `combined discover` to see the files' columns; fix the key or columns",
            **context,
        )
    if kind == "io" and "No files found" in text:
        return SourceError(
            f"{where} vanished before it was read",
            hint="the read is retried on the next capture",
            **context,
        )
    if "GZIP" in text:
        return SchemaMismatch(
            f"{where} is not a whole gzip stream: it ends early or is corrupt",
            hint="a writer may not have finished it: have it write to a hidden name and rename "
            "the file into place when done, or remove the file; nothing was committed",
            **context,
        )
    if "Error when sniffing file" in text:
        # The dialect is pinned: the sniffer failing means rows that do not fit it.
        return SchemaMismatch(
            f"{where} does not parse as the declared dialect: a row with more or fewer "
            "fields than the header, an unclosed quote, or text in another encoding",
            hint="fix the file, or set the file set's delimiter, quote or encoding; "
            "nothing was committed",
            **context,
        )
    if kind in ("conversion", "invalid input", "binder") or "CSV Error" in text:
        hint = _unreadable_hint(kind, text)
        return SchemaMismatch(f"{where} cannot be read: {detail}", hint=hint, **context)
    return SourceError(
        f"reading {where} failed: {detail}",
        hint="check the files with `duckdb` directly",
        **context,
    )


def _where(text: str, listing: Listing, relation: str) -> tuple[str, dict[str, Any]]:
    """Where DuckDB's ``text`` says it failed (file and line), and the error's context."""
    path = _find(_FILE_PATTERNS, text)
    name = path
    if path is not None:
        name = path.removeprefix(str(listing.root).rstrip("/") + "/")
    line = _find(_LINE_PATTERNS, text)
    where = f"file {name!r}" if name else f"file set {relation!r}"
    if name and line:
        where += f" line {line}"
    context: dict[str, Any] = {"relation": relation}
    if name:
        context["file"] = name
    if line:
        context["line"] = int(line)
    return where, context


def _unreadable_hint(kind: str, text: str) -> str:
    """What to do about a value or file DuckDB cannot read."""
    lower = text.lower()
    if kind == "conversion":
        return (
            "fix the value, or declare the column's type under `columns:` "
            "(VARCHAR reads anything); nothing was committed"
        )
    if "unicode" in lower or "utf-8" in lower:
        return "set `encoding:` (utf-16 or latin-1) or convert the file to utf-8"
    if "maximum line size" in lower:
        return (
            f"a row (header and quoted line breaks included) is longer than {MAX_CSV_ROW} "
            "bytes, the most a CSV row may hold: write such values to Parquet or JSON "
            "files; nothing was committed"
        )
    if "non-record" in text:
        return (
            "write one JSON object per line (or one array of objects), each key a name: "
            'DuckDB reads a record with an empty key ("") as no record'
        )
    return "fix or remove the file; nothing was committed"


def locate(
    con: duckdb.DuckDBPyConnection,
    file_set: FileSet,
    fmt: Format,
    listing: Listing,
    columns: Sequence[str] | None = None,
) -> str | None:
    """The first listed file DuckDB cannot read alone (for a failure naming no file).

    Each file is bound, then its columns evaluated (a cast to a declared
    type fails only there): a second read, paid on a failed read only, and
    only up to the file that fails.
    """
    for entry in listing.entries:
        query = select(file_set, fmt, Listing(listing.root, (entry,)), columns)
        try:
            describe(con, query)
            # count(COLUMNS(*)) evaluates every column; count(*) would skip the casts.
            con.execute(f"SELECT count(COLUMNS(*)) FROM ({query})").fetchall()
        except DUCKDB_ERRORS:
            return entry.name
    return None


# DuckDB quotes the value that failed a cast: keep the type, drop the value. Its
# JSON errors quote the record ('Object {...} has duplicate key "n"') or the value
# ('Expected ARRAY, but got VARCHAR: "..."'), and the file's absolute path.
_VALUES = (
    (re.compile(r"\bstring ([\"']).*\1 to "), "a value to "),
    (re.compile(r"(\bto \w+): ([\"']).*\2"), r"\1"),
    (re.compile(r' in file "[^"]*",?'), ""),
    (re.compile(r"\bObject [{\[].* (has duplicate key )"), r"an object \1"),
    (re.compile(r'(field format): ".*", (expected format)'), r"\1, \2"),
    (re.compile(r"(Failed to cast value to \w+|Expected \w+, but got \w+): .*"), r"\1"),
    (re.compile(r'^(JSON transform error[^:]*: .*?): ["{\[].*$'), r"\1"),
)


def _detail(text: str) -> str:
    # DuckDB's message: a kind prefix, then advice and the reader's settings
    # over many lines. The offending line's content is left out: a value of
    # the source has no place in the catalog's error text.
    keep = []
    for ln in (ln.strip() for ln in text.strip().splitlines()):
        if not ln or ln.startswith(("Possible", "*", "Original Line", "LINE ", "^", "Try ")):
            continue
        if re.match(r"^[a-z_]+ = ", ln) or ln.startswith(("This type", "Column ")):
            continue
        ln = _KIND.sub("", ln)
        ln = re.sub(r"^CSV Error on Line: \d+", "", ln).strip()
        for pattern, replacement in _VALUES:
            ln = pattern.sub(replacement, ln)
        if ln:
            keep.append(ln)
        if len(keep) == 2:
            break
    return "; ".join(keep)[:400] or "unknown failure"


__all__ = [
    "DUCKDB_ERRORS",
    "arrow_schema",
    "check_parquet",
    "connect",
    "declared_schema",
    "describe",
    "infer",
    "literal",
    "locate",
    "quote_ident",
    "scan",
    "select",
    "translate",
]
