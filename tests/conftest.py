"""Shared test set-up: figures render off-screen and are closed after every test."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def close_figures():
    yield
    plt.close("all")
