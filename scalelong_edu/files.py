"""Writing files so that an interrupted run never leaves a half-written one behind."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable


def atomic_write(path: str | Path, write: Callable[[Path], None]) -> Path:
    """Call ``write(tmp)`` on a temporary file beside ``path``, then rename it over ``path``.

    The rename is atomic on one file system, so readers see the old file or the new one, never a
    partial one; if ``write`` fails (or the run is interrupted) the temporary file is removed.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path
