"""The Airbyte connector (registered as ``airbyte``).

Runs any Airbyte-protocol source (a Python connector such as
``source-faker``, or a ``docker run`` of its image) as a child process:
``check``, ``discover`` for the catalog, and one ``read`` per dataset with a
configured catalog selecting that stream alone. Strategies: ``snapshot``
(``full_refresh``) and ``cursor`` (``incremental``, per-stream state). See
:class:`AirbyteSource` and ``docs/airbyte.md``.
"""

from combined.connectors.airbyte._read import AirbyteExtraction
from combined.connectors.airbyte._source import AirbyteSource

__all__ = ["AirbyteExtraction", "AirbyteSource"]
