"""The commsched IR: a columnar, integer-indexed graph of one step (see ``graph.py`` for the contract)."""

from commsched.ir.builder import GraphBuilder
from commsched.ir.graph import Buffer, Collective, CollType, Graph, GraphError, NodeView, OpKind, ProcessGroup

__all__ = [
    "Buffer",
    "CollType",
    "Collective",
    "Graph",
    "GraphBuilder",
    "GraphError",
    "NodeView",
    "OpKind",
    "ProcessGroup",
]
