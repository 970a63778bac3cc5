"""The trace cache (binary graphs, .npz, under a key of everything that decides a trace) and the row store (an
interrupted sweep resumes)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from commsched.execute import base, cache
from commsched.execute.graph_npz import load_graph_npz as load_graph
from commsched.experiments import sweep_task
from commsched.experiments.sweep import run_sweep

KW = {"parallel": ["fsdp", "ddp"], "world_sizes": [8], "hardware": ["h100-sxm", "b200"], "layers": 1, "processes": 1}


def test_cache_folder_respects_the_environment(monkeypatch, tmp_path):
    monkeypatch.delenv("COMMSCHED_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache.cache_dir() == tmp_path / "xdg" / "commsched"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache.cache_dir() == tmp_path / "home" / ".cache" / "commsched"
    monkeypatch.setenv("COMMSCHED_CACHE_DIR", str(tmp_path / "mine"))
    assert cache.cache_dir() == tmp_path / "mine"


def test_the_key_covers_every_field_and_the_versions(monkeypatch):
    args = ("llama3-8b", "fsdp", 64, 2, {"mode": "train", "seq_len": 1024, "batch": 2, "dtype": "bfloat16"})
    key = cache.trace_key(*args)
    assert key == cache.trace_key(*args) and len(key) == 32
    changed = [
        ("llama3-70b", *args[1:]),
        (args[0], "ddp", *args[2:]),
        (*args[:2], 128, *args[3:]),
        (*args[:3], 4, args[4]),
        (*args[:4], {**args[4], "mode": "prefill"}),
        (*args[:4], {**args[4], "seq_len": 2048}),
        (*args[:4], {**args[4], "batch": 1}),
        (*args[:4], {**args[4], "dtype": "float32"}),
    ]
    assert len({cache.trace_key(*a) for a in changed} | {key}) == len(changed) + 1
    mine = base.versions()
    for field in ("commsched_version", "torch_version"):
        monkeypatch.setattr(cache, "versions", lambda f=field: {**mine, f: "other"})
        assert cache.trace_key(*args) != key, field


def test_a_rerun_traces_nothing_and_gives_the_same_rows():
    first = run_sweep("llama-tiny", **KW)
    second = run_sweep("llama-tiny", **KW, resume=False)  # not the stored rows: the trace cache only
    assert not any(r.trace_cached for r in first) and all(r.trace_cached for r in second)
    assert [r.result_dict() for r in first] == [r.result_dict() for r in second]
    assert all(r.trace_wall_s < 0.5 for r in second)
    files = sorted((cache.cache_dir() / "traces").glob("*.npz"))
    assert len(files) == 2  # one per trace, not per hardware profile
    assert {len(load_graph(f)) for f in files} == {r.num_graph_nodes for r in first}
    assert len(list((cache.cache_dir() / "sweeps").glob("*.json"))) == 1  # the finished sweep's rows, kept


def test_a_finished_sweep_run_again_takes_its_stored_rows(monkeypatch):
    first = run_sweep("llama-tiny", **KW)

    def no_work(spec):
        raise AssertionError("a stored sweep computed a task")

    run_task = sweep_task.run_task
    monkeypatch.setattr(sweep_task, "run_task", no_work)
    again = run_sweep("llama-tiny", **KW)
    assert [r.to_dict() for r in again] == [r.to_dict() for r in first]  # wall times too: the first run's
    other = run_sweep("llama-tiny", **{**KW, "layers": 2})  # another configuration is computed
    assert all("computed a task" in r.error for r in other)
    monkeypatch.setattr(sweep_task, "run_task", run_task)
    uncached = run_sweep("llama-tiny", **KW, cache=False)  # --no-cache: computed, and not kept
    assert [r.result_dict() for r in uncached] == [r.result_dict() for r in first]
    assert len(list((cache.cache_dir() / "sweeps").glob("*.json"))) == 1


def test_no_cache_neither_reads_nor_writes():
    rows = run_sweep("llama-tiny", **KW, cache=False)
    assert not any(r.trace_cached for r in rows) and all(r.ok for r in rows)
    assert not (cache.cache_dir() / "traces").exists()


def test_an_unreadable_entry_is_a_miss_and_is_rewritten():
    (row,) = run_sweep("llama-tiny", **{**KW, "parallel": "fsdp", "hardware": "h100-sxm"})
    (path,) = (cache.cache_dir() / "traces").glob("*.npz")
    path.write_bytes(path.read_bytes()[:100])  # a torn file
    sweep_task._MEMORY.clear()  # as a fresh process would start
    (again,) = run_sweep("llama-tiny", **{**KW, "parallel": "fsdp", "hardware": "h100-sxm"}, resume=False)
    assert not again.trace_cached and again.result_dict() == row.result_dict()
    assert len(load_graph(path)) == row.num_graph_nodes


class _Stop(KeyboardInterrupt):
    pass


def test_an_interrupted_sweep_resumes_where_it_stopped():
    done = []

    def stop_after_first(rows):
        done.append(rows)
        raise _Stop  # as Ctrl-C would, after the first task's rows were stored

    with pytest.raises(_Stop):
        run_sweep("llama-tiny", **KW, on_rows=stop_after_first)
    (progress,) = (cache.cache_dir() / "sweeps").glob("*.json")
    stored = json.loads(progress.read_text())
    assert stored["format"] == "commsched.sweep-progress" and list(stored["results"]) == ["0"]
    resumed = run_sweep("llama-tiny", **KW)
    # the first task's rows come from the store (its wall times too), the second was computed now
    assert [r.trace_wall_s for r in resumed[:2]] == [r.trace_wall_s for r in done[0]]
    assert sorted(json.loads(progress.read_text())["results"]) == ["0", "1"]  # now the whole sweep is stored
    fresh = run_sweep("llama-tiny", **KW, resume=False)
    assert [r.result_dict() for r in resumed] == [r.result_dict() for r in fresh]


def test_another_configuration_does_not_resume_from_the_store(tmp_path):
    store = cache.RowStore([{"preset": "llama-tiny", "world_size": 8}])
    store.add(0, [{"x": 1}])
    assert cache.RowStore([{"preset": "llama-tiny", "world_size": 8}]).load() == {0: [{"x": 1}]}
    assert cache.RowStore([{"preset": "llama-tiny", "world_size": 16}]).load() == {}
    Path(store.path).write_text("not json")
    assert cache.RowStore([{"preset": "llama-tiny", "world_size": 8}]).load() == {}
    assert os.environ["COMMSCHED_CACHE_DIR"] in str(store.path)


class _LosesTheFirstTask:
    """An executor whose worker 'dies' on the first task (``fail``), and runs the others here."""

    name = "test"

    def map(self, fn, specs, *, fail, on_result=None):
        out = []
        for i, spec in enumerate(specs):
            out.append(fail(spec, "worker: worker 1 died of signal SIGKILL") if i == 0 else base.resolve_fn(fn)(spec))
            if on_result is not None:
                on_result(i, out[-1])
        return out

    def close(self):
        return None


def test_a_dead_workers_rows_are_not_stored_and_the_same_sweep_retries_them():
    first = run_sweep("llama-tiny", **KW, executor=_LosesTheFirstTask())
    assert all(r.error.startswith("worker:") for r in first[:2]) and all(r.ok for r in first[2:])
    again = run_sweep("llama-tiny", **KW)
    assert all(r.ok for r in again)
    assert [r.to_dict() for r in again[2:]] == [r.to_dict() for r in first[2:]]  # stored: the first run's rows
    assert [r.result_dict() for r in again] == [r.result_dict() for r in run_sweep("llama-tiny", **KW, resume=False)]
