"""Typed models of the project file, ``combined.yaml``.

Every model forbids unknown keys, so a misspelt setting is an error rather
than a silently ignored line. Validators raise errors of type ``combined``
whose context carries a ``hint`` and, when the problem sits below the field
being validated, its location ``at``; the loader turns them into one
:class:`~combined.errors.ConfigError`.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PlainValidator,
    PrivateAttr,
    WithJsonSchema,
    field_validator,
    model_validator,
)

from combined.config._retention import Retention, RetentionPolicy, effective
from combined.config._schedule import ScheduleConfig
from combined.config._secrets import (
    REFERENCE_HINT,
    Problem,
    config_problems,
    parse_secret_ref,
    resolve_secret,
    resolve_secrets,
)
from combined.config._shape import (
    column_problems,
    cursor_problems,
    key_problems,
    mode_problems,
)
from combined.config._urls import (
    _URL,
    CatalogKind,
    _catalog,
    _lake,
    _version,
    catalog_kind,
)
from combined.config._values import (
    _BOOLEAN_HINT,
    TEXT_SCHEMA,
    ByteSize,
    Count,
    Duration,
    GiB,
    Lookback,
    MiB,
    Text,
    _error,
    _errors,
    _text,
    format_duration,
    parse_duration,
    parse_size,
)
from combined.errors import ConfigError, NotFoundError

__all__ = ["format_duration", "parse_duration", "parse_size"]

PROJECT_FILE = "combined.yaml"
"""The file name ``load_project`` looks for by default."""

PROJECT_ENV = "COMBINED_PROJECT"
"""Environment variable naming the project file when no path is given."""

DEFAULT_CATALOG = "sqlite:///.combined/catalog.db"
"""The embedded catalog, relative to the project directory."""

Strategy = Literal["snapshot", "cursor", "cdc"]
SyncMode = Literal["incremental", "append", "full_refresh"]
DriftOutcome = Literal["evolve", "quarantine", "fail"]
CursorNulls = Literal["fail", "include", "exclude"]

# ---------------------------------------------------------------------------
# names and columns

_NAME = re.compile(r"^[a-z_][a-z0-9_]*$")


def _name_of(kind: str) -> Any:
    def check(value: object) -> str:
        if isinstance(value, str) and _NAME.match(value):
            return value
        suggestion = re.sub(r"[^a-z0-9_]+", "_", str(value).lower()).strip("_") or "name"
        if suggestion[0].isdigit():
            suggestion = f"_{suggestion}"
        raise _error(
            f"is not a valid {kind} name: {value!r}",
            "use lower-case letters, digits and _, not starting with a digit "
            f"(e.g. {suggestion!r})",
        )

    return PlainValidator(check)


NAME_PATTERN = _NAME.pattern
_NAME_SCHEMA = WithJsonSchema({"type": "string", "pattern": NAME_PATTERN})
SourceName = Annotated[str, _name_of("source"), _NAME_SCHEMA]
DatasetName = Annotated[str, _name_of("dataset"), _NAME_SCHEMA]


def _columns(value: object, *, empty: bool = False) -> list[str]:
    if isinstance(value, str):
        value = [value]
    hint = "write a column name or a list of them, such as [id] or [tenant_id, id]"
    if not isinstance(value, list) or not (value or empty):
        raise _error("must name at least one column", hint)
    seen: set[str] = set()
    for index, column in enumerate(value):
        if not isinstance(column, str) or not column.strip():
            why = _BOOLEAN_HINT if isinstance(column, bool) else hint
            raise _error(f"must be a column name, not {column!r}", why, at=(index,))
        if column in seen:
            raise _error(f"names column {column!r} twice", "list each column once")
        seen.add(column)
    return value


Columns = Annotated[
    list[str],
    PlainValidator(_columns),
    WithJsonSchema(
        {
            "anyOf": [
                TEXT_SCHEMA,
                {"type": "array", "items": TEXT_SCHEMA, "minItems": 1, "uniqueItems": True},
            ]
        }
    ),
]

#: A key: columns, or ``[]`` for a table without one (rows identified by their content).
Key = Annotated[
    list[str],
    PlainValidator(lambda value: _columns(value, empty=True)),
    WithJsonSchema(
        {
            "anyOf": [
                TEXT_SCHEMA,
                {"type": "array", "items": TEXT_SCHEMA, "uniqueItems": True},
            ]
        }
    ),
]

# ---------------------------------------------------------------------------
# models


class _Model(BaseModel):
    # hide_input_in_errors keeps configuration values (possibly secrets) out
    # of the text of a raw pydantic ValidationError.
    model_config = ConfigDict(
        extra="forbid", frozen=True, hide_input_in_errors=True, use_attribute_docstrings=True
    )


class SecretRef(_Model):
    """A reference to a secret held elsewhere: ``{secret: "env:NAME"}`` or ``file:PATH``."""

    secret: str
    """``env:NAME`` (an environment variable) or ``file:PATH`` (relative to the project file)."""

    @model_validator(mode="before")
    @classmethod
    def _refuse_literal(cls, data: Any) -> Any:
        if isinstance(data, str | int | float) and not isinstance(data, bool):
            raise _error("holds a literal secret", REFERENCE_HINT)
        return data

    @field_validator("secret")
    @classmethod
    def _check_reference(cls, value: str) -> str:
        try:
            parse_secret_ref(value)
        except ValueError as exc:
            raise _error(str(exc), REFERENCE_HINT) from None
        return value

    def resolve(self, root: Path, *, where: str = "") -> str:
        """The secret's value; raises :class:`~combined.errors.SecretError` if unavailable."""
        return resolve_secret(self.secret, root, where=where)


