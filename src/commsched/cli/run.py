"""``commsched run``: run a zoo step for real with the original and the scheduled orders, predicted vs measured."""

from __future__ import annotations

import contextlib
import dataclasses
from pathlib import Path

import typer

from commsched.cli.common import (
    HardwareOption,
    KnobOption,
    Stages,
    console,
    error_line,
    parse_knobs,
    user_errors,
)
from commsched.cli.options import ZooStep, emit_json, given_options, json_option, out_dir, zoo_step_options


def register(app: typer.Typer) -> None:
    @app.command()
    @zoo_step_options(world_size=2, dtype="float32")
    def run(
        ctx: typer.Context,
        preset: str = typer.Argument(..., help="a zoo preset small enough to run here, e.g. llama-tiny"),
        zoo: ZooStep = None,  # type: ignore[assignment]  (the zoo-step options: zoo_step_options; --mode train)
        bandwidth: str = typer.Option(None, "--bandwidth", help="shape the loopback (root): tc rate, e.g. 2gbit"),
        delay: str = typer.Option("0ms", "--delay", help="with --bandwidth: netem delay per packet, e.g. 1ms"),
        iters: int = typer.Option(10, "--iters", min=1, help="timed steps per order"),
        warmup: int = typer.Option(2, "--warmup", min=0, help="untimed steps per order first"),
        variants: str = typer.Option(
            "original,overlap,torch",
            "--variants",
            help="orders to run (comma-separated); add optimize for commsched.optimize's program on --hardware",
        ),
        passes: str = typer.Option("default", "--passes", "-s", help="our scheduler: pass preset or list"),
        knob: KnobOption = [],  # noqa: B006 (typer copies it)
        costs: str = typer.Option("measured", "--costs", help="costs the schedulers see: measured | profile"),
        memory_budget: str = typer.Option(
            None,
            "--memory-budget",
            help="both schedulers' peak-memory limit: 1.1 (x input peak) or 40GiB (default: torch's)",
        ),
        hardware: HardwareOption = "cpu-local",
        threads: int = typer.Option(1, "--threads", min=1, help="intra-op threads per rank"),
        compute_nice: int = typer.Option(
            10, "--compute-nice", min=0, max=19, help="CPU runs: niceness increment of compute, favouring gloo"
        ),
        backend: str = typer.Option(None, "--backend", help="gloo | nccl (default: nccl with a GPU per rank)"),
        seed: int = typer.Option(0, "--seed", help="parameters and batch"),
        json_out: str = json_option("the full report (every step time)", stdout_replaces="the report's tables"),
        profile: Path = out_dir(
            "--profile", help="also profile one step per order: DIR/ORDER-rankR.json.gz (commsched replay)"
        ),
        pp_size: int = typer.Option(None, "--pp-size", min=2, help="pipeline: P ranks, pure PP (--world-size is P)"),
        pp_schedule: str = typer.Option(
            "1F1B,GPipe,Interleaved1F1B", "--pp-schedule", help="with --pp-size: torch's schedules (comma-separated)"
        ),
        microbatches: int = typer.Option(None, "--microbatches", min=1, help="with --pp-size: M (default: 2P)"),
        stages_per_rank: int = typer.Option(None, "--stages-per-rank", min=1, help="with --pp-size: V (default 2)"),
    ) -> None:
        """Run PRESET's training step for real on WORLD_SIZE ranks with the original order, commsched's order and
        torch's OverlapScheduler order; check that every order's outputs are bit-identical; report the measured step
        time (median, spread) next to the simulator's prediction from calibrated costs. --variants
        original,optimize also runs the program commsched.optimize keeps (collectives bucketed); where it merged
        reductions its outputs must match within 4 x ranks x eps of the dtype (the sums' order may change).

        Local ranks are spawned on gloo (NCCL with a GPU per rank); with --bandwidth (root only) they run inside a
        network namespace whose loopback is shaped with tc, torn down afterwards. Under torchrun (env:// rendezvous)
        the command runs as one rank of the launch, so the same command spans the hosts of a cluster.

        Example: commsched run llama-tiny --parallel fsdp --world-size 2 --bandwidth 2gbit --iters 10

        Example: torchrun --nnodes 2 --nproc-per-node 8 -m commsched.cli run llama-tiny --world-size 16

        With --pp-size P: torch.distributed.pipelining's schedules on P gloo ranks (pure PP; the layers split over
        the stages as torchtitan splits them), each against the pipeline simulator fed this machine's measured stage
        costs and P2P link; the first step's loss and gradients are checked against the unpipelined model's.

        Example: commsched run llama-tiny --pp-size 2 --microbatches 4 --layers 4 --seq-len 128
        """
        from commsched.report.terminal_run import print_run_report
        from commsched.runtime.executor import RunConfig, run_rank
        from commsched.runtime.launch import RunStopped, launched_by_torchrun, run_local, signals_stop_the_run
        from commsched.runtime.netns import ShapedNetworkUnavailable, shaped_network

        if pp_size is not None:  # torch.distributed.pipelining's schedules (runtime/pipeline_run.py)
            with user_errors():
                _check_pure_pipeline(given_options(ctx, ("world_size", "parallel", "tp_size")), zoo, pp_size)
            opts = dict(iters=iters, warmup=warmup, seed=seed, threads=threads, hardware=hardware)
            _run_pipeline(preset, zoo, pp_size, pp_schedule, microbatches, stages_per_rank, bandwidth, delay, json_out,
                          **opts)  # fmt: skip
            return
        with user_errors():
            if backend not in (None, "gloo", "nccl"):
                raise ValueError(f"--backend {backend!r}: expected gloo or nccl")
            if zoo.world_size < 2:
                raise ValueError(f"--world-size {zoo.world_size}: expected at least 2 ranks")
            if zoo.mode != "train":
                raise ValueError(f"--mode {zoo.mode}: commsched run runs training steps (--mode train)")
            import torch

            cuda = torch.cuda.is_available() and backend != "gloo"
            spec = zoo.resolve(preset, attention="flash" if cuda else "sdpa")  # the flash op has no CPU kernel
            names = tuple(v.strip() for v in variants.split(",") if v.strip())
            cfg = RunConfig(
                spec=spec,
                variants=names,
                iters=iters,
                warmup=warmup,
                seed=seed,
                hardware=hardware,
                costs=costs,
                passes=passes,
                knobs=parse_knobs(knob),
                memory_budget=memory_budget,
                threads=threads,
                compute_nice=compute_nice,
                profile_dir=str(profile) if profile is not None else None,
            )
            torchrun = launched_by_torchrun()
            if torchrun and bandwidth:
                raise ValueError("--bandwidth shapes local ranks; under torchrun, shape the hosts' network instead")
        if torchrun:
            report = run_rank(cfg, backend=backend)
        else:
            try:
                ctx = shaped_network(bandwidth, delay=delay) if bandwidth else contextlib.nullcontext()
                what = f"{zoo.world_size} ranks: {', '.join(names)}, {warmup} + {iters} steps each"
                with signals_stop_the_run(), user_errors(), ctx as net, Stages(("run",)) as stages:
                    stages.stage("run", what)  # each rank traces, calibrates, then runs every order
                    report = run_local(cfg, network=net, backend=backend, progress=stages.detail)
            except typer.Exit:
                raise
            except RunStopped as exc:  # ranks terminated and the namespace deleted on the way here
                removed = ", network namespace removed" if bandwidth else ""
                error_line(f"{exc}: ranks terminated{removed}")
                raise typer.Exit(128 + exc.signum) from None
            except ShapedNetworkUnavailable as exc:
                error_line(str(exc))
                raise typer.Exit(2) from None
            except RuntimeError as exc:  # a rank failed: its traceback is in the message; its first and last line
                lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
                error_line(" ... ".join(dict.fromkeys([lines[0], lines[-1]])) if lines else type(exc).__name__)
                raise typer.Exit(1) from None
        if report is None:  # a rank other than 0 under torchrun
            return
        if json_out == "-":
            emit_json(report.to_dict(), json_out)
            return
        print_run_report(report, console)
        if json_out:
            console.print(f"wrote [bold]{report.save(json_out)}[/]")


