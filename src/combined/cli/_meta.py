"""``combined --version`` and ``combined schema``: which Combined, and the files it reads."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from combined.cli import _fail, app, console


def print_version(value: bool) -> None:
    """``--version``: print it and stop (an eager option of the app's callback)."""
    if value:
        from combined import __version__

        console.print(f"combined {__version__}")
        raise typer.Exit()


@app.command()
def schema(
    output: Annotated[
        Path | None, typer.Option("--output", "-o", help="write it to this file, not stdout")
    ] = None,
    reference: Annotated[
        bool,
        typer.Option(
            "--reference", help="the Markdown reference of every key (docs/configuration.md)"
        ),
    ] = False,
) -> None:
    """Print the JSON Schema of combined.yaml, which editors use to complete and check it."""
    from combined.config._reference import reference_markdown, schema_text
    from combined.errors import ConfigError

    text = reference_markdown() if reference else schema_text()
    if output is None:
        sys.stdout.write(text)
        return
    try:
        output.write_text(text, encoding="utf-8")
    except OSError as exc:
        _fail(
            ConfigError(
                f"cannot write {output}: {exc.strerror or type(exc).__name__}",
                hint="choose a path this user can write to",
            )
        )
    console.print(f"wrote {output}")
