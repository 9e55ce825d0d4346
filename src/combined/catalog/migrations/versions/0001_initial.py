"""The first catalog schema, frozen as it was when revision 0002 came.

A new catalog is not built through these revisions: it is the schema module
created as it is and stamped with the newest revision (``Catalog._create_new``,
without loading Alembic). So the schema module must always be the newest
revision's schema; a test compares a catalog built each way. Each revision
after this one states its change explicitly, never by reading the schema
module (which moves on).

Revision ID: 0001
Revises:
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from combined.catalog import _schema as t

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Create every table of the first revision."""
    op.create_table(
        "activity",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("at", t.UTCDateTime(), nullable=False),
        sa.Column("kind", sa.String(length=64), nullable=False),
        sa.Column("source", sa.String(length=128), nullable=True),
        sa.Column("dataset", sa.String(length=128), nullable=True),
        sa.Column("run_id", sa.String(length=64), nullable=True),
        sa.Column("body", sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index(op.f("ix_activity_at"), "activity", ["at"], unique=False)
    op.create_table(
        "admissions",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("connector", sa.String(length=128), nullable=False),
        sa.Column("revision", sa.String(length=64), nullable=False),
        sa.Column("config_digest", sa.String(length=64), nullable=False),
        sa.Column("config", sa.JSON(), nullable=False),
        sa.Column("billing_policy", sa.String(length=64), nullable=False),
        sa.Column("venue", sa.String(length=64), nullable=False),
        sa.Column("created_at", t.UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_table(
        "dataset_versions",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("source", sa.String(length=128), nullable=False),
        sa.Column("dataset", sa.String(length=128), nullable=False),
        sa.Column("parent_id", sa.String(length=64), nullable=True),
        sa.Column("transition_digest", sa.String(length=64), nullable=False),
        sa.Column("inserts", sa.Integer(), nullable=False),
        sa.Column("updates", sa.Integer(), nullable=False),
        sa.Column("deletes", sa.Integer(), nullable=False),
        sa.Column("row_count", sa.Integer(), nullable=False),
        sa.Column("content_digest", sa.String(length=64), nullable=False),
        sa.Column("run_id", sa.String(length=64), nullable=False),
        sa.Column("lake_version", sa.Integer(), nullable=False),
        sa.Column("created_at", t.UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_versions_dataset", "dataset_versions", ["source", "dataset"], unique=False)
    op.create_table(
        "datasets",
        sa.Column("source", sa.String(length=128), nullable=False),
        sa.Column("name", sa.String(length=128), nullable=False),
        sa.Column("relation", sa.String(length=512), nullable=False),
        sa.Column("key", sa.JSON(), nullable=False),
        sa.Column("strategy", sa.String(length=16), nullable=False),
        sa.Column("sync_mode", sa.String(length=16), nullable=False),
        sa.Column("schema", sa.JSON(), nullable=True),
        sa.Column("schema_revision", sa.Integer(), nullable=False),
        sa.Column("checkpoint", sa.JSON(), nullable=True),
        sa.Column("source_position", sa.Text(), nullable=True),
        sa.Column("last_sequence", sa.Integer(), nullable=False),
        sa.Column("lake_version", sa.Integer(), nullable=True),
        sa.Column("current_version", sa.String(length=64), nullable=True),
        sa.Column("published_at", t.UTCDateTime(), nullable=True),
        sa.Column("freshness_target_s", sa.Integer(), nullable=True),
        sa.PrimaryKeyConstraint("source", "name"),
    )
    op.create_table(
        "deliveries",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("run_id", sa.String(length=64), nullable=False),
        sa.Column("source", sa.String(length=128), nullable=False),
        sa.Column("dataset", sa.String(length=128), nullable=False),
        sa.Column("sequence", sa.Integer(), nullable=False),
        sa.Column("schema_revision", sa.Integer(), nullable=False),
        sa.Column("record_count", sa.Integer(), nullable=False),
        sa.Column("byte_count", sa.Integer(), nullable=False),
        sa.Column("content_hash", sa.String(length=64), nullable=False),
        sa.Column("state", sa.String(length=24), nullable=False),
        sa.Column("path", sa.Text(), nullable=False),
        sa.Column("created_at", t.UTCDateTime(), nullable=False),
        sa.Column("committed_at", t.UTCDateTime(), nullable=True),
        sa.Column("lake_version", sa.Integer(), nullable=True),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index(
        "ix_deliveries_dataset_seq", "deliveries", ["source", "dataset", "sequence"], unique=False
    )
    op.create_index(op.f("ix_deliveries_run_id"), "deliveries", ["run_id"], unique=False)
    op.create_table(
        "discoveries",
        sa.Column("source", sa.String(length=128), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("connector", sa.String(length=128), nullable=False),
        sa.Column("revision", sa.String(length=64), nullable=False),
        sa.Column("body", sa.JSON(), nullable=False),
        sa.Column("discovered_at", t.UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("source", "version"),
    )
    op.create_table(
        "leases",
        sa.Column("source", sa.String(length=128), nullable=False),
        sa.Column("dataset", sa.String(length=128), nullable=False),
        sa.Column("holder", sa.String(length=256), nullable=False),
        sa.Column("run_id", sa.String(length=64), nullable=False),
        sa.Column("expires_at", t.UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("source", "dataset"),
    )
    op.create_table(
        "publications",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.String(length=64), nullable=True),
        sa.Column("published_at", t.UTCDateTime(), nullable=False),
        sa.Column("snapshot_token", sa.String(length=64), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("seq"),
    )
    op.create_index(
        op.f("ix_publications_published_at"), "publications", ["published_at"], unique=False
    )
    op.create_table(
        "quarantine",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("source", sa.String(length=128), nullable=False),
        sa.Column("dataset", sa.String(length=128), nullable=False),
        sa.Column("run_id", sa.String(length=64), nullable=False),
        sa.Column("delivery_id", sa.String(length=64), nullable=True),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("path", sa.Text(), nullable=False),
        sa.Column("record_count", sa.Integer(), nullable=False),
        sa.Column("reader", sa.String(length=128), nullable=False),
        sa.Column("review_due_at", t.UTCDateTime(), nullable=False),
        sa.Column("created_at", t.UTCDateTime(), nullable=False),
        sa.Column("decision", sa.String(length=16), nullable=True),
        sa.Column("decided_at", t.UTCDateTime(), nullable=True),
        sa.Column("decided_by", sa.String(length=128), nullable=True),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_table(
        "sources",
        sa.Column("name", sa.String(length=128), nullable=False),
        sa.Column("connector", sa.String(length=128), nullable=False),
        sa.Column("config", sa.JSON(), nullable=False),
        sa.Column("config_digest", sa.String(length=64), nullable=False),
        sa.Column("updated_at", t.UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("name"),
    )
    op.create_table(
        "usage",
        sa.Column("source", sa.String(length=128), nullable=False),
        sa.Column("dataset", sa.String(length=128), nullable=False),
        sa.Column("month", sa.String(length=7), nullable=False),
        sa.Column("mar", sa.Integer(), nullable=False),
        sa.Column("inserts", sa.Integer(), nullable=False),
        sa.Column("updates", sa.Integer(), nullable=False),
        sa.Column("deletes", sa.Integer(), nullable=False),
        sa.Column("updated_at", t.UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("source", "dataset", "month"),
    )
    op.create_table(
        "publication_members",
        sa.Column("publication_id", sa.String(length=64), nullable=False),
        sa.Column("source", sa.String(length=128), nullable=False),
        sa.Column("dataset", sa.String(length=128), nullable=False),
        sa.Column("dataset_version", sa.String(length=64), nullable=True),
        sa.Column("lake_version", sa.Integer(), nullable=True),
        sa.Column("source_position", sa.Text(), nullable=True),
        sa.Column("extraction_receipt", sa.JSON(), nullable=True),
        sa.Column("committed_at", t.UTCDateTime(), nullable=True),
        sa.Column("changed", sa.Boolean(), nullable=False),
        sa.ForeignKeyConstraint(
            ["publication_id"],
            ["publications.id"],
        ),
        sa.PrimaryKeyConstraint("publication_id", "source", "dataset"),
    )
    op.create_table(
        "runs",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("source", sa.String(length=128), nullable=False),
        sa.Column("datasets", sa.JSON(), nullable=False),
        sa.Column("trigger", sa.String(length=16), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("admission_id", sa.String(length=64), nullable=False),
        sa.Column("retry_of", sa.String(length=64), nullable=True),
        sa.Column("created_at", t.UTCDateTime(), nullable=False),
        sa.Column("started_at", t.UTCDateTime(), nullable=True),
        sa.Column("ended_at", t.UTCDateTime(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("error_type", sa.String(length=128), nullable=True),
        sa.Column("stats", sa.JSON(), nullable=True),
        sa.Column("publication_id", sa.String(length=64), nullable=True),
        sa.ForeignKeyConstraint(
            ["admission_id"],
            ["admissions.id"],
        ),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index(op.f("ix_runs_source"), "runs", ["source"], unique=False)
    op.create_index(op.f("ix_runs_state"), "runs", ["state"], unique=False)
    op.create_table(
        "attempts",
        sa.Column("run_id", sa.String(length=64), nullable=False),
        sa.Column("number", sa.Integer(), nullable=False),
        sa.Column("worker", sa.String(length=256), nullable=False),
        sa.Column("host", sa.String(length=256), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("started_at", t.UTCDateTime(), nullable=False),
        sa.Column("ended_at", t.UTCDateTime(), nullable=True),
        sa.Column("outcome", sa.String(length=32), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.ForeignKeyConstraint(
            ["run_id"],
            ["runs.id"],
        ),
        sa.PrimaryKeyConstraint("run_id", "number"),
    )


def downgrade() -> None:
    """Drop every table."""
    op.drop_table("attempts")
    op.drop_table("runs")
    op.drop_table("publication_members")
    op.drop_table("usage")
    op.drop_table("sources")
    op.drop_table("quarantine")
    op.drop_table("publications")
    op.drop_table("leases")
    op.drop_table("discoveries")
    op.drop_table("deliveries")
    op.drop_table("datasets")
    op.drop_table("dataset_versions")
    op.drop_table("admissions")
    op.drop_table("activity")
