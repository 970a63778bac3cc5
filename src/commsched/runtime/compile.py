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

With ``optimize=True`` either way in runs each graph through :func:`commsched.optimize` instead of the scheduler
alone: the program may change (collectives bucketed where the simulator says that wins within the memory budget),
not only its order. Every rank simulates the same graph on the same hardware, so every rank keeps the same program.
Each decision is logged (logger ``commsched.runtime.compile``, INFO) and kept in ``results``.
"""

from __future__ import annotations

import copy
import hashlib
import inspect
import json
import logging
import operator
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch
import torch.fx

from commsched.ir import GraphError
from commsched.runtime.apply import apply_schedule, copy_graph_module

if TYPE_CHECKING:
    from commsched.optimize import Optimized

CostsFn = Callable[[Any], Any]  # commsched Graph -> CostEstimate

_log = logging.getLogger(__name__)
_SHAPE_ARGS = ("hardware", "num_nodes", "gpus_per_node")  # optimize arguments the integrations set themselves
_SCHEDULER_KNOBS = ("memory_budget", "reorder_collectives")  # optimize options the scheduler also takes


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
    optimize: bool = False,
    **knobs: Any,
) -> Any:
    """A ``torch.compile`` backend: ``torch.compile(fn, backend=commsched_backend("h100-sxm", num_nodes=4))``.

    AOTAutograd traces the forward (and, under autograd, the backward) into ATen graphs; each is scheduled with
    :func:`schedule_fx` and run as a GraphModule. ``on_schedule(kind, schedule)`` (kind "forward" / "backward" /
    "inference") sees each Schedule, e.g. to log or save it. ``verify``: run the traced order too at every call and
    raise RuntimeError unless every output is bit-identical (a debugging aid: each graph runs twice; AOTAutograd's
    graphs are functional, so running one twice changes nothing else).

    ``optimize``: each graph goes through :func:`commsched.optimize` and the kept program (``Optimized.gm``) runs;
    ``knobs`` then go to ``optimize`` (``memory_budget``, ``reorder_collectives``, ...) and ``passes`` / ``costs``
    must be left unset. ``verify`` then allows rounding differences where the program changed (a bucketed reduction
    may sum in another order), and stays bit-exact where it was only reordered. The returned backend's ``results``
    lists ``(kind, Optimized)`` for every graph optimized (empty without ``optimize``)."""
    from torch._dynamo.backends.common import aot_autograd

    if optimize:
        _check_optimize_args(passes, costs, knobs)
    results: list[tuple[str, Optimized]] = []
    shape = {"num_nodes": num_nodes, "gpus_per_node": gpus_per_node}

    def compiler(kind: str) -> Callable:
        def compile_graph(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable:
            original = copy_graph_module(gm) if verify else None
            exact = True
            if optimize:
                opt = _optimize_logged(f"{kind} graph", gm, hardware, shape, knobs)
                results.append((kind, opt))
                gm, result, exact = opt.gm, opt.schedule, not _program_changed(opt)
            else:
                result = schedule_fx(gm, hardware, passes=passes, costs=costs, **shape, **knobs)
            if on_schedule is not None:
                on_schedule(kind, result)
            return _boxed(kind, gm, original, exact)

        return compile_graph

    backend = aot_autograd(
        fw_compiler=compiler("forward"), bw_compiler=compiler("backward"), inference_compiler=compiler("inference")
    )
    backend.results = results
    return backend


def _check_optimize_args(passes: Any, costs: Any, knobs: dict[str, Any]) -> None:
    """Refuse, before any compiling, what ``optimize`` cannot honour: its own passes and cost model are used."""
    from commsched.optimize import optimize

    if passes != "default" or costs is not None:
        raise ValueError("optimize=True schedules with optimize's own passes and cost model: leave passes and costs")
    allowed = set(inspect.signature(optimize).parameters) - {"program", *_SHAPE_ARGS}
    unknown = sorted(set(knobs) - allowed)
    if unknown:
        raise TypeError(f"optimize=True: unknown option(s) {unknown}; optimize takes {sorted(allowed)}")


def _optimize_logged(what: str, gm: torch.fx.GraphModule, hardware: Any, shape: dict, knobs: dict) -> Optimized:
    """``commsched.optimize(gm, ...)``, its decision logged at INFO and every variant's verdict at DEBUG."""
    from commsched.optimize import optimize

    opt = optimize(gm, hardware, **shape, **knobs)
    traced, kept = len(opt.before.graph.collectives), len(opt.graph.collectives)
    _log.info("commsched optimize, %s: %s; collectives %d -> %d", what, opt.summary(), traced, kept)
    for t in opt.tried:
        _log.debug("  %s: %s (%s collectives)", t.label, t.verdict, t.collectives)
    return opt


