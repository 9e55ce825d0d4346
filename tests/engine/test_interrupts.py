"""A Ctrl-C that DuckDB reported as its own error stops the command, not the Run.

DuckDB stops a statement a KeyboardInterrupt reaches and raises "Query
interrupted" instead: the Run ended ``failed`` (an alert sent, once after its
lake commit), where Ctrl-C leaves it unfinished for the next capture to close.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import duckdb
import pytest

from combined import _interrupts
from combined.engine import Engine
from combined.errors import CaptureError


def test_a_duckdb_interrupt_after_a_sigint_is_the_sigint(monkeypatch: pytest.MonkeyPatch) -> None:
    translated = CaptureError("reducing failed")
    translated.__cause__ = RuntimeError("Query interrupted")
    _interrupts.raise_if_interrupted(translated)  # no SIGINT: an error like any other
    monkeypatch.setattr(_interrupts, "received", "SIGINT")
    for exc in (duckdb.InterruptException("x"), RuntimeError("Query interrupted"), translated):
        with pytest.raises(KeyboardInterrupt):
            _interrupts.raise_if_interrupted(exc)
    _interrupts.raise_if_interrupted(RuntimeError("another"))  # not an interrupt


def test_a_run_a_sigint_stopped_inside_duckdb_stays_unfinished(
    tmp_path: Path, tools: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from combined.runtime import _runner

    engine = Engine.open(tools.make(tmp_path))
    try:

        def interrupted(*args: Any, **kwargs: Any) -> Any:
            raise duckdb.InterruptException("INTERRUPT Error: Interrupted!")

        monkeypatch.setattr(_runner, "extract", interrupted)
        monkeypatch.setattr(_interrupts, "received", "SIGINT")
        with pytest.raises(KeyboardInterrupt):
            engine.capture(["shop.orders"])
        (run,) = engine.runs()
        assert run.state == "extracting"  # unfinished: the next capture closes it
        assert engine.activity(kind="alert.run_failed") == []
    finally:
        engine.close()
