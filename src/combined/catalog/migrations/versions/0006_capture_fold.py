"""An unchanged capture's fold, kept for the next capture of its dataset.

A snapshot mirror's lake commit records its rows' fold with the source's
marker of its state (``runtime._fold``). A capture that changes nothing
commits nothing: where its marker moved (a write that changed no row, a
server restart), the next capture found no fold under that marker and
hashed every row again, at every capture, until a row changed. The fold of
such a capture is kept on its dataset (``datasets.capture_fold``) with the
lake commit it describes, and taken as that commit's own.

Revision ID: 0006
Revises: 0005
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Add ``datasets.capture_fold``."""
    op.add_column("datasets", sa.Column("capture_fold", sa.JSON(), nullable=True))


def downgrade() -> None:
    """Drop the column."""
    with op.batch_alter_table("datasets") as batch:
        batch.drop_column("capture_fold")
