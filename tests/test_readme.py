"""The README's Python API example runs as written (the README stays true)."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def test_python_api_example_runs():
    text = README.read_text()
    section = text[text.index("## Python API") :]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    namespace: dict = {}
    exec(compile(code, "README.md#python-api", "exec"), namespace)  # our own documentation, not untrusted input
    before, after = namespace["before"], namespace["after"]
    assert after.makespan_s < before.makespan_s
