"""An index on the Activity feed's kinds.

A Run's end writes to the lake's ledger the Runs whose end the catalog
recorded alone (the store refused it): it finds them by their event's kind
(``run.unledgered``, ``run.ledgered``), which without an index read the
whole feed at every Run's end.

Revision ID: 0009
Revises: 0008
"""

from __future__ import annotations

from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Index ``activity.kind``."""
    op.create_index(op.f("ix_activity_kind"), "activity", ["kind"], unique=False)


def downgrade() -> None:
    """Drop the index."""
    op.drop_index(op.f("ix_activity_kind"), table_name="activity")
