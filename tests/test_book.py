"""Tests of scalelong_edu.book: the chapter setup line and glue."""

import sys

import numpy as np
import pandas as pd
import pytest
import torch

from scalelong_edu import book


def test_setup_states_profile_device_and_dataset(monkeypatch, capsys):
    monkeypatch.setenv("SCALELONG_PROFILE", "ci")
    monkeypatch.setenv("SCALELONG_DEVICE", "cpu")
    monkeypatch.delenv("SCALELONG_TRAIN", raising=False)
    env = book.setup(seed=3)
    assert capsys.readouterr().out == ("profile: ci | device: cpu | dataset: digits8x8 at 16 px\n"
                                       "a cell trains at most 25 min on its own (SCALELONG_TRAIN=all: no limit)\n")
    assert env.profile.name == "ci" and env.dataset.channels == 1
    assert torch.initial_seed() == 3
    assert pd.get_option("display.max_colwidth") is None  # a claim's measured text is shown whole
    monkeypatch.setenv("SCALELONG_TRAIN", "all")
    book.setup()
    assert "SCALELONG_TRAIN=all: every experiment missing from the cache trains" in capsys.readouterr().out
    pd.reset_option("display.max_colwidth")


def test_setup_tells_colab_users_how_to_get_a_gpu(monkeypatch, capsys):
    monkeypatch.setenv("SCALELONG_DEVICE", "cpu")
    monkeypatch.setitem(sys.modules, "google.colab", object())
    book.setup()
    assert book.COLAB_GPU_HINT in capsys.readouterr().out


def test_glue_passes_python_numbers_to_myst_nb(monkeypatch):
    import myst_nb

    seen = []
    monkeypatch.setattr(myst_nb, "glue", lambda name, value, display: seen.append((name, value, display)))
    book.glue("a", torch.tensor(2.5))
    book.glue("b", np.float64(1.0))
    book.glue("c", "text", display=True)
    assert seen == [("a", 2.5, False), ("b", 1.0, False), ("c", "text", True)]
    assert type(seen[0][1]) is float


def test_glue_without_myst_nb_does_nothing(monkeypatch):
    monkeypatch.setitem(sys.modules, "myst_nb", None)
    assert book.glue("x", 1.0) is None
    with pytest.raises(ImportError):
        import myst_nb  # noqa: F401


def test_figures_are_shown_light_inside_ipython(monkeypatch):
    import matplotlib.pyplot as plt
    from IPython.core.interactiveshell import InteractiveShell

    from scalelong_edu.plotting import light_png

    assert book.show_light_figures() is False  # plain Python: no shell to register with
    shell = InteractiveShell.instance()
    monkeypatch.setattr("IPython.get_ipython", lambda: shell)
    try:
        assert book.show_light_figures() is True
        fig = plt.figure()
        assert shell.display_formatter.formatters["image/png"].lookup(fig) is light_png
        plt.close(fig)
    finally:
        InteractiveShell.clear_instance()
