"""Names a package exports but imports only on first use (``import commsched`` stays fast: torch, the zoo and the
executor load when a name that needs them is first read)."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from typing import Any


def lazy_getattr(package: str, table: dict[str, str]) -> Callable[[str], Any]:
    """A module-level ``__getattr__`` for ``package``: ``name`` in ``table`` is imported from module
    ``table[name]`` when first read and kept in the package (where that module has no such name, the module itself:
    ``commsched.hardware``); any other name raises AttributeError as a module does."""

    def __getattr__(name: str) -> Any:
        if name not in table:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module = importlib.import_module(table[name])
        value = getattr(module, name, module)
        setattr(sys.modules[package], name, value)
        return value

    return __getattr__
