"""Tests of scalelong_edu.workers and of sweeps with --workers seen from the shell: a dead worker,
a dead parent, Ctrl-C (issue 19, cases 1, 4, 5, 11, 15)."""

import multiprocessing
import os
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import psutil
import pytest

from scalelong_edu import experiments as ex
from scalelong_edu import workers

CLI_WORKER = Path(__file__).with_name("cli_worker.py")


def touch(path):
    Path(path).write_text("done")


def kill_myself():
    os.kill(os.getpid(), signal.SIGKILL)


def test_run_in_processes_reports_a_dead_job_and_finishes_the_others(tmp_path):
    done, lost = [], []
    jobs = [(0, (tmp_path / "0",)), (1, ()), (2, (tmp_path / "2",))]
    targets = {0: touch, 1: kill_myself, 2: touch}

    failed = workers.run_in_processes(dispatch, [(i, (targets[i].__name__, *args)) for i, args in jobs], 2,
                                      done.append, lambda i, why: lost.append((i, why)))
    assert failed == [1] and sorted(done) == [0, 2] and (tmp_path / "0").exists() and (tmp_path / "2").exists()
    assert lost == [(1, "killed by signal 9 (SIGKILL: out of memory, or killed by hand?)")]
    assert workers.exit_reason(1) == "exited with code 1"


def dispatch(name, *args):
    globals()[name](*args)


