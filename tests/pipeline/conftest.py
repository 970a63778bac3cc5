"""Fixtures shared by the pipeline tests."""

from __future__ import annotations

import pytest

from commsched.pipeline import cache as stage_cache
from commsched.pipeline import per_step


@pytest.fixture
def own_stage_cache(tmp_path, monkeypatch):
    """The test its own disk cache, and nothing in memory from an earlier test (a cold process)."""
    monkeypatch.setenv("COMMSCHED_CACHE_DIR", str(tmp_path / "cache"))
    stage_cache.clear_memory()
    per_step.clear_tails()
    yield
    stage_cache.clear_memory()
    per_step.clear_tails()
