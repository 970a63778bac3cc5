"""The hostile-input fuzzer of issue 20, shared by ``tests/fuzz`` (bounded, under hypothesis) and
``benchmarks/bench_fuzz.py`` (long runs): seed files of every input kind, mutations of their JSON trees and bytes,
and :func:`run_case`, which loads one mutated file as the CLI would and says what happened:

* ``ok``: it loaded and every number checked out (for a graph: simulated, makespan >= the lower bound and >= every
  stream's busy time, utilisation in [0, 1]);
* ``error``: the documented failure, a ValueError / GraphError / FileNotFoundError whose one-line message names the
  file;
* ``crash``: any other exception, or an error that does not name the file; ``hang``: past the time limit;
  ``wrong``: it loaded but a number broke an invariant.
"""

from __future__ import annotations

import copy
import gzip
import json
import random
import signal
import sys
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from commsched.cost import CostEstimate, load_measured
from commsched.cost.trace_import import trace_collectives
from commsched.frontends.json_io import graph_to_dict, load_graph
from commsched.hardware import load_profile
from commsched.hardware.toml_write import dump_toml
from commsched.ir import Graph, GraphError
from commsched.sim import simulate_costs
from hostile import profile_dict, small_graph

KINDS = ("graph", "table", "profile", "trace")
OUTCOMES = ("ok", "error", "crash", "hang", "wrong")
HOSTILE_VALUES: tuple[Any, ...] = (
    None, True, False, 0, -1, 1, 2**31, 2**53 + 1, 2**63, 2**64, -(2**63) - 1, 10**400, 0.5, -0.0, 1e300, -1e300,
    1e-300, 5e-324, "", "x", "1", "nan", "inf", "\x00", "é" * 3, "a" * 5000, [], {}, [[]], [1, "a"], {"a": {}},
)  # fmt: skip


class Hang(Exception):
    """The case ran past its time limit."""


@contextmanager
def time_limit(seconds: float):
    """Raise :class:`Hang` in this (main) thread after ``seconds``."""

    def _alarm(signum, frame):
        raise Hang(f"over {seconds} s")

    old = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


# ---------------------------------------------------------------- seeds
def seed_trace() -> dict[str, Any]:
    """A small Kineto-shaped trace: cpu ops with shapes and their kernels, a gloo annotation, record_param_comms."""
    ops = []
    for k, (name, dims) in enumerate([("aten::mm", [[64, 32], [32, 16]]), ("aten::add", [[64, 16], [64, 16]])]):
        ops.append({"ph": "X", "cat": "cpu_op", "name": name, "ts": 10 * k, "dur": 5 + k,
                    "args": {"Input Dims": dims, "Input type": ["float", "float"], "External id": k + 1}})  # fmt: skip
        ops.append({"ph": "X", "cat": "kernel", "name": f"kernel_{k}", "ts": 10 * k + 1, "dur": 3.5,
                    "args": {"External id": k + 1}})  # fmt: skip
    comms = [
        {"ph": "X", "cat": "user_annotation", "name": "gloo:all_reduce", "ts": 40, "dur": 12,
         "args": {"Input Dims": [[1024]], "Input type": ["float"], "Group size": 2}},
        {"ph": "X", "cat": "cpu_op", "name": "record_param_comms", "ts": 60, "dur": 20,
         "args": {"Collective name": "all_gather", "In msg nelems": 256, "Out msg nelems": 512, "Group size": 2,
                  "dtype": "Float", "Process Group Name": "0", "Process Group Ranks": "[0, 1]"}},
    ]  # fmt: skip
    return {"traceEvents": ops + comms, "distributedInfo": {"rank": 0, "world_size": 2,
            "pg_config": [{"pg_name": "0", "pg_desc": "default_pg", "ranks": [0, 1]}]}}  # fmt: skip


def seed_table() -> dict[str, Any]:
    return {
        "format": "commsched.cost-table",
        "version": 1,
        "ops": [{"target": "aten.mm", "shapes": [[256, 256], [256, 256]], "dtype": "float32", "time_s": 1e-4}],
        "collectives": [
            {"type": "all_reduce", "group_size": 8, "nbytes": n, "time_s": 1e-5 * (1 + n / 1e6)}
            for n in (1024, 1 << 20)
        ],
    }