_HEADER = re.compile(r"^[A-Za-z0-9!#$%&'*+.^_`|~-]+$")


def _header(value: object) -> str:
    text = _text(value)
    if not _HEADER.match(text):
        raise _error(f"is not an HTTP header name: {text!r}", "e.g. X-Signature-256")
    return text


class WebhookConfig(_Model):
    """A provider's signed notification that a dataset changed (``POST /webhooks/S/D``).

    The provider signs the raw request body with HMAC-SHA256 under a shared
    secret, given here by reference only, and sends the hex digest, after
    ``prefix``, in the ``header`` header.
    """

    secret: SecretRef
    """The shared HMAC key, by reference."""
    header: Annotated[
        str, PlainValidator(_header), WithJsonSchema({"type": "string", "pattern": _HEADER.pattern})
    ] = "X-Signature-256"
    """The request header carrying the signature."""
    prefix: str = "sha256="
    """Text before the hex digest in the header."""


AlertKind = Literal[
    "freshness",
    "run_failed",
    "run_needs_review",
    "run_needs_auth",
    "run_retries_exhausted",
    "quarantine_overdue",
    "reconciliation_failed",
    "cdc_slot_at_risk",
    "recovery_failed",
    "lake_unreachable",
]


class NotificationTarget(_Model):
    """Where alerts are sent (``notifications:``), optionally only some kinds or datasets.

    ``type: webhook`` POSTs the alert as JSON, its body signed with
    HMAC-SHA256 under ``secret`` (hex digest in ``header`` after
    ``sha256=``). ``type: slack`` POSTs ``{"text": ...}`` to a
    Slack-compatible incoming webhook whose URL is itself the credential.
    Both URLs are secret references, so no text Combined keeps shows them.
    """

    name: Annotated[str, _name_of("notification")]
    """The target's name, as notification events record it."""
    type: Literal["webhook", "slack"]
    """``webhook``: signed JSON; ``slack``: a Slack-compatible incoming webhook."""
    url: SecretRef
    """The URL to POST to, by reference (a webhook URL is a credential)."""
    secret: SecretRef | None = None
    """The HMAC-SHA256 key that signs a webhook's body, by reference."""
    header: Annotated[str, PlainValidator(_header)] = "X-Combined-Signature"
    """The header carrying a webhook's signature (``sha256=<hex>``)."""
    kinds: list[AlertKind] | None = None
    """Only these alert kinds (all when omitted)."""
    datasets: list[Text] | None = None
    """Only alerts of these ``SOURCE.DATASET`` (all when omitted)."""
    attempts: Count = 5
    """How many times one alert is tried (with exponential backoff) before it is recorded failed."""

    @model_validator(mode="after")
    def _check_secret(self) -> NotificationTarget:
        if self.type == "webhook" and self.secret is None:
            raise _error(
                "needs a signing secret",
                'add `secret: {secret: "env:NAME"}`: the receiver checks the signature with it',
            )
        return self

    def wants(self, kind: str, source: str | None, dataset: str | None) -> bool:
        """Whether this target is sent the alert ``kind`` (``alert.<kind>``) of a dataset."""
        short = kind.removeprefix("alert.")
        if self.kinds is not None and short not in self.kinds:
            return False
        if self.datasets is None:
            return True
        return source is not None and (
            source in self.datasets or f"{source}.{dataset}" in self.datasets
        )


