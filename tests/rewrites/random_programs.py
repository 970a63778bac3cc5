"""Random small torch programs with functional collectives, traced with make_fx under the fake process group, and
random per-rank inputs for them: the raw material of the rewrites' property tests.

A program is a list of steps over a pool of live 2-D tensors: elementwise compute, casts, narrowing, in-place
updates of computed tensors, and all_gather / reduce_scatter / all_reduce whose waits come at once or a few steps
later. Later steps may read earlier collectives' results, so bucketing meets real dependencies (and cycles).
"""

from __future__ import annotations

import dataclasses

import torch
from hypothesis import strategies as st
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx

from commsched.frontends.fake_pg import fake_process_group
from commsched.frontends.fx import from_fx
from commsched.rewrites.fxutil import fill_none_vals

c10d = torch.ops._c10d_functional
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


@dataclasses.dataclass(frozen=True)
class Program:
    world: int
    inputs: tuple[tuple[int, int, str], ...]  # (rows, cols, dtype)
    steps: tuple[tuple, ...]

    def __call__(self, *xs: torch.Tensor) -> list[torch.Tensor]:
        group = "0"
        pool: list[torch.Tensor] = list(xs)
        computed: set[int] = set()  # pool slots holding tensors made by compute (safe to update in place)
        pending: dict[int, tuple[int, torch.Tensor]] = {}  # pool slot -> (due step, collective result)

        def get(slot: int) -> torch.Tensor:
            # a pending collective result is waited for before anything reads it
            if slot in pending:
                pool[slot] = c10d.wait_tensor(pending.pop(slot)[1])
            return pool[slot]

        for k, step in enumerate(self.steps):
            for slot in [slot for slot, (due, _) in pending.items() if due <= k]:
                get(slot)
            op, src = step[0], get(step[1] % len(pool))
            if op == "unary":
                pool.append(torch.sin(src) * 1.5 + 0.25)
                computed.add(len(pool) - 1)
            elif op == "binary":
                other = get(step[2] % len(pool))
                if other.shape == src.shape and other.dtype == src.dtype:
                    pool.append(src * other - src)
                    computed.add(len(pool) - 1)
            elif op == "cast":
                pool.append(src.to(DTYPES[step[2]]) * 1)
                computed.add(len(pool) - 1)
            elif op == "narrow" and src.shape[0] > 1:
                pool.append(src.narrow(0, 1, src.shape[0] - 1).contiguous())
                computed.add(len(pool) - 1)
            elif op == "inplace":
                slot = step[1] % len(pool)
                if slot in computed:
                    pool[slot].mul_(0.5).add_(1.0)
            elif op in ("all_gather", "reduce_scatter", "all_reduce"):
                if op == "all_gather":
                    res = c10d.all_gather_into_tensor(src.contiguous(), self.world, group)
                elif op == "reduce_scatter":
                    if src.shape[0] % self.world:
                        continue
                    res = c10d.reduce_scatter_tensor(src.contiguous(), step[3], self.world, group)
                else:
                    res = c10d.all_reduce(src, step[3], group)
                pool.append(res)
                pending[len(pool) - 1] = (k + step[2], res)
        for slot in list(pending):
            get(slot)
        return [t * 1 for t in pool[len(xs) :]] or [xs[0] * 1]

    def trace(self):
        """(GraphModule, IR graph) of the program, traced on fake tensors."""
        with fake_process_group(self.world):
            with FakeTensorMode():
                fakes = [torch.empty(r, c, dtype=DTYPES[d]) for r, c, d in self.inputs]
                gm = make_fx(self)(*fakes)
            graph = from_fx(gm)
        return gm, graph

    def real_inputs(self, seed: int) -> list[list[torch.Tensor]]:
        gen = torch.Generator().manual_seed(seed)
        return [[torch.randn(r, c, generator=gen).to(DTYPES[d]) for r, c, d in self.inputs] for _ in range(self.world)]


@st.composite
def programs(
    draw, max_steps: int = 14, collective_ops: tuple[str, ...] = ("all_gather", "reduce_scatter", "all_reduce")
):
    world = draw(st.sampled_from([2, 4]))
    n_in = draw(st.integers(1, 3))
    inputs = tuple(
        (draw(st.sampled_from([world, 2 * world, 3])), draw(st.integers(1, 5)), draw(st.sampled_from(list(DTYPES))))
        for _ in range(n_in)
    )
    steps = []
    for _ in range(draw(st.integers(2, max_steps))):
        op = draw(st.sampled_from(["unary", "binary", "cast", "narrow", "inplace", *collective_ops, *collective_ops]))
        src = draw(st.integers(0, 30))
        if op in collective_ops:
            rop = draw(st.sampled_from(["sum", "sum", "max", "avg"]))
            steps.append((op, src, draw(st.integers(1, 4)), rop))
        elif op == "binary":
            steps.append((op, src, draw(st.integers(0, 30))))
        elif op == "cast":
            steps.append((op, src, draw(st.sampled_from(list(DTYPES)))))
        else:
            steps.append((op, src))
    return Program(world, inputs, tuple(steps))


def random_topological_order(graph, rnd) -> list[int]:
    """A random topological order of the IR graph (data and ordering edges), drawn with ``rnd`` (random.Random)."""
    n = len(graph)
    ptr, _idx = graph.predecessors_csr()
    indeg = [int(ptr[i + 1] - ptr[i]) for i in range(n)]
    sptr, sidx = graph.successors_csr()
    ready = [i for i in range(n) if indeg[i] == 0]
    out = []
    while ready:
        i = ready.pop(rnd.randrange(len(ready)))
        out.append(i)
        for s in sidx[sptr[i] : sptr[i + 1]].tolist():
            indeg[s] -= 1
            if indeg[s] == 0:
                ready.append(s)
    return out


def trace(fn, world: int, shapes: list[tuple[int, ...]], dtype: torch.dtype = torch.float32):
    """(GraphModule, IR graph) of ``fn`` traced on fake inputs of ``shapes`` under a fake group of ``world`` ranks."""
    with fake_process_group(world):
        with FakeTensorMode():
            gm = make_fx(fn)(*[torch.empty(s, dtype=dtype) for s in shapes])
        fill_none_vals(gm)
        graph = from_fx(gm)
    return gm, graph
