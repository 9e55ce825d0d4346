"""Combined: governed capture into a Delta Lake you own."""

from combined import _alloc  # noqa: F401  (first: it picks Arrow's allocator)

__version__ = "0.1.0"
