"""``combined run cancel``: cancel a queued Run, or ask a running one to stop."""

from __future__ import annotations

import getpass
from typing import Annotated

import typer

from combined.cli import ProjectOpt, _session, console, run_app


def _user() -> str:
    """The operating system's name of the user running the command."""
    try:
        return getpass.getuser()
    except (OSError, KeyError):
        return "unknown"


@run_app.command("cancel")
def run_cancel(
    run_id: str,
    reason: Annotated[str | None, typer.Option("--reason", help="why (recorded)")] = None,
    by: Annotated[
        str | None, typer.Option("--by", help="who cancels (default: your user name)")
    ] = None,
    project: ProjectOpt = None,
) -> None:
    """Cancel a run: a queued one at once; a running one stops its read and commits nothing.

    A finished run (or one already committing) cannot be canceled: exit status 2.
    """
    who = by or _user()
    with _session(project) as engine:
        run = engine.cancel(run_id, by=who, reason=reason)
    if run.state == "canceled":
        console.print(f"run {run.id} canceled by {who}")
    else:
        console.print(
            f"run {run.id} is {run.state}: asked to stop (by {who}); it ends canceled once "
            "its process sees the request (within a few seconds)"
        )
