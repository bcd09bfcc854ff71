"""Writing files so that an interrupted run never leaves a half-written one behind, and two
processes never compute the same one at once."""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
from pathlib import Path
from typing import Callable, Iterator

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None


def _alive(pid: int) -> bool:
    """Whether a process with this id runs on this machine (signal 0 only asks)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists, under another user
        pass
    return True


def remove_stale_temporaries(path: str | Path) -> list[Path]:
    """Delete the temporary files that :func:`atomic_write` left for ``path`` in a killed process.

    Temporary files are named ``.<name>.<pid>.tmp``; one whose process no longer runs can only be
    a leftover (a SIGKILL during a write). Returns the files removed.
    """
    path = Path(path)
    removed = []
    for tmp in path.parent.glob(f".{path.name}.*.tmp"):
        pid = tmp.name[len(path.name) + 2 : -len(".tmp")]
        if pid.isdigit() and int(pid) != os.getpid() and not _alive(int(pid)):
            tmp.unlink(missing_ok=True)
            removed.append(tmp)
    return removed


def atomic_write(path: str | Path, write: Callable[[Path], None]) -> Path:
    """Call ``write(tmp)`` on a temporary file beside ``path``, then rename it over ``path``.

    The rename is atomic on one file system, so readers see the old file or the new one, never a
    partial one; if ``write`` fails (or the run is interrupted) the temporary file is removed, and
    the leftovers of writers that were killed outright are removed by the next write.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        write(tmp)
        os.replace(tmp, path)
    except OSError as e:  # a full disk, a vanished folder: name the file (the previous version stands)
        raise OSError(e.errno, e.strerror or str(e), str(path)) from e
    finally:
        tmp.unlink(missing_ok=True)
    return path


@contextlib.contextmanager
def exclusive(path: str | Path, what: str, say: Callable[[str], None] | None = None) -> Iterator[None]:
    """Hold an exclusive lock for computing ``path`` while the block runs, so that a second process
    that wants the same file waits for the first (``say`` tells it so) instead of computing it too.
    A ``path`` that could not be written raises first (:func:`check_writable`; ``what`` names it).

    The lock is ``flock`` on an empty ``.<name>.lock`` beside ``path``, which stays there; the
    system frees the lock when its holder exits, killed or not, so a dead holder never blocks the
    next. Without ``fcntl`` (Windows) nothing is locked.
    """
    path = Path(path)
    if fcntl is None:
        yield
        return
    check_writable(path, what)
    with open(path.with_name(f".{path.name}.lock"), "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if say is not None:
                say(f"another process is computing {path.name}: waiting for it")
            fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def check_writable(path: str | Path, what: str) -> Path:
    """Raise a clear error now, before any work, if the file ``path`` could not be written later.

    Creates the missing parent folders and writes (then deletes) a probe file beside ``path``.
    ``what`` names the file in the message, e.g. ``"the checkpoint"``.
    """
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(f"{what} {path} is a folder; give a file name inside it")
    probe = path.with_name(f".{path.name}.{os.getpid()}.probe")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        raise PermissionError(
            f"cannot write {what} {path} ({type(e).__name__}: {e.strerror or e}); "
            "choose a folder you can write to before training, so no work is lost"
        ) from e
    return path


def check_free_space(path: str | Path, needed: int, what: str, advice: str = "choose another path") -> None:
    """Raise an OSError (ENOSPC) now if the file system that will hold ``path`` has fewer than
    ``needed`` bytes free; ``what`` names the files in the message, ``advice`` the way out."""
    folder = Path(path).absolute().parent
    while not folder.exists():
        folder = folder.parent
    free = shutil.disk_usage(folder).free
    if free < needed:
        raise OSError(errno.ENOSPC, f"not enough space for {what} in {Path(path).parent}: about "
                      f"{needed / 1e6:.1f} MB needed, {free / 1e6:.1f} MB free; free some space, or {advice}, "
                      "before training")