def _check_pure_pipeline(given: set[str], zoo: ZooStep, pp_size: int) -> None:
    """``run --pp-size`` runs pure PP on P ranks: a plan inside the pipeline ranks, or another world, is refused."""
    if "world_size" in given and zoo.world_size != pp_size:
        raise ValueError(f"--world-size {zoo.world_size}: run --pp-size runs pure PP on P = {pp_size} ranks "
                         "(omit --world-size, or give it equal to --pp-size)")  # fmt: skip
    if "tp_size" in given or ("parallel" in given and zoo.parallel != "none"):
        raise ValueError(f"--parallel {zoo.parallel}: run --pp-size runs pure PP (no plan inside the pipeline "
                         "ranks); commsched pipeline simulates PP with FSDP / TP")  # fmt: skip


def _run_pipeline(preset, zoo: ZooStep, pp_size: int, schedules: str, microbatches: int | None,
                  stages_per_rank: int | None, bandwidth: str | None, delay: str, json_out: str | None,
                  **options) -> None:  # fmt: skip
    """``run --pp-size``: resolve, run every schedule, print the table (or the JSON)."""
    from commsched.runtime.launch import signals_stop_the_run
    from commsched.runtime.netns import ShapedNetworkUnavailable, shaped_network
    from commsched.runtime.pipeline_run import PipelineRunConfig, run_pipeline_local

    with user_errors():
        m = microbatches or 2 * pp_size
        batch = zoo.batch if zoo.batch is not None else m
        spec = dataclasses.replace(zoo, parallel="none", world_size=1, batch=batch).resolve(preset, attention="sdpa")
        names = tuple(n.strip() for n in schedules.split(",") if n.strip())
        cfg = PipelineRunConfig(spec=spec, pp_size=pp_size, schedules=names, microbatches=m,
                                stages_per_rank=stages_per_rank, **options)  # fmt: skip
    try:
        ctx = shaped_network(bandwidth, delay=delay) if bandwidth else contextlib.nullcontext()
        what = f"{pp_size} pipeline ranks: {', '.join(names)}, {cfg.warmup} + {cfg.iters} rounds"
        with signals_stop_the_run(), user_errors(), ctx as net, Stages(("run",)) as stages:
            stages.stage("run", what)
            report = run_pipeline_local(cfg, network=net, progress=stages.detail)
    except ShapedNetworkUnavailable as exc:
        error_line(str(exc))
        raise typer.Exit(2) from None
    except RuntimeError as exc:  # a rank failed: its first and last line
        lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
        error_line(" ... ".join(dict.fromkeys([lines[0], lines[-1]])) if lines else type(exc).__name__)
        raise typer.Exit(1) from None
    if json_out == "-":
        emit_json(report.to_dict(), json_out)
        return
    _print_pipeline_report(report)
    if json_out:
        console.print(f"wrote [bold]{emit_json(report.to_dict(), json_out)}[/]")


