"""How progress leaves the engine: a reporter interface (core code never prints)."""

from __future__ import annotations

from typing import Protocol


class Reporter(Protocol):
    """Receives progress from the engine; the CLI and API implement it."""

    def run_started(self, run_id: str, source: str, datasets: list[str]) -> None:
        """A Run began executing."""
        ...

    def progress(self, dataset: str, rows: int, nbytes: int, deliveries: int) -> None:
        """Running totals of one dataset's capture."""
        ...

    def phase(self, dataset: str, phase: str) -> None:
        """A dataset entered a lifecycle phase (extracting, reducing, committing...)."""
        ...

    def note(self, message: str) -> None:
        """A line of information for a person."""
        ...

    def run_finished(self, run_id: str, state: str) -> None:
        """A Run reached a final state."""
        ...


class NullReporter:
    """A reporter that drops everything."""

    def run_started(self, run_id: str, source: str, datasets: list[str]) -> None:
        """Ignore."""

    def progress(self, dataset: str, rows: int, nbytes: int, deliveries: int) -> None:
        """Ignore."""

    def phase(self, dataset: str, phase: str) -> None:
        """Ignore."""

    def note(self, message: str) -> None:
        """Ignore."""

    def run_finished(self, run_id: str, state: str) -> None:
        """Ignore."""
