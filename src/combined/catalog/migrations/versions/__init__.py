"""Numbered catalog revisions."""
