"""The ``commsched`` command line. Each command lives in its own module and registers itself here."""

from __future__ import annotations

import gc
import importlib

import typer

from commsched.cli.common import CommandGroup, install_typer_conventions

install_typer_conventions()
app = typer.Typer(
    name="commsched",
    help="Hide communication behind computation: trace, estimate, schedule and simulate distributed steps.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    cls=CommandGroup,
)

# modules that define `register(app)`; one per command family
COMMAND_MODULES = (
    "commsched.cli.info",
    "commsched.cli.hardware",
    "commsched.cli.trace",
    "commsched.cli.estimate",
    "commsched.cli.calibrate",
    "commsched.cli.demo",
    "commsched.cli.simulate",
    "commsched.cli.schedule",
    "commsched.cli.compare",
    "commsched.cli.optimize",
    "commsched.cli.predict",
    "commsched.cli.rewrite",
    "commsched.cli.sweep",
    "commsched.cli.run",
    "commsched.cli.replay",
    "commsched.cli.pipeline",
    "commsched.cli.plan",
)

for _mod in COMMAND_MODULES:
    importlib.import_module(_mod).register(app)


def main() -> None:
    """Run the command line; exits (SystemExit) with the command's status."""
    try:
        app()
    finally:
        # Python's finalisation runs full collections over every object still alive: after torch, 1-2 s of the
        # exit (benchmarks/RESULTS.md, issue 24). Frozen, they are skipped; exit handlers still run and modules and
        # objects are still freed, only reference cycles are left to the OS (Python never promises their __del__).
        gc.freeze()
