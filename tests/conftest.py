"""Shared test set-up: one intra-op thread, figures render off-screen and are closed after every test."""

import os

import matplotlib
import torch

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def close_figures():
    yield
    plt.close("all")


SETTINGS = ("SCALELONG_RESULTS", "SCALELONG_DATA", "SCALELONG_PROFILE", "SCALELONG_TRAIN", "SCALELONG_DEVICE")


@pytest.fixture(autouse=True)
def environment_kept():
    """No test may leave the package's settings changed: the notebooks that run later in the same
    worker start their kernels with this environment (a leaked SCALELONG_RESULTS made them train
    every experiment live)."""
    before = {name: os.environ.get(name) for name in SETTINGS}
    yield
    changed = {name: (value, os.environ.get(name)) for name, value in before.items() if os.environ.get(name) != value}
    assert not changed, f"the test left these settings changed (before, after): {changed}"


@pytest.fixture(autouse=True, scope="session")
def one_thread():
    """The tests' models are tiny: intra-op threads gain nothing, and on a busy 2-core machine they
    cost up to ten times the run time waiting for each other."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def untimed_estimate(monkeypatch):
    """run_experiment's cost estimate as a zero-minute stub (:func:`tests.stubs.untimed_estimate`)."""
    from scalelong_edu import experiments as ex
    from tests.stubs import untimed_estimate

    monkeypatch.setattr(ex, "estimate_here", untimed_estimate)


@pytest.fixture
def results_here(tmp_path, monkeypatch):
    """Experiments cache into a fresh folder, with the reader's default budget (no SCALELONG_TRAIN)."""
    monkeypatch.setenv("SCALELONG_RESULTS", str(tmp_path))
    monkeypatch.delenv("SCALELONG_TRAIN", raising=False)
    return tmp_path


SLOWEST_FIRST = ("tests/test_book_html.py", "tests/test_experiments.py", "tests/test_gpu_profile.py",
                 "tests/test_workers.py", "tests/test_gpu_scale.py", "tests/test_train.py", "tests/test_colab.py",
                 "tests/test_stats.py", "book/03_hidden_features.ipynb", "book/01_ddpm_objective.ipynb",
                 "book/06_constant_scaling.ipynb", "book/08_reviewer_questions.ipynb", "tests/test_cost.py",
                 "tests/test_benchmarks.py", "book/")
"""The files that take longest (measured), run first: `make test`'s two workers (pytest-xdist, one
file at a time each) then finish together instead of one waiting while the other runs a notebook.
The Makefile passes ``--no-loadscope-reorder``: without it xdist hands out files by their number of
tests, and the slow files with few tests come last."""


def pytest_collection_modifyitems(config, items):
    def rank(item):
        path = item.path.relative_to(config.rootpath).as_posix()
        return next((i for i, prefix in enumerate(SLOWEST_FIRST) if path.startswith(prefix)), len(SLOWEST_FIRST))

    items.sort(key=rank)  # stable: a file's tests, a notebook's cells, keep their order
