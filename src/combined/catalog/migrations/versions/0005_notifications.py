"""Alert notifications: one row per alert and target, so each is sent once.

A sender claims an alert for a target by inserting its row; the row ends
``sent`` or ``failed``. A claim whose sender died expires and is taken again.

Revision ID: 0005
Revises: 0003
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from combined.catalog import _schema as t

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Add the ``notifications`` table."""
    op.create_table(
        "notifications",
        sa.Column("target", sa.String(length=128), nullable=False),
        sa.Column("event_id", sa.Integer(), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("claimed_until", t.UTCDateTime(), nullable=False),
        sa.Column("updated_at", t.UTCDateTime(), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("target", "event_id"),
    )


def downgrade() -> None:
    """Drop the ``notifications`` table."""
    op.drop_table("notifications")
