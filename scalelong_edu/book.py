"""What the first cell of every chapter calls: profile, device and dataset, stated once."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

import torch

from .cost import TRAIN_VAR, default_budget
from .data import DatasetInfo, dataset_info
from .plotting import light_png, use_book_style
from .profiles import Profile, get_profile
from .train import pick_device

COLAB_RUNTIME = "On Colab: Runtime > Change runtime type > T4 GPU, then run all cells again."
COLAB_GPU_HINT = f"No GPU found. {COLAB_RUNTIME}"


@dataclass(frozen=True)
class Setup:
    """The environment a chapter runs in."""

    profile: Profile
    device: torch.device
    dataset: DatasetInfo

    def __str__(self) -> str:
        budget = default_budget()
        training = (f"a cell trains at most {budget:g} min on its own ({TRAIN_VAR}=all: no limit)" if budget
                    else f"{TRAIN_VAR}=all: every experiment missing from the cache trains, with no time limit")
        return (f"profile: {self.profile.name} | device: {self.device.type} | "
                f"dataset: {self.dataset.name} at {self.profile.image_size} px\n{training}")


def setup(seed: int = 0) -> Setup:
    """Seed torch, apply the book's plot style, show figures as light PNGs
    (:func:`~scalelong_edu.plotting.light_png`) and table cells in full (pandas cuts them at 50
    characters, which hides the seed counts at the end of a measured text), and print profile,
    device and dataset.

    On Colab it also turns on Colab's custom widget manager, which ipywidgets 8 and
    third-party widgets need there, and says how to get a GPU.
    """
    import pandas as pd

    torch.manual_seed(seed)
    use_book_style()
    pd.set_option("display.max_colwidth", None)
    show_light_figures()
    profile = get_profile()
    info = dataset_info(profile.dataset)
    env = Setup(profile, pick_device(), info)
    print(env)
    if "google.colab" in sys.modules:
        enable_colab_widgets()
        if env.device.type == "cpu":
            print(COLAB_GPU_HINT)
    return env


def show_light_figures() -> bool:
    """Make IPython show matplotlib figures as :func:`~scalelong_edu.plotting.light_png`;
    ``False`` outside IPython, where there is nothing to show them in."""
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    if shell is None:
        return False
    import matplotlib.pyplot as plt
    from matplotlib.figure import Figure

    plt.close(plt.figure())  # the inline backend registers its own formatter when first used: before ours
    shell.display_formatter.formatters["image/png"].for_type(Figure, light_png)
    return True


def enable_colab_widgets() -> bool:
    """Call ``google.colab.output.enable_custom_widget_manager()``; ``False`` where it is missing."""
    try:
        from google.colab import output
    except ImportError:
        return False
    enable = getattr(output, "enable_custom_widget_manager", None)
    if enable is None:
        return False
    enable()
    return True


def glue(name: str, value: Any, display: bool = False) -> None:
    """Record ``value`` for the book's text (`` {glue:text}`name` ``) with myst-nb.

    Tensor and NumPy scalars become Python numbers first. Without myst-nb (e.g. on Colab)
    there is no book to write into, and nothing happens.
    """
    try:
        from myst_nb import glue as myst_glue
    except ImportError:
        return
    myst_glue(name, value.item() if hasattr(value, "item") else value, display=display)
