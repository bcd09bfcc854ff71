"""Shared test set-up: one intra-op thread, figures render off-screen and are closed after every test."""

import matplotlib
import torch

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def close_figures():
    yield
    plt.close("all")


@pytest.fixture(autouse=True, scope="session")
def one_thread():
    """The tests' models are tiny: intra-op threads gain nothing, and on a busy 2-core machine they
    cost up to ten times the run time waiting for each other."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def results_here(tmp_path, monkeypatch):
    """Experiments cache into a fresh folder, with the reader's default budget (no SCALELONG_TRAIN)."""
    monkeypatch.setenv("SCALELONG_RESULTS", str(tmp_path))
    monkeypatch.delenv("SCALELONG_TRAIN", raising=False)
    return tmp_path
