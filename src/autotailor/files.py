"""Writing files so that a reader never sees half of one: ``atomic_write``.

A crash or Ctrl-C during a write leaves the previous file (or none), never a truncated one:
the data goes to a temporary file in the same directory, which replaces the target only
once it is complete.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def atomic_write(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path next to ``path``; when the block ends without an exception, it
    replaces ``path``; otherwise it is deleted and ``path`` is left as it was.

    >>> with atomic_write("out.json") as tmp:
    ...     tmp.write_text("{}")
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    tmp = Path(name)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)  # mkstemp's 0600 would make the result private
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_text(path: str | Path, text: str) -> Path:
    """``path.write_text(text)``, atomically."""
    with atomic_write(path) as tmp:
        tmp.write_text(text)
    return Path(path)
