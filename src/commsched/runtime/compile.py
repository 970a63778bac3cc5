"""torch.compile integration: schedule the graphs torch.compile captures.

Two ways in:

* :func:`commsched_backend` -- a ``torch.compile`` backend built on AOTAutograd: the forward and backward ATen graphs
  are imported (``from_fx``), scheduled (``commsched.passes.schedule``), reordered (``apply_schedule``) and run as
  FX GraphModules (eager kernels, no Inductor codegen).
* :class:`CommschedPostGradPass` -- an Inductor ``post_grad_custom_post_pass``: Inductor's post-grad graph is
  scheduled the same way before Inductor lowers it, so Inductor's kernels keep their fusion and our order.

Costs come from a hardware profile (``hardware=``, default ``cpu-local``), or from a callable
``costs(graph) -> CostEstimate`` for anything else (a measured table, aligned estimates). Every rank compiles the
same graph with the same costs, so every rank picks the same order (SPMD).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.fx

from commsched.runtime.apply import apply_schedule, copy_graph_module

CostsFn = Callable[[Any], Any]  # commsched Graph -> CostEstimate


def schedule_fx(
    gm: torch.fx.GraphModule | torch.fx.Graph,
    hardware: str | Any = "cpu-local",
    *,
    passes: str | Sequence[str] = "default",
    num_nodes: int | None = None,
    gpus_per_node: int | None = None,
    costs: CostsFn | None = None,
    **knobs: Any,
):
    """Import ``gm``, schedule it and reorder it in place; return the :class:`commsched.passes.Schedule`.

    ``gm`` needs FakeTensor ``meta['val']`` on its nodes (make_fx, AOTAutograd and Inductor graphs have it) and its
    process groups registered (real or fake). ``hardware``, ``num_nodes``, ``gpus_per_node``: as
    ``commsched.schedule`` takes them (nodes inferred from the process groups unless given); ``costs``: a callable
    overriding them. ``knobs`` go to the passes."""
    from commsched.frontends.fx import from_fx
    from commsched.passes import schedule

    graph = from_fx(gm)
    if costs is not None:
        result = schedule(graph, costs(graph), passes, **knobs)
    else:
        result = schedule(graph, hardware, passes, num_nodes=num_nodes, gpus_per_node=gpus_per_node, **knobs)
    apply_schedule(gm, result)
    return result


def commsched_backend(
    hardware: str | Any = "cpu-local",
    *,
    passes: str | Sequence[str] = "default",
    num_nodes: int | None = None,
    gpus_per_node: int | None = None,
    costs: CostsFn | None = None,
    on_schedule: Callable[[str, Any], None] | None = None,
    verify: bool = False,
    **knobs: Any,
):
    """A ``torch.compile`` backend: ``torch.compile(fn, backend=commsched_backend("h100-sxm", num_nodes=4))``.

    AOTAutograd traces the forward (and, under autograd, the backward) into ATen graphs; each is scheduled with
    :func:`schedule_fx` and run as a GraphModule. ``on_schedule(kind, schedule)`` (kind "forward" / "backward" /
    "inference") sees each Schedule, e.g. to log or save it. ``verify``: run the traced order too at every call and
    raise RuntimeError unless every output is bit-identical (a debugging aid: each graph runs twice; AOTAutograd's
    graphs are functional, so running one twice changes nothing else)."""
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    def compiler(kind: str) -> Callable:
        def compile_graph(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable:
            original = copy_graph_module(gm) if verify else None
            result = schedule_fx(
                gm, hardware, passes=passes, num_nodes=num_nodes, gpus_per_node=gpus_per_node, costs=costs, **knobs
            )
            if on_schedule is not None:
                on_schedule(kind, result)
            if original is None:
                return make_boxed_func(gm.forward)

            def run_verified(*args: Any) -> Any:
                expected, got = original(*args), gm(*args)
                for i, (a, b) in enumerate(zip(_flat(expected), _flat(got), strict=True)):
                    if isinstance(a, torch.Tensor) and not (a.dtype == b.dtype and torch.equal(a, b)):
                        raise RuntimeError(
                            f"{kind} graph: output {i} of the scheduled order differs from the traced one"
                        )
                return got

            return make_boxed_func(run_verified)

        return compile_graph

    return aot_autograd(
        fw_compiler=compiler("forward"), bw_compiler=compiler("backward"), inference_compiler=compiler("inference")
    )


def _flat(out: Any) -> list[Any]:
    return list(out) if isinstance(out, (list, tuple)) else [out]


def _custom_graph_pass_base() -> type:
    try:
        from torch._inductor.custom_graph_pass import CustomGraphPass

        return CustomGraphPass
    except ImportError:  # pragma: no cover - torch < 2.6
        return object


class CommschedPostGradPass(_custom_graph_pass_base()):
    """An Inductor post-grad pass: ``torch._inductor.config.post_grad_custom_post_pass = CommschedPostGradPass()``.

    Schedules the post-grad FX graph in place (see :func:`schedule_fx`); ``last`` keeps the last Schedule.
    ``uuid()`` names the configuration, so Inductor's cache tells differently scheduled graphs apart."""

    def __init__(
        self,
        hardware: str = "cpu-local",
        *,
        passes: str | Sequence[str] = "default",
        num_nodes: int | None = None,
        gpus_per_node: int | None = None,
        **knobs: Any,
    ) -> None:
        if not isinstance(hardware, str):
            raise ValueError("CommschedPostGradPass takes a profile name or path (it is part of the cache key)")
        self.hardware, self.passes, self.knobs = hardware, passes, dict(knobs)
        self.num_nodes, self.gpus_per_node = num_nodes, gpus_per_node
        self.last = None

    def __call__(self, graph: torch.fx.Graph) -> None:
        self.last = schedule_fx(
            graph,
            self.hardware,
            passes=self.passes,
            num_nodes=self.num_nodes,
            gpus_per_node=self.gpus_per_node,
            **self.knobs,
        )

    def uuid(self) -> str:
        from commsched import __version__

        shape = [self.num_nodes, self.gpus_per_node]
        key = [__version__, self.hardware, self.passes, shape, sorted(self.knobs.items())]
        return hashlib.sha256(json.dumps(key, default=str).encode()).hexdigest()
