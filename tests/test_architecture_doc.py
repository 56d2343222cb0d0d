"""Every Python example of docs/architecture.md runs as written (each in its own process: the
registrations it makes are global to a process)."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parent.parent / "docs" / "architecture.md"
TEXT = DOC.read_text()
BLOCKS = [(re.findall(r"^## (.+)$", TEXT[: m.start()], flags=re.M)[-1], m.group(1))
          for m in re.finditer(r"```python\n(.*?)```", TEXT, flags=re.S)]


def test_the_page_has_the_four_examples():
    assert [title for title, _ in BLOCKS] == ["Adding an operator", "Adding a variable kind", "Adding a template",
                                              "Adding a backend"]


@pytest.mark.parametrize("code", [code for _, code in BLOCKS], ids=[t for t, _ in BLOCKS])
def test_the_example_runs(code, tmp_path):
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
