"""Helpers shared by CLI commands: console, errors as clean messages."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator

import typer
from rich.console import Console

# captured output (CI logs, pipes) gets wide tables instead of rich's 80-column default
console = Console(width=None if sys.stdout.isatty() else 140)
err_console = Console(stderr=True, width=None if sys.stderr.isatty() else 140)


@contextlib.contextmanager
def user_errors() -> Iterator[None]:
    """Turn expected errors (bad input) into a one-line message and exit code 2, without a traceback."""
    from commsched.ir import GraphError

    try:
        yield
    except (GraphError, ValueError, FileNotFoundError) as exc:
        err_console.print(f"[bold red]error:[/] {exc}")
        raise typer.Exit(2) from None
