"""Alembic environment: runs on the connection the catalog hands over."""

from __future__ import annotations

from alembic import context

from combined.catalog._schema import metadata

connection = context.config.attributes["connection"]
context.configure(
    connection=connection,
    target_metadata=metadata,
    render_as_batch=connection.dialect.name == "sqlite",
)
with context.begin_transaction():
    context.run_migrations()
