"""Helpers shared by CLI commands: console, errors as clean messages."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import typer
from rich.console import Console

console = Console()
err_console = Console(stderr=True)


@contextlib.contextmanager
def user_errors() -> Iterator[None]:
    """Turn expected errors (bad input) into a one-line message and exit code 2, without a traceback."""
    from commsched.ir import GraphError

    try:
        yield
    except (GraphError, ValueError, FileNotFoundError) as exc:
        err_console.print(f"[bold red]error:[/] {exc}")
        raise typer.Exit(2) from None
