"""The options every command takes: how it logs (``--log-format``, ``--log-level``), and
``--version``."""

from __future__ import annotations

from typing import Annotated

import typer

from combined.cli import _fail, app
from combined.cli._meta import print_version


@app.callback()
def _global_options(
    log_format: Annotated[
        str | None,
        typer.Option(
            "--log-format",
            help="text or json (one object a line): how logs reach standard error "
            "[env COMBINED_LOG_FORMAT; combined.yaml logging.format]",
        ),
    ] = None,
    log_level: Annotated[
        str | None,
        typer.Option(
            "--log-level",
            help="DEBUG, INFO, WARNING (default) or ERROR "
            "[env COMBINED_LOG_LEVEL; combined.yaml logging.level]",
        ),
    ] = None,
    version: Annotated[
        bool,
        typer.Option(
            "--version",
            help="print the version and exit",
            callback=print_version,
            is_eager=True,
        ),
    ] = False,
) -> None:
    """Capture data you do not own into a Delta Lake you do own, governed."""
    from combined._logging import configure
    from combined.errors import CombinedError

    try:
        configure(log_format, log_level, explicit=log_format is not None or log_level is not None)
    except CombinedError as exc:
        _fail(exc)
