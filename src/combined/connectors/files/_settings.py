"""The files source's configuration: a root directory and its named file sets.

A directory has no catalog to discover, so the file sets are declared in the
source's configuration (``files:``), each with its glob, format, CSV dialect,
declared column types and whether it may match nothing. A dataset's
``relation`` names a file set, or is itself a glob read with the source's
defaults.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import PurePosixPath
from typing import Any, Literal

from combined.connectors.abc import refuse_unknown_keys
from combined.connectors.files._listing import FOLLOW_SYMLINKS, FollowSymlinks
from combined.errors import ConfigError, NotFoundError

Format = Literal["csv", "parquet", "json"]
FORMATS: tuple[Format, ...] = ("csv", "parquet", "json")

#: Encodings DuckDB reads without installing an extension.
ENCODINGS = ("utf-8", "utf-16", "latin-1")

#: The options a file set and the source share (the source's are the defaults).
DIALECT_KEYS = ("format", "delimiter", "header", "quote", "encoding")
SOURCE_KEYS = ("path", *DIALECT_KEYS, "files", "follow_symlinks")
FILE_SET_KEYS = ("glob", *DIALECT_KEYS, "columns", "allow_empty")

_EXTENSIONS: dict[str, Format] = {
    ".csv": "csv",
    ".tsv": "csv",
    ".txt": "csv",
    ".parquet": "parquet",
    ".pq": "parquet",
    ".json": "json",
    ".jsonl": "json",
    ".ndjson": "json",
}
#: Compression suffixes DuckDB undoes by itself (csv and json).
_COMPRESSED = (".gz", ".zst")

# A DuckDB type name: words, an optional (precision[, scale]) and list brackets.
# Anything richer (STRUCT, MAP) is refused: the text is spliced into SQL.
_TYPE = re.compile(
    r"^[A-Za-z][A-Za-z0-9_]*(?: [A-Za-z][A-Za-z0-9_]*)*"
    r"(?:\(\s*\d+\s*(?:,\s*\d+\s*)?\))?(?:\[\])*$"
)
_GLOB_CHARS = frozenset("*?[")


@dataclass(frozen=True, slots=True)
class Dialect:
    """How the files of a set are parsed; None means "the format's default"."""

    format: Format | None = None
    delimiter: str | None = None
    header: bool | None = None
    quote: str | None = None
    encoding: str | None = None

    def over(self, defaults: Dialect) -> Dialect:
        """This dialect, each unset option taken from ``defaults``."""
        return Dialect(
            **{
                k: getattr(self, k) if getattr(self, k) is not None else getattr(defaults, k)
                for k in DIALECT_KEYS
            }
        )


@dataclass(frozen=True, slots=True)
class FileSet:
    """One named set of files under the root: what a dataset's relation reads."""

    name: str
    glob: str
    dialect: Dialect = field(default_factory=Dialect)
    #: Declared DuckDB types by column name, in declaration order.
    columns: tuple[tuple[str, str], ...] = ()
    allow_empty: bool = False
    #: Whether the set was declared under ``files:`` (else the relation was a glob).
    declared: bool = True

    @property
    def types(self) -> dict[str, str]:
        """The declared types by column name."""
        return dict(self.columns)

    def format_for(self, names: list[str]) -> Format:
        """The set's format: declared, else from the glob's or the files' extension.

        Raises :class:`~combined.errors.ConfigError` when neither says it
        unambiguously (``orders/*`` over csv and json files).
        """
        if self.dialect.format is not None:
            return self.dialect.format
        guessed = format_of(self.glob)
        if guessed is not None:
            return guessed
        found = {format_of(n) for n in names}
        if len(found) == 1 and None not in found:
            return found.pop()  # type: ignore[return-value]
        shown = ", ".join(sorted(str(f) for f in found)) if names else "no file"
        raise ConfigError(
            f"the format of file set {self.name!r} ({self.glob!r}) cannot be inferred "
            f"from its extension (matched: {shown})",
            hint=f"set `format: csv | parquet | json` under files.{self.name}, or end the "
            "glob with the extension (orders/*.csv)",
            relation=self.name,
        )