def _print_pipeline_report(report) -> None:
    from rich.table import Table

    ms = 1e3
    table = Table(title=f"{report.preset} / {report.layers} layers / seq {report.seq_len} x batch {report.batch}, "
                        f"P {report.pp_size}, M {report.microbatches}" + (f", {report.network}" if report.network
                                                                          else ""))  # fmt: skip
    for col in ("schedule", "V", "predicted", "profile", "measured median (p25-p75)", "error", "step / first's: "
                "predicted, measured", "loss error", "grad error"):  # fmt: skip
        table.add_column(col)
    ratios = report.ratios()
    for name, r in report.schedules.items():
        t = r.measured
        profile = "-" if r.predicted_profile_s is None else f"{r.predicted_profile_s * ms:.1f} ms"
        table.add_row(name, str(r.stages_per_rank), f"{r.predicted_s * ms:.1f} ms", profile,
                      f"{t.median_s * ms:.1f} ms ({t.p25_s * ms:.1f}-{t.p75_s * ms:.1f})", f"{r.prediction_error:+.1%}",
                      f"{ratios[name][0]:.3f}, {ratios[name][1]:.3f}", f"{r.loss_error:.1e}",
                      f"{r.max_grad_error:.1e}")  # fmt: skip
    console.print(table)
    p2p = report.p2p
    console.print(f"P2P (rank 0 -> 1, {p2p.send_bytes} B): {p2p.transfer_s * ms:.2f} ms, of which "
                  f"{p2p.latency_s * ms:.2f} ms fixed; the ranks shared {report.cores:.2f} cores (predicted: their "
                  "compute sharing them in the simulation); stage costs in --json")  # fmt: skip
