"""Combined: governed capture into a Delta Lake you own."""

__version__ = "0.1.0"
