"""Console sessions logged out, kept until their cookies would expire.

A console session is a signed cookie, not a server-side record, so a copy
taken before a logout stayed valid. The logout was remembered only in the
server process that took it: a restart of ``combined serve``, or a second
server on the same catalog, opened the copy again. Each logout is now a row
here, keyed by the SHA-256 of the session's CSRF token (never the token).

Revision ID: 0008
Revises: 0007
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from combined.catalog._schema import UTCDateTime

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Create ``console_logouts``."""
    op.create_table(
        "console_logouts",
        sa.Column("session", sa.String(64), primary_key=True),
        sa.Column("until", UTCDateTime(), nullable=False),
    )


def downgrade() -> None:
    """Drop the table."""
    op.drop_table("console_logouts")
