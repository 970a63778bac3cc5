"""``commsched calibrate``: measure this machine and write a hardware profile (and its measured table); or, with
``--nccl-tests``, compare nccl-tests / rccl-tests logs with the collective model, and with ``--fit`` fit the
profile's collective fields to them and write the result as a profile overlay (:mod:`commsched.cost.nccl_fit`)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer

from commsched.cli.common import console, error_line, user_errors
from commsched.cli.options import json_option, out_file

if TYPE_CHECKING:
    from rich.console import Console

    from commsched.cost.nccl_fit import FitResult
    from commsched.cost.nccl_tests import LogComparison
    from commsched.cost.trace_calibrate import TraceCalibration


def run_calibration(
    device: str,
    out: Path | None,
    *,
    world: int = 2,
    quick: bool = False,
    threads: int | None = 1,
    base: str | None = None,
    collectives: bool = True,
    gpus_per_node: int | None = None,
    force: bool = False,
    progress=None,
) -> tuple[Path, object]:
    """Measure, fit and write; returns (profile path, Hardware). ``progress(step_text)`` is called per step.

    ``out`` (default: ``cpu-local.toml`` / ``cuda-local.toml`` in the user profile folder) is checked before any
    measurement: never a file in the package's shipped profiles, never an existing file unless ``force``. A fit
    that ends on a search bound is a ValueError naming the field, and nothing is written."""
    import dataclasses
    import datetime
    import sys

    from commsched import hardware as hw_mod
    from commsched.cost.calibrate import (
        fit_profile,
        machine_description,
        measure_collectives,
        measure_compute,
        measurements_table,
    )
    from commsched.cost.nccl_fit import check_overlay_path

    if device not in ("cpu", "cuda"):
        raise ValueError(f"--device {device!r}: expected cpu or cuda")
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise ValueError(
                "--device cuda: torch sees no CUDA device here; expected a machine with one, or --device cpu"
            )
    name = "cpu-local" if device == "cpu" else "cuda-local"
    out = out or hw_mod.user_profile_dir() / f"{name}.toml"
    try:
        check_overlay_path(out, force=force)
        table_path = Path(out).with_name(f"{Path(out).stem}.table.json")
        if table_path.exists() and not force:
            raise FileExistsError(f"{table_path} exists: pass --force to replace it, or another -o path")
    except FileExistsError as exc:
        raise ValueError(
            str(exc).replace("another -o path", "another -o path (a new calibration is a new file)")
        ) from None
    base_hw = hw_mod.get(base or ("cpu-local" if device == "cpu" else "h100-sxm"))
    if base is None and device == "cpu":
        # the shipped placeholder, not a previous calibration, so results never depend on an older run
        base_hw = hw_mod.load_profile(hw_mod.shipped_profile("cpu-local"))
    step = progress or (lambda text: None)
    coll = None
    if collectives:
        backend = "gloo" if device == "cpu" else "nccl"
        if device == "cuda":
            import torch

            world = min(world, torch.cuda.device_count())
        if world >= 2:
            step(f"collectives: {world} local {backend} ranks")
            # before any compute in this process: the ranks are forked, and OpenMP pools do not survive a fork
            coll = measure_collectives(world, backend=backend, quick=quick)
    step(f"kernels on {device}")
    dtypes = ("float32", "bfloat16") if not quick else ("float32",)
    m = measure_compute(device, quick=quick, dtypes=dtypes, threads=threads)
    step("fitting")
    hw = fit_profile(base_hw, m, coll, name=name)
    if gpus_per_node:
        hw = hw.with_nodes(1, gpus_per_node)
    description = f"{machine_description(device)}; calibrated"
    table_name = f"{Path(out).stem}.table.json"
    table = measurements_table(*([coll] if coll else []), source=str(Path(out).with_name(table_name)))
    hw = dataclasses.replace(hw, description=description)
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    command = " ".join(["commsched calibrate", *sys.argv[2:]]) if "calibrate" in sys.argv else "commsched calibrate"
    header = (
        f"Written by `commsched calibrate --device {device}` on {stamp}.\n"
        f"Machine: {machine_description(device)}.\n"
        "Every number below was measured on that machine and fitted (commsched.cost.calibrate), except [inter_node]\n"
        f"and [interference], copied from the base profile {base_hw.name!r}."
        + ("".join(f"\nNote: {n}" for n in (m.notes + (coll.notes if coll else []))))
    )
    extra = {"calibration": {"device": machine_description(device), "measured": stamp, "command": command}}
    if len(table):
        table.save(Path(out).with_name(table_name))
        extra["calibration"]["table"] = table_name
    step("writing")
    path = hw_mod.save_profile(hw, out, header=header, extra=extra)
    return path, hw_mod.load_profile(path)


def compare_nccl_tests(
    logs: list[Path],
    hardware: str,
    *,
    num_nodes: int | None = None,
    gpus_per_node: int | None = None,
    collective: str | None = None,
) -> list[LogComparison]:
    """Every test of every log against ``hardware`` (:func:`commsched.cost.nccl_tests.compare_with_model`)."""
    from commsched.cost.nccl_tests import compare_with_model, read_nccl_tests

    out = []
    for path in logs:
        for log in read_nccl_tests(path, collective=collective):
            out.append(compare_with_model(log, hardware, num_nodes=num_nodes, gpus_per_node=gpus_per_node))
    return out


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:+.1f} %"


def _size(nbytes: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes / scale:g} {unit}"
    return f"{nbytes} B"


def print_nccl_comparisons(comparisons: list[LogComparison], out: Console) -> None:
    """A table per log test (size, measured and model busbw, the model's algorithm, relative error) and its summary."""
    from rich.table import Table

    for c in comparisons:
        log = c.log
        where = f"{c.nranks} ranks on {c.num_nodes} x {c.gpus_per_node}" if c.nranks else "ranks unknown"
        gpu = log.gpu or "GPU not named"
        out.print(f"[bold]{log.source}:{log.line}[/]  {log.collective or '?'}, {where} ({gpu}) vs {c.hardware}",
                  soft_wrap=True)  # fmt: skip
        table = Table()
        for name in ("size (B)", "size", "measured busbw GB/s", "model busbw GB/s", "model algorithm", "rel err"):
            table.add_column(name, justify="left" if name in ("size", "model algorithm") else "right")
        for s in c.sizes:
            model = "-" if s.model_busbw_GBps is None else f"{s.model_busbw_GBps:.2f}"
            algo = f"{s.algorithm}/{s.protocol}" if s.algorithm else "-"
            # nccl-tests' own size column first, so that a row is found in the log by its exact size
            table.add_row(str(s.size_bytes), _size(s.size_bytes), f"{s.measured_busbw_GBps:.2f}", model, algo,
                          _pct(s.rel_err))  # fmt: skip
        out.print(table)
        if c.note:
            out.print(f"  note: {c.note}")
        if c.abs_errs():
            med, worst = (f"{100 * e:.1f} %" for e in (c.median_abs_err, c.worst_abs_err))
            out.print(f"  |rel err| over the {len(c.abs_errs())} sizes >= 1 MiB: median {med}, worst {worst}")
        out.print()


def print_fit(fit: FitResult, out: Console) -> None:
    """Per log the error per size before (base profile) and after the fit, then the fields and the summary."""
    from rich.table import Table

    logs: dict[tuple[str, int], list] = {}
    for s in fit.sizes:
        logs.setdefault((s.source, s.line), []).append(s)
    for (source, line), sizes in logs.items():
        first = sizes[0]
        out.print(f"[bold]{source}:{line}[/]  {first.collective}, {first.nranks} ranks on {first.num_nodes} nodes",
                  soft_wrap=True)  # fmt: skip
        table = Table()
        for name in ("size", "measured busbw GB/s", f"{fit.base.name} GB/s", "err before", "fitted GB/s",
                     "err after", "fitted algorithm", "note"):  # fmt: skip
            table.add_column(name, justify="left" if name in ("size", "fitted algorithm", "note") else "right")
        for s in sizes:
            note = "not fitted" if not s.fitted else ""
            note = "; ".join(n for n in (note, s.extrapolated and f"extrapolates: {s.extrapolated}") if n)
            table.add_row(_size(s.size_bytes), f"{s.measured_busbw_GBps:.2f}", f"{s.before_busbw_GBps:.2f}",
                          _pct(s.before_err), f"{s.after_busbw_GBps:.2f}", _pct(s.after_err), s.after_algorithm,
                          note)  # fmt: skip
        out.print(table)
    fields = Table()
    for name in ("field", "base", "fitted", "bounds", "status"):
        fields.add_column(name, justify="left" if name in ("field", "status") else "right")
    for p in fit.parameters:
        fields.add_row(p.key, f"{p.base:g}", f"{p.value:.4g}", f"[{p.lo:g}, {p.hi:g}]", p.status)
    out.print(fields)
    (med_b, worst_b), (med_a, worst_a) = fit.summary(after=False), fit.summary()
    n = sum(s.fitted for s in fit.sizes)
    out.print(f"|rel err| over the {n} fitted sizes (>= {_size(fit.min_bytes)}): median {100 * med_b:.1f} % -> "
              f"{100 * med_a:.1f} %, worst {100 * worst_b:.1f} % -> {100 * worst_a:.1f} %")  # fmt: skip


def _run_nccl_fit(logs: list[Path], hardware: str, num_nodes: int | None, gpus_per_node: int | None,
                  collective: str | None, fit_args: dict) -> tuple[FitResult, Path | None]:  # fmt: skip
    """``--fit``: check ``-o`` first (before the search), fit, write the overlay."""
    from commsched.cost.nccl_fit import check_overlay_path, fit_profile, save_overlay
    from commsched.cost.nccl_tests import ONE_MIB, read_nccl_tests

    out, force = fit_args["out"], fit_args["force"]
    if out is not None:
        check_overlay_path(out, force=force)
    parsed = [log for path in logs for log in read_nccl_tests(path, collective=collective)]
    min_bytes = 0 if fit_args["all_sizes"] else ONE_MIB
    fit = fit_profile(parsed, hardware, num_nodes=num_nodes, gpus_per_node=gpus_per_node, min_bytes=min_bytes,
                      allow_bounds=fit_args["allow_bounds"], network_only=fit_args["network"])  # fmt: skip
    return fit, None if out is None else save_overlay(fit, out, force=force)


def _run_nccl_mode(
    logs: list[Path] | None,
    hardware: str | None,
    num_nodes: int | None,
    gpus_per_node: int | None,
    collective: str | None,
    json_out: str | None,
    device_args: dict[str, bool],
    fit_args: dict,
) -> None:
    """``calibrate --nccl-tests``: compare (or fit and write), print, exit 2 with one line on stderr for bad input."""
    from rich.markup import escape

    from commsched.cli.options import emit_json

    try:
        stray = [name for name, given in device_args.items() if given]
        if stray:
            what = "--nccl-tests --fit writes only its -o overlay" if fit_args["fit"] else "--nccl-tests compares logs"
            raise ValueError(f"{what} and writes nothing else: drop {', '.join(stray)}")
        if not logs:
            raise ValueError("--nccl-tests: expected one or more LOG files")
        if not hardware:
            raise ValueError("--nccl-tests: expected --hardware PROFILE (the profile to compare with)")
        if fit_args["fit"]:
            fit, written = _run_nccl_fit(logs, hardware, num_nodes, gpus_per_node, collective, fit_args)
        else:
            comparisons = compare_nccl_tests(logs, hardware, num_nodes=num_nodes, gpus_per_node=gpus_per_node,
                                             collective=collective)  # fmt: skip
    except (ValueError, OSError) as exc:
        # one line however long the path: no wrapping; brackets of a quoted log line are not markup
        error_line(str(exc))
        raise typer.Exit(2) from None
    data = None
    if json_out and fit_args["fit"]:
        data = {**fit.to_json(), "overlay": None if written is None else str(written)}
    elif json_out:
        data = {"hardware": hardware, "logs": [c.to_json() for c in comparisons]}
    try:
        json_written = emit_json(data, json_out) if data is not None else None
    except (ValueError, OSError) as exc:
        error_line(str(exc))
        raise typer.Exit(2) from None
    if data is not None and json_written is None:  # on stdout, in place of the tables
        return
    if fit_args["fit"]:
        print_fit(fit, console)
        if written is not None:
            where = escape(str(written))
            use = f"{escape(fit.base.name.split('@')[0])}@{where}" if fit.network_only else where
            console.print(f"wrote {where} (use it with --hardware {use})", soft_wrap=True)
    else:
        print_nccl_comparisons(comparisons, console)
    if json_written is not None:
        console.print(f"wrote {escape(str(json_written))}", soft_wrap=True)


def print_trace_calibration(cal: TraceCalibration, out: Console) -> None:
    """Per (collective, group size, bytes): ranks, occurrences, the median over ranks and the per-rank min / max."""
    from rich.table import Table

    table = Table()
    for name in ("collective", "group size", "size", "ranks", "occurrences", "median ms", "min ms (rank)",
                 "max ms (rank)", "process groups"):  # fmt: skip
        table.add_column(name, justify="left" if name in ("collective", "size", "process groups") else "right")
    for r in cal.rows:
        table.add_row(r.kind, str(r.group_size), _size(r.nbytes), str(r.ranks), str(r.occurrences),
                      f"{1e3 * r.median_s:.4g}", f"{1e3 * r.min_rank_s:.4g}", f"{1e3 * r.max_rank_s:.4g}",
                      ", ".join(r.groups))  # fmt: skip
    out.print(table)
    sources = sorted({t.source for t in cal.traces})
    out.print(f"{len(cal.traces)} rank traces ({', '.join(sources)} events); median over ranks of each rank's median")


def _run_trace_mode(paths: list[Path] | None, out: Path | None, stray: list[str]) -> None:
    """``calibrate --trace``: build the aligned table, print it, write ``-o``; exit 2 with one line for bad input."""
    from rich.markup import escape

    from commsched.cost.trace_calibrate import calibrate_from_traces

    try:
        if stray:
            raise ValueError(f"--trace reads profiler traces and writes only -o: drop {', '.join(stray)}")
        if not paths:
            raise ValueError("--trace: expected one or more trace files (one per rank) or folders of them")
        cal = calibrate_from_traces(paths)
        written = None if out is None else cal.table.save(out)
    except (ValueError, OSError) as exc:
        error_line(str(exc))
        raise typer.Exit(2) from None
    print_trace_calibration(cal, console)
    if written is not None:
        where = escape(str(written))
        console.print(f"wrote {where} (MeasuredTable.load; commsched estimate --table {where})", soft_wrap=True)


def register(app: typer.Typer) -> None:
    @app.command()
    def calibrate(
        logs: list[Path] = typer.Argument(
            None,
            metavar="LOG",
            show_default=False,
            help="with --nccl-tests: nccl-tests / rccl-tests output; with --trace: profiler traces or folders",
        ),
        trace: bool = typer.Option(
            False, "--trace", help="build a measured table from per-rank profiler traces (-o: write it)"
        ),
        nccl_tests: bool = typer.Option(
            False, "--nccl-tests", help="compare the LOG files with the model (without --fit: writes nothing)"
        ),
        fit: bool = typer.Option(
            False, "--fit", help="with --nccl-tests: fit the profile's collective fields to the LOGs (-o: write them)"
        ),
        allow_bounds: bool = typer.Option(
            False, "--allow-bounds", help="with --fit: keep a fit that ends on a field's physical bound (else: error)"
        ),
        all_sizes: bool = typer.Option(False, "--all-sizes", help="with --fit: fit every size, not only >= 1 MiB"),
        network: bool = typer.Option(
            False, "--network", help="with --fit: fit only the network's fields; -o writes a network profile"
        ),
        force: bool = typer.Option(
            False, "--force", help="replace an existing file (the calibrated profile, or --fit's -o overlay)"
        ),
        hardware: str = typer.Option(None, "--hardware", "-H", help="with --nccl-tests: profile name or .toml path"),
        num_nodes: int = typer.Option(
            None, "--num-nodes", min=1, help="with --nccl-tests: nodes the logs ran on (default: their hosts)"
        ),
        collective: str = typer.Option(None, "--collective", help="with --nccl-tests: for logs that do not name it"),
        json_out: str = json_option("with --nccl-tests: the comparison (or the fit)"),
        device: str = typer.Option("cpu", "--device", help="cpu or cuda"),
        out: Path = out_file(
            "--out", "-o", help="profile path (default: the user profile folder; --fit: the overlay, no default)"
        ),
        world: int = typer.Option(2, "--world", min=1, help="local ranks for the collective measurements"),
        quick: bool = typer.Option(False, "--quick", help="fewer sizes and repetitions (a few seconds)"),
        threads: int = typer.Option(1, "--threads", min=0, help="CPU intra-op threads while measuring (0: torch's)"),
        base: str = typer.Option(None, "--base", help="profile the unmeasured fields come from"),
        no_collectives: bool = typer.Option(False, "--no-collectives", help="skip the collective measurements"),
        gpus_per_node: int = typer.Option(
            None, "--gpus-per-node", min=1, help="ranks per node in the profile (--nccl-tests: in the logs' runs)"
        ),
    ) -> None:
        """Measure matmul, elementwise, reduction, attention and collectives here; write a calibrated profile.

        The profile is found by name afterwards (`--hardware cpu-local`), before the shipped default. It is never
        written into the shipped profiles, nor over an existing file without --force; a fitted value that ends on
        its search bound (e.g. a peak the matmuls did not constrain) is an error, and nothing is written.
        Example: commsched calibrate --device cpu --quick

        With --nccl-tests LOG [LOG ...] --hardware PROFILE: read nccl-tests / rccl-tests output (all_reduce_perf,
        all_gather_perf, reduce_scatter_perf, alltoall_perf, ...) and print, per size, the measured busbw, the model's
        busbw on PROFILE at the log's placement (ranks and hosts from its '# Rank' lines, unless --num-nodes /
        --gpus-per-node say) and the relative error; then the median and worst error over sizes >= 1 MiB. Without
        --fit this only compares: it does not fit or write a profile.
        Example: commsched calibrate --nccl-tests all_reduce_perf.log --hardware h100-sxm

        With --fit: fit PROFILE's network fields (multi-node logs) or NVLink fields (one-node logs) to the LOGs by
        least squares in log time, print the error per size before and after, and with -o FILE.toml write the
        fitted profile (an overlay: the base with those fields replaced). A fit ending on a physical bound is an
        error unless --allow-bounds; -o never writes into the shipped profiles, nor over a file without --force.
        Example: commsched calibrate --nccl-tests all_reduce_perf.log --hardware h100-sxm --fit -o h100-fit.toml
        With --network: fit only the network (NIC efficiency, NVLS-tree's pace across nodes, per-protocol network
        step latency) and write a network profile, usable under any GPU profile: --hardware b200@my-fabric.toml.
        Start from a shipped network (--hardware h100-sxm@ib-ndr-8x400) to keep its tree structure.

        With --trace FILE_OR_DIR [...]: read PyTorch profiler traces, one per rank (.json / .json.gz; a folder: its
        traces), and build one measured table of their collectives: per (collective, group size, bytes) the median
        over ranks of each rank's median occurrence. Prints the table; -o FILE (.json or .csv) writes it.
        Example: commsched calibrate --trace traces/ -o table.json
        """
        if trace:
            given = (("--nccl-tests", nccl_tests), ("--fit", fit), ("--allow-bounds", allow_bounds),
                     ("--all-sizes", all_sizes), ("--force", force), ("--hardware", hardware is not None),
                     ("--num-nodes", num_nodes is not None), ("--collective", collective is not None),
                     ("--json", json_out is not None), ("--device", device != "cpu"), ("--world", world != 2),
                     ("--quick", quick),
                     ("--threads", threads != 1), ("--base", base is not None), ("--no-collectives", no_collectives),
                     ("--gpus-per-node", gpus_per_node is not None))  # fmt: skip
            _run_trace_mode(logs, out, [name for name, on in given if on])
            return
        fit_args = {"fit": fit, "out": out, "force": force, "all_sizes": all_sizes, "allow_bounds": allow_bounds,
                    "network": network}  # fmt: skip
        fit_only = [name for name, given in (("--fit", fit), ("--allow-bounds", allow_bounds),
                                             ("--all-sizes", all_sizes), ("--force", force and nccl_tests),
                                             ("--network", network)) if given]  # fmt: skip
        if nccl_tests or logs or fit_only:
            if not nccl_tests or (fit_only and not fit):
                need = "LOG arguments need --nccl-tests" if not nccl_tests else f"{', '.join(fit_only)} need --fit"
                error_line(need)
                raise typer.Exit(2)
            device_args = {"--device": device != "cpu", "--out": out is not None and not fit, "--world": world != 2,
                           "--quick": quick, "--threads": threads != 1, "--base": base is not None,
                           "--no-collectives": no_collectives}  # fmt: skip
            _run_nccl_mode(logs, hardware, num_nodes, gpus_per_node, collective, json_out, device_args, fit_args)
            return
        from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        from commsched.report.terminal_inputs import print_calibrated_profile

        with user_errors(), Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
                                     console=console, transient=True) as bar:  # fmt: skip
            task = bar.add_task("calibrating", total=None)
            try:
                path, hw = run_calibration(
                    device, out, world=world, quick=quick, threads=threads or None, base=base,
                    collectives=not no_collectives, gpus_per_node=gpus_per_node, force=force,
                    progress=lambda text: bar.update(task, description=f"measuring: {text}"),
                )  # fmt: skip
            except RuntimeError as exc:
                raise ValueError(str(exc)) from None
        print_calibrated_profile(path, hw, console)
        _say_what_the_name_reads(path)


def _say_what_the_name_reads(path: Path) -> None:
    """A calibrated profile in the user folder shadows a shipped one of the same name: say so, never silently."""
    from rich.markup import escape

    from commsched import hardware as hw_mod

    name = path.stem
    try:
        shipped = hw_mod.shipped_profile(name)
    except FileNotFoundError:
        return
    if hw_mod.resolve_profile(name).resolve() == path.resolve():
        console.print(f"--hardware {name} now reads {escape(str(path))}, not the shipped {escape(str(shipped))} "
                      f"(delete the file to go back)", soft_wrap=True)  # fmt: skip
