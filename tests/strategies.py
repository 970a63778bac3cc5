"""Hypothesis strategies: random valid graphs with collectives on several process groups.

Small synthetic DAGs for property tests of the IR, the JSON format, the simulator and every pass.
"""

from __future__ import annotations

from hypothesis import strategies as st

from commsched.ir import CollType, Graph, GraphBuilder, OpKind

DTYPES = ("float32", "bfloat16", "float16")
ITEMSIZE = {"float32": 4, "bfloat16": 2, "float16": 2}
MAX_GATHERED_BYTES = 1 << 44
"""the largest buffer an all_gather of :func:`graphs` makes (its inputs may be gathers already)"""


@st.composite
def graphs(
    draw, min_nodes: int = 2, max_nodes: int = 40, max_groups: int = 3, p_collective: float = 0.25, p_sync: float = 0.0
) -> Graph:
    """A random valid Graph: inputs, compute/other/view ops, collectives with their waits, one output. With
    ``p_sync`` > 0, that share of the collectives is synchronous (no wait; its output is ready when it ends), and a
    synchronous collective may also carry a control dependency on an earlier collective of its group."""
    b = GraphBuilder({"source": "hypothesis"})
    num_groups = draw(st.integers(1, max_groups))
    groups = [b.group(f"g{k}", draw(st.sampled_from([2, 4, 8, 64, 1024]))) for k in range(num_groups)]
    live: list[int] = []  # nodes with a buffer that later nodes may read
    pending_waits: list[tuple[int, int]] = []  # (collective, earliest position) waiting for their wait node
    group_colls: dict[int, list[int]] = {}  # per group: its collectives so far

    def buffer(dtype: str | None = None):
        dtype = dtype or draw(st.sampled_from(DTYPES))
        rows, cols = draw(st.integers(1, 64)), draw(st.integers(1, 64))
        return ((rows, cols), dtype, rows * cols * ITEMSIZE[dtype], None)

    for _ in range(draw(st.integers(1, 3))):
        live.append(b.add_node(f"in{len(b)}", "placeholder", OpKind.INPUT, buffers=[buffer()]))
    target_nodes = draw(st.integers(min_nodes, max_nodes))
    while len(b) < target_nodes:
        name = f"n{len(b)}"
        # close some pending collectives with their waits
        if pending_waits and draw(st.booleans()):
            k = draw(st.integers(0, len(pending_waits) - 1))
            coll, _ = pending_waits.pop(k)
            shape, dtype, nbytes, storage = b.node_buffer(coll, 0)
            w = b.add_node(
                f"wait{len(b)}",
                "_c10d_functional.wait_tensor.default",
                OpKind.WAIT,
                [coll],
                buffers=[(shape, dtype, nbytes, storage)],
                side_effect=True,
            )
            b.set_wait(w, coll)
            live.append(w)
            continue
        op = draw(
            st.sampled_from(["compute", "other", "view", "collective"])
            if draw(st.floats(0, 1)) >= p_collective
            else st.just("collective")
        )
        srcs = draw(st.lists(st.sampled_from(live), min_size=1, max_size=3, unique=True))
        if op == "collective":
            src = srcs[0]
            grp = draw(st.sampled_from(groups))
            ctype = draw(st.sampled_from(list(CollType)))
            sync = p_sync > 0 and draw(st.floats(0, 1)) < p_sync
            shape, dtype, nbytes, _ = b.node_buffer(src, 0)
            size = b.groups[grp].size
            if ctype == CollType.ALL_GATHER and nbytes * size > MAX_GATHERED_BYTES:
                ctype = CollType.ALL_REDUCE  # a chain of gathers over 1024 ranks would pass the IR's 2**53 bytes
            out_bytes = (
                nbytes * size
                if ctype == CollType.ALL_GATHER
                else (max(1, nbytes // size) if ctype == CollType.REDUCE_SCATTER else nbytes)
            )
            c = b.add_node(
                name,
                f"_c10d_functional.{ctype.name.lower()}.default",
                OpKind.COLLECTIVE,
                [src],
                buffers=[((out_bytes // ITEMSIZE[dtype],), dtype, out_bytes, None)],
                side_effect=True,
            )
            b.set_collective(
                c,
                ctype,
                grp,
                "sum" if ctype in (CollType.ALL_REDUCE, CollType.REDUCE_SCATTER) else None,
                out_bytes * size if ctype == CollType.REDUCE_SCATTER else nbytes,  # in_bytes = out x group size
                out_bytes,
                sync=sync,
            )
            if sync:
                same_group = [x for x in group_colls.get(grp, []) if x not in srcs]
                if same_group and draw(st.booleans()):
                    b.add_dep(c, draw(st.sampled_from(same_group)))  # e.g. an in-place write ordered after a read
                live.append(c)
            else:
                pending_waits.append((c, len(b)))
            group_colls.setdefault(grp, []).append(c)
        elif op == "view":
            shape, dtype, nbytes, storage = b.node_buffer(srcs[0], 0)
            live.append(
                b.add_node(
                    name, "aten.view.default", OpKind.VIEW, [srcs[0]], buffers=[(shape[::-1], dtype, nbytes, storage)]
                )
            )
        else:
            flops = float(draw(st.integers(1, 10**9))) if op == "compute" else 0.0
            live.append(
                b.add_node(
                    name,
                    "aten.mm.default" if op == "compute" else "aten.add.Tensor",
                    OpKind.COMPUTE if op == "compute" else OpKind.OTHER,
                    srcs,
                    buffers=[buffer()],
                    flops=flops,
                )
            )
    for coll, _ in pending_waits:
        shape, dtype, nbytes, storage = b.node_buffer(coll, 0)
        w = b.add_node(
            f"wait{len(b)}",
            "_c10d_functional.wait_tensor.default",
            OpKind.WAIT,
            [coll],
            buffers=[(shape, dtype, nbytes, storage)],
            side_effect=True,
        )
        b.set_wait(w, coll)
        live.append(w)
    outs = draw(st.lists(st.sampled_from(live), min_size=1, max_size=4, unique=True))
    b.add_node("output", "output", OpKind.OUTPUT, outs, side_effect=True)
    return b.build()
