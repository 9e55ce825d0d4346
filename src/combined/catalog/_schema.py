"""The catalog's tables (SQLAlchemy Core), shared by SQLite and PostgreSQL.

The schema itself is created and evolved only by the numbered Alembic
migrations under ``migrations/versions``; this module is the code's view of
the newest revision.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Dialect


class UTCDateTime(sa.types.TypeDecorator[datetime]):
    """Aware UTC timestamps on every backend (stored naive UTC, so text order is time order)."""

    impl = sa.DateTime
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given to the catalog")
        return value.astimezone(UTC).replace(tzinfo=None)

    def process_result_value(self, value: Any, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if isinstance(value, str):
            value = datetime.fromisoformat(value)
        if value.tzinfo is None:
            return value.replace(tzinfo=UTC)  # type: ignore[no-any-return]
        return value.astimezone(UTC)  # type: ignore[no-any-return]


metadata = sa.MetaData()

sources = sa.Table(
    "sources",
    metadata,
    sa.Column("name", sa.String(128), primary_key=True),
    sa.Column("connector", sa.String(128), nullable=False),
    sa.Column("config", sa.JSON, nullable=False),  # redacted: secret references only
    sa.Column("config_digest", sa.String(64), nullable=False),
    sa.Column("updated_at", UTCDateTime, nullable=False),
)

discoveries = sa.Table(
    "discoveries",
    metadata,
    sa.Column("source", sa.String(128), primary_key=True),
    sa.Column("version", sa.Integer, primary_key=True),
    sa.Column("connector", sa.String(128), nullable=False),
    sa.Column("revision", sa.String(64), nullable=False),
    sa.Column("body", sa.JSON, nullable=False),
    sa.Column("discovered_at", UTCDateTime, nullable=False),
)

datasets = sa.Table(
    "datasets",
    metadata,
    sa.Column("source", sa.String(128), primary_key=True),
    sa.Column("name", sa.String(128), primary_key=True),
    sa.Column("relation", sa.String(512), nullable=False),
    sa.Column("key", sa.JSON, nullable=False),
    sa.Column("strategy", sa.String(16), nullable=False),
    sa.Column("sync_mode", sa.String(16), nullable=False),
    sa.Column("schema", sa.JSON, nullable=True),  # the committed Arrow schema, as fields
    sa.Column("schema_revision", sa.Integer, nullable=False, default=0),
    sa.Column("checkpoint", sa.JSON, nullable=True),  # projection of the lake's checkpoint
    sa.Column("source_position", sa.Text, nullable=True),
    sa.Column("last_sequence", sa.Integer, nullable=False, default=0),
    sa.Column("lake_version", sa.Integer, nullable=True),
    sa.Column("current_version", sa.String(64), nullable=True),
    sa.Column("published_at", UTCDateTime, nullable=True),
    sa.Column("freshness_target_s", sa.Integer, nullable=True),
    # An unchanged capture's fold and the lake commit it describes (runtime._fold).
    sa.Column("capture_fold", sa.JSON, nullable=True),
)

admissions = sa.Table(
    "admissions",
    metadata,
    sa.Column("id", sa.String(64), primary_key=True),  # digest of the frozen body
    sa.Column("connector", sa.String(128), nullable=False),
    sa.Column("revision", sa.String(64), nullable=False),
    sa.Column("config_digest", sa.String(64), nullable=False),
    sa.Column("config", sa.JSON, nullable=False),  # redacted body: what a retry executes
    sa.Column("billing_policy", sa.String(64), nullable=False),
    sa.Column("venue", sa.String(64), nullable=False),
    sa.Column("created_at", UTCDateTime, nullable=False),
)

runs = sa.Table(
    "runs",
    metadata,
    sa.Column("id", sa.String(64), primary_key=True),
    sa.Column("source", sa.String(128), nullable=False, index=True),
    sa.Column("datasets", sa.JSON, nullable=False),
    sa.Column("trigger", sa.String(16), nullable=False),
    sa.Column("state", sa.String(16), nullable=False, index=True),
    sa.Column("admission_id", sa.String(64), sa.ForeignKey("admissions.id"), nullable=False),
    sa.Column("retry_of", sa.String(64), nullable=True),
    sa.Column("created_at", UTCDateTime, nullable=False),
    sa.Column("started_at", UTCDateTime, nullable=True),
    sa.Column("ended_at", UTCDateTime, nullable=True),
    sa.Column("error", sa.Text, nullable=True),
    sa.Column("error_type", sa.String(128), nullable=True),
    sa.Column("stats", sa.JSON, nullable=True),
    sa.Column("publication_id", sa.String(64), nullable=True),
    # Who took the Run to execute it (``host:pid:start``, as a lease holder),
    # and when. NULL while a queued Run waits for a worker (revision 0002).
    sa.Column("claimed_by", sa.String(256), nullable=True),
    sa.Column("claimed_at", UTCDateTime, nullable=True),
    # A cancel request: when, by whom, why; and the earliest time a queued
    # retry may be taken (a source's Retry-After) (revision 0004).
    sa.Column("cancel_requested_at", UTCDateTime, nullable=True),
    sa.Column("canceled_by", sa.String(256), nullable=True),
    sa.Column("cancel_reason", sa.Text, nullable=True),
    sa.Column("not_before", UTCDateTime, nullable=True),
)

attempts = sa.Table(
    "attempts",
    metadata,
    sa.Column("run_id", sa.String(64), sa.ForeignKey("runs.id"), primary_key=True),
    sa.Column("number", sa.Integer, primary_key=True),
    sa.Column("worker", sa.String(256), nullable=False),
    sa.Column("host", sa.String(256), nullable=False),
    sa.Column("pid", sa.Integer, nullable=False),
    sa.Column("started_at", UTCDateTime, nullable=False),
    sa.Column("ended_at", UTCDateTime, nullable=True),
    sa.Column("outcome", sa.String(32), nullable=True),
    sa.Column("error", sa.Text, nullable=True),
)

deliveries = sa.Table(
    "deliveries",
    metadata,
    sa.Column("id", sa.String(64), primary_key=True),
    sa.Column("run_id", sa.String(64), nullable=False, index=True),
    sa.Column("source", sa.String(128), nullable=False),
    sa.Column("dataset", sa.String(128), nullable=False),
    sa.Column("sequence", sa.Integer, nullable=False),
    sa.Column("schema_revision", sa.Integer, nullable=False),
    sa.Column("record_count", sa.Integer, nullable=False),
    sa.Column("byte_count", sa.Integer, nullable=False),
    sa.Column("content_hash", sa.String(64), nullable=False),
    sa.Column("state", sa.String(24), nullable=False),
    sa.Column("path", sa.Text, nullable=False),
    sa.Column("created_at", UTCDateTime, nullable=False),
    sa.Column("committed_at", UTCDateTime, nullable=True),
    sa.Column("lake_version", sa.Integer, nullable=True),
    sa.Index("ix_deliveries_dataset_seq", "source", "dataset", "sequence"),
)

dataset_versions = sa.Table(
    "dataset_versions",
    metadata,
    sa.Column("id", sa.String(64), primary_key=True),
    sa.Column("source", sa.String(128), nullable=False),
    sa.Column("dataset", sa.String(128), nullable=False),
    sa.Column("parent_id", sa.String(64), nullable=True),
    sa.Column("transition_digest", sa.String(64), nullable=False),
    sa.Column("inserts", sa.Integer, nullable=False),
    sa.Column("updates", sa.Integer, nullable=False),
    sa.Column("deletes", sa.Integer, nullable=False),
    sa.Column("row_count", sa.Integer, nullable=False),
    sa.Column("content_digest", sa.String(64), nullable=False),
    sa.Column("run_id", sa.String(64), nullable=False),
    sa.Column("lake_version", sa.Integer, nullable=False),
    sa.Column("created_at", UTCDateTime, nullable=False),
    sa.Index("ix_versions_dataset", "source", "dataset"),
)

publications = sa.Table(
    "publications",
    metadata,
    sa.Column("id", sa.String(64), primary_key=True),
    sa.Column("seq", sa.Integer, nullable=False, unique=True),
    sa.Column("run_id", sa.String(64), nullable=True),
    sa.Column("published_at", UTCDateTime, nullable=False, index=True),
    sa.Column("snapshot_token", sa.String(64), nullable=False),
)

publication_members = sa.Table(
    "publication_members",
    metadata,
    sa.Column("publication_id", sa.String(64), sa.ForeignKey("publications.id"), primary_key=True),
    sa.Column("source", sa.String(128), primary_key=True),
    sa.Column("dataset", sa.String(128), primary_key=True),
    sa.Column("dataset_version", sa.String(64), nullable=True),
    sa.Column("lake_version", sa.Integer, nullable=True),
    sa.Column("source_position", sa.Text, nullable=True),
    sa.Column("extraction_receipt", sa.JSON, nullable=True),
    sa.Column("committed_at", UTCDateTime, nullable=True),
    sa.Column("changed", sa.Boolean, nullable=False),
)

usage = sa.Table(
    "usage",
    metadata,
    sa.Column("source", sa.String(128), primary_key=True),
    sa.Column("dataset", sa.String(128), primary_key=True),
    sa.Column("month", sa.String(7), primary_key=True),
    sa.Column("mar", sa.Integer, nullable=False),
    sa.Column("inserts", sa.Integer, nullable=False),
    sa.Column("updates", sa.Integer, nullable=False),
    sa.Column("deletes", sa.Integer, nullable=False),
    sa.Column("updated_at", UTCDateTime, nullable=False),
)

activity = sa.Table(
    "activity",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("at", UTCDateTime, nullable=False, index=True),
    # (indexed since revision 0009: a Run's end finds the Runs the ledger lacks by kind)
    sa.Column("kind", sa.String(64), nullable=False, index=True),
    sa.Column("source", sa.String(128), nullable=True),
    sa.Column("dataset", sa.String(128), nullable=True),
    sa.Column("run_id", sa.String(64), nullable=True),
    sa.Column("body", sa.JSON, nullable=False),
)

quarantine = sa.Table(
    "quarantine",
    metadata,
    sa.Column("id", sa.String(64), primary_key=True),
    sa.Column("source", sa.String(128), nullable=False),
    sa.Column("dataset", sa.String(128), nullable=False),
    sa.Column("run_id", sa.String(64), nullable=False),
    sa.Column("delivery_id", sa.String(64), nullable=True),
    sa.Column("reason", sa.Text, nullable=False),
    sa.Column("path", sa.Text, nullable=False),
    sa.Column("record_count", sa.Integer, nullable=False),
    sa.Column("reader", sa.String(128), nullable=False),
    sa.Column("review_due_at", UTCDateTime, nullable=False),
    sa.Column("created_at", UTCDateTime, nullable=False),
    sa.Column("decision", sa.String(16), nullable=True),
    sa.Column("decided_at", UTCDateTime, nullable=True),
    sa.Column("decided_by", sa.String(128), nullable=True),
)

leases = sa.Table(
    "leases",
    metadata,
    sa.Column("source", sa.String(128), primary_key=True),
    sa.Column("dataset", sa.String(128), primary_key=True),
    sa.Column("holder", sa.String(256), nullable=False),
    sa.Column("run_id", sa.String(64), nullable=False),
    sa.Column("expires_at", UTCDateTime, nullable=False),
)

schedule_ticks = sa.Table(
    "schedule_ticks",
    metadata,
    # One row per scheduled tick of a dataset, written in the transaction that
    # queues (or joins) its Run: a second scheduler's row for the same tick
    # breaks the primary key, so a tick queues exactly one Run (revision 0003).
    sa.Column("source", sa.String(128), primary_key=True),
    sa.Column("dataset", sa.String(128), primary_key=True),
    sa.Column("tick", UTCDateTime, primary_key=True),
    sa.Column("run_id", sa.String(64), nullable=False),
    sa.Column("joined", sa.Boolean, nullable=False),
    sa.Column("created_at", UTCDateTime, nullable=False),
)

notifications = sa.Table(
    "notifications",
    metadata,
    # One row per alert (an Activity event) and notification target: the
    # sender claims it by inserting it (``sending``, until ``claimed_until``),
    # so two senders never send one alert twice; it ends ``sent`` or
    # ``failed`` once its attempts are spent (revision 0005).
    sa.Column("target", sa.String(128), primary_key=True),
    sa.Column("event_id", sa.Integer, primary_key=True),
    sa.Column("state", sa.String(16), nullable=False),
    sa.Column("attempts", sa.Integer, nullable=False),
    sa.Column("claimed_until", UTCDateTime, nullable=False),
    sa.Column("updated_at", UTCDateTime, nullable=False),
    sa.Column("error", sa.Text, nullable=True),
)

dataset_resets = sa.Table(
    "dataset_resets",
    metadata,
    # One row per recorded reset of a dataset (``combined reset``): the catalog
    # forgot the lake table versions (and checkpoint) it held of the dataset,
    # and its next capture is a first capture (revision 0007).
    sa.Column("id", sa.String(64), primary_key=True),  # the same in the lake's ledger
    sa.Column("source", sa.String(128), nullable=False),
    sa.Column("dataset", sa.String(128), nullable=False),
    sa.Column("at", UTCDateTime, nullable=False),
    sa.Column("by", sa.String(256), nullable=False),
    sa.Column("reason", sa.Text, nullable=False),
    # The newest publication when it was made: the dataset's members published
    # up to it read the table it forgot.
    sa.Column("after_seq", sa.Integer, nullable=False),
    # What was forgotten (lake version, sequence, dataset version, checkpoint,
    # the table's location) and which of the dataset's lake tables it removed.
    sa.Column("forgotten", sa.JSON, nullable=False),
    sa.Index("ix_dataset_resets_dataset", "source", "dataset"),
)

console_logouts = sa.Table(
    "console_logouts",
    metadata,
    # One row per console session logged out (revision 0008): the SHA-256 hex
    # of the session's CSRF token, and when its cookie's signature expires
    # (after which the row is of no use and is removed).
    sa.Column("session", sa.String(64), primary_key=True),
    sa.Column("until", UTCDateTime, nullable=False),
)
