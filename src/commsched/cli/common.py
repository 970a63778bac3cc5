"""Helpers shared by CLI commands: console, errors as clean messages, the options several commands take alike."""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Annotated, Any, NoReturn

import typer
from rich.console import Console
from typer.core import TyperGroup

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
        fail(str(exc))


def error_line(message: str) -> None:
    """Print ``error: message`` on stderr as one line: never wrapped (at any width, piped or not), line breaks in
    the message joined, brackets in names not markup. :func:`fail` also exits 2."""
    from rich.markup import escape

    text = " ".join(part.strip() for part in str(message).splitlines() if part.strip())
    err_console.print(f"[bold red]error:[/] {escape(text)}", soft_wrap=True)


def install_typer_conventions() -> None:
    """Make typer's own output follow the CLI's: a usage error (unknown option, bad value) is one ``error:`` line
    naming the command's --help (typer draws a panel that wraps at the terminal's width), and a flag shows no
    ``<bool>`` type in --help (it takes no value). Called once, when the app is built."""
    from typer import core, rich_utils

    if getattr(rich_utils, "_commsched_conventions", False):
        return

    def one_line_usage_error(exc: Any) -> None:
        if type(exc).__name__ == "NoArgsIsHelpError":  # typer has printed the help
            return
        ctx = getattr(exc, "ctx", None)
        hint = f" (see '{ctx.command_path} --help')" if ctx is not None else ""
        error_line(f"{exc.format_message()}{hint}")

    # typer's hooks as of 0.29; another version without them keeps its own rendering (tests/test_cli.py notices)
    if hasattr(rich_utils, "rich_format_error"):
        rich_utils.rich_format_error = one_line_usage_error
    option = getattr(core, "TyperOption", None)
    if option is not None and hasattr(option, "display_type_rich"):
        display_type = option.display_type_rich

        def flag_without_type(self: Any, ctx: Any) -> str | None:
            return None if getattr(self, "is_flag", False) else display_type(self, ctx)

        option.display_type_rich = flag_without_type
    rich_utils._commsched_conventions = True


JSON_STDOUT = "-"
"""the ``--json`` value that means stdout"""

OPTIONAL_VALUES = {"--json": JSON_STDOUT}
"""options whose value may be left out (typer takes no optional-value options): given last, or before another
option, they read as given this value"""


def bare_json_as_stdout(args: Sequence[str]) -> list[str]:
    """A command's arguments with each value-less ``--json`` (:data:`OPTIONAL_VALUES`) given its value: ``--json``
    followed by nothing or by another option (``-x``, ``--x``; ``-`` is a value) reads as ``--json -``. A ``--json``
    followed by anything else takes it as its PATH (so ``--json`` before a positional argument must be ``--json -``)."""
    out: list[str] = []
    items = list(args)
    for k, arg in enumerate(items):
        out.append(arg)
        if arg == "--":
            out.extend(items[k + 1 :])
            break
        if arg in OPTIONAL_VALUES:
            nxt = items[k + 1] if k + 1 < len(items) else None
            if nxt is None or (nxt.startswith("-") and nxt != "-"):
                out.append(OPTIONAL_VALUES[arg])
    return out


class CommandGroup(TyperGroup):
    """The app's command group: a bare ``--json`` reads as ``--json -``
    (:func:`bare_json_as_stdout`), and Ctrl-C anywhere in a command is "interrupted" on stderr
    and exit 130 (typer exits 130 saying nothing)."""

    def resolve_command(self, ctx: Any, args: list[str]) -> Any:
        name, cmd, rest = super().resolve_command(ctx, args)
        return name, cmd, bare_json_as_stdout(rest)

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt:
            err_console.print("interrupted", highlight=False)
            raise typer.Exit(130) from None


def warn(lines: Iterable[str]) -> None:
    """Print each line as ``warning: line`` on stderr, one line each (stdout stays clean for --json)."""
    from rich.markup import escape

    for line in lines:
        err_console.print(f"[bold yellow]warning:[/] {escape(line)}", soft_wrap=True)