def start(tmp_path, *args, steps=3000, seeds=1):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "SCALELONG_RESULTS": str(tmp_path)}
    # Ctrl-C's default action restored: a shell's background job (`make test &`) starts with SIGINT
    # ignored, its children inherit that, and Python then leaves Ctrl-C ignored too
    return subprocess.Popen([sys.executable, str(CLI_WORKER), str(steps), str(seeds), *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def worker_processes(parent, n, timeout=120):
    """The ``n`` training workers of ``parent`` once they are all running."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = [p for p in psutil.Process(parent.pid).children() if "spawn_main" in " ".join(p.cmdline())]
        if len(found) == n:
            return found
        time.sleep(0.2)
    pytest.fail(f"{n} workers did not start")


def test_a_killed_worker_costs_its_run_only_and_the_sweep_exits_non_zero(tmp_path):
    """Case 1: kill -9 one of two workers; the other run finishes and is kept, the parent exits 1
    naming the lost run, and a rerun trains only that one. Case 15: no leaked-semaphore warning."""
    parent = start(tmp_path, "--workers", "2", steps=30)
    worker_processes(parent, 2)[0].kill()
    out, err = parent.communicate(timeout=300)
    assert parent.returncode == 1, err
    assert "is lost: its worker killed by signal 9" in out
    assert err.startswith("error: 1 run(s) lost to a dead worker (run ") and "rerun to train the rest" in err
    assert "leaked" not in err and "Traceback" not in err
    (runs,) = tmp_path.glob("*.runs")
    assert len(list(runs.iterdir())) == 1
    rerun = start(tmp_path, "--no-progress", steps=30)
    out, err = rerun.communicate(timeout=300)
    assert rerun.returncode == 0, err
    assert rerun.returncode == 0 and "quick (tiny profile)" in out


def test_workers_stop_when_their_parent_is_killed(tmp_path):
    """Case 4: after a SIGKILL of the parent, no worker trains on for nobody."""
    parent = start(tmp_path, "--workers", "2")
    found = worker_processes(parent, 2)
    parent.kill()
    parent.communicate(timeout=60)
    gone, alive = psutil.wait_procs(found, timeout=30)
    assert not alive


@pytest.mark.parametrize("flags", [(), ("--workers", "2")])
def test_ctrl_c_says_what_is_kept_in_one_line_and_exits_130(tmp_path, flags):
    """Case 11: Ctrl-C (SIGINT to the whole process group, as a terminal sends it)."""
    parent = start(tmp_path, *flags)  # progress shown: "run 1/2" says when the serial run trains
    if flags:
        worker_processes(parent, 2)  # at once: while they still import torch and unpickle their run
    else:
        next(line for line in parent.stdout if "run 1/2" in line)
        time.sleep(1)
    os.killpg(parent.pid, signal.SIGINT)
    out, err = parent.communicate(timeout=120)
    assert parent.returncode == 130, err
    last = err.strip().splitlines()[-1]
    assert "Traceback" not in err and "KeyboardInterrupt" not in err
    assert last.startswith("interrupted; 0 of 2 runs kept in ") and last.endswith("; rerun to continue")


@pytest.fixture
def ctrl_c_raises():
    """SIGINT raises KeyboardInterrupt in this process during the test, as in a terminal."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def test_a_ctrl_c_inside_a_deferred_block_arrives_when_the_block_ends(ctrl_c_raises):
    """The interrupt is neither lost nor raised half-way (the Trainer's first optimizer)."""
    finished = []
    with pytest.raises(KeyboardInterrupt):
        with workers.interrupts_deferred():
            signal.raise_signal(signal.SIGINT)
            finished.append("block")
        finished.append("after")
    assert finished == ["block"]


def start_and_interrupt(monkeypatch, whom):
    """Make every worker start send a Ctrl-C, as soon as the process exists, to ``whom`` of
    ``"parent"`` and ``"worker"``; returns the list the started workers' pids go to."""
    start, pids = multiprocessing.process.BaseProcess.start, []

    def start_then_ctrl_c(process):
        start(process)
        pids.append(process.pid)
        os.kill(os.getpid() if whom == "parent" else process.pid, signal.SIGINT)

    monkeypatch.setattr(multiprocessing.process.BaseProcess, "start", start_then_ctrl_c)
    return pids


def test_a_ctrl_c_while_a_worker_starts_reaches_the_parent(tmp_path, monkeypatch, ctrl_c_raises):
    """Not lost (the parent once ignored it while a worker started, and the sweep trained on), and
    no worker outlives it."""
    pids = start_and_interrupt(monkeypatch, "parent")
    with pytest.raises(KeyboardInterrupt):
        workers.run_in_processes(dispatch, [(0, ("touch", tmp_path / "0"))], 1, print, print)
    assert len(pids) == 1 and not psutil.pid_exists(pids[0])


def test_a_ctrl_c_while_a_worker_starts_is_ignored_by_the_worker(tmp_path, monkeypatch, ctrl_c_raises):
    """The worker holds it from its first instruction (before it can ignore it) and drops it."""
    done, lost = [], []
    pids = start_and_interrupt(monkeypatch, "worker")
    workers.run_in_processes(dispatch, [(0, ("touch", tmp_path / "0"))], 1, done.append,
                             lambda i, why: lost.append(why))
    assert len(pids) == 1 and done == [0] and lost == [] and (tmp_path / "0").exists()


def test_the_first_worker_of_a_fresh_process_ignores_a_ctrl_c_while_it_starts():
    """The test above, alone in its own interpreter: there the first worker's start also starts
    multiprocessing's resource tracker, which unblocks SIGINT on its way, and the worker once died
    of the Ctrl-C with a traceback (in a test session some earlier test has started it)."""
    test = f"{Path(__file__).name}::test_a_ctrl_c_while_a_worker_starts_is_ignored_by_the_worker"
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:xdist", "-p", "no:cacheprovider", test],
                            cwd=Path(__file__).parent, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout[-3000:]


def test_workers_are_capped_at_the_runs_left_and_warned_above_the_cores(tmp_path, monkeypatch, capsys):
    """Case 5: --workers 8 for 2 runs starts 2 workers; above the cores it warns; each finished
    run shows its worker's peak memory."""
    from tests.test_experiments import QUICK, TINY

    monkeypatch.setenv("SCALELONG_RESULTS", str(tmp_path))
    monkeypatch.setitem(ex.EXPERIMENTS, "quick", QUICK)
    monkeypatch.setattr(ex.os, "cpu_count", lambda: 1)
    ex.run_experiment("quick", replace(TINY, steps=2), workers=8)
    out = capsys.readouterr().out
    assert "warning: 2 workers on 1 cores" in out and "training 2 runs, 2 at a time" in out
    assert out.count("MB peak memory)") == 2
