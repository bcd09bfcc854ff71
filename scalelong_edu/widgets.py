"""The kappa widgets of the book and their static figures (the theory they show: :mod:`.theory`).

* :func:`kappa_coefficients`, :func:`stream_coefficients`, :func:`kappa_table` -- the
  coefficients each constant method puts on the long skips (and, for the block-output scaling of
  Hanin & Rolnick, on the decoder stream), read from :mod:`scalelong_edu.scaling`, the one place
  that defines them.
* :func:`measured_kappas` -- the mean ``kappa_i`` a model applies to a batch (LS gates included).
* :func:`plot_kappas`, :func:`plot_cs_band` -- the static figures.
* :func:`kappa_explorer` -- the ipywidgets control (method, kappa, N) that redraws
  :func:`plot_kappas`; :meth:`KappaExplorer.show` displays the static figure first and the live
  widget below it, so a static book shows the default state even without a kernel.
"""

from __future__ import annotations

import io
import math
from typing import Callable, Sequence

import numpy as np
import pandas as pd
import torch
from torch import Tensor, nn

from .diagrams import skip_features
from .plotting import METHOD_COLORS
from .scaling import METHODS, BlockOutputScaling, check_kappa, make_scaling
from .theory import (
    PAPER_KAPPA_RANGE,
    SUM_KAPPA2_BAND,
    check_band,
    check_n_skips,
    cs_kappa_range,
    cs_sum_kappa_squared,
    sum_kappa_squared,
)

CONSTANT_METHODS = ("none", "sqrt2-cs", "cs", "block-output")
LEARNED_METHODS = ("ls", "ls-per-skip")

METHOD_LABELS = {
    "none": "none",
    "sqrt2-cs": "1/√2-CS",
    "cs": "CS",
    "ls": "LS (shared)",
    "ls-per-skip": "LS (per skip)",
    "block-output": "block-output (Hanin & Rolnick)",
}
"""How each method is named in figures and widget menus."""

LearnedKappas = Callable[[str, int], Sequence[float]]


# --------------------------------------------------------------------------------------------
# coefficients and the theory around sum kappa_i^2
# --------------------------------------------------------------------------------------------


def _check_method(method: str) -> str:
    if method not in METHODS:
        raise ValueError(f"unknown skip-scaling method {method!r}; choose one of {', '.join(METHODS)}")
    return method


def _bound_scaling(method: str, kappa: float, n_skips: int):
    n = check_n_skips(n_skips)
    kappa = check_kappa(kappa)
    if _check_method(method) in LEARNED_METHODS:
        raise ValueError(
            f"method {method!r} learns kappa_i (a gate per sample and channel/token); there is no fixed value. "
            "Measure it on a model and a batch with measured_kappas(model, x, t)"
        )
    scaling = make_scaling(method, kappa)
    scaling.bind([1] * n)
    return scaling, n


def kappa_coefficients(method: str, kappa: float = 0.5, n_skips: int = 6) -> list[float]:
    """The coefficients ``kappa_1 .. kappa_N`` that a constant method puts on the long skips.

    ``none``: all 1; ``sqrt2-cs``: all ``1/sqrt(2)``; ``cs``: ``kappa ** (i - 1)`` (Eq. 8);
    ``block-output``: all 1, because that method scales the decoder stream instead (see
    :func:`stream_coefficients`). ``ls`` and ``ls-per-skip`` raise: their coefficients are learned.

    Args:
        method: a name from :data:`scalelong_edu.scaling.METHODS`.
        kappa: the CS base (``cs``) or ``eta`` (``block-output``); must be > 0 for every method.
        n_skips: ``N`` >= 1.
    """
    scaling, n = _bound_scaling(method, kappa, n_skips)
    probe = torch.zeros(1, 1)
    return [float(scaling.kappa(probe, i)) for i in range(1, n + 1)]