def format_of(name: str) -> Format | None:
    """The format an extension names (``.csv``, ``.csv.gz``, ``.parquet``), if any."""
    lower = name.lower()
    for suffix in _COMPRESSED:
        lower = lower.removesuffix(suffix)
    suffix = PurePosixPath(lower).suffix
    if not suffix or _GLOB_CHARS & set(suffix):
        return None
    return _EXTENSIONS.get(suffix)


def is_glob(text: str) -> bool:
    """Whether ``text`` holds glob characters."""
    return bool(_GLOB_CHARS & set(text))


def _dialect(body: Mapping[str, Any], where: str) -> Dialect:
    fmt = body.get("format")
    if fmt is not None and fmt not in FORMATS:
        raise ConfigError(
            f"{where}.format must be csv, parquet or json, not {fmt!r}",
            hint="remove it to infer the format from the files' extension",
        )
    chars = {}
    for key in ("delimiter", "quote"):
        value = body.get(key)
        if value is not None and (not isinstance(value, str) or len(value) != 1):
            raise ConfigError(
                f"{where}.{key} must be one character, not {value!r}",
                hint=f'for example {key}: "{"," if key == "delimiter" else chr(34)}"',
            )
        chars[key] = value
    header = body.get("header")
    if header is not None and not isinstance(header, bool):
        raise ConfigError(
            f"{where}.header must be true or false, not {header!r}",
            hint="true when the first line of each file names the columns (the default)",
        )
    encoding = body.get("encoding")
    if encoding is not None:
        encoding = str(encoding).lower().replace("_", "-")
        encoding = {"utf8": "utf-8", "utf16": "utf-16", "latin1": "latin-1"}.get(encoding, encoding)
        if encoding not in ENCODINGS:
            raise ConfigError(
                f"{where}.encoding {body.get('encoding')!r} is not one the files connector reads",
                hint=f"use one of: {', '.join(ENCODINGS)}; or convert the files to utf-8",
            )
    return Dialect(fmt, chars["delimiter"], header, chars["quote"], encoding)


def _columns(value: Any, where: str) -> tuple[tuple[str, str], ...]:
    example = 'for example columns: {id: BIGINT, total: "DECIMAL(12,2)", placed_at: TIMESTAMP}'
    if value is None:
        return ()
    if not isinstance(value, Mapping) or not value:
        raise ConfigError(f"{where}.columns must map column names to DuckDB types", hint=example)
    out = []
    for name, type_ in value.items():
        if not isinstance(name, str) or not name or not isinstance(type_, str):
            raise ConfigError(
                f"{where}.columns: {name!r}: {type_!r} is not a column name and a type",
                hint=example,
            )
        if not _TYPE.match(type_.strip()):
            raise ConfigError(
                f"{where}.columns.{name} is {type_!r}, which is not a DuckDB type name",
                hint="write a plain type: BIGINT, DOUBLE, VARCHAR, DATE, TIMESTAMP, "
                "TIMESTAMPTZ, BOOLEAN, DECIMAL(12,2), VARCHAR[]",
            )
        out.append((name, type_.strip().upper()))
    return tuple(out)


