"""How a capture shows its progress on stderr, and what a stopped command says of its Runs.

On a terminal: rich progress bars. Elsewhere (cron, CI, a log file), bars
would print nothing until the end, so lines are written at most every
``COMBINED_PROGRESS_EVERY_S`` seconds (10 by default): where the Run's
datasets stand, and the datasets still reading. Either way the Runs started and not yet finished
are remembered, so that SIGINT or SIGTERM can say what became of them.
"""

from __future__ import annotations

import os
import time
from typing import Any

from rich.text import Text

from combined.cli import err

#: The Runs this process started and has not seen finish: run id -> source.
ACTIVE: dict[str, str] = {}

EVERY_ENV = "COMBINED_PROGRESS_EVERY_S"
"""Seconds between two progress lines of a dataset when stderr is not a terminal."""


class Tracking:
    """Remembers the Runs in flight for :func:`say_interrupted`."""

    def run_started(self, run_id: str, source: str, datasets: list[str]) -> None:
        ACTIVE[run_id] = source

    def run_finished(self, run_id: str, state: str) -> None:
        ACTIVE.pop(run_id, None)


class BarProgress(Tracking):
    """Rich progress bars: rows, bytes and deliveries per dataset."""

    def __init__(self) -> None:
        from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        self.bars = Progress(
            SpinnerColumn(),
            TextColumn("{task.description}", markup=False),
            TextColumn("{task.fields[phase]}", markup=False),
            TextColumn("{task.fields[rows]:>10,} rows", markup=False),
            TextColumn("{task.fields[mb]:>8.1f} MB", markup=False),
            TextColumn("{task.fields[deliveries]} deliveries", markup=False),
            TimeElapsedColumn(),
            console=err,
            transient=False,
        )
        self.tasks: dict[str, Any] = {}

    def _task(self, dataset: str) -> Any:
        if dataset not in self.tasks:
            self.tasks[dataset] = self.bars.add_task(
                dataset, total=None, phase="", rows=0, mb=0.0, deliveries=0
            )
        return self.tasks[dataset]

    def run_started(self, run_id: str, source: str, datasets: list[str]) -> None:
        super().run_started(run_id, source, datasets)
        self.bars.start()
        err.print(f"run {run_id}: capturing {source} ({', '.join(datasets)})")
        for d in datasets:
            self._task(d)

    def progress(self, dataset: str, rows: int, nbytes: int, deliveries: int) -> None:
        fields: dict[str, Any] = {"rows": rows, "deliveries": deliveries}
        if nbytes:
            fields["mb"] = nbytes / 1e6
        self.bars.update(self._task(dataset), **fields)

    def phase(self, dataset: str, phase: str) -> None:
        self.bars.update(self._task(dataset), phase=phase)

    def note(self, message: str) -> None:
        # An engine note quotes errors, paths and values: text, never markup.
        self.bars.console.print(Text(message), highlight=False)

    def run_finished(self, run_id: str, state: str) -> None:
        super().run_finished(run_id, state)
        for task in self.tasks.values():
            self.bars.update(task, phase="done" if state == "succeeded" else state)
        self.bars.stop()
        self.tasks.clear()


#: A dataset's state in a line: phase, rows, bytes, deliveries.
_State = tuple[str, int, int, int]
_PHASES = ("waiting", "extracting", "reducing", "committing")


