"""Hardware profiles: the frozen dataclasses, and their strict TOML form.

A profile file states numbers in the units of their public sources (TFLOP/s, TB/s, GB/s per direction, Gb/s per
NIC, microseconds); the key names carry the unit. Loading converts them to SI units (``_s``, ``_bytes``,
``_bytes_per_s``, FLOP/s) and checks every field: unknown keys, missing keys and out-of-range values are errors that
name the file and the key.
"""

from __future__ import annotations

import dataclasses
import math
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from commsched.io import read_input_text

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

_T = 1e12
_G = 1e9
_US = 1e-6


@dataclasses.dataclass(frozen=True, kw_only=True)
class OpEfficiency:
    """Best achieved fraction of peak for each op class (large, well-shaped problems)."""

    matmul: float  # of peak FLOP/s, GEMM and convolution
    attention: float  # of peak FLOP/s, fused attention kernels
    elementwise: float  # of HBM bandwidth, memory-bound pointwise / copy kernels
    reduction: float  # of HBM bandwidth, memory-bound reductions (norms, softmax, sums)
    sustained_matmul: float = 1.0  # x matmul in a training step, whose GEMMs keep the chip at its power limit


@dataclasses.dataclass(frozen=True, kw_only=True)
class ComputeSpec:
    """One accelerator (or the CPU) as the roofline sees it."""

    num_units: int  # SMs / CUs / cores: the parallel units a GEMM's tiles are spread over (wave quantization)
    launch_overhead_s: float  # fixed cost of one kernel launch (one eager op dispatch on a CPU)
    hbm_bandwidth_bytes_per_s: float  # memory bandwidth (datasheet)
    hbm_capacity_bytes: int
    peak_flops: tuple[tuple[str, float], ...]  # (dtype, dense FLOP/s); "float32" is the fallback dtype
    efficiency: OpEfficiency
    matmul_tiles: tuple[tuple[int, int, float], ...]  # (tile_m, tile_n, relative efficiency) a GEMM library picks from
    matmul_k_half: float  # K at which a GEMM's main loop reaches half its efficiency (prologue/epilogue cost)
    memory_half_bytes: float  # bytes at which a memory-bound kernel reaches half its bandwidth (Little's law)
    attention_tile: int  # query rows per attention tile
    cache_bytes: float = 0.0  # kernels moving at most this many bytes run at cache_bandwidth (0: no cache level)
    cache_bandwidth_bytes_per_s: float = 0.0
    # a memory-bound matmul's half-bandwidth bytes (a few tokens against a weight: its grid streams the weight with
    # fewer requests in flight than a copy); 0: memory_half_bytes
    matmul_memory_half_bytes: float = 0.0

    def peak_flops_for(self, dtype: str) -> float:
        table = dict(self.peak_flops)
        return table.get(dtype, table["float32"])


@dataclasses.dataclass(frozen=True, kw_only=True)
class Protocol:
    """An NCCL-like protocol: how much of a link's bandwidth it reaches and what each step costs."""

    name: str  # "ll", "ll128", "simple"
    bandwidth_fraction: float  # of the algorithm's bus bandwidth
    max_bus_bandwidth_bytes_per_s: float  # cap on the bus bandwidth (inf when none)
    base_latency_s: float  # per collective: launch and setup
    intra_hop_latency_s: float  # per ring step / tree level over the intra-node link
    inter_hop_latency_s: float  # per step over the network


@dataclasses.dataclass(frozen=True, kw_only=True)
class IntraNode:
    """The fabric between the accelerators of one node."""

    link_bandwidth_bytes_per_s: float  # per accelerator, per direction
    ring_efficiency: float  # achieved ring bus bandwidth / link bandwidth
    all_to_all_efficiency: float  # achieved all_to_all bus bandwidth / link bandwidth
    nvls: bool  # NVLink SHARP: the switch reduces and multicasts
    nvls_efficiency: float  # NVLS all_reduce algorithm bandwidth / link bandwidth
    nvls_latency_s: float
    nvls_tree_efficiency: float = 1.0  # NVLS-tree (several nodes): its NVLS phase's bandwidth / one node's NVLS


