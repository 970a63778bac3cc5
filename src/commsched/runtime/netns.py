"""A shaped network for real runs on one machine: a network namespace whose loopback is rate-limited (tc tbf) and
optionally delayed (tc netem), always torn down.

Ranks of a local run join the namespace (``ShapedNetwork.enter()``, a ``setns`` of the calling process) before they
open any socket, so every byte between them crosses the shaped loopback. The loopback is one device: the rate is
shared by the traffic of all ranks (two ranks exchanging halves of a buffer each get about half of it), and a netem
delay applies to every packet in each direction. Needs root, ``ip`` and ``tc`` (iproute2).
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import os
import re
import secrets
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

from commsched.io import pid_alive

NAME_PREFIX = "commsched-"
_CLONE_NEWNET = 0x40000000
_NETNS_DIRS = (Path("/run/netns"), Path("/var/run/netns"))

_RATE_UNITS = {  # tc's units: "bit" suffixes are bits per second, "bps" suffixes are bytes per second
    "bit": 1,
    "kbit": 1e3,
    "mbit": 1e6,
    "gbit": 1e9,
    "tbit": 1e12,
    "bps": 8,
    "kbps": 8e3,
    "mbps": 8e6,
    "gbps": 8e9,
    "tbps": 8e12,
}
_TIME_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}


class ShapedNetworkUnavailable(RuntimeError):
    """The shaped network cannot be set up here (not root, no iproute2, no namespace support); says which."""


def parse_rate(text: str | float) -> float:
    """A rate in tc's notation (``"2gbit"``, ``"500mbit"``, ``"100mbps"`` = bytes/s) -> bits per second."""
    if isinstance(text, (int, float)):
        value = float(text)
    else:
        m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:e[+-]?\d+)?)\s*([a-zA-Z]*)\s*", str(text))
        unit = m.group(2).lower() if m else ""
        if m is None or unit not in _RATE_UNITS:
            raise ValueError(
                f"bandwidth {text!r}: expected a number with a tc unit ({', '.join(_RATE_UNITS)}), e.g. '2gbit'"
            )
        value = float(m.group(1)) * _RATE_UNITS[unit]
    if not value > 0:
        raise ValueError(f"bandwidth {text!r}: expected > 0")
    return value


def parse_time(text: str | float) -> float:
    """A duration (``"1ms"``, ``"250us"``, ``"0.5s"``; a bare number is seconds) -> seconds."""
    if isinstance(text, (int, float)):
        value = float(text)
    else:
        m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:e[+-]?\d+)?)\s*([a-zA-Z]*)\s*", str(text))
        unit = (m.group(2).lower() or "s") if m else ""
        if m is None or unit not in _TIME_UNITS:
            raise ValueError(f"duration {text!r}: expected a number with a unit ({', '.join(_TIME_UNITS)}), e.g. '1ms'")
        value = float(m.group(1)) * _TIME_UNITS[unit]
    if value < 0:
        raise ValueError(f"duration {text!r}: expected >= 0")
    return value


def shaping_unavailable_reason() -> str | None:
    """Why a shaped network cannot be created here, or None when it can be tried."""
    if os.name != "posix" or not hasattr(os, "geteuid"):
        return "a shaped network needs Linux network namespaces"
    if os.geteuid() != 0:
        return "a shaped network needs root (ip netns add, tc qdisc); run as root or drop --bandwidth"
    missing = [tool for tool in ("ip", "tc") if shutil.which(tool) is None]
    if missing:
        return f"a shaped network needs iproute2 ({' and '.join(missing)} not found; apt-get install iproute2)"
    return None


def _run(cmd: list[str]) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise ShapedNetworkUnavailable(f"`{' '.join(cmd)}` failed: {(proc.stderr or proc.stdout).strip()}")


def _netns_path(name: str) -> Path:
    for d in _NETNS_DIRS:
        if (d / name).exists():
            return d / name
    raise ShapedNetworkUnavailable(f"network namespace {name!r} has no file in {', '.join(map(str, _NETNS_DIRS))}")


def list_namespaces() -> list[str]:
    """Names of the network namespaces ``ip netns`` knows."""
    names: set[str] = set()
    for d in _NETNS_DIRS:
        if d.is_dir():
            names.update(p.name for p in d.iterdir())
    return sorted(names)