def fail(message: str) -> None:
    """Print ``error: message`` on one line (:func:`error_line`) and exit 2."""
    error_line(message)
    raise typer.Exit(2) from None


class Stages:
    """Progress of a command that runs in named stages: one rich line on stderr with the stage, a bar over the
    stages (``2/3``), what the stage is doing and the elapsed time, cleared when done. Shown only where stderr is a
    terminal and ``enabled`` (commands pass ``enabled=not json``), as sweep's and calibrate's bars; else every call
    is a no-op, so piped output and --json stay clean.

    ``with Stages(("trace", "import", "write")) as st: st.stage("trace", "layer 1/4"); st.detail("layer 2/4")``"""

    def __init__(self, stages: Sequence[str], *, enabled: bool = True) -> None:
        self.stages = tuple(stages)
        self._bar: Any = None
        self._task: Any = None
        self._current = ""
        if enabled and err_console.is_terminal:
            from rich import progress

            columns = (
                progress.SpinnerColumn(),
                progress.TextColumn("{task.description}"),
                progress.BarColumn(bar_width=20),
                progress.MofNCompleteColumn(),
                progress.TimeElapsedColumn(),
            )
            self._bar = progress.Progress(*columns, console=err_console, transient=True)

    def __enter__(self) -> Stages:
        if self._bar is not None:
            self._bar.start()
            self._task = self._bar.add_task(self.stages[0] if self.stages else "", total=len(self.stages))
        return self

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.stop()

    def stage(self, name: str, detail: str = "") -> None:
        """Stage ``name`` (one of ``stages``) begins: the stages before it count as done."""
        self._current = name
        done = self.stages.index(name) if name in self.stages else 0
        self._update(detail, completed=done)

    def detail(self, text: str) -> None:
        """What the current stage is doing now (a layer, a rank, an iteration)."""
        self._update(text)

    def _update(self, detail: str, **fields: Any) -> None:
        if self._bar is not None:
            text = f"{self._current}: {detail}" if detail else self._current
            self._bar.update(self._task, description=escape_markup(text), refresh=True, **fields)


def escape_markup(text: str) -> str:
    """``text`` with rich markup escaped (file and node names may hold brackets)."""
    from rich.markup import escape

    return escape(text)


# The hardware arguments of every command that estimates costs: commsched.hardware.for_graph reads them, as
# commsched.schedule / simulate / estimate_costs do.
HardwareOption = Annotated[str, typer.Option("--hardware", "-H", help="hardware profile name or path to a .toml file")]
NumNodesOption = Annotated[
    int | None, typer.Option("--num-nodes", min=1, help="nodes in the cluster (default: enough for the world size)")
]
GpusPerNodeOption = Annotated[
    int | None, typer.Option("--gpus-per-node", min=1, help="override the profile's GPUs per node")
]

# pass knobs, as commsched.schedule takes them (see parse_knobs)
KnobOption = Annotated[
    list[str], typer.Option("--knob", "-k", help="pass knob NAME=VALUE, or PASS.NAME=VALUE for one pass (repeatable)")
]


def parse_knobs(items: list[str]) -> dict[str, Any]:
    """``--knob`` values as ``commsched.schedule`` keywords: ``NAME=VALUE`` sets NAME on every pass that has it,
    ``PASS.NAME=VALUE`` on that pass only (``{PASS: {NAME: VALUE}}``). VALUE is read as JSON when it parses
    (``true``, ``1.5``, ``null``, ``[1, 2]``), else kept as a string; the passes convert and check it."""
    knobs: dict[str, Any] = {}
    for item in items:
        name, sep, text = item.partition("=")
        name = name.strip()
        if not sep or not name:
            raise ValueError(f"--knob {item!r}: expected NAME=VALUE or PASS.NAME=VALUE, e.g. overlap.waits=late")
        try:
            value = json.loads(text)
        except json.JSONDecodeError:
            value = text
        pass_name, dot, field = name.rpartition(".")
        if dot:
            namespace = knobs.setdefault(pass_name, {})
            if not isinstance(namespace, dict):
                raise ValueError(f"--knob {item!r}: {pass_name!r} is also given a value; use {pass_name}.NAME=VALUE")
            namespace[field] = value
        else:
            knobs[name] = value
    return knobs


