"""Shared FX plumbing for the rewrites: copying a GraphModule, fake values for new nodes, a stable topological sort.

Every rewrite works on a copy of the caller's GraphModule, gives each node it creates a FakeTensor ``meta['val']``
(so ``commsched.from_fx`` can import the result), and lets :func:`stable_toposort` put nodes where they belong:
original nodes keep their relative order unless a data edge or an ordering edge forces one later.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import heapq
import operator
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import torch
import torch.fx

from commsched.ir import Graph, GraphError

c10d = torch.ops._c10d_functional
WAIT = c10d.wait_tensor.default


@dataclasses.dataclass
class RewriteResult:
    """A rewritten copy of a GraphModule and what the rewrite did.

    ``stats`` rows are one dict per decision (JSON-friendly); ``counts`` tallies decisions by reason;
    ``replaced`` maps each removed node name to the node that now yields its value (or ``None`` if dropped).
    """

    gm: torch.fx.GraphModule
    name: str
    rows: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    counts: dict[str, int] = dataclasses.field(default_factory=dict)
    replaced: dict[str, str | None] = dataclasses.field(default_factory=dict)
    notes: list[str] = dataclasses.field(default_factory=list)
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)  # rewrite-specific results (e.g. constraints)

    @classmethod
    def on_copy(cls, gm: torch.fx.GraphModule, name: str, *, copy: bool = True, lazy: bool = False) -> RewriteResult:
        """The result of rewrite ``name`` started on a copy of ``gm`` (:func:`copy_graph_module`, ``lazy`` as
        there), or on ``gm`` itself where ``copy`` is False (the caller owns it and gives it up)."""
        return cls(gm=copy_graph_module(gm, lazy=lazy) if copy else gm, name=name)

    def count(self, reason: str, k: int = 1) -> None:
        self.counts[reason] = self.counts.get(reason, 0) + k

    @property
    def changed(self) -> bool:
        return bool(self.replaced)


def copy_graph_module(gm: torch.fx.GraphModule, *, lazy: bool = False) -> torch.fx.GraphModule:
    """A new GraphModule over a copy of ``gm.graph`` (same node names; metadata dicts copied, values shared).

    ``lazy``: a ``_LazyGraphModule``, whose Python code is generated when first needed (called, ``.code``,
    printed) instead of on every ``recompile()``: for modules the search only rewrites or imports (generating the
    code of a 5k-node module costs about a quarter of a second)."""
    graph = copy.deepcopy(gm.graph)
    if lazy:
        from torch.fx._lazy_graph_module import _LazyGraphModule

        new = _LazyGraphModule(gm, graph)
    else:
        new = torch.fx.GraphModule(gm, graph)
    new.meta = dict(getattr(gm, "meta", {}))
    return new


def fill_none_vals(gm: torch.fx.GraphModule) -> None:
    """Give ops that return nothing (they only write their arguments: ``fsdp.copy_``, ``split_with_sizes_copy``,
    ``resize_storage_bytes_``) ``meta['val'] = None``, which is what ``commsched.from_fx`` expects of them."""
    for n in gm.graph.nodes:
        schema = getattr(n.target, "_schema", None)
        if n.op == "call_function" and "val" not in n.meta and schema is not None and not schema.returns:
            n.meta["val"] = None


def nodes_by_name(gm: torch.fx.GraphModule) -> dict[str, torch.fx.Node]:
    return {n.name: n for n in gm.graph.nodes}


def fake_mode_of(gm: torch.fx.GraphModule):
    """The FakeTensorMode the graph was traced under (from its nodes' ``meta['val']``)."""
    from torch._guards import detect_fake_mode

    vals = [n.meta["val"] for n in gm.graph.nodes if isinstance(n.meta.get("val"), torch.Tensor)]
    mode = detect_fake_mode(vals[:64])
    if mode is None:
        raise GraphError("the GraphModule has no FakeTensor meta['val']: trace it with make_fx on fake tensors")
    return mode


def set_fake_val(node: torch.fx.Node, mode) -> Any:
    """Run ``node``'s target on its inputs' fake values under ``mode`` and store the result in ``meta['val']``
    (the ops of :func:`_meta_ops` by their meta kernel directly: the same values, a fraction of the cost)."""
    tensors: list[torch.Tensor] = []

    def val(a: Any) -> Any:
        if isinstance(a, torch.fx.Node):
            if "val" not in a.meta:
                raise GraphError(f"FX node {a.name!r} has no meta['val'] (needed to compute {node.name!r})")
            a = a.meta["val"]
        elif isinstance(a, (tuple, list)):
            return type(a)(val(x) for x in a)
        elif isinstance(a, dict):
            return {k: val(x) for k, x in a.items()}
        if isinstance(a, (torch.Tensor, torch.SymInt)):
            tensors.append(a)
        return a

    args, kwargs = val(node.args), val(node.kwargs)
    out = _meta_val(node.target, args, kwargs, tensors, mode) if node.target in _meta_ops() else _NO_FAST
    if out is _NO_FAST:
        with mode:
            out = args[0][args[1]] if node.target is operator.getitem else node.target(*args, **kwargs)
    node.meta["val"] = out
    return out


_NO_FAST = object()


@functools.cache
def _meta_ops() -> frozenset:
    """Ops whose fake value :func:`set_fake_val` computes by their meta kernel directly: the views, slices,
    concatenations, GEMMs, sums and functional collectives the rewrites create. For these FakeTensorMode itself
    ends in the same meta kernel (no decomposition, fake-kernel or constructor rule of its own applies; the test
    ``tests/rewrites/test_fake_values.py`` compares every value both ways), but through its dispatch and cache-key
    machinery, 5-10x the cost: a quarter to a half of rewriting a 5k-node module."""
    aten = torch.ops.aten
    return frozenset({
        aten.view.default, aten._unsafe_view.default, aten.slice.Tensor, aten.cat.default, aten.mm.default,
        aten.add.Tensor, aten.split_with_sizes.default, aten.split.Tensor, aten.t.default, aten.permute.default,
        aten.transpose.int, aten.select.int, WAIT, c10d.all_reduce.default, c10d.all_gather_into_tensor.default,
        c10d.reduce_scatter_tensor.default,
    })  # fmt: skip


def _meta_val(target: Any, args: Any, kwargs: Any, inputs: list, mode) -> Any:
    """``target``'s fake outputs by its meta kernel, wrapped as FakeTensorMode wraps them (on the inputs' device);
    ``_NO_FAST`` unless every input (``inputs``: the tensors and SymInts among the arguments) is a plain
    static-shape FakeTensor of ``mode`` on one device (FakeTensorMode's own dispatch then decides)."""
    from torch._subclasses.fake_tensor import FakeTensor, in_kernel_invocation_manager

    device = inputs[0].fake_device if inputs and type(inputs[0]) is FakeTensor else None
    for a in inputs:
        if not (
            type(a) is FakeTensor and a.fake_mode is mode and a.fake_device == device
            and not a._has_symbolic_sizes_strides and a.real_tensor is None and a.constant is None
        ):  # fmt: skip
            return _NO_FAST
    if device is None or "device" in kwargs:
        return _NO_FAST
    with in_kernel_invocation_manager(mode):
        out = target(*args, **kwargs)

    def wrap(t: Any) -> Any:  # FakeTensorMode.wrap_meta_outputs_with_default_device_logic for one common device
        if isinstance(t, (tuple, list)):
            return type(t)(wrap(x) for x in t)
        if not isinstance(t, torch.Tensor) or type(t) is FakeTensor:  # an input returned as it is (e.g. a wait)
            return t
        return FakeTensor(mode, t, device)

    return wrap(out)


def call(
    graph: torch.fx.Graph,
    mode,
    target: Callable[..., Any],
    args: tuple,
    kwargs: Mapping[str, Any] | None = None,
    name: str | None = None,
) -> torch.fx.Node:
    """Create a call_function node (at the graph's current insertion point) with its fake value; ``name``: the
    node's name (unique names not ending in digits are kept as given)."""
    node = graph.create_node("call_function", target, args, dict(kwargs or {}), name=name)
    set_fake_val(node, mode)
    return node


def fsdp_op(name: str):
    """The ``torch.ops.fsdp.<name>.default`` op FSDP2 registers (importing its modules registers them)."""
    import torch.distributed.fsdp._fully_shard._fsdp_collectives
    import torch.distributed.fsdp._fully_shard._fsdp_param

    return getattr(torch.ops.fsdp, name).default


def is_op(node: torch.fx.Node, *targets: Any) -> bool:
    return node.op == "call_function" and node.target in targets


def wait_users(node: torch.fx.Node) -> list[torch.fx.Node]:
    """The ``wait_tensor`` nodes that complete a functional collective."""
    return [u for u in node.users if is_op(u, WAIT)]


def stable_toposort(
    graph: torch.fx.Graph,
    priority: Mapping[torch.fx.Node, float],
    extra_edges: Iterable[tuple[torch.fx.Node, torch.fx.Node]] = (),
) -> None:
    """Reorder ``graph`` in place: a topological order over data edges plus ``extra_edges`` (src before dst) that,
    among the nodes ready at each step, takes the one with the smallest ``priority`` (ties: current order).

    Placeholders stay first and the output last. Raises GraphError naming a node on a cycle. O((N + E) log N).
    """
    nodes = list(graph.nodes)
    index = {n: i for i, n in enumerate(nodes)}
    succ: dict[torch.fx.Node, list[torch.fx.Node]] = {n: [] for n in nodes}
    indeg = dict.fromkeys(nodes, 0)
    seen_edges: set[tuple[int, int]] = set()

    def add(src: torch.fx.Node, dst: torch.fx.Node) -> None:
        key = (index[src], index[dst])
        if src is dst or key in seen_edges:
            return
        seen_edges.add(key)
        succ[src].append(dst)
        indeg[dst] += 1

    for n in nodes:
        for a in n.all_input_nodes:
            add(a, n)
    for src, dst in extra_edges:
        add(src, dst)

    def key(n: torch.fx.Node) -> tuple:
        if n.op == "placeholder":
            return (0, index[n], 0)
        if n.op == "output":
            return (2, 0.0, index[n])
        return (1, float(priority.get(n, index[n])), index[n])

    heap = [(key(n), index[n], n) for n in nodes if indeg[n] == 0]
    heapq.heapify(heap)
    out: list[torch.fx.Node] = []
    while heap:
        _, _, n = heapq.heappop(heap)
        out.append(n)
        for s in succ[n]:
            indeg[s] -= 1
            if indeg[s] == 0:
                heapq.heappush(heap, (key(s), index[s], s))
    if len(out) != len(nodes):
        stuck = next(n for n in nodes if indeg[n] > 0)
        raise GraphError(f"the rewritten graph has a cycle through FX node {stuck.name!r}")
    output = graph.output_node()
    for n in out:
        if n is not output:
            output.prepend(n)


def ir_control_edges(
    gm: torch.fx.GraphModule, graph: Graph, remap: Mapping[str, torch.fx.Node] | None = None
) -> list[tuple[torch.fx.Node, torch.fx.Node]]:
    """The IR's ordering-only edges (in-place write hazards, see ``commsched.frontends.fx``) as FX node pairs.

    ``remap`` sends the name of a node the rewrite removed to the node that now stands for it; edges whose ends
    are gone without a stand-in are dropped.
    """
    by_name = nodes_by_name(gm)
    remap = remap or {}

    def fx(name: str) -> torch.fx.Node | None:
        return remap.get(name) or by_name.get(name)

    edges = []
    for v in range(len(graph)):
        deps = graph.deps(v)
        if not len(deps):
            continue
        dst = fx(graph.names[v])
        for d in deps.tolist():
            src = fx(graph.names[d])
            if src is not None and dst is not None and src is not dst:
                edges.append((src, dst))
    return edges


def finish(gm: torch.fx.GraphModule, recompile: bool = True) -> torch.fx.GraphModule:
    """Lint and (unless ``recompile=False``) recompile a rewritten GraphModule (raises on an invalid graph)."""
    gm.graph.lint()
    if recompile:
        gm.recompile()
    return gm


def order_positions(gm: torch.fx.GraphModule, graph: Graph, order: Sequence[int] | None) -> dict[torch.fx.Node, float]:
    """Priority of every FX node: its position in ``order`` (IR ids, matched by name), else its FX position."""
    if order is None:
        return {n: float(i) for i, n in enumerate(gm.graph.nodes)}
    by_name = nodes_by_name(gm)
    pos: dict[torch.fx.Node, float] = {}
    for p, i in enumerate(order):
        n = by_name.get(graph.names[int(i)])
        if n is not None:
            pos[n] = float(p)
    missing = [n.name for n in gm.graph.nodes if n not in pos and n.op not in ("placeholder", "output")]
    if missing:
        raise GraphError(f"order does not cover FX node {missing[0]!r}: pass the IR graph imported from this module")
    return pos