def seed(kind: str) -> Any:
    """The valid input each mutation starts from (a JSON-ready tree; a profile's TOML tree)."""
    return {"graph": lambda: graph_to_dict(small_graph()), "table": seed_table, "profile": profile_dict,
            "trace": seed_trace}[kind]()  # fmt: skip


# ---------------------------------------------------------------- mutations
def _paths(tree: Any, prefix: tuple = ()) -> list[tuple]:
    out = [prefix]
    if len(prefix) > 12:
        return out
    if isinstance(tree, dict):
        for k, v in tree.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(tree, list):
        for i, v in enumerate(tree):
            out += _paths(v, (*prefix, i))
    return out


def _at(tree: Any, path: tuple) -> Any:
    for key in path:
        tree = tree[key]
    return tree


def _numeric_twist(rng: random.Random, v: Any) -> Any:
    """A number near the edge of its type, scaled by a huge or tiny factor, or its sign flipped."""
    if isinstance(v, bool):
        return not v
    if isinstance(v, int):
        return rng.choice([v * 10 ** rng.randint(5, 30), -v, v + 2**63, 0, v - 1])
    return rng.choice([v * 10.0 ** rng.randint(20, 300), -v, v * 1e-300, float("inf"), float("nan")])


def mutate_tree(rng: random.Random, tree: Any, steps: int = 1) -> Any:
    """``steps`` random edits of a JSON tree: replace a value (hostile, or its number twisted), delete a key,
    add an unknown key, duplicate or drop a list item, nest a value deeply."""
    tree = copy.deepcopy(tree)
    nested_once = False  # one deep value per tree: deepcopy and json.dumps recurse (deeper nesting: mutate_bytes)
    for _ in range(steps):
        path = rng.choice(_paths(tree)[1:] or [()])
        if not path:
            return rng.choice(HOSTILE_VALUES)
        parent, key = _at(tree, path[:-1]), path[-1]
        op = rng.randrange(7)
        value = parent[key]
        if op == 0 and isinstance(value, (int, float)):
            parent[key] = _numeric_twist(rng, value)
        elif op in (0, 1, 2):
            parent[key] = copy.deepcopy(rng.choice(HOSTILE_VALUES))
        elif op == 3 and isinstance(parent, dict):
            del parent[key]
        elif op == 3:
            parent.pop(key)
        elif op == 4 and isinstance(parent, dict):
            parent["unknown_" + str(rng.randrange(9))] = rng.choice(HOSTILE_VALUES)
        elif op == 4:
            parent.insert(key, copy.deepcopy(value))
        elif op == 5 and not nested_once:
            nested_once = True
            nested: Any = value
            for _ in range(rng.choice([3, 50, 400])):
                nested = [nested]
            parent[key] = nested
        elif op == 6:
            parent[key] = str(value)[:200] if not isinstance(value, str) else value + "\x7f"
    return tree


def encode(kind: str, tree: Any) -> bytes:
    """The file bytes of a tree: TOML for a profile (a tree TOML cannot hold becomes JSON, itself a bad profile)."""
    if kind == "profile":
        try:
            return dump_toml(tree).encode("utf-8", "surrogatepass")
        except Exception:
            return json.dumps(tree, default=str).encode()
    return json.dumps(tree, allow_nan=True).encode("utf-8", "surrogatepass")


def mutate_bytes(rng: random.Random, data: bytes) -> bytes:
    """A file-level edit: truncate, flip a byte, insert invalid UTF-8, nest 100k levels, or gzip (whole or
    truncated)."""
    op = rng.randrange(6)
    cut = rng.randrange(max(len(data), 1))
    if op == 0:
        return data[:cut]
    if op == 1 and data:
        return data[:cut] + bytes([data[cut] ^ (1 << rng.randrange(8))]) + data[cut + 1 :]
    if op == 2:
        return data[:cut] + b"\xff\xfe\xc3" + data[cut:]
    if op == 3:
        return data[:cut] + b"[" * 100_000 + data[cut:]
    packed = gzip.compress(data)
    return packed if op == 4 else packed[: rng.randrange(len(packed))]


