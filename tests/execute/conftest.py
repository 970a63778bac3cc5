"""Every executor test gets its own cache folder (the trace cache and the row store live there)."""

import pytest


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("COMMSCHED_CACHE_DIR", str(tmp_path / "cache"))
