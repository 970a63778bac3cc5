"""Hardware profiles as data: TOML files shipped in ``commsched/hardware/profiles`` or written by calibration.

``get(name)`` looks a profile up in this order (the first hit wins):

1. ``name`` is a path to a ``.toml`` file (or contains a path separator): that file;
2. the user profile folder: ``$COMMSCHED_PROFILE_DIR`` if set, else ``$XDG_CACHE_HOME/commsched/profiles``
   (``~/.cache/commsched/profiles``), where ``commsched calibrate`` writes ``cpu-local.toml``;
3. the profiles shipped with the package (``h100-sxm``, ``h100-sxm-96g``, ``h100-nvl``, ``h800``, ``h200-sxm``,
   ``a100-sxm-80g``, ``b200``, ``gb200-nvl72``, ``gb300-nvl72``, ``mi300x``, ``mi325x``, ``cpu-local``; ``commsched
   hardware`` lists them with their headline numbers).

So a calibrated ``cpu-local`` replaces the shipped default once written. ``"PROFILE@NETWORK"`` (or
``get(name, network=...)``) puts a network profile (``commsched/hardware/networks``: NICs per node, line rate and
efficiency, per-protocol network step latency) under a GPU profile. Without one, the profile's ``default_network``
is put under it (``h100-sxm``, ``h200-sxm``, ``h800``, ``b200``: the fitted ``ib-ndr-8x400``); ``PROFILE@nccl-defaults``
keeps the profile's own inter-node fields (NCCL's tuning constants). ``network_warning`` is the one line a command
prints when a step spans nodes on a network with no fitted data.

``for_graph(hardware, graph, num_nodes=None, gpus_per_node=None)`` is the one way from the hardware arguments of
``schedule``, ``simulate``, ``estimate_costs`` and the CLI to a :class:`Hardware`: a profile name or path is sized for
the graph's world size (``nodes_for_world``) unless ``num_nodes`` is given.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Any

from commsched.hardware.profile import (
    ComputeSpec,
    Hardware,
    InterNode,
    IntraNode,
    OpEfficiency,
    Protocol,
    hardware_from_dict,
    hardware_to_dict,
    load_profile,
)
from commsched.hardware.toml_write import dump_toml
from commsched.io import atomic_write_text, path_kind, read_input_text

_cache: dict[tuple[str, float, str, float], Hardware] = {}


def user_profile_dir() -> Path:
    """Where calibrated and user profiles live (see the module docstring)."""
    env = os.environ.get("COMMSCHED_PROFILE_DIR")
    if env:
        return Path(env).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache).expanduser() / "commsched" / "profiles"


def _shipped_dir() -> Path:
    return Path(str(resources.files("commsched.hardware") / "profiles"))


def shipped_profile(name: str) -> Path:
    """The file of a profile shipped with the package (ignoring user profiles)."""
    path = _shipped_dir() / f"{name}.toml"
    if not path.is_file():
        raise FileNotFoundError(f"no shipped hardware profile {name!r}")
    return path


def list_profiles() -> dict[str, Path]:
    """Profile name -> the file ``get(name)`` would read (user profiles shadow shipped ones)."""
    found: dict[str, Path] = {}
    for folder in (_shipped_dir(), user_profile_dir()):
        if folder.is_dir():
            for f in sorted(folder.glob("*.toml")):
                found[f.stem] = f
    return dict(sorted(found.items()))


def resolve_profile(name: str | os.PathLike[str]) -> Path:
    """The file a profile name or path refers to; FileNotFoundError naming the places searched."""
    text = os.fspath(name)
    if text.endswith(".toml") or os.sep in text or "/" in text:
        path = Path(text).expanduser()
        if not path.exists():
            raise FileNotFoundError(f"hardware profile {text!r} does not exist")
        if not path.is_file():  # a device such as /dev/zero, a directory: it exists, and is no profile
            raise ValueError(f"hardware profile {text!r}: is {path_kind(path.stat().st_mode)}; expected a .toml "
                             f"file or a known profile name")  # fmt: skip
        return path
    for folder in (user_profile_dir(), _shipped_dir()):
        path = folder / f"{text}.toml"
        if path.is_file():
            return path
    known = ", ".join(list_profiles()) or "none"
    raise FileNotFoundError(f"unknown hardware profile {text!r}: expected one of {known}, or a path to a .toml file")


NCCL_DEFAULTS = "nccl-defaults"
"""the network name (``"PROFILE@nccl-defaults"``) that keeps a GPU profile's own inter-node fields, NCCL's tuning
constants, instead of its default network: for comparison with the fitted one"""


def _load(path: Path) -> Hardware:
    key = (str(path.resolve()), path.stat().st_mtime, "", 0.0)
    hw = _cache.get(key)
    if hw is None:
        hw = _cache[key] = load_profile(path)
    return hw


def get(
    name: str | os.PathLike[str],
    *,
    num_nodes: int = 1,
    gpus_per_node: int | None = None,
    network: str | os.PathLike[str] | None = None,
) -> Hardware:
    """A hardware profile by name or path, on ``num_nodes`` nodes (``gpus_per_node`` overrides the profile's).

    ``network`` (or ``"PROFILE@NETWORK"`` as the name, which also works wherever a profile name is taken, e.g.
    ``--hardware h100-sxm@roce-8x400``): a network profile (:func:`list_networks`, or a path) whose inter-node
    fields replace the GPU profile's; the result is named ``PROFILE@NETWORK``. Without one, the profile's
    ``default_network`` (the fitted network of its usual fabric, e.g. ``ib-ndr-8x400`` under ``h100-sxm``) is put
    under it, keeping the profile's name; :data:`NCCL_DEFAULTS` keeps the profile's own inter-node fields."""
    text = os.fspath(name)
    if network is None and "@" in text:
        text, network = text.split("@", 1)
    path = resolve_profile(text)
    hw = _load(path)
    if network is not None and os.fspath(network) == NCCL_DEFAULTS:
        hw = dataclasses.replace(hw, name=f"{hw.name}@{NCCL_DEFAULTS}", default_network="")
    elif network is not None or hw.default_network:
        named = network is not None
        try:
            net_path = resolve_network(network if named else hw.default_network)
        except FileNotFoundError as exc:
            if named:
                raise
            raise FileNotFoundError(f"{path}: default_network: {exc}") from None
        key = (str(path.resolve()), path.stat().st_mtime, str(net_path), net_path.stat().st_mtime)
        with_net = _cache.get(key)
        if with_net is None:
            with_net = _cache[key] = _with_network(path, net_path)
        hw = with_net if named else dataclasses.replace(with_net, name=hw.name)
    return hw.with_nodes(num_nodes, gpus_per_node)


def _networks_dir() -> Path:
    return Path(str(resources.files("commsched.hardware") / "networks"))


def list_networks() -> dict[str, Path]:
    """Network profile name -> file, shipped with the package (``commsched/hardware/networks``)."""
    return {f.stem: f for f in sorted(_networks_dir().glob("*.toml"))}


def resolve_network(name: str | os.PathLike[str]) -> Path:
    """The file of a network profile name or path; FileNotFoundError naming the known ones."""
    text = os.fspath(name)
    path = Path(text).expanduser() if text.endswith(".toml") or "/" in text else _networks_dir() / f"{text}.toml"
    if not path.is_file():
        known = ", ".join([*list_networks(), NCCL_DEFAULTS])
        raise FileNotFoundError(f"unknown network profile {text!r}: expected one of {known}, or a path to a .toml file")
    return path


_NETWORK_KEYS = {"name", "description", "inter_node", "intra_node", "protocols"}
# the one NVLink field a network profile may set: NVLS-tree's NVLS phase is paced by the network phase across nodes
_NETWORK_INTRA_KEYS = {"nvls_tree_efficiency"}


def _with_network(path: Path, net_path: Path) -> Hardware:
    """The GPU profile at ``path`` with the inter-node fields of the network profile at ``net_path``."""
    import tomllib

    try:
        net = tomllib.loads(read_input_text(net_path, "network profile"))
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"{net_path}: not valid TOML: {exc}") from None
    except RecursionError:
        raise ValueError(f"{net_path}: TOML nested too deeply; expected a network profile") from None
    extra = set(net) - _NETWORK_KEYS
    if extra:
        raise ValueError(f"{net_path}: unexpected key {sorted(extra)[0]!r}: a network profile holds "
                         "name, description, [inter_node], [intra_node] nvls_tree_efficiency and "
                         "[protocols.NAME] inter_hop_us")  # fmt: skip
    data = hardware_to_dict(load_profile(path))
    data.pop("default_network", None)  # the network is chosen: a profile saved from this one keeps these fields
    # a network is fitted only where its own file says so, whatever the GPU profile's fields were
    data["inter_node"] = {**data["inter_node"], "fitted": False, **net.get("inter_node", {})}
    intra = net.get("intra_node", {})
    if not isinstance(intra, dict) or set(intra) - _NETWORK_INTRA_KEYS:
        raise ValueError(f"{net_path} [intra_node]: a network profile may only set nvls_tree_efficiency there")
    if data["intra_node"]["nvls"]:  # without NVLS there is no NVLS-tree to pace
        data["intra_node"] = {**data["intra_node"], **intra}
    for proto, fields in net.get("protocols", {}).items():
        if proto not in data["protocols"] or set(fields) - {"inter_hop_us"}:
            raise ValueError(f"{net_path} [protocols.{proto}]: expected a protocol of the GPU profile "
                             f"({', '.join(data['protocols'])}) with only inter_hop_us")  # fmt: skip
        data["protocols"][proto] = {**data["protocols"][proto], **fields}
    net_name = str(net.get("name", net_path.stem))
    data["name"] = f"{data['name']}@{net_name}"
    data["description"] = f"{data['description']}; network: {net.get('description', net_name)}"
    return hardware_from_dict(data, where=f"{path} with network {net_path}", base_dir=path.parent)


def network_to_dict(hw: Hardware, name: str, description: str) -> dict:
    """The network part of ``hw`` as a network profile's data (what :func:`get` ``network=`` puts under a GPU)."""
    data = hardware_to_dict(hw)
    protocols = {p: {"inter_hop_us": f["inter_hop_us"]} for p, f in data["protocols"].items()}
    out = {"name": name, "description": description, "inter_node": data["inter_node"], "protocols": protocols}
    if hw.intra_node.nvls:  # NVLS-tree's pace across nodes is the network's (a GPU without NVLS ignores it)
        out["intra_node"] = {"nvls_tree_efficiency": hw.intra_node.nvls_tree_efficiency}
    return out


def save_network(hw: Hardware, path: str | os.PathLike[str], *, description: str, header: str = "") -> Path:
    """Write the network part of ``hw`` (:func:`network_to_dict`, named after ``path``) as a network profile TOML
    (atomically); it loads under any GPU profile with ``get("GPU@PATH")``."""
    path = Path(path)
    data = network_to_dict(hw, path.stem, description)
    text = "".join(f"# {line}\n" if line else "#\n" for line in header.splitlines()) + dump_toml(data)
    atomic_write_text(path, text)
    return path


def network_warning(hw: Hardware) -> str | None:
    """One line when ``hw`` spans more than one node on a network with no fitted data (its inter-node fields are
    NCCL's tuning constants or other unmeasured values, not ``fitted``); None otherwise."""
    if hw.num_nodes <= 1 or hw.inter_node.fitted:
        return None
    gpu = hw.name.split("@", 1)[0]
    fitted = ", ".join(n for n, p in list_networks().items() if _network_is_fitted(p))
    return (
        f"{hw.name} on {hw.num_nodes} nodes: its network is not fitted to measurements (NCCL's tuning constants run "
        f"several times too fast at 1-16 MB on the clusters measured); give a fitted one as {gpu}@NETWORK ({fitted}: "
        "each sets its own NICs) or fit yours (commsched calibrate --nccl-tests LOG --fit --network)"
    )


def _network_is_fitted(path: Path) -> bool:
    import tomllib

    try:
        inter = tomllib.loads(path.read_text()).get("inter_node", {})
    except (OSError, tomllib.TOMLDecodeError):
        return False
    return isinstance(inter, dict) and inter.get("fitted") is True


def nodes_for_world(world_size: int, gpus_per_node: int) -> int:
    """Nodes that ``world_size`` ranks fill at ``gpus_per_node`` ranks per node: ceil(world / GPUs per node)."""
    if world_size < 1 or gpus_per_node < 1:
        raise ValueError(f"world_size={world_size} and gpus_per_node={gpus_per_node}: expected integers >= 1")
    return -(-world_size // gpus_per_node)


def world_size_of(graph: Any) -> int | None:
    """The world size a graph was traced at: ``graph.meta["world_size"]`` where the frontend recorded it (zoo
    traces), else the widest process group span (size x stride: the outer group of a 2-D mesh spans the world);
    None for a graph without process groups."""
    meta = getattr(graph, "meta", None)
    recorded = meta.get("world_size") if isinstance(meta, Mapping) else None
    if isinstance(recorded, int) and not isinstance(recorded, bool) and recorded >= 1:
        return recorded
    spans = [group.size * group.stride for group in getattr(graph, "groups", ())]
    return max(spans) if spans else None


def for_graph(
    hardware: str | os.PathLike[str] | Hardware,
    graph: Any = None,
    *,
    num_nodes: int | None = None,
    gpus_per_node: int | None = None,
    world_size: int | None = None,
) -> Hardware:
    """The :class:`Hardware` that ``hardware`` names, shaped for ``graph``.

    A profile name or ``.toml`` path is loaded (:func:`get`) on ``num_nodes`` nodes of ``gpus_per_node`` GPUs (the
    profile's unless given); without ``num_nodes``, on as many nodes as the world size needs (``world_size``, else
    the graph's, see :func:`world_size_of`; one node when neither is known). A Hardware is used as given, reshaped
    only by the ``num_nodes`` / ``gpus_per_node`` that are given.
    """
    if isinstance(hardware, Hardware):
        if num_nodes is None and gpus_per_node is None:
            return hardware
        return hardware.with_nodes(hardware.num_nodes if num_nodes is None else num_nodes, gpus_per_node)
    if not isinstance(hardware, (str, os.PathLike)):
        raise TypeError(f"hardware: expected a profile name, a .toml path or a Hardware, got {type(hardware).__name__}")
    profile = get(hardware)
    if num_nodes is None:
        world = world_size if world_size is not None else world_size_of(graph) if graph is not None else None
        gpn = profile.gpus_per_node if gpus_per_node is None else gpus_per_node
        num_nodes = nodes_for_world(world, gpn) if world is not None else 1
    return profile.with_nodes(num_nodes, gpus_per_node)


def save_profile(hw: Hardware, path: str | os.PathLike[str], *, header: str = "", extra: dict | None = None) -> Path:
    """Write ``hw`` as a TOML profile (atomically); ``header`` becomes leading comment lines."""
    data = hardware_to_dict(hw)
    if extra:
        data.update(extra)
    text = "".join(f"# {line}\n" if line else "#\n" for line in header.splitlines()) + dump_toml(data)
    path = Path(path)
    atomic_write_text(path, text)
    return path


__all__ = [
    "NCCL_DEFAULTS",
    "ComputeSpec",
    "Hardware",
    "InterNode",
    "IntraNode",
    "OpEfficiency",
    "Protocol",
    "for_graph",
    "get",
    "hardware_from_dict",
    "hardware_to_dict",
    "list_networks",
    "list_profiles",
    "load_profile",
    "network_to_dict",
    "network_warning",
    "nodes_for_world",
    "resolve_network",
    "resolve_profile",
    "save_network",
    "save_profile",
    "shipped_profile",
    "user_profile_dir",
    "world_size_of",
]