def _program_changed(opt: Optimized) -> bool:
    """Whether the kept program is another program than the traced one (bucketed), not only another order."""
    return opt.graph is not opt.before.graph


def _boxed(kind: str, gm: torch.fx.GraphModule, original: torch.fx.GraphModule | None, exact: bool) -> Callable:
    """``gm`` as AOTAutograd calls it; with ``original``, each call also runs it and compares the outputs (bit for
    bit when ``exact``, else within float rounding)."""
    from functorch.compile import make_boxed_func

    if original is None:
        return make_boxed_func(gm.forward)

    def run_verified(*args: Any) -> Any:
        expected, got = original(*args), gm(*args)
        for i, (a, b) in enumerate(zip(_flat(expected), _flat(got), strict=True)):
            if isinstance(a, torch.Tensor) and not _same(a, b, exact):
                which, how = ("scheduled order", "") if exact else ("optimized program", " beyond rounding")
                raise RuntimeError(f"{kind} graph: output {i} of the {which} differs from the traced one{how}")
        return got

    return make_boxed_func(run_verified)


def _same(a: torch.Tensor, b: Any, exact: bool) -> bool:
    if not (isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape):
        return False
    if exact:
        return torch.equal(a, b)
    try:  # assert_close's per-dtype defaults (float32: rtol 1.3e-6, atol 1e-5): a sum taken in another order
        torch.testing.assert_close(b, a)
    except AssertionError:
        return False
    return True


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

    Schedules the post-grad FX graph in place (see :func:`schedule_fx`); ``last`` keeps the last Schedule and
    ``scheduled`` counts the graphs this pass scheduled. ``uuid()`` names the configuration, so Inductor's cache
    tells differently scheduled graphs apart.

    **Inductor's cache.** A graph Inductor has compiled before under the same configuration (same graph, same
    ``uuid()``, in this process or from its on-disk FX graph cache) is loaded already scheduled, and Inductor does
    not call the pass: ``last`` then keeps what it held (None for a new pass) and ``scheduled`` does not move.
    ``cache=False`` makes ``uuid()`` None, which tells Inductor to compile every graph under this pass afresh (its
    FX graph and AOTAutograd caches are bypassed), so the pass runs, and ``last`` is set, on every compile.

    ``optimize``: the graph goes through :func:`commsched.optimize` and its contents are replaced, in place, by the
    kept program's (placeholders and output node kept); ``knobs`` then go to ``optimize``. ``results`` lists every
    ``Optimized``. A graph reading its owning module (``get_attr``, ``call_module``: the kept program's copy could
    not resolve them) is only scheduled, with the reason logged at WARNING and kept in ``refused``."""

    def __init__(
        self,
        hardware: str = "cpu-local",
        *,
        passes: str | Sequence[str] = "default",
        num_nodes: int | None = None,
        gpus_per_node: int | None = None,
        optimize: bool = False,
        cache: bool = True,
        **knobs: Any,
    ) -> None:
        if not isinstance(hardware, str):
            raise ValueError("CommschedPostGradPass takes a profile name or path (it is part of the cache key)")
        if optimize:
            _check_optimize_args(passes, None, knobs)
        self.hardware, self.passes, self.knobs, self.optimize = hardware, passes, dict(knobs), optimize
        self.num_nodes, self.gpus_per_node, self.cache = num_nodes, gpus_per_node, cache
        self.last = None  # the Schedule of the last graph this pass scheduled (see "Inductor's cache" above)
        self.scheduled = 0  # graphs this pass scheduled (a graph served from Inductor's cache is not counted)
        self.results: list[Optimized] = []  # one per graph optimized
        self.refused: list[str] = []  # why optimize was not run on a graph (it was scheduled instead)

    def __call__(self, graph: torch.fx.Graph) -> None:
        shape = {"num_nodes": self.num_nodes, "gpus_per_node": self.gpus_per_node}
        reason = _reads_owning_module(graph) if self.optimize else None
        if self.optimize and reason is None:
            # a GraphModule takes ownership of its graph: Inductor's stays its module's until replaced below
            module = torch.fx.GraphModule(torch.nn.Module(), copy.deepcopy(graph))
            opt = _optimize_logged("post-grad graph", module, self.hardware, shape, self.knobs)
            kept = copy_graph_module(opt.gm)  # opt.gm stays the kept program as optimize returned it
            _decompose_for_inductor(kept)
            _replace_graph_body(graph, kept.graph)
            self.results.append(opt)
            self.last = opt.schedule
            self.scheduled += 1
            return
        knobs = self.knobs
        if reason is not None:
            _log.warning("commsched optimize refused for a post-grad graph (%s): scheduling it only", reason)
            self.refused.append(reason)
            knobs = {k: v for k, v in knobs.items() if k in _SCHEDULER_KNOBS}
        self.last = schedule_fx(graph, self.hardware, passes=self.passes, **shape, **knobs)
        self.scheduled += 1

    def uuid(self) -> str | None:
        """The configuration's cache key; None with ``cache=False`` (Inductor then caches no graph it runs on)."""
        from commsched import __version__

        if not self.cache:
            return None
        shape = [self.num_nodes, self.gpus_per_node]
        key = [__version__, self.hardware, self.passes, shape, sorted(self.knobs.items())]
        if self.optimize:  # appended only when set: the default configuration keeps its cache key
            key.append("optimize")
        return hashlib.sha256(json.dumps(key, default=str).encode()).hexdigest()


