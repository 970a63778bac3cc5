"""Small real torch programs with functional collectives, traced with make_fx under the fake process group.

Every ``_c10d_functional`` collective type appears; tests import these through ``trace_program``.
"""

from __future__ import annotations

import torch
import torch.distributed._functional_collectives as fc
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx

from commsched.frontends.fake_pg import fake_process_group
from commsched.frontends.fx import from_fx

c10d = torch.ops._c10d_functional
DIM = 64
TOKENS = 128


def every_collective(x, w_shard, pg, world):
    """One of each functional collective on a tiny MLP-like computation (wait_tensor explicit)."""
    name = pg.group_name
    w = c10d.wait_tensor(c10d.all_gather_into_tensor(w_shard, world, name))  # [world*rows, DIM]
    h = x @ w.t()  # [TOKENS, world*rows]
    h = c10d.wait_tensor(c10d.all_reduce(h, "sum", name))
    rs = c10d.wait_tensor(c10d.reduce_scatter_tensor(h.contiguous(), "sum", world, name))  # [TOKENS/world, ...]
    splits = [h.shape[0] // world] * world
    a2a = c10d.wait_tensor(c10d.all_to_all_single(h, splits, splits, name))
    b = c10d.wait_tensor(c10d.broadcast(x, 0, name))
    ar_c = c10d.all_reduce_coalesced([x, b], "avg", name)
    ar_c = [c10d.wait_tensor(t) for t in ar_c]
    ag_c = c10d.all_gather_into_tensor_coalesced([x, b], world, name)
    ag_c = [c10d.wait_tensor(t) for t in ag_c]
    rs_c = c10d.reduce_scatter_tensor_coalesced([ag_c[0], ag_c[1]], "sum", world, name)
    rs_c = [c10d.wait_tensor(t) for t in rs_c]
    return rs.sum() + a2a.sum() + ar_c[0].sum() + ar_c[1].sum() + rs_c[0].sum() + rs_c[1].sum()


def inplace_collectives(x, buf, pg, world):
    """In-place and `_out` variants: the collective writes a storage the program also reads."""
    name = pg.group_name
    y = x * 2
    y = c10d.wait_tensor(c10d.all_reduce_(y, "sum", name))
    out = torch.empty(world * x.shape[0], x.shape[1], dtype=x.dtype)
    g = c10d.wait_tensor(c10d.all_gather_into_tensor_out(x, world, name, out=out))
    z = buf.sum()  # read before an in-place copy into buf
    buf.copy_(y)
    return g.sum() + z + buf.sum()


def fsdp_mlp_step(x, *shards, pg, layers_dim):
    """FSDP-style joint forward+backward: params all-gathered (autograd makes the reduce-scatters)."""
    params = [fc.all_gather_tensor(s, 0, pg).view(layers_dim, layers_dim) for s in shards]
    h = x
    for w in params:
        h = torch.relu(h @ w.t())
    loss = h.float().pow(2).mean()
    grads = torch.autograd.grad(loss, shards)
    return [loss, *grads]


def trace_program(kind: str, world: int, **kw):
    """Trace one of the programs at ``world`` ranks; returns (GraphModule, Graph)."""
    with fake_process_group(world) as pg:
        with FakeTensorMode():
            if kind == "every_collective":
                x = torch.randn(TOKENS * world // 8 if world >= 8 else TOKENS, DIM)
                w = torch.randn(2, DIM)
                gm = make_fx(lambda x, w: every_collective(x, w, pg, world))(x, w)
            elif kind == "inplace":
                x, buf = torch.randn(16, DIM), torch.randn(16, DIM)
                gm = make_fx(lambda x, b: inplace_collectives(x, b, pg, world))(x, buf)
            elif kind == "fsdp_mlp":
                layers, dim = kw.get("layers", 3), kw.get("dim", 256)
                x = torch.randn(TOKENS, dim)
                shards = [torch.randn(dim * dim // world, requires_grad=True) for _ in range(layers)]
                gm = make_fx(lambda x, *s: fsdp_mlp_step(x, *s, pg=pg, layers_dim=dim))(x, *shards)
            else:
                raise ValueError(kind)
        return gm, from_fx(gm)


def prefetch_under_pressure(x, w_big, w_shard, pg, world):
    """A big temporary sets the peak; an all_gather that moves above it would raise that peak."""
    name = pg.group_name
    tmp = torch.relu(x @ w_big)  # the peak: a large activation
    small = tmp.sum(dim=1, keepdim=True)
    w = c10d.wait_tensor(c10d.all_gather_into_tensor(w_shard, world, name))
    return (small * w.sum()).sum()


def trace_pressure(world: int = 8):
    with fake_process_group(world) as pg:
        with FakeTensorMode():
            x, w_big, w_shard = torch.randn(512, 256), torch.randn(256, 4096), torch.randn(256, 256)
            gm = make_fx(lambda x, a, b: prefetch_under_pressure(x, a, b, pg, world))(x, w_big, w_shard)
        return gm, from_fx(gm)
