"""Evidence a person can read: where a row came from (``combined explain``), and a
projection rebuilt from the raw layer alone (``combined replay``)."""

from combined.evidence._explain import Explanation, RowVersion, explain
from combined.evidence._replay import Replay, replay

__all__ = ["Explanation", "Replay", "RowVersion", "explain", "replay"]
