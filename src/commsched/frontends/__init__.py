"""Frontends: turn a program into a commsched Graph (FX GraphModule, JSON file, built-in workloads).

``json_io`` needs no torch; the FX frontend imports torch on first use.
"""

from commsched.frontends.json_io import graph_from_dict, graph_to_dict, load_graph, save_graph


def __getattr__(name: str):
    if name == "from_fx":
        from commsched.frontends.fx import from_fx

        return from_fx
    if name == "fake_process_group":
        from commsched.frontends.fake_pg import fake_process_group

        return fake_process_group
    raise AttributeError(f"module 'commsched.frontends' has no attribute {name!r}")


__all__ = ["fake_process_group", "from_fx", "graph_from_dict", "graph_to_dict", "load_graph", "save_graph"]
