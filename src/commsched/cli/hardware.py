"""``commsched hardware``: the hardware profiles and network profiles ``--hardware`` takes, with headline numbers."""

from __future__ import annotations

from typing import Any

import typer

from commsched.cli.common import console, warn
from commsched.cli.options import emit_json, json_option

PROFILE_COLUMNS = ("profile", "GPUs/node", "BF16 TFLOP/s", "FP8 TFLOP/s", "HBM TB/s", "HBM GB", "link GB/s", "network")
NETWORK_COLUMNS = ("network", "NICs/node", "Gb/s per NIC", "fitted")


def profile_rows() -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[str]]:
    """(GPU profiles, network profiles, one line per file that does not load): each profile's headline numbers in
    its file's units, as ``get`` reads it (a user profile shadows a shipped one of the same name)."""
    import tomllib

    from commsched import hardware
    from commsched.hardware import load_profile

    shipped = hardware.shipped_profile("h100-sxm").parent
    profiles, problems = [], []
    for name, path in hardware.list_profiles().items():
        try:
            hw = load_profile(path)  # the file's own fields: its default_network as written
        except (ValueError, OSError) as exc:
            problems.append(f"profile {name}: {exc}")
            continue
        c, peak = hw.compute, dict(hw.compute.peak_flops)
        profiles.append({
            "name": name,
            "file": str(path),
            "shipped": path.parent == shipped,
            "description": hw.description,
            "gpus_per_node": hw.gpus_per_node,
            "bfloat16_tflops": peak.get("bfloat16", peak["float32"]) / 1e12,
            "float8_e4m3fn_tflops": peak["float8_e4m3fn"] / 1e12 if "float8_e4m3fn" in peak else None,
            "hbm_tb_per_s": c.hbm_bandwidth_bytes_per_s / 1e12,
            "hbm_capacity_gb": c.hbm_capacity_bytes / 1e9,
            "link_gb_per_s": hw.intra_node.link_bandwidth_bytes_per_s / 1e9,
            "default_network": hw.default_network or None,
        })  # fmt: skip
    networks = []
    for name, path in hardware.list_networks().items():
        try:
            data = tomllib.loads(path.read_text())
        except (OSError, tomllib.TOMLDecodeError) as exc:
            problems.append(f"network {name}: {exc}")
            continue
        inter = data.get("inter_node", {})
        networks.append({
            "name": name,
            "file": str(path),
            "description": data.get("description", ""),
            "nics_per_node": inter.get("nics_per_node"),
            "nic_gbit_per_s": inter.get("nic_gbit_per_s"),
            "fitted": inter.get("fitted") is True,
        })  # fmt: skip
    return profiles, networks, problems


def _num(v: float | None) -> str:
    return "-" if v is None else f"{v:.5g}"


def register(app: typer.Typer) -> None:
    @app.command()
    def hardware(json_out: str = json_option("the profiles")) -> None:
        """List the hardware profiles (--hardware NAME) with their headline numbers: dense BF16 and FP8 peaks per
        GPU, HBM bandwidth and capacity, NVLink (or xGMI) bandwidth per GPU and direction, and the network put under
        a profile when none is named; then the network profiles (--hardware PROFILE@NETWORK). Every number is cited
        in its profile's file.

        Example: commsched hardware
        """
        from commsched.report.tables import new_table

        profiles, networks, problems = profile_rows()
        warn(problems)
        written = None
        if json_out:
            written = emit_json({"profiles": profiles, "networks": networks}, json_out)
            if written is None:
                return
        table = new_table("hardware profiles", [*PROFILE_COLUMNS, "description"], left={"profile", "network",
                                                                                        "description"})  # fmt: skip
        for p in profiles:
            table.add_row(
                p["name"] + ("" if p["shipped"] else " (user)"),
                str(p["gpus_per_node"]),
                _num(p["bfloat16_tflops"]),
                _num(p["float8_e4m3fn_tflops"]),
                _num(p["hbm_tb_per_s"]),
                _num(p["hbm_capacity_gb"]),
                _num(p["link_gb_per_s"]),
                p["default_network"] or "-",
                p["description"],
            )
        console.print(table)
        nets = new_table("network profiles (PROFILE@NETWORK)", [*NETWORK_COLUMNS, "description"],
                         left={"network", "fitted", "description"})  # fmt: skip
        for n in networks:
            nets.add_row(n["name"], _num(n["nics_per_node"]), _num(n["nic_gbit_per_s"]), "yes" if n["fitted"] else "no",
                         n["description"])  # fmt: skip
        console.print(nets)
        if written is not None:
            console.print(f"wrote [bold]{written}[/]")
