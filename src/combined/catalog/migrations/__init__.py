"""Alembic migrations of the catalog, numbered."""
