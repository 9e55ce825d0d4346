"""Scheduled captures: one row per dataset and tick, so a tick queues one Run.

A scheduler writes the row in the transaction that queues the tick's Run (or
joins a capture of the dataset already queued or running). Two schedulers
sharing the catalog both try: the primary key lets exactly one succeed.

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from combined.catalog import _schema as t

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Add the ``schedule_ticks`` table."""
    op.create_table(
        "schedule_ticks",
        sa.Column("source", sa.String(length=128), nullable=False),
        sa.Column("dataset", sa.String(length=128), nullable=False),
        sa.Column("tick", t.UTCDateTime(), nullable=False),
        sa.Column("run_id", sa.String(length=64), nullable=False),
        sa.Column("joined", sa.Boolean(), nullable=False),
        sa.Column("created_at", t.UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("source", "dataset", "tick"),
    )


def downgrade() -> None:
    """Drop the ``schedule_ticks`` table."""
    op.drop_table("schedule_ticks")