def run_on_executor(fn: Callable[[Any], Any], jobs: int | None, ray_address: str | None) -> Any:
    """``fn(executor)`` on the executor of ``--jobs`` / ``--ray-address``, closed after: one that cannot start is a
    ValueError (a one-line error under :func:`user_errors`); Ctrl-C, after the executor stopped every worker, is
    "interrupted" and exit 130."""
    from commsched.execute import ExecutorError, make_executor

    deadline = ctrl_c_deadline() if ray_address is None else contextlib.nullcontext()  # Ray stops its own way
    try:
        with deadline:
            executor = make_executor(jobs=jobs, ray_address=ray_address)
            try:
                return fn(executor)
            finally:
                executor.close()
    except ExecutorError as exc:
        raise ValueError(str(exc)) from None
    except KeyboardInterrupt:
        exit_interrupted("interrupted")


def exit_interrupted(message: str) -> NoReturn:
    """After Ctrl-C, once the executor has stopped every worker: ``message`` on stderr, then exit 130 at once.

    The process leaves with ``os._exit``. When it left through ``SystemExit`` instead, about one run in three of a
    sweep interrupted 2-4 s after its workers started died of SIGINT (exit status -2) after printing the message,
    with no traceback: some part of the interpreter's shutdown still took the signal. Every file is written
    atomically and the workers are already reaped, so nothing is lost by skipping the rest of shutdown."""
    err_console.print(message)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(130)


CTRL_C_DEADLINE_S = 3.0
"""how long after Ctrl-C a local-pool run may take to stop before it is stopped by force (a normal stop takes well
under a second)"""


@contextlib.contextmanager
def ctrl_c_deadline(seconds: float = CTRL_C_DEADLINE_S) -> Iterator[None]:
    """Ctrl-C inside the block raises KeyboardInterrupt as usual (the executor reaps its workers, the finished rows
    are kept), and also arms a timer: if the block has not been left ``seconds`` later (a cleanup that waits on
    something the interrupt left held), the process's multiprocessing children are killed and it exits 130 at
    once. A safety net for the promise that Ctrl-C stops a local pool within a few seconds and leaves no worker
    behind."""
    import signal
    import threading

    def force_exit() -> None:
        import multiprocessing

        for child in multiprocessing.active_children():
            with contextlib.suppress(Exception):
                child.kill()
                child.join(0.5)
        exit_interrupted(f"interrupted: stopped by force, {seconds:g} s after Ctrl-C")

    timer: list[threading.Timer] = []

    def on_sigint(signum: int, frame: Any) -> None:
        if not timer:
            timer.append(threading.Timer(seconds, force_exit))
            timer[0].daemon = True
            timer[0].start()
        signal.default_int_handler(signum, frame)

    if threading.current_thread() is not threading.main_thread():  # signals reach the main thread only
        yield
        return
    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        for t in timer:  # the block has been left (its cleanup done): the rest of the stop is the caller's
            t.cancel()


@contextlib.contextmanager
def quiet_torch_logs() -> Iterator[None]:
    """Log records below WARNING held back inside the block: torch sets some of its loggers to INFO as their module
    is imported (Inductor's FSDP bucketing pass, which torch's OverlapScheduler runs, announces what it merged on
    stderr); the command's output is its tables. Warnings and errors still show."""
    import logging

    previous = logging.root.manager.disable
    logging.disable(max(previous, logging.INFO))
    try:
        yield
    finally:
        logging.disable(previous)
