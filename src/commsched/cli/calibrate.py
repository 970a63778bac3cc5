"""``commsched calibrate``: measure this machine and write a hardware profile (and its measured table)."""

from __future__ import annotations

from pathlib import Path

import typer

from commsched.cli.common import console, user_errors


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
    progress=None,
) -> tuple[Path, object]:
    """Measure, fit and write; returns (profile path, Hardware). ``progress(step_text)`` is called per step."""
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

    if device not in ("cpu", "cuda"):
        raise ValueError(f"--device {device!r}: expected cpu or cuda")
    name = "cpu-local" if device == "cpu" else "cuda-local"
    out = out or hw_mod.user_profile_dir() / f"{name}.toml"
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


def register(app: typer.Typer) -> None:
    @app.command()
    def calibrate(
        device: str = typer.Option("cpu", "--device", help="cpu or cuda"),
        out: Path = typer.Option(None, "--out", "-o", help="profile path (default: the user profile folder)"),
        world: int = typer.Option(2, "--world", min=1, help="local ranks for the collective measurements"),
        quick: bool = typer.Option(False, "--quick", help="fewer sizes and repetitions (a few seconds)"),
        threads: int = typer.Option(1, "--threads", min=0, help="CPU intra-op threads while measuring (0: torch's)"),
        base: str = typer.Option(None, "--base", help="profile the unmeasured fields come from"),
        no_collectives: bool = typer.Option(False, "--no-collectives", help="skip the collective measurements"),
        gpus_per_node: int = typer.Option(None, "--gpus-per-node", min=1, help="ranks per node in the profile"),
    ) -> None:
        """Measure matmul, elementwise, reduction, attention and collectives here; write a calibrated profile.

        The profile is found by name afterwards (`--hardware cpu-local`), before the shipped default.
        Example: commsched calibrate --device cpu --quick
        """
        from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        from commsched.report.terminal_inputs import print_calibrated_profile

        with user_errors(), Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
                                     console=console, transient=True) as bar:  # fmt: skip
            task = bar.add_task("calibrating", total=None)
            try:
                path, hw = run_calibration(
                    device, out, world=world, quick=quick, threads=threads or None, base=base,
                    collectives=not no_collectives, gpus_per_node=gpus_per_node,
                    progress=lambda text: bar.update(task, description=f"measuring: {text}"),
                )  # fmt: skip
            except RuntimeError as exc:
                raise ValueError(str(exc)) from None
        print_calibrated_profile(path, hw, console)
