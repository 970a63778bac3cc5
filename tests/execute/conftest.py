"""Every executor test gets its own cache folder (the trace cache and the row store live there), and this process's
memory of recent traces is forgotten."""

import pytest

from commsched.experiments import sweep_task


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("COMMSCHED_CACHE_DIR", str(tmp_path / "cache"))
    sweep_task._MEMORY.clear()