class LineProgress(Tracking):
    """Plain progress lines, for a stderr that is not a terminal.

    At most one round of lines every ``every_s`` seconds: a Run of several
    datasets writes where they stand (how many in each phase) and a line for
    each dataset whose rows grew since its last line; a Run of one dataset
    writes that dataset's line. A dataset that had a line gets a last one
    when the Run ends; the others are in the summary that follows, so a
    source of 200 small tables logs a handful of lines, not 800.
    """

    def __init__(self, every_s: float | None = None) -> None:
        self.every_s = every_s if every_s is not None else _every()
        self.source = ""
        self.datasets: list[str] = []
        self.started = self.last_round = time.monotonic()
        self.totals: dict[str, _State] = {}
        self.said: dict[str, _State] = {}

    def run_started(self, run_id: str, source: str, datasets: list[str]) -> None:
        super().run_started(run_id, source, datasets)
        self.source, self.datasets = source, list(datasets)
        self.started = self.last_round = time.monotonic()
        self.totals, self.said = {}, {}
        self._say(f"run {run_id}: capturing {source} ({', '.join(datasets)})")

    def progress(self, dataset: str, rows: int, nbytes: int, deliveries: int) -> None:
        phase, _, old_bytes, _ = self.totals.get(dataset, ("", 0, 0, 0))
        self.totals[dataset] = (phase, rows, nbytes or old_bytes, deliveries)
        self._round()

    def phase(self, dataset: str, phase: str) -> None:
        _, rows, nbytes, deliveries = self.totals.get(dataset, ("", 0, 0, 0))
        self.totals[dataset] = (phase, rows, nbytes, deliveries)
        self._round()

    def note(self, message: str) -> None:
        self._say(message)

    def run_finished(self, run_id: str, state: str) -> None:
        super().run_finished(run_id, state)
        for dataset in self.said:
            self._line(dataset, "done" if state == "succeeded" else state)

    def _round(self) -> None:
        """The lines due, when ``every_s`` has passed since the last round."""
        now = time.monotonic()
        if now - self.last_round < self.every_s:
            return
        self.last_round = now
        if len(self.datasets) <= 1:
            for dataset in self.totals:
                self._line(dataset)
            return
        self._say(f"{self.source}: {self._standing()}, {self._elapsed()} elapsed")
        for dataset, (phase, rows, _, _) in self.totals.items():
            if phase == "extracting" and rows > self.said.get(dataset, ("", 0, 0, 0))[1]:
                self._line(dataset)

    def _standing(self) -> str:
        """How many datasets are in each phase, in lifecycle order."""
        counts = dict.fromkeys(_PHASES, 0)
        for dataset in self.datasets:
            phase = self.totals.get(dataset, ("waiting", 0, 0, 0))[0] or "waiting"
            counts[phase] = counts.get(phase, 0) + 1
        parts = [f"{n} {phase}" for phase, n in counts.items() if n]
        return f"{len(self.datasets)} datasets ({', '.join(parts)})"

    def _line(self, dataset: str, phase: str | None = None) -> None:
        state = self.totals.get(dataset, ("", 0, 0, 0))
        self.said[dataset] = state
        now_phase, rows, nbytes, deliveries = state
        self._say(
            f"{self.source}.{dataset} {phase or now_phase}: {rows:,} rows, "
            f"{nbytes / 1e6:.1f} MB, {deliveries} deliveries, {self._elapsed()} elapsed"
        )

    def _elapsed(self) -> str:
        elapsed = int(time.monotonic() - self.started)
        return f"{elapsed // 3600}:{elapsed // 60 % 60:02d}:{elapsed % 60:02d}"

    @staticmethod
    def _say(message: str) -> None:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        err.print(Text(f"{stamp} {message}"), highlight=False, soft_wrap=True)


def _every() -> float:
    text = os.environ.get(EVERY_ENV, "")
    try:
        return max(0.0, float(text)) if text else 10.0
    except ValueError:
        return 10.0


def reporter() -> BarProgress | LineProgress:
    """Bars on a terminal, lines elsewhere."""
    return BarProgress() if err.is_terminal else LineProgress()


def say_interrupted(signal_name: str, what: str = "") -> None:
    """Tell what SIGINT or SIGTERM did to the command and to each Run in flight.

    A Run so stopped stays unfinished with its leases released: the next
    capture of its source, or ``combined repair``, marks it failed; what it
    committed before is in the lake and projected from it, and nothing
    uncommitted is published.
    """
    err.print(f"stopped by {signal_name}{what}", highlight=False)
    for run_id, source in ACTIVE.items():
        err.print(
            Text(
                f"  run {run_id} ({source}) was interrupted: it stays unfinished, its "
                f"leases released; the next `combined capture` of {source} (or "
                "`combined repair`) marks it failed. Nothing it did not commit is "
                "published; what it committed is kept in the lake."
            ),
            highlight=False,
        )
    ACTIVE.clear()
