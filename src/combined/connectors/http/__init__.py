"""The http connector (registered as ``http``).

Reads the endpoints of a REST/JSON API, every page in turn, as bounded Arrow
batches. Strategies: ``snapshot`` (every page, reduced against the lake by
key) and ``cursor`` (the last checkpoint passed in a ``since`` parameter).
See :class:`HTTPSource` for the configuration and ``docs/http.md``.
"""

from combined.connectors.http._extraction import HTTPExtraction
from combined.connectors.http._settings import Endpoint, Settings
from combined.connectors.http._source import HTTPSource

__all__ = ["Endpoint", "HTTPExtraction", "HTTPSource", "Settings"]
