"""Evidence a person can read: where a row came from (``combined explain``), and a
projection rebuilt from the raw layer alone (``combined replay``), each source's
ingestion design from evidence (``combined plan``)."""

from combined.evidence._explain import Explanation, RowVersion, explain
from combined.evidence._plan import SourcePlan, plans, render
from combined.evidence._replay import Replay, replay

__all__ = [
    "Explanation",
    "Replay",
    "RowVersion",
    "SourcePlan",
    "explain",
    "plans",
    "render",
    "replay",
]
