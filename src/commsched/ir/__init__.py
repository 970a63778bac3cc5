"""The commsched IR: a columnar, integer-indexed graph of one step (see ``graph.py`` for the contract)."""

from commsched.ir.builder import GraphBuilder
from commsched.ir.graph import (
    CAUSAL_META,
    PERMUTE_META,
    Buffer,
    Collective,
    CollType,
    Graph,
    GraphError,
    NodeView,
    OpKind,
    ProcessGroup,
)

__all__ = [
    "CAUSAL_META",
    "PERMUTE_META",
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
