"""The Singer connector (registered as ``singer``).

Runs any Singer tap as a child process: ``--discover`` for the catalog, and
one run per dataset that reads the tap's standard output (SCHEMA, RECORD,
STATE messages) as bounded Arrow batches. Strategies: ``snapshot`` and
``cursor`` (the tap's own bookmark). See :class:`SingerSource` and
``docs/singer.md``.
"""

from combined.connectors.singer._read import SingerExtraction
from combined.connectors.singer._source import SingerSource

__all__ = ["SingerExtraction", "SingerSource"]