class AlertSettings(_Model):
    """When a CDC stream is at risk (``alerts:``).

    A slot is at risk when the source would drop the WAL it needs within
    ``slot_horizon`` at the current WAL rate (``max_slot_wal_keep_size``
    set), when it retains more than ``slot_max_lag`` of WAL with no such
    limit (the disk fills instead), or when its WAL is ``unreserved`` or
    ``lost``. A binlog is at risk when the oldest binlog the stream needs
    is purged within ``slot_horizon``.
    """

    slot_horizon: Duration = timedelta(hours=24)
    """A slot the source would drop within this time at its WAL rate is at risk."""
    slot_max_lag: ByteSize = GiB
    """A slot this far behind the server's WAL position is at risk."""


class LoggingSettings(_Model):
    """How every command logs (``logging:``); ``--log-format``/``--log-level`` override it."""

    format: Literal["text", "json"] = "text"
    """``text`` lines, or one JSON object a line."""
    level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "WARNING"
    """The least severe level written."""


class StagingLimits(_Model):
    """Run-scoped limits on the files a capture stages before commit."""

    max_bytes: ByteSize = 20 * GiB
    """Bytes one Run may stage on this machine before it commits."""
    max_files: Count = 10_000
    """Files one Run may stage."""
    max_path_length: Count = 240
    """Longest staged file path."""
    compression: Literal["none", "lz4", "zstd"] = "none"
    """Codec of the private staging parts: ``none`` spends the least CPU (the
    read is CPU-bound); ``lz4`` or ``zstd`` stage text-heavy tables in less disk."""


class DeliveryLimits(_Model):
    """Bounds of one Delivery file: it is cut when either limit is reached."""

    max_rows: Count = 100_000
    """Rows of one Delivery file."""
    max_bytes: ByteSize = 64 * MiB
    """Bytes of one Delivery file."""


