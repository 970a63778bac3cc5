"""Incremental construction of a :class:`Graph` (used by the frontends and by tests)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from commsched.ir.graph import CollType, Graph, GraphError, OpKind, ProcessGroup


class GraphBuilder:
    """Append nodes in topological order, then call :meth:`build`.

    Storages are created with :meth:`new_storage`; a buffer names the storage it lives on, so aliases are
    buffers on an existing storage.
    """

    def __init__(self, meta: dict[str, Any] | None = None) -> None:
        self.meta = dict(meta or {})
        self.names: list[str] = []
        self.targets: list[str] = []
        self.kinds: list[int] = []
        self.inputs: list[list[int]] = []
        self.deps: list[list[int]] = []
        self.flops: list[float] = []
        self.side_effect: list[bool] = []
        self.buf_node_ptr: list[int] = [0]
        self.buf_shape: list[tuple[int, ...]] = []
        self.buf_dtype: list[str] = []
        self.buf_nbytes: list[int] = []
        self.buf_storage: list[int] = []
        self.storage_nbytes: list[int] = []
        self.storage_owner: list[int] = []
        self.coll: dict[int, tuple[int, int, str | None, int, int, bool]] = {}
        self.wait_of: dict[int, int] = {}
        self.groups: list[ProcessGroup] = []
        self._group_index: dict[str, int] = {}
        self._names: set[str] = set()

    def __len__(self) -> int:
        return len(self.names)

    def group(self, name: str, size: int, stride: int = 1) -> int:
        """Index of the process group ``name``, registering it on first use."""
        idx = self._group_index.get(name)
        if idx is None:
            if size < 1:
                raise GraphError(f"process group {name!r}: size {size} must be >= 1")
            idx = self._group_index[name] = len(self.groups)
            self.groups.append(ProcessGroup(name, int(size), int(stride)))
        elif self.groups[idx].size != size:
            raise GraphError(
                f"process group {name!r} is used with size {size} but was registered with size {self.groups[idx].size}"
            )
        return idx

    def new_storage(self, nbytes: int, owner: int) -> int:
        self.storage_nbytes.append(int(nbytes))
        self.storage_owner.append(int(owner))
        return len(self.storage_nbytes) - 1

    def add_node(
        self,
        name: str,
        target: str,
        kind: OpKind,
        inputs: Sequence[int] = (),
        *,
        buffers: Sequence[tuple[tuple[int, ...], str, int, int | None]] = (),
        flops: float = 0.0,
        side_effect: bool = False,
        deps: Sequence[int] = (),
    ) -> int:
        """Append a node; returns its id. A buffer is (shape, dtype, nbytes, storage); storage None allocates a
        fresh storage of ``nbytes`` owned by this node."""
        if name in self._names:
            raise GraphError(f"duplicate node name {name!r}: node names must be unique")
        self._names.add(name)
        nid = len(self.names)
        self.names.append(name)
        self.targets.append(target)
        self.kinds.append(int(kind))
        self.inputs.append(list(dict.fromkeys(int(i) for i in inputs)))
        self.deps.append(list(dict.fromkeys(int(d) for d in deps)))
        self.flops.append(float(flops))
        self.side_effect.append(bool(side_effect))
        for shape, dtype, nbytes, storage in buffers:
            if storage is None:
                storage = self.new_storage(nbytes, nid)
            self.buf_shape.append(tuple(int(s) for s in shape))
            self.buf_dtype.append(dtype)
            self.buf_nbytes.append(int(nbytes))
            self.buf_storage.append(int(storage))
        self.buf_node_ptr.append(len(self.buf_nbytes))
        return nid

    def node_storages(self, nid: int) -> list[int]:
        return self.buf_storage[self.buf_node_ptr[nid] : self.buf_node_ptr[nid + 1]]

    def node_buffer(self, nid: int, k: int) -> tuple[tuple[int, ...], str, int, int]:
        b = self.buf_node_ptr[nid] + k
        if b >= self.buf_node_ptr[nid + 1]:
            raise GraphError(f"node {self.names[nid]!r} has no output {k}")
        return self.buf_shape[b], self.buf_dtype[b], self.buf_nbytes[b], self.buf_storage[b]

    def set_collective(
        self,
        nid: int,
        coll_type: CollType,
        group: int,
        reduce_op: str | None,
        in_bytes: int,
        out_bytes: int,
        sync: bool = False,
    ) -> None:
        self.coll[nid] = (int(coll_type), int(group), reduce_op, int(in_bytes), int(out_bytes), bool(sync))

    def set_wait(self, nid: int, collective: int) -> None:
        self.wait_of[nid] = int(collective)
        self.add_dep(nid, collective)

    def add_dep(self, nid: int, before: int) -> None:
        """Make ``before`` an ordering-only predecessor of ``nid``."""
        if before != nid and before not in self.deps[nid] and before not in self.inputs[nid]:
            self.deps[nid].append(int(before))

    def build(self, validate: bool = True) -> Graph:
        n = len(self.names)

        def csr(lists: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
            ptr = np.zeros(n + 1, np.int32)
            np.cumsum([len(x) for x in lists], out=ptr[1:])
            idx = np.fromiter((v for x in lists for v in x), np.int32, count=int(ptr[-1]))
            return ptr, idx

        in_ptr, in_idx = csr(self.inputs)
        dep_ptr, dep_idx = csr(self.deps)
        coll_type = np.full(n, -1, np.int8)
        coll_group = np.full(n, -1, np.int16)
        coll_in = np.zeros(n, np.int64)
        coll_out = np.zeros(n, np.int64)
        coll_sync = np.zeros(n, bool)
        reduce_ops: dict[int, str] = {}
        for nid, (ct, grp, rop, ib, ob, sync) in self.coll.items():
            coll_type[nid], coll_group[nid], coll_in[nid], coll_out[nid] = ct, grp, ib, ob
            coll_sync[nid] = sync
            if rop is not None:
                reduce_ops[nid] = rop
        wait_of = np.full(n, -1, np.int32)
        for w, c in self.wait_of.items():
            wait_of[w] = c
        meta = dict(self.meta)
        g = Graph(
            names=self.names,
            targets=self.targets,
            kinds=np.asarray(self.kinds, np.int8),
            in_ptr=in_ptr,
            in_idx=in_idx,
            dep_ptr=dep_ptr,
            dep_idx=dep_idx,
            flops=np.asarray(self.flops, np.float64),
            buf_ptr=np.asarray(self.buf_node_ptr, np.int32),
            buf_shape=self.buf_shape,
            buf_dtype=self.buf_dtype,
            buf_nbytes=np.asarray(self.buf_nbytes, np.int64),
            buf_storage=np.asarray(self.buf_storage, np.int32),
            storage_nbytes=np.asarray(self.storage_nbytes, np.int64),
            storage_owner=np.asarray(self.storage_owner, np.int32),
            side_effect=np.asarray(self.side_effect, bool),
            coll_type=coll_type,
            coll_group=coll_group,
            coll_reduce_op=reduce_ops,
            coll_in_bytes=coll_in,
            coll_out_bytes=coll_out,
            coll_sync=coll_sync,
            wait_of=wait_of,
            groups=self.groups,
            meta=meta,
        )
        return g.validate() if validate else g
