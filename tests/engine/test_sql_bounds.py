"""`combined sql` is bounded in time and memory, and stops at once on SIGINT or SIGTERM."""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

#: A query DuckDB takes minutes over: it reads no lake file, only a range.
SLOW = "SELECT sum(hash(i)) AS s FROM range(1000000000000) t(i)"


def test_a_query_over_its_timeout_is_stopped_with_a_clear_error(captured: Path, tools: Any) -> None:
    """`--timeout` stops a query that runs too long.

    Reproduction: `combined sql` over a query that runs for hours held the
    process (and its memory) for hours: there was no statement timeout. Now
    `--timeout 2` interrupts DuckDB after 2 s: exit 2, a message saying so.
    """
    began = time.monotonic()
    done = tools.cli(captured, "sql", "--timeout", "2", SLOW)
    took = time.monotonic() - began
    assert done.returncode == 2, (done.returncode, done.stderr)
    assert "the query ran longer than its timeout of 2 s and was stopped" in done.stderr
    assert "--timeout" in done.stderr and "bug in Combined" not in done.stderr
    assert took < 60
    quick = tools.cli(captured, "sql", "--timeout", "30", "SELECT count(*) AS n FROM shop.orders")
    assert quick.returncode == 0 and "200" in quick.stdout


def test_a_query_over_its_memory_limit_fails_clearly(captured: Path, tools: Any) -> None:
    """`--memory-limit` caps DuckDB's memory; a query that needs more fails with advice.

    Reproduction: a query building a list of 200 million integers took as much
    memory as DuckDB's default (80% of the machine's RAM) allowed. Now it is
    refused at `--memory-limit 64MB`, exit 2, naming the option.
    """
    greedy = "SELECT list(i) AS l FROM range(200000000) t(i)"
    done = tools.cli(captured, "sql", "--memory-limit", "64MB", greedy)
    assert done.returncode == 2, (done.returncode, done.stderr)
    assert "the query needs more memory than its limit of 64MB" in done.stderr
    assert "--memory-limit" in done.stderr and "bug in Combined" not in done.stderr
    bad = tools.cli(captured, "sql", "--memory-limit", "lots", "SELECT 1")
    assert bad.returncode == 2 and "is not a size DuckDB reads" in bad.stderr


@pytest.mark.parametrize(
    ("sig", "status", "said"),
    [
        (signal.SIGTERM, 143, "stopped by SIGTERM"),
        (signal.SIGINT, 130, "stopped by SIGINT: the query was interrupted"),
    ],
)
def test_a_signal_stops_a_running_query_at_once(
    captured: Path, sig: signal.Signals, status: int, said: str
) -> None:
    """SIGTERM and SIGINT stop `combined sql` while DuckDB runs the query.

    Reproduction: SIGTERM to `combined sql` over a long query was not
    handled until the query ended (minutes later), and then ended as
    "internal error ... this is a bug in Combined" (exit 70). Now the query
    is interrupted at once: exit 143 (SIGTERM) or 130 (SIGINT), one clear line.
    """
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    quick = subprocess.run(
        [sys.executable, "-c", "from combined.cli import main; main()", "sql", "SELECT 1 AS n"],
        cwd=captured,
        capture_output=True,
        check=True,
    )
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    startup = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    assert quick.returncode == 0
    child = subprocess.Popen(
        [sys.executable, "-c", "from combined.cli import main; main()", "sql", SLOW],
        cwd=captured,
        env=os.environ.copy(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        _wait_until_busy(child.pid, startup)
        child.send_signal(sig)
        began = time.monotonic()
        _, err = child.communicate(timeout=60)
        took = time.monotonic() - began
    finally:
        if child.poll() is None:
            child.kill()
            child.communicate()
    assert child.returncode == status, err
    assert said in err and "bug in Combined" not in err
    assert took < 30


def _cpu_seconds(pid: int) -> float:
    """The CPU time (user and system, every thread) process ``pid`` has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _wait_until_busy(pid: int, startup: float) -> None:
    """Wait until ``pid`` used 2 s of CPU more than a whole quick query takes.

    ``startup`` is the CPU time of `combined sql "SELECT 1"`: everything
    before the query runs costs no more than that, so past it the slow query
    is certainly running, whatever the machine's load.
    """
    deadline = time.monotonic() + 300
    while _cpu_seconds(pid) < startup + 2:
        assert time.monotonic() < deadline, "the query never started"
        time.sleep(0.1)
