"""Test doubles and the connector conformance suite, shipped with Combined.

* :class:`InMemorySource` and :class:`ScriptedSource` are real connectors that
  need nothing running, so tests never monkeypatch (see :mod:`._doubles`).
  They register under the ``combined.test_connectors`` entry-point group,
  found only where ``COMBINED_TEST_CONNECTORS=1``.
* :mod:`combined.testing.conformance` is the contract every connector meets,
  as a pytest class to subclass (``docs/connectors.md``).
"""

from combined.testing._doubles import InMemorySource, ScriptedSource

__all__ = ["InMemorySource", "ScriptedSource"]
