"""Can an explicit hierarchical collective (issue 18 c) beat the collective model's own choice? Measured before
building the rewrite.

Usage: python benchmarks/bench_hierarchical.py [--hardware PROFILE ...]
For all_reduce / all_gather / reduce_scatter of 1 MiB - 1 GiB on 16, 64 and 512 ranks (8 per node): the time
``cost/collectives.py`` gives the collective as one operation (its fastest algorithm; "hierarchical" is already one
of its candidates), against the program a rewrite would emit: reduce_scatter in the node -> the collective on 1/8 of
the data across nodes (one rank per node, stride 8) -> all_gather in the node, each phase a collective of its own,
timed by the same model and run back to back. "pipelined" is the steady state of many such collectives in a row
when the NVLink phases of one overlap the network phase of the next (the best any such rewrite could do: the
larger of the NVLink and the network work per collective). Prints a markdown table for RESULTS.md.
"""

from __future__ import annotations

import argparse

KINDS = ("all_reduce", "all_gather", "reduce_scatter")
SIZES_MIB = (1, 16, 256, 1024)
WORLDS = (16, 64, 512)
GPUS_PER_NODE = 8


def phases(kind: str, nbytes: int, nodes: int, hw) -> tuple[list, list]:
    """(NVLink phases, network phases) of the explicit hierarchical program, each a CollectivePlan."""
    from commsched.cost.collectives import plan_collective

    g = GPUS_PER_NODE
    inter = plan_collective(kind, nbytes // g, nodes, hw, stride=g)
    rs, ag = plan_collective("reduce_scatter", nbytes, g, hw), plan_collective("all_gather", nbytes, g, hw)
    intra = {"all_reduce": [rs, ag], "all_gather": [ag], "reduce_scatter": [rs]}[kind]
    return intra, [inter]


def rows(profile: str):
    from commsched import hardware
    from commsched.cost.collectives import plan_collective

    for world in WORLDS:
        nodes = world // GPUS_PER_NODE
        hw = hardware.get(profile, num_nodes=nodes)
        for kind in KINDS:
            for mib in SIZES_MIB:
                nbytes = mib << 20
                flat = plan_collective(kind, nbytes, world, hw)
                intra, inter = phases(kind, nbytes, nodes, hw)
                seq_s = sum(p.time_s for p in intra + inter)
                pipe_s = max(sum(p.time_s for p in intra), sum(p.time_s for p in inter))
                yield world, kind, mib, flat, seq_s, pipe_s


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hardware", action="append", help="profile(s); default h100-sxm@nccl-defaults and h100-sxm")
    args = ap.parse_args()
    for profile in args.hardware or ["h100-sxm@nccl-defaults", "h100-sxm"]:
        print(f"\n#### {profile}\n")
        print("| ranks | collective | size (MiB) | one collective (us) | its algorithm | 3 collectives (us) | "
              "ratio | pipelined (us) | ratio |")  # fmt: skip
        print("|---|---|---|---|---|---|---|---|---|")
        for world, kind, mib, flat, seq_s, pipe_s in rows(profile):
            print(f"| {world} | {kind} | {mib} | {flat.time_s * 1e6:.1f} | {flat.algorithm}/{flat.protocol} | "
                  f"{seq_s * 1e6:.1f} | {seq_s / flat.time_s:.3f} | {pipe_s * 1e6:.1f} | "
                  f"{pipe_s / flat.time_s:.3f} |")  # fmt: skip


if __name__ == "__main__":
    main()