def stream_coefficients(method: str, kappa: float = 0.5, n_skips: int = 6) -> list[float]:
    """The factors on the decoder stream arriving at ``b_1 .. b_N``: ``eta ** i`` for
    ``block-output`` (Hanin & Rolnick), 1 for every other constant method."""
    scaling, n = _bound_scaling(method, kappa, n_skips)
    if isinstance(scaling, BlockOutputScaling):
        return [float(scaling.stream_coefficient(i)) for i in range(1, n + 1)]
    return [1.0] * n


def kappa_table(n_skips: int = 6, kappa: float = 0.5,
                methods: Sequence[str | tuple[str, float]] = CONSTANT_METHODS) -> pd.DataFrame:
    """One row per constant method: ``kappa_1 .. kappa_N`` and ``sum_i kappa_i^2``.

    ``methods`` entries are names, or ``(name, kappa)`` pairs to show one method at several bases.
    ``block-output`` gets a second row with its stream factors ``eta_i`` (no sum there).
    """
    n = check_n_skips(n_skips)
    rows: dict[str, list[float]] = {}
    for entry in methods:
        method, k = (entry, kappa) if isinstance(entry, str) else entry
        values = kappa_coefficients(method, k, n)
        label = {"cs": f"cs, κ={k:g}", "block-output": f"block-output, η={k:g}"}.get(method, method)
        rows[label] = values + [sum_kappa_squared(values)]
        if method == "block-output":
            rows[f"  η_i on the stream (η={k:g})"] = stream_coefficients(method, k, n) + [math.nan]
    columns = [f"κ_{i}" for i in range(1, n + 1)] + ["Σκ_i²"]
    return pd.DataFrame.from_dict(rows, orient="index", columns=columns)


def measured_kappas(model: nn.Module, x: Tensor, t: Tensor, **kwargs) -> list[float]:
    """The mean ``kappa_i`` of every long skip for one batch, i = 1 first.

    Runs ``model(x, t)`` once, collects ``a_1(x) .. a_N(x)`` with forward hooks and asks
    ``model.scaling.effective_kappas``: the fixed value for constant methods, the batch-mean gate
    for LS.
    """
    return model.scaling.effective_kappas(skip_features(model, x, t, **kwargs)).tolist()


# --------------------------------------------------------------------------------------------
# figures
# --------------------------------------------------------------------------------------------


def _method_title(method: str, kappa: float) -> str:
    return {
        "none": r"none: $\kappa_i = 1$",
        "sqrt2-cs": r"1/√2-CS: $\kappa_i = 2^{-1/2}$",
        "cs": rf"CS, $\kappa = {kappa:g}$: $\kappa_i = \kappa^{{i-1}}$",
        "block-output": rf"block-output, $\eta = {kappa:g}$: skips unscaled, stream $\times\,\eta^i$",
        "ls": r"LS (shared): $\kappa_i$ is learned",
        "ls-per-skip": r"LS (per skip): $\kappa_i$ is learned",
    }[method]


