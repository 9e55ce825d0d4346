"""Recorded resets of a dataset whose lake table was lost or deliberately removed.

A capture refuses a dataset whose table is gone from the lake while the
catalog records its versions (``runtime._reset``). ``combined reset``
records the decision to forget them, so that the next capture is a first
capture; the dataset's members published before it read the table it forgot.

Revision ID: 0007
Revises: 0006
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from combined.catalog._schema import UTCDateTime

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Create ``dataset_resets``."""
    op.create_table(
        "dataset_resets",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("source", sa.String(128), nullable=False),
        sa.Column("dataset", sa.String(128), nullable=False),
        sa.Column("at", UTCDateTime(), nullable=False),
        sa.Column("by", sa.String(256), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("after_seq", sa.Integer(), nullable=False),
        sa.Column("forgotten", sa.JSON(), nullable=False),
    )
    op.create_index("ix_dataset_resets_dataset", "dataset_resets", ["source", "dataset"])


def downgrade() -> None:
    """Drop the table."""
    op.drop_index("ix_dataset_resets_dataset", table_name="dataset_resets")
    op.drop_table("dataset_resets")