class DriftPolicy(_Model):
    """The outcome of each class of schema drift."""

    new_field: DriftOutcome = "evolve"
    """A column the lake does not hold yet.

    A change stream fills it on every row the source filled (a column added
    with a default), and on every row when it appears with no ``ALTER`` (a
    name ``columns:`` gained; on MariaDB, a column grant widened). One
    dropped again before the capture read it (its values gone from the
    source) stops the capture ``needs_review`` instead: take a new snapshot,
    or leave it out of ``columns:``. A PostgreSQL, MariaDB or SQLite cursor
    read that finds such values below its checkpoint reads again from the
    first row. Other cursor reads (files, HTTP, Singer, Airbyte) carry only the rows past
    their checkpoint: rows the source filled below it stay null in the lake
    until they are read again; capture the dataset once with ``strategy:
    snapshot`` to fill them.
    """
    widened_type: DriftOutcome = "evolve"
    """A column whose type now takes every value it took and more, each under its identity
    text (the lake takes the wider type: a wider integer, float or decimal, an integer as a
    decimal, an array of wider elements, a decimal past 38 digits as its exact text): no row
    changes."""
    narrowed_type: DriftOutcome = "fail"
    """A column whose type now takes fewer values, or whose values' identity texts change: an
    integer made a float (every row would be written again and count as active; a double
    also rounds integers past 2**53)."""
    rename: DriftOutcome = "fail"
    """A column renamed, as the source's own evidence shows."""
    drop: DriftOutcome = "fail"
    """A column the source no longer has. ``evolve`` keeps it in the lake: a row that does not
    otherwise change keeps its former value there, is not written again and is not billed; a
    row that changes, and a new one, holds null in it (docs/identity.md, section 1.3). A table
    without a key writes again (and bills) every row holding a value in it."""


class QuarantinePolicy(_Model):
    """Who reads a dataset's quarantine and how often it must be reviewed."""

    reader: Text = "owner"
    """Who reviews the dataset's quarantine entries."""
    review_every: Duration = timedelta(days=7)
    """An entry still undecided after this raises ``alert.quarantine_overdue``."""


class CursorConfig(_Model):
    """The keyset cursor of a ``cursor`` strategy dataset."""

    column: Text
    """The column that only grows: a number, a date or a time.

    A column holding times as text (SQLite, files) orders as text: every value
    must be written one way (``2024-01-01T12:00:00`` sorts after
    ``2024-01-01 13:00:00``, and a row written so would never be read).
    """
    lookback: Lookback = 0
    """Overlap re-read each run: cursor units for a number, time for a duration."""
    trust: Text
    """Why the column only grows: recorded with every capture, never inferred."""
    nulls: CursorNulls = "fail"
    """Rows whose cursor is NULL, which no window reaches.

    ``fail`` (the default): a capture whose source holds any fails, saying
    how many. ``include``: they are read in every capture (no checkpoint
    passes them) and counted by reconciliation; unchanged, they change
    nothing and bill nothing. ``exclude``: they are left out of the dataset.
    A column the source declares NOT NULL is not checked. Honoured by the
    SQL connectors; a Singer tap or Airbyte source chooses what it emits.
    """


class DeletesConfig(_Model):
    """A soft-delete flag: a row carrying it is projected as a delete of its key."""

    flag: Text
    """The column that marks a row deleted.

    Without ``value``: a boolean column (``true`` means deleted) or a date or
    time column (any value means deleted, NULL means live). The raw layer
    keeps the row as read, flag included.
    """
    value: str | bool | int | None = None
    """The value of ``flag`` that means deleted (``status: 'deleted'``), compared as text.

    Unset: see ``flag``.
    """