def plot_kappas(method: str, kappa: float = 0.5, n_skips: int = 6, ax=None, *,
                learned: Sequence[float] | None = None, band: tuple[float, float] = SUM_KAPPA2_BAND):
    """Bars of ``kappa_i`` for skips i = 1 .. N and a gauge of ``sum_i kappa_i^2`` against ``band``.

    For ``block-output`` the skips keep ``kappa_i = 1`` and a dashed line shows the stream factors
    ``eta_i = eta ** i``. For LS the coefficients are learned: pass ``learned`` (e.g. the
    :func:`measured_kappas` of an untrained model) to draw them hatched, otherwise the figure says
    that they are learned and draws no bars.

    Returns:
        The Axes; the bars are ``ax.containers[0]`` and the gauge's title (gid ``"sum_kappa2"``)
        states the sum.
    """
    _check_method(method)
    kappa, n = check_kappa(kappa), check_n_skips(n_skips)
    lo, hi = check_band(band)
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(6.6, 3.6))
    idx = np.arange(1, n + 1)
    color = METHOD_COLORS.get(method, "#333333")
    values = None
    if method in LEARNED_METHODS:
        if learned is not None:
            values = [float(v) for v in learned]
            if len(values) != n or not all(math.isfinite(v) for v in values):
                raise ValueError(f"learned must hold {n} finite values (one per skip, i = 1 first), got {values}")
            bars = ax.bar(idx, values, color=color, hatch="//", edgecolor="white",
                          label=r"$\bar\kappa_i$: mean gate, untrained")
        else:
            ax.text(0.5, 0.42, "$\\kappa_i$ is learned by the calibration network,\nper sample and per channel/token.\n"
                    "See the LS chapter for trained gates.", transform=ax.transAxes, ha="center", va="center",
                    fontsize=10, color="#444444")
    else:
        values = kappa_coefficients(method, kappa, n)
        bars = ax.bar(idx, values, color=color, label=r"$\kappa_i$ on skip $i$")
        if method == "block-output":
            ax.plot(idx, stream_coefficients(method, kappa, n), "D--", color="#5e3c99", markersize=5,
                    label=r"$\eta_i = \eta^{\,i}$ on the decoder stream")
    if values is not None and n <= 10:
        ax.bar_label(bars, fmt="%.3g", fontsize=8, padding=2)
    top = max([1.0] + (values or []))
    ax.set_ylim(0, 1.75 * top)
    ax.set_xlim(0.4, n + 0.6)
    ax.set_xticks(idx if n <= 16 else idx[:: math.ceil(n / 16)])
    ax.set_xlabel("long skip i  (1 = outermost)")
    ax.set_ylabel(r"$\kappa_i$")
    ax.set_title(_method_title(method, kappa), fontsize=11)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="upper left", fontsize=8)

    if values is not None:
        total = sum_kappa_squared(values)
        inside = lo <= total <= hi
        gauge = ax.inset_axes([0.52, 0.84, 0.45, 0.06])
        left, right = min(0.5, total / 1.5), max(2 * hi, 1.5 * total)
        gauge.set_xscale("log")
        gauge.set_xlim(left, right)
        gauge.axvspan(lo, hi, color="#1a9850", alpha=0.3, lw=0)
        gauge.axvline(total, color="#1a9850" if inside else "#d73027", lw=3)
        gauge.set_yticks([])
        gauge.set_xticks([lo, hi])
        gauge.set_xticklabels([f"{lo:g}", f"{hi:g}"], fontsize=7)
        gauge.xaxis.set_minor_locator(plt.NullLocator())
        gauge.tick_params(axis="x", length=2, pad=1)
        gauge.grid(False)
        word = "inside" if inside else "outside"
        what = r"$\Sigma_i\,\bar\kappa_i^2$" if method in LEARNED_METHODS else r"$\Sigma_i\,\kappa_i^2$"
        gauge.set_title(f"{what} = {total:.3g}, {word} [{lo:g}, {hi:g}]", fontsize=8, pad=2,
                        color="#1a9850" if inside else "#d73027", gid="sum_kappa2")
    return ax