@dataclasses.dataclass(frozen=True, kw_only=True)
class InterNode:
    """The network between nodes."""

    nics_per_node: int
    nic_bandwidth_bytes_per_s: float  # per NIC, per direction (line rate)
    nic_efficiency: float  # achieved / line rate
    tree_two_children: bool = False  # each tree level below the root costs two network steps (cost.collectives)
    # the fields come from a fit to measured collectives across nodes (nccl-tests logs); False: NCCL's tuning
    # constants or other unmeasured values, which commsched warns about in a multi-node estimate
    fitted: bool = False


@dataclasses.dataclass(frozen=True, kw_only=True)
class Hardware:
    """A cluster: ``num_nodes`` nodes of ``gpus_per_node`` identical accelerators.

    Placement rule (contiguous global ranks): a process group of ``size`` ranks at ``stride`` has
    ``ranks_per_node = clamp(gpus_per_node // stride, 1, size)`` ranks in each node when ``stride < gpus_per_node``,
    else 1; it spans nodes when ``size * stride > gpus_per_node``, over ``ceil(size / ranks_per_node)`` nodes. So on a
    2-D mesh the inner group (stride 1, size <= gpus_per_node) stays on NVLink and the outer one crosses nodes.
    """

    name: str
    description: str
    gpus_per_node: int
    num_nodes: int
    compute: ComputeSpec
    intra_node: IntraNode
    inter_node: InterNode
    protocols: tuple[Protocol, ...]
    compute_slowdown: float  # compute runs this much slower while a collective is in flight
    stream_sync_s: float  # one cross-stream dependency (event record + wait)
    table_path: str | None = None  # a measured table (commsched.cost.MeasuredTable) used before the model
    source: str = ""  # where the profile was read from
    # the network profile ``hardware.get`` puts under this GPU profile when none is named ("" for none): set only on
    # a profile whose inter-node fields are still its own; ``get`` clears it once a network is applied
    default_network: str = ""

    @property
    def world_size(self) -> int:
        return self.gpus_per_node * self.num_nodes

    def with_nodes(self, num_nodes: int = 1, gpus_per_node: int | None = None) -> Hardware:
        """The same profile on another cluster shape."""
        gpn = self.gpus_per_node if gpus_per_node is None else gpus_per_node
        if num_nodes < 1 or gpn < 1:
            raise ValueError(f"hardware {self.name!r}: num_nodes={num_nodes} and gpus_per_node={gpn} must be >= 1")
        return dataclasses.replace(self, num_nodes=int(num_nodes), gpus_per_node=int(gpn))

    def placement(self, size: int, stride: int = 1) -> tuple[int, int]:
        """(ranks per node, nodes spanned) of a process group; see the class docstring for the rule."""
        if size < 1 or stride < 1:
            raise ValueError(f"process group size={size} and stride={stride} must be >= 1")
        gpn = self.gpus_per_node
        per_node = min(max(gpn // stride, 1), size) if stride < gpn else 1
        nodes = 1 if size * stride <= gpn else math.ceil(size / per_node)
        return per_node, nodes


# ---------------------------------------------------------------------------------------------------- TOML schema
_REQUIRED = object()  # sentinel: the key must be present


MAX_VALUE = 1e12
"""the largest number a profile field may hold, in its file's unit (TFLOP/s, GB/s, us, bytes, ...)"""
MIN_POSITIVE = 1e-12
"""the smallest value of a field that must be positive"""
MAX_COUNT = 1 << 20
"""the largest integer field (GPUs per node, units, NICs, tile sizes)"""


def _fail(where: str, msg: str) -> ValueError:
    return ValueError(f"{where}: {msg}")


def _brief(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 60 else text[:57] + "..."


class _Section:
    """Strict reads from one TOML table: every key must be consumed (``done``), values are type- and range-checked."""

    def __init__(self, data: Any, where: str) -> None:
        if not isinstance(data, Mapping):
            raise _fail(where, f"expected a table, got {type(data).__name__}")
        self.data, self.where, self.used = data, where, set()

    def raw(self, key: str, default: Any = _REQUIRED) -> Any:
        self.used.add(key)
        if key not in self.data:
            if default is _REQUIRED:
                raise _fail(self.where, f"missing key {key!r}")
            return default
        return self.data[key]

    def num(self, key: str, *, lo: float = 0.0, hi: float = MAX_VALUE, default: Any = _REQUIRED) -> float:
        """A number in [lo, hi] (finite: every profile number is at most MAX_VALUE in its file's unit); a missing
        key with a default gives the default unchecked."""
        if key not in self.data and default is not _REQUIRED:
            self.used.add(key)
            return float(default)
        v = self.raw(key, default)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v != v:  # NaN; a huge int is out of range
            raise _fail(self.where, f"{key} = {_brief(v)}: expected a number")
        if not lo <= v <= hi:
            raise _fail(self.where, f"{key} = {v}: expected a value in [{lo:g}, {hi:g}]")
        return float(v)

    def pos(self, key: str, **kw: Any) -> float:
        """A positive number, at least MIN_POSITIVE (a rate or size that divides: 5e-324 would make times inf)."""
        v = self.num(key, **kw)
        if v < MIN_POSITIVE and (key in self.data or v <= 0):
            raise _fail(self.where, f"{key} = {v}: expected a positive number >= {MIN_POSITIVE:g}")
        return v

    def int_(self, key: str, *, lo: int = 1, hi: int = MAX_COUNT) -> int:
        v = self.raw(key)
        if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
            raise _fail(self.where, f"{key} = {_brief(v)}: expected an integer in [{lo}, {hi}]")
        return v

    def str_(self, key: str, default: Any = _REQUIRED) -> str:
        v = self.raw(key, default)
        if not isinstance(v, str):
            raise _fail(self.where, f"{key} = {_brief(v)}: expected a string")
        return v

    def bool_(self, key: str) -> bool:
        v = self.raw(key)
        if not isinstance(v, bool):
            raise _fail(self.where, f"{key} = {_brief(v)}: expected true or false")
        return v

    def done(self) -> None:
        extra = sorted(set(self.data) - self.used)
        if extra:
            raise _fail(self.where, f"unknown key(s) {', '.join(map(repr, extra))}")


def _section(parent: _Section, key: str, file: str) -> _Section:
    return _Section(parent.raw(key), f"{file} [{key}]")


def hardware_from_dict(data: Mapping[str, Any], *, where: str = "<profile>", base_dir: Path | None = None) -> Hardware:
    """Build a :class:`Hardware` from the parsed TOML of a profile (see the shipped profiles for the schema)."""
    top = _Section(data, where)
    name = top.str_("name")
    description = top.str_("description", default="")
    default_network = top.str_("default_network", default="")
    gpn = top.int_("gpus_per_node")

    c = _section(top, "compute", where)
    peak = _Section(c.raw("peak_tflops"), f"{where} [compute.peak_tflops]")
    peak_flops = tuple(sorted((k, peak.pos(k) * _T) for k in peak.data))
    peak.done()
    if "float32" not in dict(peak_flops):
        raise _fail(f"{where} [compute.peak_tflops]", "missing key 'float32' (the fallback for other dtypes)")
    eff = _Section(c.raw("efficiency"), f"{where} [compute.efficiency]")
    efficiency = OpEfficiency(**{k: eff.pos(k, hi=1.0) for k in ("matmul", "attention", "elementwise", "reduction")},
                              sustained_matmul=eff.pos("sustained_matmul", hi=1.0, default=1.0))  # fmt: skip
    eff.done()
    tiles_raw = c.raw("matmul_tiles")
    if not isinstance(tiles_raw, list) or not tiles_raw:
        raise _fail(f"{where} [compute]", "matmul_tiles: expected a list of [tile_m, tile_n, relative_efficiency]")
    tiles = []
    for t in tiles_raw:
        ok = isinstance(t, list) and len(t) == 3 and all(type(x) in (int, float) for x in t)
        ok = ok and all(type(x) is int or x.is_integer() for x in t[:2])
        if not ok or not (1 <= t[0] <= MAX_COUNT and 1 <= t[1] <= MAX_COUNT and MIN_POSITIVE <= t[2] <= 1):
            raise _fail(
                f"{where} [compute]",
                f"matmul_tiles entry {_brief(t)}: expected [tile_m, tile_n] integers in [1, {MAX_COUNT}] and "
                "0 < relative_efficiency <= 1",
            )
        tiles.append((int(t[0]), int(t[1]), float(t[2])))
    compute = ComputeSpec(
        num_units=c.int_("num_units"),
        launch_overhead_s=c.num("launch_overhead_us") * _US,
        hbm_bandwidth_bytes_per_s=c.pos("hbm_tb_per_s") * _T,
        hbm_capacity_bytes=int(c.pos("hbm_capacity_gb") * _G),
        peak_flops=peak_flops,
        efficiency=efficiency,
        matmul_tiles=tuple(tiles),
        matmul_k_half=c.num("matmul_k_half"),
        memory_half_bytes=c.num("memory_half_bytes"),
        attention_tile=c.int_("attention_tile"),
        cache_bytes=c.num("cache_bytes", default=0.0),
        cache_bandwidth_bytes_per_s=c.num("cache_gb_per_s", default=0.0) * _G,
        matmul_memory_half_bytes=c.num("matmul_memory_half_bytes", default=0.0),
    )
    if compute.cache_bytes > 0 and compute.cache_bandwidth_bytes_per_s <= 0:
        raise _fail(f"{where} [compute]", "cache_bytes > 0 needs cache_gb_per_s > 0")
    c.done()

    i = _section(top, "intra_node", where)
    nvls = i.bool_("nvls")
    intra = IntraNode(
        link_bandwidth_bytes_per_s=i.pos("link_gb_per_s") * _G,
        ring_efficiency=i.pos("ring_efficiency", hi=1.0),
        all_to_all_efficiency=i.pos("all_to_all_efficiency", hi=1.0),
        nvls=nvls,
        nvls_efficiency=i.num("nvls_efficiency", default=0.0, hi=2.0),
        nvls_latency_s=i.num("nvls_latency_us", default=0.0) * _US,
        nvls_tree_efficiency=i.pos("nvls_tree_efficiency", default=1.0, hi=1.0),
    )
    if nvls and intra.nvls_efficiency <= 0:
        raise _fail(f"{where} [intra_node]", "nvls = true needs nvls_efficiency > 0")
    i.done()

    n = _section(top, "inter_node", where)
    inter = InterNode(
        nics_per_node=n.int_("nics_per_node"),
        nic_bandwidth_bytes_per_s=n.pos("nic_gbit_per_s") * _G / 8,
        nic_efficiency=n.pos("nic_efficiency", hi=1.0),
        tree_two_children=n.bool_("tree_two_children") if "tree_two_children" in n.data else False,
        fitted=n.bool_("fitted") if "fitted" in n.data else False,
    )
    n.done()

    p = _section(top, "protocols", where)
    protocols = []
    for pname in list(p.data):
        ps = _Section(p.raw(pname), f"{where} [protocols.{pname}]")
        if pname not in ("ll", "ll128", "simple"):
            raise _fail(f"{where} [protocols]", f"unknown protocol {pname!r}: expected ll, ll128 or simple")
        protocols.append(
            Protocol(
                name=pname,
                bandwidth_fraction=ps.pos("bandwidth_fraction", hi=1.0),
                max_bus_bandwidth_bytes_per_s=ps.pos("max_bus_gb_per_s", default=math.inf) * _G,
                base_latency_s=ps.num("base_latency_us") * _US,
                intra_hop_latency_s=ps.num("intra_hop_us") * _US,
                inter_hop_latency_s=ps.num("inter_hop_us") * _US,
            )
        )
        ps.done()
    p.done()
    if not any(pr.name == "simple" for pr in protocols):
        raise _fail(f"{where} [protocols]", "missing protocol 'simple' (the one every algorithm supports)")

    f = _section(top, "interference", where)
    slowdown = f.num("compute_slowdown", lo=1.0)
    sync_s = f.num("stream_sync_us") * _US
    f.done()

    table_path = None
    if "calibration" in data:
        cal = _section(top, "calibration", where)
        table = cal.str_("table", default="")
        for key in ("device", "measured", "command"):  # provenance, kept for the reader
            cal.str_(key, default="")
        cal.done()
        if table:
            tp = Path(table)
            table_path = str(tp if tp.is_absolute() or base_dir is None else base_dir / tp)
    else:
        top.used.add("calibration")
    top.done()
    return Hardware(
        name=name,
        description=description,
        gpus_per_node=gpn,
        num_nodes=1,
        compute=compute,
        intra_node=intra,
        inter_node=inter,
        protocols=tuple(protocols),
        compute_slowdown=slowdown,
        stream_sync_s=sync_s,
        table_path=table_path,
        source=where,
        default_network=default_network,
    )


def load_profile(path: str | Path) -> Hardware:
    """Read and validate one TOML profile file."""
    path = Path(path)
    text = read_input_text(path, "hardware profile")
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"{path}: not valid TOML: {exc}") from None
    except RecursionError:
        raise ValueError(f"{path}: TOML nested too deeply; expected a hardware profile") from None
    return hardware_from_dict(data, where=str(path), base_dir=path.parent)


def hardware_to_dict(hw: Hardware) -> dict[str, Any]:
    """The TOML-ready dict of a profile, in the file's units (the inverse of :func:`hardware_from_dict`)."""
    c = hw.compute
    out: dict[str, Any] = {
        "name": hw.name,
        "description": hw.description,
        **({"default_network": hw.default_network} if hw.default_network else {}),
        "gpus_per_node": hw.gpus_per_node,
        "compute": {
            "num_units": c.num_units,
            "launch_overhead_us": c.launch_overhead_s / _US,
            "hbm_tb_per_s": c.hbm_bandwidth_bytes_per_s / _T,
            "hbm_capacity_gb": c.hbm_capacity_bytes / _G,
            "matmul_tiles": [list(t) for t in c.matmul_tiles],
            "matmul_k_half": c.matmul_k_half,
            "memory_half_bytes": c.memory_half_bytes,
            "attention_tile": c.attention_tile,
            "cache_bytes": c.cache_bytes,
            "cache_gb_per_s": c.cache_bandwidth_bytes_per_s / _G,
            "matmul_memory_half_bytes": c.matmul_memory_half_bytes,
            "peak_tflops": {k: v / _T for k, v in c.peak_flops},
            "efficiency": dataclasses.asdict(c.efficiency),
        },
        "intra_node": {
            "link_gb_per_s": hw.intra_node.link_bandwidth_bytes_per_s / _G,
            "ring_efficiency": hw.intra_node.ring_efficiency,
            "all_to_all_efficiency": hw.intra_node.all_to_all_efficiency,
            "nvls": hw.intra_node.nvls,
            "nvls_efficiency": hw.intra_node.nvls_efficiency,
            "nvls_latency_us": hw.intra_node.nvls_latency_s / _US,
            "nvls_tree_efficiency": hw.intra_node.nvls_tree_efficiency,
        },
        "inter_node": {
            "nics_per_node": hw.inter_node.nics_per_node,
            "nic_gbit_per_s": hw.inter_node.nic_bandwidth_bytes_per_s * 8 / _G,
            "nic_efficiency": hw.inter_node.nic_efficiency,
            **({"tree_two_children": True} if hw.inter_node.tree_two_children else {}),
            **({"fitted": True} if hw.inter_node.fitted else {}),
        },
        "protocols": {},
        "interference": {"compute_slowdown": hw.compute_slowdown, "stream_sync_us": hw.stream_sync_s / _US},
    }
    for p in hw.protocols:
        d: dict[str, Any] = {
            "bandwidth_fraction": p.bandwidth_fraction,
            "base_latency_us": p.base_latency_s / _US,
            "intra_hop_us": p.intra_hop_latency_s / _US,
            "inter_hop_us": p.inter_hop_latency_s / _US,
        }
        if math.isfinite(p.max_bus_bandwidth_bytes_per_s):
            d["max_bus_gb_per_s"] = p.max_bus_bandwidth_bytes_per_s / _G
        out["protocols"][p.name] = d
    return out