class DatasetConfig(_Model):
    """One declared relation of a source."""

    relation: Text
    """The table, stream or endpoint read; defaults to the dataset name.

    ``stream:`` is accepted as the same setting (a Singer stream's name).
    """
    key: Key | None = None
    """The columns that identify a row.

    Required unless ``sync_mode`` is ``append``: ``incremental`` merges by it
    and ``full_refresh`` needs it too; ``strategy: cdc`` needs it with ``append``
    as well (the first capture's snapshot and the stream overlap: the key tells a
    row read in both from two events; a table without a primary key is keyed on
    every column under ``REPLICA IDENTITY FULL``). ``[]`` declares a table without a key,
    read whole (``strategy: snapshot``): each row is identified by its whole
    content and how many equal rows come before it, so the lake mirrors the
    source's rows, repeats included, and a changed row is a delete and an
    insert (``docs/identity.md``, section 9).
    """
    strategy: Strategy = "snapshot"
    """How it is read: whole (``snapshot``), past a ``cursor``, or its change stream (``cdc``)."""
    sync_mode: SyncMode = "incremental"
    """What captured rows do to the projection: merge by key, replace it, or append."""
    cursor: CursorConfig | None = None
    """The keyset cursor; required by, and only used by, ``strategy: cursor``."""
    columns: Columns | None = None
    """The columns read, when not every one; must include the key and cursor columns."""
    delivery: DeliveryLimits = Field(default_factory=DeliveryLimits)
    """Bounds of each Delivery file the capture writes."""
    batch_rows: Count = 65_536
    """Rows per batch read from the source (bounds the memory of a read)."""
    drift: DriftPolicy = Field(default_factory=DriftPolicy)
    """What each class of schema drift does to a capture."""
    quarantine: QuarantinePolicy = Field(default_factory=QuarantinePolicy)
    """Who reviews held-back records, and how often."""
    freshness: Duration | None = None
    """Published data older than this is stale (``combined status``, ``alert.freshness``).

    Its age is that of the newest published source position: the time the
    source was at it, not the time of publication. Unset: never stale.
    """
    webhook: WebhookConfig | None = None
    """Accept signed webhooks for this dataset (else its source's ``webhook``, if any)."""
    schedule: ScheduleConfig | None = None
    """When the scheduler captures this dataset (else its source's ``schedule``, if any)."""
    retention: RetentionPolicy | None = None
    """What ``combined maintain`` keeps of this dataset (else the project's ``retention``)."""
    deletes: DeletesConfig | None = None
    """A soft-delete flag (``{flag: deleted_at}``): rows carrying it leave the projection.

    They are projected and billed as deletes of their key; a later row of the
    key without the flag inserts it again. Needs ``sync_mode: incremental``
    and a key: leave it out of an ``append`` stream to keep flagged rows as
    events; for ``full_refresh``, a snapshot with ``incremental`` projects the
    same live rows.
    """
    control_sum: Text | None = None
    """A numeric column whose sum the source reports in the capture's snapshot.

    Reconciliation compares it with the sum the lake holds, next to the row
    count, where the connector supports control totals: exactly for integer
    and decimal columns, within the rounding of the order of addition for
    float columns.
    """
    history: bool = False
    """Keep every version of every row in a second table, ``<source>.<dataset>__history``.

    Each version carries ``_combined_valid_from`` (the lake's acceptance of
    the commit that made it current), ``_combined_valid_to`` (null while
    current) and ``_combined_is_current``; a delete closes the current
    version. Maintained from the same transitions as the projection, in its
    commit protocol; enabled on a dataset with commits, it is backfilled from
    the raw layer (``docs/history.md``). Not for ``sync_mode: append``, whose
    table keeps every event already.
    """

    @model_validator(mode="after")
    def _check_shape(self) -> DatasetConfig:
        problems: list[Problem] = [
            *key_problems(self),
            *cursor_problems(self),
            *mode_problems(self),
            *column_problems(self),
        ]
        if problems:
            raise _errors(problems)
        return self


def _stream_as_relation(body: dict[str, Any]) -> dict[str, Any]:
    # ``stream:`` names a Singer stream: the same setting as ``relation:``. Given
    # both, ``stream`` stays and is refused as an unknown key.
    if "stream" in body and "relation" not in body:
        body = dict(body)
        body["relation"] = body.pop("stream")
    return body


