"""A chapter's "at GPU scale" section: its headline comparison, trained live on a GPU.

The text of every chapter rests on the committed ``cpu`` results, whatever the device. What a GPU
adds is one experiment per chapter (:data:`SECTIONS`) at the ``gpu`` profile on CIFAR-10, sized to
at most :data:`~scalelong_edu.cost.BUDGET_MINUTES` minutes of a Colab T4 by its FLOPs (the tests
check each against that budget). Chapters 3 to 6 share one experiment and chapter 7 reuses its
unscaled runs, so a reader who runs them in order trains each run once.

:func:`section` is what the section's cell calls. With a GPU it trains the experiment (or loads it
when cached), saying first what it will train and how long that should take. Without one it loads
a committed ``gpu`` result when there is one, else says what it would train and trains nothing.
Under the ``ci`` profile (the tests) it runs the same experiment at ``ci`` size on the CPU.
:func:`curves_beside`, :func:`robustness_beside` and :func:`beside` draw the section's figure beside
the same figure of the committed result.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

import matplotlib.pyplot as plt
import numpy as np
import torch

from .book import COLAB_RUNTIME
from .cost import t4_minutes
from .evidence import fd_curves, features
from .experiments import ExperimentResult, cache_path, get_experiment, run_experiment, work
from .figures import draw_seeds_and_median, plot_robustness, result_colors
from .plotting import MAX_FIGURE_WIDTH, legend_below, log_axis, method_color
from .profiles import live_profile
from .train import pick_device

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

SECTIONS: dict[int, str] = {1: "live-ddpm", 2: "live-unet", 3: "live-uvit", 4: "live-uvit", 5: "live-uvit",
                            6: "live-uvit", 7: "live-ls", 8: "live-depth"}
"""The experiment each chapter's "at GPU scale" section trains."""


def section(chapter: int, progress: bool = True) -> ExperimentResult | None:
    """The result of chapter ``chapter``'s "at GPU scale" experiment, or ``None`` where it cannot be
    trained here (no GPU, no committed result), after saying so and what it would have trained."""
    if chapter not in SECTIONS:
        raise ValueError(f"no chapter {chapter!r} has an 'at GPU scale' section; choose one of {sorted(SECTIONS)}")
    name, profile = SECTIONS[chapter], live_profile()
    experiment = get_experiment(name)
    if profile.name == "gpu" and pick_device().type != "cuda" and not cache_path(experiment, profile).exists():
        plan = work(experiment, profile)
        print(f"[{name}] no GPU found, so nothing is trained. At GPU scale this section trains {plan}: about "
              f"{t4_minutes(plan):.0f} min on a Colab T4 (by its FLOPs). {COLAB_RUNTIME}")
        return None
    return run_experiment(name, profile, progress=progress)


QUANTITIES = {"loss": "training loss", "grad_norm": "gradient norm", "feature_norm": r"$\|h_i\|$ (geometric mean)",
              "fcd": "Fréchet classifier distance"}
"""What :func:`over_training` reads from a result, and the axis label of each."""


