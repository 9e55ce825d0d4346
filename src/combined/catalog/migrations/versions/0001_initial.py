"""The first catalog schema.

This revision builds the tables from the code's schema module, which is
exact only while 0001 is the newest revision: the change that first alters
``_schema.py`` must also freeze this file into explicit ``op.create_table``
calls and add revision 0002 with the alteration.

A new catalog is not built through these revisions: it is the schema module
created as it is and stamped with the newest revision (``Catalog._create_new``,
without loading Alembic). So the schema module must always be the newest
revision's schema; a test compares a catalog built each way.

Revision ID: 0001
Revises:
"""

from __future__ import annotations

from alembic import op

from combined.catalog._schema import metadata

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Create every table of the first revision."""
    metadata.create_all(op.get_bind())


def downgrade() -> None:
    """Drop every table."""
    metadata.drop_all(op.get_bind())