class SourceConfig(_Model):
    """A configured connection to a provider system and its declared datasets."""

    connector: Text
    """A registered connector name; checked against the registry when used."""
    config: dict[str, Any] = Field(default_factory=dict)
    """Passed to the connector once secret references are resolved."""
    billing_policy: Text = "standard"
    """Recorded with each Run's admission."""
    venue: Text = "embedded"
    """Where the source's Runs execute, recorded with each Run's admission."""
    webhook: WebhookConfig | None = None
    """Accept signed webhooks for every dataset of the source that sets none itself."""
    schedule: ScheduleConfig | None = None
    """When the scheduler captures the datasets of the source that set none themselves."""
    datasets: dict[DatasetName, DatasetConfig] = Field(default_factory=dict)
    """The source's datasets by name (lower-case letters, digits and ``_``)."""

    @model_validator(mode="before")
    @classmethod
    def _default_relations(cls, data: Any) -> Any:
        # The relation defaults to the dataset's own name, which only the
        # enclosing mapping knows.
        if isinstance(data, dict) and isinstance(data.get("datasets"), dict):
            datasets = {
                name: {"relation": name, **_stream_as_relation(body)}
                if isinstance(body, dict)
                else body
                for name, body in data["datasets"].items()
            }
            return {**data, "datasets": datasets}
        return data

    @field_validator("config")
    @classmethod
    def _check_config(cls, config: dict[str, Any]) -> dict[str, Any]:
        problems = config_problems(config)
        if problems:
            raise _errors(problems)
        return config


