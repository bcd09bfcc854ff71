"""Training runs in separate processes, one CPU thread each, without losing work to a dead one.

The small models of the ``cpu`` profile do not keep several threads busy, so on a 2-core CPU two
one-thread runs at a time get through a sweep faster than one run on both cores
(``benchmarks/cpu_throughput.py``). :func:`run_in_processes` starts one fresh (spawned) process
per job, at most ``workers`` at a time, and watches their exit:

* a job writes its own result (a partial-run file) before its process exits, so what a worker
  finishes is kept even if the parent dies meanwhile;
* a worker that dies (``kill -9``, the kernel's out-of-memory killer, a crash) is reported by job
  and exit code while the other jobs go on; the caller decides what to do with the lost ones;
* workers ignore Ctrl-C from the moment they start (the terminal sends it to every process of
  the group); the parent stops them and re-raises the interrupt;
* a worker whose parent dies (SIGKILL, where no clean-up can run) stops within a second instead
  of training on for a parent that will never read its result.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import resource
import signal
import sys
import threading
import time
from contextlib import contextmanager
from multiprocessing import resource_tracker
from multiprocessing.connection import wait
from typing import Any, Callable, Iterator, Sequence

WATCH_SECONDS = 1.0
"""How often a worker checks that its parent is alive."""


def peak_memory_mb() -> float:
    """This process's peak resident memory so far, in MB (``getrusage``; KB on Linux, bytes on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 2**10


def _exit_with_parent(parent: int) -> None:
    """Stop this process as soon as ``parent`` is no longer its parent (it died; we were re-parented)."""
    while os.getppid() == parent:
        time.sleep(WATCH_SECONDS)
    os._exit(1)


def _worker(target: Callable[..., Any], args: tuple, parent: int) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # drops a Ctrl-C held since the start (_starting)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    threading.Thread(target=_exit_with_parent, args=(parent,), daemon=True).start()
    target(*args)


@contextmanager
def _sigint_handled_by(handler: Callable[..., Any] | signal.Handlers) -> Iterator[None]:
    """Let ``handler`` take SIGINT in this (main) thread for the duration, then restore the one
    before; elsewhere do nothing (only the main thread can set signal handlers)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


@contextmanager
def interrupts_deferred() -> Iterator[None]:
    """Hold a Ctrl-C (SIGINT) that arrives during the block and deliver it when the block ends.

    For steps that an interrupt must not cut in half. The first optimizer makes torch import
    ``torch._dynamo``, and a Ctrl-C inside that import can be swallowed as a failed optional
    import: training then goes on, or fails later with an unrelated error. Outside the main
    thread, where no signal handler runs, it does nothing."""
    held = []
    try:
        with _sigint_handled_by(lambda *_: held.append(True)):
            yield
    finally:
        if held:
            signal.raise_signal(signal.SIGINT)  # to the handler the block found


@contextmanager
def _starting() -> Iterator[None]:
    """Start a worker inside the block: a Ctrl-C meanwhile reaches the parent when the block ends,
    and never the worker. SIGINT is blocked in this thread for the duration; the worker inherits
    that mask through fork and exec (a handler would not survive exec), so it holds the signal
    until it ignores it in :func:`_worker`. Any thread of the parent that takes the signal hands
    it to :func:`interrupts_deferred`'s handler, which delivers it as the block ends.

    multiprocessing's resource tracker is started first, outside the block: the first worker's
    start would otherwise start it inside, and starting it unblocks SIGINT in the parent, so that
    worker would inherit no mask and die of the Ctrl-C with a traceback."""
    resource_tracker.ensure_running()
    with interrupts_deferred():
        previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            yield
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def exit_reason(code: int) -> str:
    """A process's exit code in words: ``"killed by signal 9 (SIGKILL: out of memory?)"``."""
    if code >= 0:
        return f"exited with code {code}"
    name = signal.Signals(-code).name
    hint = ": out of memory, or killed by hand?" if name == "SIGKILL" else ""
    return f"killed by signal {-code} ({name}{hint})"


def run_in_processes(
    target: Callable[..., Any], jobs: Sequence[tuple[int, tuple]], workers: int,
    on_done: Callable[[int], None], on_lost: Callable[[int, str], None],
) -> list[int]:
    """Call ``target(*args)`` for every ``(index, args)`` of ``jobs``, each in its own process, at
    most ``workers`` at once; ``on_done(index)`` after a clean exit, ``on_lost(index, reason)``
    after any other. Returns the indices of the lost jobs. ``target`` must be importable
    (processes are spawned) and store its own result."""
    context = mp.get_context("spawn")
    queue, running, lost = list(jobs), {}, []
    try:
        while queue or running:
            while queue and len(running) < workers:
                index, args = queue.pop(0)
                process = context.Process(target=_worker, args=(target, args, os.getpid()), daemon=True)
                with _starting():
                    process.start()
                    running[process.sentinel] = (index, process)  # stopped in `finally` if interrupted
            for sentinel in wait(list(running)):
                index, process = running.pop(sentinel)
                process.join()
                if process.exitcode == 0:
                    on_done(index)
                else:
                    lost.append(index)
                    on_lost(index, exit_reason(process.exitcode))
                process.close()
    finally:  # an interrupt or an error in a callback: no worker outlives the call
        for _, process in running.values():
            process.terminate()
            process.join()
    return lost