def mutated_case(rng: random.Random, kind: str) -> tuple[bytes, str]:
    """(file bytes, how they were made) for one random case of ``kind``."""
    tree = seed(kind)
    if rng.random() < 0.8:
        tree = mutate_tree(rng, tree, rng.choice([1, 1, 2, 3]))
        data, how = encode(kind, tree), "tree"
    else:
        data, how = encode(kind, tree), "clean"
    if rng.random() < 0.25:
        data, how = mutate_bytes(rng, data), how + "+bytes"
    return data, how


# ---------------------------------------------------------------- running one case
def check_simulation(g: Graph, costs: CostEstimate) -> str | None:
    """None when the simulated numbers are right, else what broke (the invariants of issue 20)."""
    res = simulate_costs(g, costs)
    if res.makespan_ns < 0 or res.makespan_s + 1e-9 < res.lower_bound_s:
        return f"makespan {res.makespan_s} < lower bound {res.lower_bound_s}"
    if len(res.stream_busy_ns) and int(res.stream_busy_ns.max()) > res.makespan_ns:
        return f"a stream is busy {int(res.stream_busy_ns.max())} ns > makespan {res.makespan_ns} ns"
    if not all(0.0 <= u <= 1.0 for u in res.stream_utilization.values()):
        return f"utilisation outside [0, 1]: {res.stream_utilization}"
    return None


def _load(kind: str, path: Path) -> Callable[[], str | None] | None:
    """Load ``path`` as ``kind`` the way the CLI does; for a graph or a profile, the next step: estimate and
    simulate (its errors are about the loaded input as a whole, so they need not name the file)."""
    from commsched.cost import estimate_costs
    from commsched.hardware import for_graph

    if kind == "graph":
        g = load_graph(path)
        return lambda: check_simulation(g, estimate_costs(g, for_graph("h100-sxm", g)))
    if kind == "profile":
        hw = load_profile(path)
        return lambda: check_simulation(small_graph(), estimate_costs(small_graph(), hw.with_nodes(1)))
    load_measured(path)
    if kind == "trace":
        trace_collectives(path)
    return None


SUFFIX = {"graph": ".json", "table": ".json", "profile": ".toml", "trace": ".json"}


def run_case(kind: str, data: bytes, folder: Path, limit_s: float = 10.0) -> tuple[str, str]:
    """(outcome, detail) of loading ``data`` as a ``kind`` file; see the module docstring for the outcomes."""
    path = folder / f"case_{kind}{SUFFIX[kind]}"
    path.write_bytes(data)
    loaded = False
    try:
        with time_limit(limit_s):
            use = _load(kind, path)
            loaded = True
            wrong = use() if use is not None else None
    except Hang as exc:
        return "hang", str(exc)
    except (GraphError, ValueError, FileNotFoundError) as exc:
        text = str(exc)
        if (not loaded and str(path) not in text) or "\n" in text.strip() or isinstance(exc, UnicodeDecodeError):
            return "crash", f"{type(exc).__name__} not naming the file: {text[:300]}"
        return "error", text[:300]
    except BaseException as exc:  # classify everything, RecursionError too
        if isinstance(exc, KeyboardInterrupt):
            raise
        return "crash", f"{type(exc).__name__}: {str(exc)[:300]}"
    return ("wrong", wrong) if wrong else ("ok", "")


def fuzz(kinds: tuple[str, ...], cases: int, seed_value: int, folder: Path,
         progress: Callable[[str, str, str], None] | None = None) -> dict[tuple[str, str], int]:  # fmt: skip
    """``cases`` random cases per kind; counts by (kind, outcome)."""
    counts = {(k, o): 0 for k in kinds for o in OUTCOMES}
    rng = random.Random(seed_value)
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 1000))
    for kind in kinds:
        for _ in range(cases):
            data, how = mutated_case(rng, kind)
            outcome, detail = run_case(kind, data, folder)
            counts[(kind, outcome)] += 1
            if progress is not None:
                progress(kind, outcome, f"{how}: {detail}")
    return counts