class Project(_Model):
    """A parsed ``combined.yaml``.

    ``path`` (the file) and ``root`` (its directory) are not part of the
    model's data: they are set by :func:`~combined.config.load_project`, or
    through the validation context ``{"path": ...}``.
    """

    version: Annotated[Literal[1], PlainValidator(_version), WithJsonSchema({"const": 1})]
    """The project file's format: 1."""
    lake: Annotated[str, PlainValidator(_lake), WithJsonSchema(TEXT_SCHEMA)] = "./lake"
    """A local directory, or a ``file://``, ``s3://``, ``gs://`` or ``az://`` URL."""
    catalog: Annotated[str, PlainValidator(_catalog), WithJsonSchema(TEXT_SCHEMA)] = DEFAULT_CATALOG
    """The catalog database: ``sqlite:///PATH`` or ``postgresql://USER@HOST/DB``."""
    catalog_password: SecretRef | None = None
    """The password of a ``postgresql://`` catalog, by reference."""
    staging: StagingLimits = Field(default_factory=StagingLimits)
    """Limits on what one Run may stage before it commits."""
    reduction_memory: ByteSize = 256 * MiB
    """Memory a snapshot's reduction against the lake may use before it spills to disk."""
    retention: RetentionPolicy | None = None
    """What ``combined maintain`` keeps, for every dataset that sets none itself."""
    sources: dict[SourceName, SourceConfig] = Field(default_factory=dict)
    """The sources by name (lower-case letters, digits and ``_``)."""
    notifications: list[NotificationTarget] = Field(default_factory=list)
    """Where alerts are sent: signed JSON webhooks and Slack-compatible incoming webhooks."""
    alerts: AlertSettings = Field(default_factory=AlertSettings)
    """When a CDC stream counts as at risk."""
    logging: LoggingSettings = Field(default_factory=LoggingSettings)
    """How every command logs; ``--log-format`` and ``--log-level`` override it."""

    _path: Path = PrivateAttr(default_factory=lambda: Path.cwd() / PROJECT_FILE)

    def model_post_init(self, context: Any) -> None:
        """Take the project file's path from the validation context, if given."""
        if isinstance(context, dict) and context.get("path") is not None:
            self._path = Path(os.path.abspath(context["path"]))

    @model_validator(mode="after")
    def _check_catalog_password(self) -> Project:
        if self.catalog_password is not None and catalog_kind(self.catalog) != "postgresql":
            raise _error(
                "is only used by a postgresql:// catalog",
                "remove `catalog_password:` or point `catalog:` at PostgreSQL",
                at=("catalog_password",),
            )
        return self

    @property
    def path(self) -> Path:
        """The absolute path of the project file."""
        return self._path

    @property
    def root(self) -> Path:
        """The project directory: relative paths in the file are relative to it."""
        return self._path.parent

    @property
    def catalog_kind(self) -> CatalogKind:
        """Which database holds the catalog."""
        kind = catalog_kind(self.catalog)
        assert kind is not None, "validated by _catalog"
        return kind

    def source(self, name: str) -> SourceConfig:
        """The source called ``name``; raises :class:`NotFoundError` if undeclared."""
        try:
            return self.sources[name]
        except KeyError:
            known = ", ".join(sorted(self.sources)) or "none declared"
            raise NotFoundError(
                f"unknown source {name!r} in {self.path}",
                hint=f"known sources: {known}",
                source=name,
            ) from None

    def dataset(self, source: str, dataset: str) -> DatasetConfig:
        """The dataset ``dataset`` of ``source``; raises :class:`NotFoundError` if undeclared."""
        datasets = self.source(source).datasets
        try:
            return datasets[dataset]
        except KeyError:
            known = ", ".join(sorted(datasets)) or "none declared"
            raise NotFoundError(
                f"unknown dataset {dataset!r} in source {source!r}",
                hint=f"datasets of {source}: {known}",
                source=source,
                dataset=dataset,
            ) from None

    def datasets(self) -> Iterator[tuple[str, str, DatasetConfig]]:
        """Every declared (source name, dataset name, dataset), in file order."""
        for source_name, source in self.sources.items():
            for dataset_name, dataset in source.datasets.items():
                yield source_name, dataset_name, dataset

    def retention_of(self, source: str, dataset: str) -> Retention:
        """A declared dataset's effective retention (its own, the project's, the defaults)."""
        own = self.dataset(source, dataset).retention
        return effective(self.retention, own, f"sources.{source}.datasets.{dataset}")

    def lake_uri(self) -> str:
        """The lake location: an object-store URL as written, or an absolute local path."""
        if self.lake.lower().startswith("file://"):
            return os.path.abspath(self.lake[len("file://") :])
        if _URL.match(self.lake):
            return self.lake.rstrip("/")
        return os.path.abspath(self.root / Path(self.lake).expanduser())

    def catalog_url(self) -> str:
        """The catalog URL, a relative SQLite path made absolute against the project root.

        For SQLite, checks that the database's directory exists or can be
        created (it is not created here) and raises :class:`ConfigError` if not.
        """
        if self.catalog_kind != "sqlite":
            return self.catalog
        scheme, _, rest = self.catalog.partition("://")
        location, query_sep, query = rest.partition("?")
        # sqlite:// and sqlite:///:memory: are in-memory databases: no file.
        if location in ("", "/", "/:memory:"):
            return self.catalog
        database = os.path.abspath(self.root / Path(location[1:]).expanduser())
        _check_creatable(Path(database).parent, what="catalog")
        # Three slashes then an absolute path: SQLAlchemy's absolute form.
        return f"{scheme}:///{database}{query_sep}{query}"

    def resolved_config(self, source: str) -> dict[str, Any]:
        """The configuration of ``source`` with its secrets resolved, for connecting."""
        return resolve_secrets(
            self.source(source).config, self.root, prefix=f"sources.{source}.config"
        )

    def catalog_secret(self) -> str | None:
        """The catalog password from ``catalog_password``, resolved; None if unset."""
        if self.catalog_password is None:
            return None
        return self.catalog_password.resolve(self.root, where="catalog_password")


def _check_creatable(directory: Path, *, what: str) -> None:
    """Raise unless ``directory`` exists or could be made by the current user."""
    existing = directory
    while not existing.exists():
        if existing.parent == existing:
            break
        existing = existing.parent
    if not existing.is_dir():
        raise ConfigError(
            f"the {what} directory {directory} cannot be created: {existing} is not a directory",
            hint=f"move {existing} out of the way or change `{what}:` in the project file",
        )
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError(
            f"the {what} directory {directory} cannot be created: {existing} is not writable",
            hint=f"make {existing} writable or change `{what}:` in the project file",
        )
