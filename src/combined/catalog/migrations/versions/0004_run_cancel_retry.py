"""Cancel and deferred retries: who asked to cancel a Run and why; when a Run may start.

``cancel_requested_at``, ``canceled_by`` and ``cancel_reason`` record a cancel
request (``combined run cancel``, ``POST /v1/runs/{run}/cancel``): a running
Run polls for it and stops. ``not_before`` holds a queued retry back until
the time a source's ``Retry-After`` asked for: no worker takes it earlier.

Revision ID: 0004
Revises: 0003
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from combined.catalog import _schema as t

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Add the cancel and ``not_before`` columns to ``runs``."""
    op.add_column("runs", sa.Column("cancel_requested_at", t.UTCDateTime(), nullable=True))
    op.add_column("runs", sa.Column("canceled_by", sa.String(length=256), nullable=True))
    op.add_column("runs", sa.Column("cancel_reason", sa.Text(), nullable=True))
    op.add_column("runs", sa.Column("not_before", t.UTCDateTime(), nullable=True))


def downgrade() -> None:
    """Drop the columns."""
    with op.batch_alter_table("runs") as batch:
        for name in ("not_before", "cancel_reason", "canceled_by", "cancel_requested_at"):
            batch.drop_column(name)
