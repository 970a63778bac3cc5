"""Fixtures of the plan tests."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    """A trace cache of the module's own (COMMSCHED_CACHE_DIR), so that its traces are its own."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("COMMSCHED_CACHE_DIR", str(tmp_path_factory.mktemp("plan_cache")))
        yield
