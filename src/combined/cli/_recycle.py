"""A long-running command that starts afresh in place once it has grown (``--recycle-mb``).

``combined worker`` and ``combined cdc follow`` capture for weeks in one
process. The Delta library keeps a few KB of native memory for every table
it opens (delta-io/delta-rs issue 4241, open; bench/RESULTS.md): ~40 KB a
capture of a small table, ~23 KB a `cdc follow` round with nothing to read.
Between two captures, never inside one, such a command whose anonymous
memory grew by ``--recycle-mb`` since it started replaces itself with the
same command line (``exec``: the same process id, so a supervisor sees
nothing stop), its count of captures left carried on.
"""

from __future__ import annotations

import os
import sys
from typing import Annotated

import typer

from combined.cli import err
from combined.runtime._memory import held_anonymous

#: The default: a worker capturing a small table once a minute starts afresh
#: about every nine days, a `cdc follow` every 5 s with nothing to read every day or so.
RECYCLE_MB = 512

RecycleOpt = Annotated[
    int,
    typer.Option(
        "--recycle-mb",
        min=0,
        help="between captures, start afresh in place once the process holds this many MB "
        "more than when it started (0: never)",
    ),
]


class Recycler:
    """How much the process grew since it started, against its ``--recycle-mb``."""

    def __init__(self, limit_mb: int) -> None:
        self.limit, self.started = limit_mb << 20, held_anonymous()

    def due(self) -> bool:
        """Whether the process grew by its limit (never with a limit of 0)."""
        return bool(self.limit) and held_anonymous() - self.started >= self.limit

    def start_again(self, command: str, count: str, left: int | None) -> None:
        """Replace this process with its own command line, told ``left`` for ``count``
        (the option counting what is still to do), or as it was if None."""
        argv = list(sys.orig_argv)
        if left is not None:
            argv = [*_without_option(argv, count), count, str(left)]
        grown = (held_anonymous() - self.started) >> 20
        err.print(
            f"{command} grew by {grown} MB since it started: starting afresh in place "
            "(between captures: none is interrupted)",
            highlight=False,
        )
        sys.stdout.flush()
        sys.stderr.flush()
        os.execv(sys.executable, argv)


def _without_option(argv: list[str], name: str) -> list[str]:
    """``argv`` without the option ``name`` and its value (``--name V`` or ``--name=V``)."""
    kept: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg == name:
            skip = True
        elif not arg.startswith(name + "="):
            kept.append(arg)
    return kept
