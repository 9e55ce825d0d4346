"""Runs wait in a queue for a worker: who took a Run, and when.

``claimed_by`` is NULL while a queued Run waits for a worker; a worker (or
the process that admitted a Run to execute it at once) sets it to its
``host:pid:start`` identity. Runs of an older catalog were all admitted by the
process that executed them: they are marked as taken by an unknown process
when they were created, so recovery treats them as it did before (a queued
one is closed once older than a lease's time to live).

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from combined.catalog import _schema as t

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Add ``runs.claimed_by`` and ``runs.claimed_at``; mark existing Runs as taken."""
    op.add_column("runs", sa.Column("claimed_by", sa.String(length=256), nullable=True))
    op.add_column("runs", sa.Column("claimed_at", t.UTCDateTime(), nullable=True))
    op.execute("UPDATE runs SET claimed_by = '', claimed_at = created_at")


def downgrade() -> None:
    """Drop the queue columns."""
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("claimed_at")
        batch.drop_column("claimed_by")