def plot_cs_band(n_values: Sequence[int] = (2, 4, 6, 8, 10, 12), ax=None, *,
                 band: tuple[float, float] = SUM_KAPPA2_BAND, kappa_max: float = 1.05):
    """``sum_i kappa_i^2`` under CS against ``kappa`` for several ``N``, the target band shaded,
    the ends of each :func:`cs_kappa_range` marked, and the paper's ``kappa`` range in grey."""
    lo, hi = check_band(band)
    ns = [check_n_skips(n) for n in n_values]
    if not ns:
        raise ValueError("n_values is empty: give at least one N")
    kappa_max = check_kappa(kappa_max, "kappa_max")
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(6.6, 3.8))
    grid = np.linspace(0.01, kappa_max, 400)
    ax.axhspan(lo, hi, color="#1a9850", alpha=0.15, lw=0, label=f"target band [{lo:g}, {hi:g}]")
    ax.axvspan(*PAPER_KAPPA_RANGE, color="#999999", alpha=0.15, lw=0,
               label=f"paper's κ range [{PAPER_KAPPA_RANGE[0]:g}, {PAPER_KAPPA_RANGE[1]:g}]")
    colors = plt.cm.viridis(np.linspace(0.05, 0.85, len(ns)))
    for n, c in zip(ns, colors):
        ax.plot(grid, [cs_sum_kappa_squared(k, n) for k in grid], color=c, lw=1.6, label=f"N = {n}")
        if n > 1 and hi > 1:
            k_lo, k_hi = cs_kappa_range(n, lo, hi)
            points = [(k, s) for k, s in ((k_lo, lo), (k_hi, hi)) if 0 < k <= kappa_max]
            if points:
                ax.plot(*zip(*points), "o", color=c, markersize=4)
    ax.set_ylim(0.8, 2 * hi)
    ax.set_xlim(0, kappa_max)
    ax.set_xlabel(r"CS base $\kappa$")
    ax.set_ylabel(r"$\Sigma_i\,\kappa_i^2$")
    ax.legend(fontsize=8, ncol=2, loc="upper left")
    return ax


# --------------------------------------------------------------------------------------------
# the widget
# --------------------------------------------------------------------------------------------

STATIC_NOTE = ("Static view of the default setting. In a running notebook (Colab, Binder or local) "
               "the controls redraw this figure.")


