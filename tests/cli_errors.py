"""A CLI command's one-line error, checked the same way by every test that needs it."""

from __future__ import annotations

from typer.testing import CliRunner

from commsched.cli import app

runner = CliRunner()


def one_error_line(args: list[str], *words: str) -> str:
    """Run ``commsched ARGS``: it must exit 2 with one ``error: ...`` line on stderr holding every word of
    ``words``; that line."""
    res = runner.invoke(app, args)
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert res.exit_code == 2 and len(lines) == 1 and lines[0].startswith("error: "), (res.exit_code, res.output)
    assert all(w in lines[0] for w in words), (words, lines[0])
    return lines[0]