def _relative_glob(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(
            f"{where} must be a glob under the source's path, not {value!r}",
            hint="for example orders/*.csv or events/**/*.parquet",
        )
    parts = PurePosixPath(value).parts
    if value.startswith(("/", "\\")) or ".." in parts or re.match(r"^[A-Za-z]:", value):
        raise ConfigError(
            f"{where} {value!r} leaves the source's directory",
            hint="write the glob relative to the source's path, without .. (move `path` up "
            "instead)",
        )
    if any("**" in part and part != "**" for part in parts):
        # The listing (pathlib) only expands ** as a whole path component.
        fixed = "/".join(
            "**/" + p.replace("**", "*") if "**" in p and p != "**" else p for p in parts
        )
        raise ConfigError(
            f"{where} {value!r} uses ** inside a name: ** matches directories only as a "
            "whole path component",
            hint=f"write {fixed!r}",
        )
    return value


def _follow_symlinks(value: Any) -> FollowSymlinks:
    for known in FOLLOW_SYMLINKS:
        if value == known:
            return known
    raise ConfigError(
        f"config.follow_symlinks must be within or never, not {value!r}",
        hint="within (the default) follows a symbolic link only to a file inside the "
        "source's directory; never follows none",
    )


@dataclass(frozen=True, slots=True)
class Settings:
    """The validated configuration of one files source."""

    path: str
    defaults: Dialect
    file_sets: Mapping[str, FileSet]
    follow_symlinks: FollowSymlinks = "within"

    @classmethod
    def parse(cls, config: Mapping[str, Any]) -> Settings:
        """Validate ``config``; raises :class:`~combined.errors.ConfigError`."""
        path = config.get("path")
        if not isinstance(path, str) or not path:
            raise ConfigError(
                "the files source needs a path",
                hint="set `path` to the directory that holds the files (relative to the "
                "project file)",
            )
        defaults = _dialect(config, "config")
        files = config.get("files") or {}
        if not isinstance(files, Mapping):
            raise ConfigError(
                "config.files must map file set names to their settings",
                hint='for example files: {orders: {glob: "orders/*.csv"}}',
            )
        sets: dict[str, FileSet] = {}
        for name, body in files.items():
            where = f"config.files.{name}"
            if not isinstance(body, Mapping):
                raise ConfigError(
                    f"{where} must be a mapping with at least a glob",
                    hint='for example {glob: "orders/*.csv"}',
                )
            refuse_unknown_keys("files", body, FILE_SET_KEYS, where=where)
            allow = body.get("allow_empty", False)
            if not isinstance(allow, bool):
                raise ConfigError(
                    f"{where}.allow_empty must be true or false, not {allow!r}",
                    hint="true only when no file at all is a real state of the source",
                )
            sets[str(name)] = FileSet(
                name=str(name),
                glob=_relative_glob(body.get("glob"), f"{where}.glob"),
                dialect=_dialect(body, where),
                columns=_columns(body.get("columns"), where),
                allow_empty=allow,
            )
        return cls(
            path=path,
            defaults=defaults,
            file_sets=sets,
            follow_symlinks=_follow_symlinks(config.get("follow_symlinks", "within")),
        )

    def file_set(self, relation: str) -> FileSet:
        """The file set a dataset's relation names: declared, or the relation as a glob.

        The source's dialect fills what the set leaves unset; its ``format``
        only where the glob's extension names none (``events/*.parquet`` is
        Parquet whatever the source's default).
        """
        found = self.file_sets.get(relation)
        if found is None:
            if not is_glob(relation) and format_of(relation) is None and "/" not in relation:
                known = ", ".join(sorted(self.file_sets)) or "none declared"
                raise NotFoundError(
                    f"relation {relation!r} is neither a file set of the source nor a glob",
                    hint=f"declare it under config.files with its glob, or write the glob "
                    f"as the relation (orders/*.csv); file sets: {known}",
                    relation=relation,
                )
            found = FileSet(
                name=relation, glob=_relative_glob(relation, "relation"), declared=False
            )
        defaults = self.defaults
        if format_of(found.glob) is not None:
            defaults = replace(defaults, format=None)
        return replace(found, dialect=found.dialect.over(defaults))


__all__ = [
    "DIALECT_KEYS",
    "ENCODINGS",
    "FILE_SET_KEYS",
    "FORMATS",
    "SOURCE_KEYS",
    "Dialect",
    "FileSet",
    "Format",
    "Settings",
    "format_of",
    "is_glob",
]
