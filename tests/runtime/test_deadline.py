"""The Attempt deadline stops reads in progress, and only them (real files read by DuckDB)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from combined.connectors.abc import Extraction, ReadRequest
from combined.connectors.files import FilesSource
from combined.errors import SourceUnavailable
from combined.runtime._deadline import AttemptDeadline, reading


def _extraction(tmp_path: Path) -> Extraction:
    (tmp_path / "orders.csv").write_text("id,v\n1,a\n2,b\n")
    source = FilesSource({"path": str(tmp_path)})
    return source.read(
        ReadRequest(dataset="orders", relation="orders.csv", key=("id",), strategy="snapshot")
    )


def test_a_read_that_ended_is_never_stopped_by_the_deadline(tmp_path: Path) -> None:
    extraction = _extraction(tmp_path)
    deadline = AttemptDeadline(3, attempt=1).start()
    try:
        with reading(extraction):
            messages = list(extraction)
        waited = time.monotonic()
        while not deadline.expired and time.monotonic() - waited < 10:
            time.sleep(0.1)  # the deadline passes while the engine works on (reduction, commit)
    finally:
        deadline.cancel()
    assert deadline.expired and len(messages) == 2
    assert extraction.finish("success").outcome == "success"


def test_a_read_opened_after_the_deadline_passed_fails_as_transient(tmp_path: Path) -> None:
    extraction = _extraction(tmp_path)
    deadline = AttemptDeadline(0.05, attempt=2).start()
    try:
        time.sleep(0.2)
        with pytest.raises(SourceUnavailable, match="attempt 2 ran past its deadline") as info:
            with reading(extraction):
                list(extraction)
    finally:
        deadline.cancel()
    assert info.value.transient
    assert extraction.finish("success").outcome == "abort"