def over_training(result: ExperimentResult, quantity: str) -> pd.DataFrame:
    """One value per run and step, columns ``label, method, seed, step, value``: the training batch's
    ``loss`` or ``grad_norm`` (a running mean over a twentieth of the run), the decoder blocks'
    ``feature_norm`` on the fixed probe batch (paper Fig. 1's ``||h_i||``, geometric mean over the
    skips), or the ``fcd`` measured during training."""
    if quantity not in QUANTITIES:
        raise ValueError(f"unknown quantity {quantity!r}; choose one of {', '.join(QUANTITIES)}")
    methods = {r["label"]: r["run"]["method"] for r in result.runs}
    if quantity in ("loss", "grad_norm"):
        history = result.history()
        window = max(1, int(history.step.max()) // 20)
        value = history.groupby(["label", "seed"], sort=False)[quantity].transform(
            lambda s: s.rolling(window, min_periods=1).mean())
        frame = history[["label", "seed", "step"]].assign(value=value)
    elif quantity == "feature_norm":
        logs = features(result).assign(log=lambda f: np.log(f["norm"]))
        frame = logs.groupby(["label", "seed", "step"], sort=False).log.mean().map(np.exp).rename("value")
        frame = frame.reset_index()
    else:
        frame = fd_curves(result).rename(columns={"fcd": "value"})
    order = {label: i for i, label in enumerate(result.labels)}
    frame = frame.sort_values(["label", "seed", "step"], key=lambda c: c.map(order) if c.name == "label" else c)
    return frame.assign(method=frame.label.map(methods))[["label", "method", "seed", "step", "value"]]


def plot_curves(frame: pd.DataFrame, quantity: str, ax: Axes) -> Axes:
    """:func:`over_training`'s ``frame`` on ``ax``: every seed a thin line, the median over seeds bold,
    one colour per method (:func:`scalelong_edu.figures.draw_seeds_and_median`), log scale."""
    methods = frame.drop_duplicates("label").set_index("label").method
    draw_seeds_and_median(ax, frame, list(methods.index), {label: method_color(m) for label, m in methods.items()},
                          alpha=0.45)
    log_axis(ax)
    ax.set_xlabel("training step")
    ax.set_ylabel(QUANTITIES[quantity])
    legend_below(ax, ncol=2)
    return ax


def beside(draw: Callable[[Axes, Any], object], cpu: Any, live: Any | None,
           titles: tuple[str, str] = ("cpu profile (committed)", "gpu profile (live)")) -> Figure:
    """The same figure twice, side by side: ``draw(ax, cpu)`` and ``draw(ax, live)``. Where the live
    experiment was not trained (``live`` is ``None``), its panel says so instead of drawing."""
    fig, axes = plt.subplots(1, 2, figsize=(MAX_FIGURE_WIDTH, 3.4), constrained_layout=True)
    for ax, value, title in zip(axes, (cpu, live), titles):
        ax.set_title(title, fontsize=11)
        if value is None:
            ax.text(0.5, 0.5, "not trained here:\nit needs a GPU", ha="center", va="center", transform=ax.transAxes)
            ax.set_axis_off()
        else:
            draw(ax, value)
    return fig


def section_labels(chapter: int) -> list[str]:
    """The methods (run labels) of chapter ``chapter``'s "at GPU scale" experiment."""
    return [run.label for run in get_experiment(SECTIONS[chapter]).runs]


def curves_beside(chapter: int, quantity: str, cpu: ExperimentResult, live: ExperimentResult | None) -> Figure:
    """:func:`beside` for :func:`plot_curves` of ``quantity``, on the methods of chapter ``chapter``'s
    section (:func:`section_labels`)."""
    labels = section_labels(chapter)

    def draw(ax: Axes, result: ExperimentResult) -> None:
        frame = over_training(result, quantity)
        plot_curves(frame[frame.label.isin(labels)], quantity, ax)

    return beside(draw, cpu, live)


def samples(result: ExperimentResult | None, label: str) -> torch.Tensor | None:
    """The end-of-training samples of ``label``'s first seed, or ``None`` without a result."""
    return None if result is None else result.samples(label)


def robustness_beside(chapter: int, cpu: ExperimentResult, live: ExperimentResult | None,
                      quantity: str = "loss_change", ylabel: str = "rise of the loss") -> Figure:
    """:func:`beside` for paper Fig. 3c (:func:`scalelong_edu.figures.plot_robustness`): ``quantity``
    of the end-of-training robustness probe against the extra input noise, on the methods of chapter
    ``chapter``'s section."""
    labels = section_labels(chapter)
    colors = result_colors(cpu) | (result_colors(live) if live else {})

    def draw(ax: Axes, result: ExperimentResult) -> None:
        probes = result.probes()
        rows = probes[(probes.probe == "robustness") & probes.label.isin(labels)]
        plot_robustness(rows, quantity, ylabel, colors, ax=ax)

    return beside(draw, cpu, live)
