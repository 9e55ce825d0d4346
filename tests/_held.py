"""Processes held at their first dataset lease while a test acts, then let go.

A child process's ``Catalog.acquire_lease`` writes a file when it is reached
and waits until the file ``go`` exists: a test can act while a Run was
admitted (or taken) and holds nothing yet.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path


def while_held(
    root: Path, code: str, reached: str, action: Callable[[], subprocess.CompletedProcess[str]]
) -> tuple[str, subprocess.CompletedProcess[str]]:
    """Run ``code`` (argv[1]: ``root``) in a child process and ``action`` while it waits.

    The child writes the file ``root/reached`` when it gets to its waiting
    point and waits there until ``root/go`` exists. Returns its output (once
    it ended with status 0) and what ``action`` returned.
    """
    import time

    child = subprocess.Popen(
        [sys.executable, "-c", code, str(root)],
        cwd=root,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while not (root / reached).exists():
            assert child.poll() is None and time.monotonic() < deadline, child.stderr
            time.sleep(0.05)
        done = action()
    finally:
        (root / "go").touch()
        out, err = child.communicate(timeout=120)
    assert child.returncode == 0, err
    return out, done


def _held_before_its_lease(reached: str) -> str:
    """Code that makes the process's first dataset lease wait until the file ``go`` exists
    (``argv[1]``: the directory), writing the file ``reached`` when it gets there."""
    return f"""
import sys, time
from pathlib import Path
from combined.catalog import Catalog

root = Path(sys.argv[1])
take = Catalog.acquire_lease

def held(self, *args, **kwargs):
    (root / "{reached}").touch()
    while not (root / "go").exists():
        time.sleep(0.05)
    return take(self, *args, **kwargs)

Catalog.acquire_lease = held
"""


#: A capture of shop.orders that, once admitted, waits before taking the dataset's
#: lease until the file ``go`` exists (it writes ``admitted`` when it gets there).
CAPTURE_HELD_BEFORE_ITS_LEASE = (
    _held_before_its_lease("admitted")
    + """
from combined.engine import Engine

engine = Engine.open(root / "combined.yaml")
(run,) = engine.capture(["shop.orders"])
print(run.state, run.error)
"""
)

#: A ``combined`` command (argv[2:]) that waits before taking its first dataset lease
#: until the file ``go`` exists (it writes ``reached`` when it gets there).
COMMAND_HELD_BEFORE_ITS_LEASE = (
    _held_before_its_lease("reached")
    + """
from combined.cli import main

sys.argv = ["combined", *sys.argv[2:]]
main()
"""
)