def _reads_owning_module(graph: torch.fx.Graph) -> str | None:
    """Why ``graph``'s nodes cannot be re-created from a detached copy, or None when they can."""
    for n in graph.nodes:
        if n.op in ("get_attr", "call_module"):
            return f"node {n.name!r} is a {n.op} of {n.target!r}, an attribute of the owning module"
    return None


def _decompose_for_inductor(gm: torch.fx.GraphModule) -> int:
    """Decompose, in place, the nodes Inductor has a decomposition for but no lowering; return how many.

    Inductor decomposes those ops before its post-grad passes and refuses them after (the bucketing rewrite's
    ``split_with_sizes_copy`` is one). Each is traced through Inductor's own decomposition table on its inputs'
    ``meta['val']`` and spliced in its place, so the graph keeps its order."""
    from torch._inductor.decomposition import select_decomp_table
    from torch._inductor.lowering import lowerings
    from torch.fx.experimental.proxy_tensor import make_fx
    from torch.fx.node import map_arg

    from commsched.rewrites.fxutil import fake_mode_of

    table = select_decomp_table()
    todo = [n for n in gm.graph.nodes if n.op == "call_function" and n.target in table and n.target not in lowerings]
    for node in todo:
        inputs = node.all_input_nodes

        def run(*vals: Any, node: torch.fx.Node = node, inputs: list = inputs) -> Any:
            env = dict(zip(inputs, vals))
            return node.target(*map_arg(node.args, env.__getitem__), **map_arg(node.kwargs, env.__getitem__))

        with fake_mode_of(gm):
            sub = make_fx(run, decomposition_table=table)(*[i.meta["val"] for i in inputs])
        env = dict(zip([n for n in sub.graph.nodes if n.op == "placeholder"], inputs))
        with gm.graph.inserting_before(node):
            for n in sub.graph.nodes:
                if n.op == "output":
                    _replace_uses(node, map_arg(n.args[0], env.__getitem__))
                elif n.op == "call_function":
                    env[n] = gm.graph.node_copy(n, env.__getitem__)
                elif n.op != "placeholder":
                    raise GraphError(f"decomposing {node.name!r} gave a {n.op} node")
        gm.graph.erase_node(node)
    if todo:
        gm.graph.lint()
        gm.recompile()
    return len(todo)


def _replace_uses(node: torch.fx.Node, value: Any) -> None:
    """Point ``node``'s users at ``value``: a Node, or a list / tuple whose items its ``getitem`` users took."""
    if isinstance(value, torch.fx.Node):
        node.replace_all_uses_with(value)
        return
    for user in list(node.users):
        if not (user.target is operator.getitem and user.args[0] is node):
            raise GraphError(f"{user.name!r} uses the multi-output {node.name!r} other than by index")
        user.replace_all_uses_with(value[user.args[1]])
        user.graph.erase_node(user)


def _replace_graph_body(graph: torch.fx.Graph, source: torch.fx.Graph) -> None:
    """Make ``graph`` compute what ``source`` computes, in place and in ``source``'s order: ``graph``'s placeholders
    (matched by position) and its output node stay the same Node objects, every other node is replaced by a copy of
    ``source``'s (meta copied: Inductor lowers from ``meta['val']``). Raises GraphError if the signatures differ."""
    from torch.fx.node import map_arg

    inputs = [n for n in graph.nodes if n.op == "placeholder"]
    source_inputs = [n for n in source.nodes if n.op == "placeholder"]
    if len(inputs) != len(source_inputs):
        raise GraphError(f"the graph has {len(inputs)} placeholders, its replacement {len(source_inputs)}")
    output = next(n for n in graph.nodes if n.op == "output")
    old_body = [n for n in graph.nodes if n.op not in ("placeholder", "output")]
    env: dict[torch.fx.Node, torch.fx.Node] = dict(zip(source_inputs, inputs))
    with graph.inserting_before(output):
        for n in source.nodes:
            if n.op == "output":
                output.args = map_arg(n.args, env.__getitem__)
            elif n.op != "placeholder":
                env[n] = graph.node_copy(n, env.__getitem__)
    for n in reversed(old_body):  # users before what they use: each has no user left when erased
        graph.erase_node(n)
    graph.lint()
