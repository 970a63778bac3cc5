"""The shaped network: units, a namespace with a tbf (and netem) loopback that traffic really crosses, and teardown
in every case. Namespace tests need root and iproute2; elsewhere they are skipped with the reason."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import threading

import pytest

from commsched.runtime.netns import (
    NAME_PREFIX,
    ShapedNetworkUnavailable,
    list_namespaces,
    parse_rate,
    parse_time,
    qdisc_summary,
    remove_stale_namespaces,
    shaped_network,
    shaping_unavailable_reason,
)

needs_shaping = pytest.mark.skipif(
    shaping_unavailable_reason() is not None, reason=f"shaped network unavailable: {shaping_unavailable_reason()}"
)


@pytest.mark.parametrize(
    ("text", "bits_per_s"),
    [("2gbit", 2e9), ("500mbit", 5e8), ("1.5Gbit", 1.5e9), ("100mbps", 8e8), ("64kbit", 64e3), (1e9, 1e9)],
)
def test_parse_rate(text, bits_per_s):
    assert parse_rate(text) == pytest.approx(bits_per_s)


@pytest.mark.parametrize(("text", "seconds"), [("1ms", 1e-3), ("250us", 250e-6), ("0.5s", 0.5), ("2", 2.0), (0, 0)])
def test_parse_time(text, seconds):
    assert parse_time(text) == pytest.approx(seconds)


@pytest.mark.parametrize("bad", ["2 gigabits", "fast", "-1gbit", "0mbit", ""])
def test_bad_rate_names_the_value(bad):
    with pytest.raises(ValueError, match=re.escape(repr(bad))):
        parse_rate(bad)


def test_bad_time_is_an_error():
    with pytest.raises(ValueError, match="'1 fortnight'"):
        parse_time("1 fortnight")


def _sent_bytes(summary: str) -> int:
    m = re.search(r"Sent (\d+) bytes", summary)
    assert m, summary
    return int(m.group(1))


@needs_shaping
def test_namespace_is_shaped_traffic_crosses_it_and_it_is_removed():
    payload = 3 << 20
    with shaped_network("2gbit") as net:
        assert net.name in list_namespaces()
        summary = qdisc_summary(net)
        assert "tbf" in summary and "rate 2Gbit" in summary

        received = []

        def exchange() -> None:
            net.enter()  # setns applies to this thread only: the test process stays where it was
            with socket.create_server(("127.0.0.1", 0)) as srv:
                client = socket.create_connection(srv.getsockname())
                conn, _ = srv.accept()
                with client, conn:
                    client.sendall(b"x" * payload)
                    client.shutdown(socket.SHUT_WR)
                    n = 0
                    while chunk := conn.recv(1 << 16):
                        n += len(chunk)
                    received.append(n)

        t = threading.Thread(target=exchange)
        t.start()
        t.join(timeout=30)
        assert received == [payload]
        stats = subprocess.run(
            [*net.exec_prefix, "tc", "-s", "qdisc", "show", "dev", "lo"], capture_output=True, text=True, check=True
        )
        assert _sent_bytes(stats.stdout) >= payload  # every byte went through the shaped qdisc
        name = net.name
    assert name not in list_namespaces()


@needs_shaping
def test_delay_uses_netem_or_fails_cleanly():
    before = _ours()
    try:
        with shaped_network("2gbit", delay="1ms") as net:
            summary = qdisc_summary(net)
            assert "tbf" in summary and "netem" in summary and "delay 1ms" in summary
    except ShapedNetworkUnavailable as exc:
        assert "netem" in str(exc)  # a kernel without sch_netem (containers): the reason, and no namespace left
    assert _ours() == before


def _ours() -> set[str]:
    """This process's namespaces (another test process may be making its own at the same time)."""
    return {n for n in list_namespaces() if n.startswith(f"{NAME_PREFIX}{os.getpid()}-")}


@needs_shaping
def test_namespace_is_removed_when_the_body_fails():
    with pytest.raises(RuntimeError, match="boom"), shaped_network("1gbit") as net:
        name = net.name
        raise RuntimeError("boom")
    assert name not in list_namespaces()


@needs_shaping
def test_stale_namespaces_of_dead_runs_are_removed():
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    name = f"{NAME_PREFIX}{int(dead.stdout)}-0bad"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        assert name in remove_stale_namespaces()
        assert name not in list_namespaces()
    finally:
        subprocess.run(["ip", "netns", "del", name], capture_output=True, check=False)


def test_without_root_the_reason_is_clear(monkeypatch):
    monkeypatch.setattr("os.geteuid", lambda: 1000)
    assert "root" in shaping_unavailable_reason()
    with pytest.raises(ShapedNetworkUnavailable, match="needs root"), shaped_network("1gbit"):
        pass


def _cmdline(pid: int) -> str:
    """A live process's command line ("" once it is gone)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _rank_processes(parent: int) -> list[int]:
    """The spawned ranks among ``parent``'s children."""
    out = subprocess.run(["pgrep", "-P", str(parent)], capture_output=True, text=True, check=False).stdout.split()
    return [k for k in map(int, out) if "spawn" in _cmdline(k)]


@needs_shaping
@pytest.mark.parametrize(("sig", "code"), [("SIGTERM", 143), ("SIGINT", 130)])
def test_a_signal_to_a_shaped_run_tears_everything_down_at_once(sig, code):
    """issue 20: SIGTERM (or SIGINT sent to the parent alone) ends ``commsched run --bandwidth`` within seconds, its
    rank processes gone and its network namespace (with the qdiscs in it) deleted; exit 128 + the signal number."""
    import os
    import signal
    import time

    cmd = [sys.executable, "-m", "commsched", "run", "llama-tiny", "-w", "2", "--bandwidth", "1gbit", "--iters", "5000"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            ranks = _rank_processes(proc.pid)
            ours = [n for n in list_namespaces() if n.startswith(f"{NAME_PREFIX}{proc.pid}-")]
            if len(ranks) == 2 and ours:
                break
            time.sleep(0.2)
        else:
            pytest.fail("the run did not start its 2 ranks in its namespace within 60 s")
        time.sleep(2)  # the ranks are importing torch or tracing: a signal can come at any time
        t0 = time.monotonic()
        os.kill(proc.pid, getattr(signal, sig))
        _, err = proc.communicate(timeout=20)
        took = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == code, err
    assert took < 10, took
    assert f"stopped by {sig}: ranks terminated, network namespace removed" in err
    assert not [n for n in list_namespaces() if n.startswith(f"{NAME_PREFIX}{proc.pid}-")]
    time.sleep(0.5)
    assert not [k for k in ranks if "spawn" in _cmdline(k)]  # terminated and reaped
