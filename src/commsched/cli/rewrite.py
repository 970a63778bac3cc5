"""``commsched rewrite``: trace a zoo workload, bucket its collectives and / or lower its all_reduces, show every
decision and the simulated step before and after."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from commsched.cli import common as opt
from commsched.cli.common import Stages, console, user_errors
from commsched.cli.options import ZooStep, check_layers, out_file, step_title, trace_zoo_step, zoo_step_options


def register(app: typer.Typer) -> None:
    @app.command()
    @zoo_step_options()
    def rewrite(
        preset: str = typer.Argument(..., help="model preset, e.g. llama3-8b (see commsched trace --list)"),
        zoo: ZooStep = None,  # type: ignore[assignment]  (the zoo-step options: zoo_step_options)
        hardware_name: opt.HardwareOption = "h100-sxm",
        num_nodes: opt.NumNodesOption = None,
        gpus_per_node: opt.GpusPerNodeOption = None,
        bucket: bool = typer.Option(True, "--bucket/--no-bucket", help="merge collectives into buckets"),
        lower: bool = typer.Option(False, "--lower-all-reduce", help="clone + all_reduce_ or one-shot symm-mem"),
        plan_on: str = typer.Option("schedule", "--plan-on", help="order the buckets are planned on: schedule|trace"),
        passes: str = typer.Option("default", "--schedule", "-s", help="scheduler preset to simulate with"),
        reorder: bool = typer.Option(
            False,
            "--reorder-collectives/--keep-collective-order",
            help="let the scheduler reorder each group's collectives, as optimize does (default: keep their order)",
        ),
        out: Path = out_file("--out", "-o", help="write the rewritten graph JSON here"),
        stats: Path = out_file("--stats", help="write every decision as JSON here"),
        rows: int = typer.Option(30, "--rows", help="bucket rows to print"),
    ) -> None:
        """Rewrite a traced step (bucketing, all_reduce lowering) and simulate it before and after.

        Both are scheduled by SCHEDULE keeping each group's collective order (the title says so); optimize's
        "traced program, scheduled" lets the scheduler reorder them, so its step can be shorter than "before" here:
        --reorder-collectives schedules as optimize does.

        Example: commsched rewrite llama3-8b --parallel fsdp --world-size 64 --layers 4 --seq-len 2048 --stats b.json
        """
        from commsched import from_fx, hardware
        from commsched.cost import estimate_costs
        from commsched.frontends.json_io import save_graph
        from commsched.io import atomic_write_text
        from commsched.passes import schedule
        from commsched.report.rewrite_report import BucketingDecisions, LoweringDecisions, RewriteReport, StepChange
        from commsched.report.terminal_rewrite import print_bucket_plan, print_rewrite_result
        from commsched.rewrites import bucket_collectives
        from commsched.rewrites.lower_all_reduce import lower_all_reduces
        from commsched.sim import simulate_costs

        with user_errors():
            if plan_on not in ("schedule", "trace"):
                raise ValueError(f"--plan-on {plan_on!r}: expected 'schedule' or 'trace'")
            check_layers(preset, zoo.layers)
            hw = hardware.for_graph(hardware_name, num_nodes=num_nodes, gpus_per_node=gpus_per_node,
                                    world_size=zoo.world_size)  # fmt: skip
            with Stages(("trace", "import")) as stages:
                w = trace_zoo_step(zoo, preset, stages)
            sizes = {g["name"]: g["size"] for g in w.meta["groups"].values()}
            graph, gm = w.graph, w.graph_module
            lowering = bucketing = None

            def simulate(g):
                costs = estimate_costs(g, hw)
                sched = schedule(g, costs, passes, **({"reorder_collectives": True} if reorder else {}))
                return simulate_costs(g, costs, sched.order), sched, costs

            before, sched, costs = simulate(graph)
            if lower:
                res = lower_all_reduces(gm, hw, graph=graph)
                gm, graph = res.gm, from_fx(res.gm, group_sizes=sizes, meta=w.graph.meta)
                lowering = LoweringDecisions(counts=res.counts, rows=res.rows)
            if bucket:
                if plan_on == "schedule":
                    _, sched, costs = simulate(graph)
                    res, plan = bucket_collectives(gm, hw, graph=graph, order=sched.order, costs=costs)
                else:
                    res, plan = bucket_collectives(gm, hw, graph=graph)
                gm, graph = res.gm, from_fx(res.gm, group_sizes=sizes, meta=w.graph.meta)
                bucketing = BucketingDecisions(summary=plan.summary(), buckets=plan.rows())
                print_bucket_plan(plan, console, max_rows=rows)
            after, _, _ = simulate(graph)
            if out is not None:
                save_graph(graph, out)
        report = RewriteReport(
            workload=step_title(w.meta),
            hardware=hw.name,
            lower_all_reduce=lowering,
            bucketing=bucketing,
            step_s=StepChange(before=before.makespan_s, after=after.makespan_s),
        )
        how = "collectives reordered" if reorder else "each group's collective order kept"
        title = f"{step_title(w.meta)} on {hw.name} x {hw.num_nodes}, schedule {passes!r} ({how})"
        print_rewrite_result(report, before, after, console, title=title)
        if stats is not None:
            atomic_write_text(stats, json.dumps(report.to_dict(), indent=1, default=str))
            console.print(f"wrote [bold]{stats}[/]")
