"""Evidence a person can read: where a row came from (``combined explain``)."""

from combined.evidence._explain import Explanation, RowVersion, explain

__all__ = ["Explanation", "RowVersion", "explain"]
