"""``commsched replay``: replay profiler traces with the simulator, measured next to replayed, with what-ifs."""

from __future__ import annotations

from pathlib import Path

import typer

from commsched.cli.common import console, user_errors, warn
from commsched.cli.options import emit_json, json_option, out_file


def register(app: typer.Typer) -> None:
    @app.command()
    def replay(
        traces: list[Path] = typer.Argument(
            ..., help="PyTorch profiler traces (.json / .json.gz), one per rank, or folders of them"
        ),
        scale: list[str] = typer.Option(
            [], "--scale", help="what-if SELECTOR=FACTOR: stream:N, kernel:REGEX, comm, compute (repeatable)"
        ),
        hardware: str = typer.Option(
            None, "--hardware", "-H", help="re-cost the recorded NCCL collectives with this hardware profile"
        ),
        comm_pattern: list[str] = typer.Option(
            [], "--comm-pattern", help="a regex naming more communication kernels (added to the defaults)"
        ),
        json_out: str = json_option(),
        trace_out: Path = out_file("--trace", help="write the (slowest rank's) replay as a Chrome trace"),
        html: Path = out_file("--html", help="write the (slowest rank's) replay as an HTML report"),
    ) -> None:
        """Replay each profiler trace from its device work's durations and dependencies (stream order, launches,
        events, synchronising calls; not its timestamps) and print the measured and replayed step, per-stream busy
        time, exposed communication and overlap side by side. What-ifs change durations, never timestamps: a
        stream, kernels by name, all communication or all computation scaled, or the recorded collectives re-costed
        on a hardware profile. Several ranks' traces are aligned by collective sequence (stragglers).

        Example: commsched replay tests/replay/data/hta_sampled_rank0.json.gz --scale stream:7=2 --scale comm=0.5
        """
        from commsched.replay.kineto import DEFAULT_COMM_PATTERNS
        from commsched.replay.run import replay_traces
        from commsched.replay.whatif import parse_scale
        from commsched.report.terminal_replay import print_multi_replay

        with user_errors():
            scales = [parse_scale(s) for s in scale]
            result = replay_traces(traces, scales, hardware, (*DEFAULT_COMM_PATTERNS, *comm_pattern))
            written = []
            if trace_out:
                from commsched.report.trace import write_chrome_trace

                written.append(write_chrome_trace(result.slowest.sim, trace_out))
            if html:  # the replay's own result, as the terminal and the JSON print it
                from commsched.report.replay_html import write_replay_html

                written.append(write_replay_html(result.slowest, html, context={"what-if": ", ".join(scale) or "none"}))
        warn(result.warnings)
        if json_out:
            out = result.to_dict()
            out["files"] = [str(p) for p in written]
            with user_errors():
                path = emit_json(out, json_out)
            if path is None:
                return
            written.append(path)
        print_multi_replay(result, console)
        for p in written:
            console.print(f"wrote [bold]{p}[/]")