def remove_stale_namespaces() -> list[str]:
    """Delete namespaces left by commsched runs whose process no longer exists (a run killed by SIGKILL cannot
    clean up after itself). Returns the names removed."""
    removed = []
    for name in list_namespaces():
        m = re.fullmatch(re.escape(NAME_PREFIX) + r"(\d+)-[0-9a-f]+", name)
        if m and not pid_alive(int(m.group(1))):
            subprocess.run(["ip", "netns", "del", name], capture_output=True, check=False)
            removed.append(name)
    return removed


@dataclasses.dataclass(frozen=True, kw_only=True)
class ShapedNetwork:
    """A live network namespace with a shaped loopback (see the module docstring)."""

    name: str
    rate_bits_per_s: float
    delay_s: float = 0.0
    burst_bytes: int = 0

    @property
    def exec_prefix(self) -> list[str]:
        """Command prefix running a program inside the namespace."""
        return ["ip", "netns", "exec", self.name]

    def enter(self) -> None:
        """Move the calling process (thread) into the namespace. Call before any socket or thread is created."""
        fd = os.open(_netns_path(self.name), os.O_RDONLY)
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            if libc.setns(fd, _CLONE_NEWNET) != 0:
                err = ctypes.get_errno()
                raise ShapedNetworkUnavailable(f"setns into network namespace {self.name!r}: {os.strerror(err)}")
        finally:
            os.close(fd)

    def describe(self) -> str:
        text = f"loopback at {self.rate_bits_per_s / 1e9:g} Gbit/s (tbf, shared by all ranks)"
        if self.delay_s:
            text += f", {self.delay_s * 1e3:g} ms delay per packet (netem)"
        return text


@contextlib.contextmanager
def shaped_network(
    bandwidth: str | float,
    *,
    delay: str | float = 0.0,
    burst_bytes: int | None = None,
    queue_latency_s: float = 0.1,
) -> Iterator[ShapedNetwork]:
    """Create a uniquely named namespace, bring its loopback up, shape it, yield it; delete it on the way out (also
    on error or Ctrl-C). ``bandwidth``: tc rate (``"2gbit"``) or bits/s; ``delay``: netem delay per packet;
    ``burst_bytes``: tbf bucket (default: 1 ms at the rate, at least 4 loopback MTUs); ``queue_latency_s``: the
    longest a packet may queue in tbf before it is dropped. Raises ShapedNetworkUnavailable with the reason."""
    rate = parse_rate(bandwidth)
    delay_s = parse_time(delay)
    reason = shaping_unavailable_reason()
    if reason is not None:
        raise ShapedNetworkUnavailable(reason)
    remove_stale_namespaces()
    name = f"{NAME_PREFIX}{os.getpid()}-{secrets.token_hex(4)}"
    # lo's MTU is 64 KiB: tbf drops any packet larger than its bucket, so the bucket holds several of them
    burst = int(burst_bytes) if burst_bytes is not None else max(4 * 65536, int(rate / 8 * 1e-3))
    _run(["ip", "netns", "add", name])
    try:
        inside = ["ip", "netns", "exec", name]
        _run([*inside, "ip", "link", "set", "lo", "up"])
        tbf = ["tc", "qdisc", "add", "dev", "lo", "root", "handle", "1:", "tbf", "rate", f"{int(rate)}bit"]
        _run([*inside, *tbf, "burst", str(burst), "latency", f"{int(queue_latency_s * 1e6)}us"])
        if delay_s > 0:
            netem = ["tc", "qdisc", "add", "dev", "lo", "parent", "1:1", "handle", "10:", "netem"]
            try:
                _run([*inside, *netem, "delay", f"{round(delay_s * 1e6)}us"])
            except ShapedNetworkUnavailable as exc:
                raise ShapedNetworkUnavailable(
                    f"a delay needs the netem qdisc, which this kernel does not offer (modprobe sch_netem on the "
                    f"host), or drop the delay; {exc}"
                ) from None
        yield ShapedNetwork(name=name, rate_bits_per_s=rate, delay_s=delay_s, burst_bytes=burst)
    finally:
        subprocess.run(["ip", "netns", "del", name], capture_output=True, check=False)


def qdisc_summary(net: ShapedNetwork) -> str:
    """``tc qdisc show dev lo`` inside the namespace (for reports and tests)."""
    proc = subprocess.run(
        [*net.exec_prefix, "tc", "qdisc", "show", "dev", "lo"], capture_output=True, text=True, check=False
    )
    return proc.stdout.strip()