class KappaExplorer:
    """Method, kappa and N controls that redraw :func:`plot_kappas` into an image widget.

    The figure is rendered to PNG and placed in an ``ipywidgets.Image``, so the widget works (and
    can be tested) without a kernel, and a notebook executed with stored widget state shows the
    last drawn figure. Build one with :func:`kappa_explorer`.

    Attributes:
        method_control, kappa_control, n_control: the Dropdown and sliders.
        image: the ``ipywidgets.Image`` with the current figure.
        status: an ``ipywidgets.HTML`` line with ``sum kappa_i^2`` (or what went wrong).
        widget: the whole ``ipywidgets.VBox``.
        figure, ax: the matplotlib figure and axes of the last redraw.
        redraws: how many times the figure was drawn.
    """

    def __init__(self, method: str = "cs", kappa: float = 0.5, n_skips: int = 6,
                 learned: LearnedKappas | None = None):
        import ipywidgets as w

        _check_method(method)
        kappa, n = check_kappa(kappa), check_n_skips(n_skips)
        if learned is not None and not callable(learned):
            raise ValueError("learned must be a function (method, n_skips) -> N mean gates, or None")
        self.learned = learned
        self._learned_cache: dict[tuple[str, int], list[float] | None] = {}
        self.redraws = 0
        self.figure = self.ax = None
        self.method_control = w.Dropdown(options=[(METHOD_LABELS[m], m) for m in METHODS], value=method,
                                         description="method")
        self.kappa_control = w.FloatSlider(value=kappa, min=min(0.05, kappa), max=max(1.5, kappa), step=0.01,
                                           description="κ (η)", continuous_update=False, readout_format=".2f")
        self.n_control = w.IntSlider(value=n, min=1, max=max(16, n), description="N", continuous_update=False)
        self.image = w.Image(format="png", layout=w.Layout(max_width="680px"))
        self.status = w.HTML()
        self.widget = w.VBox([w.HBox([self.method_control, self.kappa_control, self.n_control]), self.image,
                              self.status])
        for control in (self.method_control, self.kappa_control, self.n_control):
            control.observe(self._on_change, names="value")
        self.redraw()

    @property
    def state(self) -> tuple[str, float, int]:
        """The current (method, kappa, N)."""
        return self.method_control.value, float(self.kappa_control.value), int(self.n_control.value)

    def _learned_values(self, method: str, n: int) -> list[float] | None:
        if method not in LEARNED_METHODS or self.learned is None:
            return None
        if (method, n) not in self._learned_cache:
            self._learned_cache[(method, n)] = [float(v) for v in self.learned(method, n)]
        return self._learned_cache[(method, n)]

    def draw(self, ax) -> None:
        """Draw the current state into ``ax``."""
        method, kappa, n = self.state
        plot_kappas(method, kappa, n, ax, learned=self._learned_values(method, n))

    def redraw(self) -> None:
        """Draw the current state into a fresh figure and put it into the image widget."""
        from matplotlib.figure import Figure

        method, kappa, n = self.state
        fig = Figure(figsize=(6.6, 3.6))
        ax = fig.subplots()
        try:
            self.draw(ax)
        except Exception as exc:  # a failing `learned` callable must not kill the widget
            ax.clear()
            ax.text(0.5, 0.5, f"could not draw: {exc}", ha="center", va="center", transform=ax.transAxes, wrap=True)
            self.status.value = f"<span style='color:#d73027'>{type(exc).__name__}: {exc}</span>"
        else:
            learned = self._learned_values(method, n)
            values = learned if method in LEARNED_METHODS else kappa_coefficients(method, kappa, n)
            if values is None:
                self.status.value = "κ_i is learned by LS; no fixed value to sum."
            else:
                total = sum_kappa_squared(values)
                lo, hi = SUM_KAPPA2_BAND
                word = "inside" if lo <= total <= hi else "outside"
                what = "Σ (mean gate)<sup>2</sup>" if method in LEARNED_METHODS else "Σ κ<sub>i</sub><sup>2</sup>"
                self.status.value = f"{what} = {total:.4g}, {word} the band [{lo:g}, {hi:g}] of the paper's Section 4.1"
        buffer = io.BytesIO()
        fig.savefig(buffer, format="png", dpi=100, bbox_inches="tight")
        self.image.value = buffer.getvalue()
        self.figure, self.ax = fig, ax
        self.redraws += 1

    def _on_change(self, change) -> None:
        self.redraw()

    def static_figure(self):
        """A pyplot figure of the current state with a note that it is static; returns the figure."""
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6.6, 3.6))
        self.draw(ax)
        fig.text(0.01, -0.03, STATIC_NOTE, fontsize=8, style="italic", color="#555555", ha="left", va="top")
        return fig

    def show(self) -> None:
        """Display the static figure of the current state, then the live widget below it."""
        import matplotlib.pyplot as plt
        from IPython.display import display

        fig = self.static_figure()
        display(fig)
        plt.close(fig)
        display(self.widget)

    def _ipython_display_(self) -> None:
        self.show()


def kappa_explorer(method: str = "cs", kappa: float = 0.5, n_skips: int = 6,
                   learned: LearnedKappas | None = None) -> KappaExplorer:
    """A :class:`KappaExplorer` at the given state: pick a method, move kappa and N, watch
    ``kappa_i`` and ``sum_i kappa_i^2``.

    Args:
        method: the initial method (a name from :data:`scalelong_edu.scaling.METHODS`).
        kappa: the initial CS base (also ``eta`` for ``block-output``), > 0.
        n_skips: the initial ``N`` >= 1.
        learned: optional ``f(method, N) -> N values`` giving LS coefficients to show (e.g. the
            :func:`measured_kappas` of an untrained model); results are cached per (method, N).

    Displaying the returned object (last line of a cell, or ``.show()``) shows the static figure
    first and the live widget below it.
    """
    return KappaExplorer(method, kappa, n_skips, learned)


__all__ = [
    "CONSTANT_METHODS", "LEARNED_METHODS", "METHOD_LABELS", "kappa_coefficients", "stream_coefficients",
    "kappa_table", "measured_kappas", "plot_kappas", "plot_cs_band", "KappaExplorer", "kappa_explorer",
]
