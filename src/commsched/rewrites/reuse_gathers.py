"""Gathered parameters kept for the backward: a re-gather dropped (FSDP's ``reshard_after_forward=False``, per layer).

An FSDP step gathers each layer's parameters twice: in the forward, and again in the backward after freeing them
(resharding) to save memory. Where the memory is there, the backward can read the forward's gathered value instead:
one all_gather fewer per parameter, the same values bit for bit (the same collective of the same unchanged shard).
torchtitan does this for the last block (its backward follows at once); which layers pay off within a memory budget
is the simulator's call (:mod:`commsched.optimize.families.kept_gathers`).

A *re-gather* is an ``all_gather_into_tensor`` whose input is the same chain of pure ops (``detach``, ``_to_copy``,
views) of the same placeholder as an earlier one's, with the same group arguments, where nothing writes the
placeholder or the earlier gathered value. :func:`find_regathers` lists them in program order, grouped in *runs*
(the re-gathers issued together, e.g. one layer's, with no compute between them); :func:`reuse_gathers` rewires the
readers of each chosen re-gather's wait to the earlier wait and deletes the re-gather with its input chain. Every
rank rewrites the same program, so each group's collectives keep one order on every rank.

Recognised: per-parameter functional gathers of a placeholder, as the zoo and SimpleFSDP-style compiled steps trace
them. Not recognised: eager FSDP2's traces, whose every gather reads a copy-in buffer (``fsdp.all_gather_copy_in``)
of constants traced anew for each gather; nothing is found there and nothing changes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

import torch
import torch.fx

from commsched.ir import Graph, GraphError, OpKind
from commsched.rewrites.fxutil import WAIT, RewriteResult, finish, is_op, nodes_by_name, wait_users

aten = torch.ops.aten
AG = torch.ops._c10d_functional.all_gather_into_tensor.default
PURE = {aten.detach.default, aten._to_copy.default, aten.view.default, aten.alias.default, aten.clone.default,
        aten._unsafe_view.default, aten.reshape.default, aten.t.default}  # fmt: skip
"""ops a gathered parameter's input may pass through (pure functions of their input)"""


@dataclasses.dataclass(frozen=True)
class Regather:
    """A backward all_gather (``backward``) that repeats an earlier one (``forward``) of placeholder ``param``."""

    forward: str
    backward: str
    param: str


def _written(node: torch.fx.Node) -> bool:
    """Whether any op writes ``node`` or a view of it (a mutable schema argument, through pure views)."""
    todo, seen = [node], set()
    while todo:
        n = todo.pop()
        if n in seen:
            continue
        seen.add(n)
        for u in n.users:
            schema = getattr(u.target, "_schema", None)
            if schema is not None:
                for arg, val in zip(schema.arguments, u.args, strict=False):
                    if val is n and arg.alias_info is not None and arg.alias_info.is_write:
                        return True
            if u.op == "call_function" and u.target in PURE:
                todo.append(u)
    return False


def _key(ag: torch.fx.Node) -> tuple | None:
    """What an all_gather computes: (placeholder, its pure chain, the gather's other arguments), or None."""
    chain, x = [], ag.args[0]
    while isinstance(x, torch.fx.Node) and x.op == "call_function" and x.target in PURE:
        if any(isinstance(a, torch.fx.Node) for a in (*x.args[1:], *x.kwargs.values())):
            return None
        chain.append((str(x.target), repr(x.args[1:]), repr(sorted(x.kwargs.items()))))
        x = x.args[0]
    if not isinstance(x, torch.fx.Node) or x.op != "placeholder":
        return None
    return x.name, tuple(chain), repr(ag.args[1:]), repr(sorted(ag.kwargs.items()))


def find_regathers(gm: torch.fx.GraphModule) -> list[list[Regather]]:
    """The step's re-gathers in program order, in runs (no other compute between the members of a run)."""
    first: dict[tuple, torch.fx.Node] = {}
    runs: list[list[Regather]] = []
    compute_since = True
    for n in gm.graph.nodes:
        if n.op == "call_function" and n.target not in PURE and not is_op(n, AG, WAIT):
            compute_since = True
        if not is_op(n, AG):
            continue
        key = _key(n)
        if key is None:
            continue
        earlier = first.setdefault(key, n)
        if earlier is n or len(wait_users(n)) != 1 or len(wait_users(earlier)) != 1:
            continue
        if _written(earlier.args[0]) or _written(wait_users(earlier)[0]) or _placeholder_written(n):
            continue
        if compute_since or not runs:
            runs.append([])
        runs[-1].append(Regather(earlier.name, n.name, key[0]))
        compute_since = False
    return runs


def _placeholder_written(ag: torch.fx.Node) -> bool:
    x = ag.args[0]
    while x.op == "call_function":
        x = x.args[0]
    return _written(x)


def reuse_gathers(gm: torch.fx.GraphModule, backward: Iterable[str], *, recompile: bool = True) -> RewriteResult:
    """A copy of ``gm`` in which each named re-gather (:attr:`Regather.backward`) is replaced by its earlier gather's
    value. Raises ``GraphError`` naming a name that is not a re-gather of ``gm``."""
    known = {r.backward: r for run in find_regathers(gm) for r in run}
    names = list(dict.fromkeys(backward))
    for name in names:
        if name not in known:
            raise GraphError(f"FX node {name!r} is not an all_gather that repeats an earlier one of the same "
                             f"unchanged parameter: expected one of find_regathers' backward names")  # fmt: skip
    res = RewriteResult.on_copy(gm, "reuse_gathers", lazy=True)
    out = res.gm
    by_name = nodes_by_name(out)
    for name in names:
        r = known[name]
        ag, kept = by_name[r.backward], by_name[r.forward]
        wait, kept_wait = wait_users(ag)[0], wait_users(kept)[0]
        wait.replace_all_uses_with(kept_wait)
        res.replaced[wait.name] = kept_wait.name
        src = ag.args[0]
        out.graph.erase_node(wait)
        out.graph.erase_node(ag)
        while isinstance(src, torch.fx.Node) and src.op == "call_function" and not src.users:
            nxt = src.args[0]
            out.graph.erase_node(src)
            src = nxt
        res.rows.append({"dropped": r.backward, "reads": r.forward, "param": r.param})
        res.count("re-gather dropped")
    finish(out, recompile=recompile)
    return res


def reuse_graph(g: Graph, dropped: Iterable[Regather]) -> Graph:
    """The IR of :func:`reuse_gathers` made on ``g`` (the IR of the module the re-gathers were found in) directly:
    node for node what ``from_fx`` gives of the rewritten module (``tests/rewrites/test_reuse_gathers.py``), without
    rewriting and importing it."""
    import numpy as np

    from commsched.ir.transform import select_nodes

    waits = np.flatnonzero(g.wait_of >= 0)
    wait_for = dict(zip(g.wait_of[waits].tolist(), waits.tolist(), strict=True))
    readers = np.bincount(g.in_idx, minlength=len(g))
    keep = np.ones(len(g), bool)
    redirect: dict[int, int] = {}
    for r in dropped:
        ag, kept = g.index[r.backward], g.index[r.forward]
        redirect[wait_for[ag]] = wait_for[kept]
        keep[[ag, wait_for[ag]]] = False
        x = ag
        while True:  # the gather's input chain, as far as nothing else reads it
            src = g.inputs(x)
            if len(src) != 1 or g.kinds[int(src[0])] == OpKind.INPUT or readers[int(src[0])] != 1:
                break
            x = int(src[0])
            keep[x] = False
    return select_nodes(g, keep, redirect)
