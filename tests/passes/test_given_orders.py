"""Every consumer of a user-given order checks it the same way (issue 36, item 7): an order that issues two
collectives of one process group in the other order (the SPMD rule: every rank must issue a group's collectives
alike) is refused with exit 2 and the same line by ``check`` and ``simulate --order``, and by the Python loaders;
a schedule that records its deliberate reordering (``reorder_collectives``) stays valid everywhere."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from commsched.cli import app
from commsched.frontends.json_io import save_graph
from commsched.ir import OpKind
from commsched.passes import Schedule, ScheduleError, load_schedule
from commsched.workloads import build

runner = CliRunner()


@pytest.fixture(scope="module")
def graph():
    return build("llama-tiny", parallel="fsdp", world_size=8, layers=1).graph


def _swapped(g) -> tuple[np.ndarray, str, str]:
    """A topological order of ``g`` that issues the second collective of the first group before the first (its
    ancestors first, then it, then everything else in id order), and the two names."""
    colls = [c for c in g.collectives.tolist() if g.coll_group[c] == g.coll_group[g.collectives[0]]]
    anc = g.ancestor_bitsets([colls[1]])[0]
    assert not anc >> colls[0] & 1  # the second does not depend on the first: both orders are topological
    first = [i for i in range(len(g)) if anc >> i & 1] + [colls[1]]
    order = np.array(first + [i for i in range(len(g)) if i not in set(first)], np.int32)
    return order, g.names[colls[0]], g.names[colls[1]]


def _error(args: list[str]) -> str:
    res = runner.invoke(app, args)
    out = " ".join(res.output.split())
    assert res.exit_code == 2 and out.startswith("error:") and "Traceback" not in out, (res.exit_code, out)
    return out


@pytest.mark.parametrize("form", ["schedule file", "list of names"])
def test_swapped_collectives_are_refused_alike_by_every_consumer(graph, tmp_path, form):
    g = graph
    order, first, second = _swapped(g)
    path, gpath = tmp_path / "order.json", tmp_path / "g.json"
    save_graph(g, gpath)
    if form == "schedule file":
        Schedule(g, order).save(path)
    else:
        path.write_text(json.dumps([g.names[i] for i in order.tolist()]))
    check = _error(["check", str(gpath), str(path)])
    simulate = _error(["simulate", str(gpath), "--order", str(path)])
    simulate_json = _error(["simulate", str(gpath), "--order", str(path), "--json"])
    assert check == simulate == simulate_json
    want = f"{path}: process group '{g.groups[0].name}': collective #0 is '{second}' but the reference order issues "
    assert want in check and f"'{first}' there" in check and "(SPMD)" in check
    from commsched.passes import load_order  # the Python way in: the same check, the same line

    loaders = [load_order] + ([load_schedule] if form == "schedule file" else [])
    for load in loaders:
        with pytest.raises(ScheduleError) as info:
            load(g, path)
        assert f"error: {info.value}" == check
    ok = runner.invoke(app, ["check", str(gpath), str(path), "--allow-collective-reorder"])
    assert ok.exit_code == 0 and "valid schedule" in ok.output, ok.output


def test_a_recorded_reordering_stays_valid_for_every_consumer(graph, tmp_path):
    """The same swap, written by a schedule that declares it (``collectives_reordered_by`` with the group's recorded
    issue order), is what ``reorder_collectives`` produces: every consumer accepts it, and simulates that order."""
    g = graph
    order, _, _ = _swapped(g)
    path, gpath = tmp_path / "s.json", tmp_path / "g.json"
    save_graph(g, gpath)
    Schedule(g, order, reordered_by=["overlap"]).save(path)
    res = runner.invoke(app, ["check", str(gpath), str(path)])
    assert res.exit_code == 0 and "collectives reordered by overlap, as recorded" in res.output, res.output
    res = runner.invoke(app, ["simulate", str(gpath), "--order", str(path), "--json"])
    assert res.exit_code == 0, res.output
    from commsched.passes import load_order

    assert np.array_equal(load_schedule(g, path).order, order) and np.array_equal(load_order(g, path).order, order)
    # a topological break is refused alike as well, naming the file
    data = json.loads(path.read_text())
    c = next(k for k, name in enumerate(data["order"]) if g.kinds[g.index[name]] == OpKind.COLLECTIVE)
    data["order"].insert(0, data["order"].pop(c))
    path.write_text(json.dumps(data))
    msgs = {_error(["check", str(gpath), str(path)]), _error(["simulate", str(gpath), "--order", str(path)])}
    assert len(msgs) == 1 and f"{path}: node" in msgs.pop()
