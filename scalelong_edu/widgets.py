"""The kappa widgets of the book and their static figures (the theory they show: :mod:`.theory`).

* :func:`kappa_coefficients`, :func:`stream_coefficients` -- the coefficients each constant method
  puts on the long skips and on the decoder stream (only the block-output scaling of Hanin &
  Rolnick scales the stream), read from :mod:`scalelong_edu.scaling`, the one place that defines
  them; :func:`kappa_table` -- the resulting total factor on every path and ``sum_i kappa_i^2``.
* :func:`measured_kappas` -- the effective ``kappa_i`` a model applies to a batch (LS gates included).
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
from .plotting import METHOD_COLORS, legend_below
from .scaling import METHODS, Statistic, check_kappa, constant_scaling, path_factors
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


def kappa_coefficients(method: str, kappa: float = 0.5, n_skips: int = 6) -> list[float]:
    """The coefficients ``kappa_1 .. kappa_N`` that a constant method puts on the long skips themselves.

    ``none``: all 1; ``sqrt2-cs``: all ``1/sqrt(2)``; ``cs``: ``kappa ** (i - 1)`` (Eq. 8);
    ``block-output``: all 1, because that method scales the decoder stream instead (see
    :func:`stream_coefficients`; the total factor on each path is
    :func:`scalelong_edu.scaling.path_factors`). ``ls`` and ``ls-per-skip`` raise: their
    coefficients are learned.

    Args:
        method: a name from :data:`scalelong_edu.scaling.METHODS`.
        kappa: the CS base (``cs``) or ``eta`` (``block-output``); must be > 0 for every method.
        n_skips: ``N`` >= 1.
    """
    scaling = constant_scaling(_check_method(method), kappa, n_skips)
    probe = torch.zeros(1, 1)
    return [float(scaling.kappa(probe, i)) for i in range(1, scaling.n_skips + 1)]


def stream_coefficients(method: str, kappa: float = 0.5, n_skips: int = 6) -> list[float]:
    """The factor on the decoder stream entering ``b_1 .. b_N``: ``eta`` at every merge for
    ``block-output`` (Hanin & Rolnick), 1 for every other constant method."""
    scaling = constant_scaling(_check_method(method), kappa, n_skips)
    return [scaling.stream_factor(i) for i in range(1, scaling.n_skips + 1)]


def kappa_table(n_skips: int = 6, kappa: float = 0.5,
                methods: Sequence[str | tuple[str, float]] = CONSTANT_METHODS) -> pd.DataFrame:
    """One row per constant method: the total factor on every path of Eq. (3) and ``sum_i kappa_i^2``.

    Columns ``skip 1 .. skip N`` are the effective ``kappa_i``, the total factor on the path through skip
    ``i`` (:func:`scalelong_edu.scaling.path_factors`): the coefficient on the skip itself for the
    skip-scaling methods, and ``eta ** (i - 1)`` for ``block-output``, whose skips are unscaled but
    whose paths ride the stream through ``i - 1`` merges scaled by ``eta``. Column ``B`` is
    the factor on the path through the bottleneck: 1 except for ``block-output`` (``eta ** N``).
    ``Σκ_i² (paths)`` sums the squared skip-path factors, the paper's ``sum_i kappa_i^2`` (Theorem 3.1);
    for ``block-output`` it is that sum read over paths, which is what ``kappa_i`` stands for when
    the merges are linear, and it equals CS's at ``eta = kappa``. Like the paper's sum it leaves
    the bottleneck out (the paper's methods all leave it at 1).

    ``methods`` entries are names, or ``(name, kappa)`` pairs to show one method at several bases.
    """
    n = check_n_skips(n_skips)
    rows: dict[str, list[float]] = {}
    for entry in methods:
        method, k = (entry, kappa) if isinstance(entry, str) else entry
        factors = path_factors(_check_method(method), k, n)
        label = {"cs": f"cs, κ={k:g}", "block-output": f"block-output, η={k:g}"}.get(method, method)
        rows[label] = factors + [sum_kappa_squared(factors[:n])]
    columns = [f"skip {i}" for i in range(1, n + 1)] + ["B", "Σκ_i² (paths)"]
    return pd.DataFrame.from_dict(rows, orient="index", columns=columns)


def measured_kappas(model: nn.Module, x: Tensor, t: Tensor, statistic: Statistic = "mean",
                    **kwargs) -> list[float]:
    """The effective ``kappa_i`` of every long skip for one batch, i = 1 first.

    Runs ``model(x, t, **kwargs)`` once, collects ``a_1(x) .. a_N(x)`` with forward hooks and asks
    ``model.scaling.effective_kappas``: the total factor on each skip's path, which for LS is the
    gate averaged over samples and channels/tokens. With ``statistic="rms"`` LS gives
    ``sqrt(E[kappa_i^2])``, whose squares sum to the LS value of ``sum_i kappa_i^2``; constant methods
    give the same numbers either way.
    """
    return model.scaling.effective_kappas(skip_features(model, x, t, **kwargs), statistic).tolist()


# --------------------------------------------------------------------------------------------
# figures
# --------------------------------------------------------------------------------------------


def _method_title(method: str, kappa: float) -> str:
    return {
        "none": r"none: $\kappa_i = 1$",
        "sqrt2-cs": r"1/√2-CS: $\kappa_i = 2^{-1/2}$",
        "cs": rf"CS, $\kappa = {kappa:g}$: $\kappa_i = \kappa^{{i-1}}$",
        "block-output": rf"block-output, $\eta = {kappa:g}$: stream $\times\,\eta$ at every merge",
        "ls": r"LS (shared): $\kappa_i$ is learned",
        "ls-per-skip": r"LS (per skip): $\kappa_i$ is learned",
    }[method]


def _profile(method: str, kappa: float, n: int, learned: Sequence[float] | None) -> list[float] | None:
    """The bars of :func:`plot_kappas`: the skip-path factors of a constant method, the validated
    ``learned`` values of LS, or None for LS without them."""
    if method not in LEARNED_METHODS:
        return path_factors(method, kappa, n)[:n]
    if learned is None:
        return None
    values = [float(v) for v in learned]
    if len(values) != n or not all(math.isfinite(v) for v in values):
        raise ValueError(f"learned must hold {n} finite values (one per skip, i = 1 first), got {values}")
    return values


def plot_kappas(method: str, kappa: float = 0.5, n_skips: int = 6, ax=None, *,
                learned: Sequence[float] | None = None, band: tuple[float, float] = SUM_KAPPA2_BAND):
    """Bars of the effective ``kappa_i`` for skips i = 1 .. N and a gauge of ``sum_i kappa_i^2`` against ``band``.

    The bars are the total factor on each skip's path (:func:`kappa_table`'s columns). For
    ``block-output`` the skips themselves are unscaled and the bars come from the factor ``eta`` on
    the stream at every merge; the legend adds the bottleneck path's ``eta ** N``.
    For LS the coefficients are learned: pass ``learned``, the RMS gates ``sqrt(E[kappa_i^2])`` (e.g.
    ``measured_kappas(model, x, t, statistic="rms")`` of an untrained model), to draw them hatched;
    otherwise the figure says that they are learned and draws no bars.

    Returns:
        The Axes; the bars are ``ax.containers[0]`` and the gauge's title (gid ``"sum_kappa2"``)
        states the sum.
    """
    _check_method(method)
    kappa, n = check_kappa(kappa), check_n_skips(n_skips)
    lo, hi = check_band(band)
    values = _profile(method, kappa, n, learned)
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(6.6, 3.6))
    idx = np.arange(1, n + 1)
    color = METHOD_COLORS.get(method, "#333333")
    if values is None:
        ax.text(0.5, 0.42, "$\\kappa_i$ is learned by the calibration network,\nper sample and per channel/token.\n"
                "See the LS chapter for trained gates.", transform=ax.transAxes, ha="center", va="center",
                color="#444444")
    elif method in LEARNED_METHODS:
        bars = ax.bar(idx, values, color=color, hatch="//", edgecolor="white",
                      label=r"RMS gate $\sqrt{\mathrm{E}[\kappa_i^2]}$, untrained")
    elif method == "block-output":
        bars = ax.bar(idx, values, color=color, label=rf"total factor on skip $i$'s path, $\eta^{{i-1}}$; "
                      rf"bottleneck path $\eta^{{{n}}}$ = {path_factors(method, kappa, n)[n]:.3g}")
    else:
        bars = ax.bar(idx, values, color=color, label=r"$\kappa_i$ on skip $i$")
    if values is not None and n <= 10:
        ax.bar_label(bars, fmt="%.3g", fontsize="small", padding=2)
    top = max([1.0] + (values or []))
    ax.set_ylim(0, 1.6 * top)
    ax.set_xlim(0.4, n + 0.6)
    ax.set_xticks(idx if n <= 16 else idx[:: math.ceil(n / 16)])
    ax.set_xlabel("long skip i  (1 = outermost)")
    ax.set_ylabel(r"effective $\kappa_i$")
    ax.set_title(_method_title(method, kappa))
    if ax.get_legend_handles_labels()[0]:
        legend_below(ax, ncol=1)

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
        gauge.set_xticklabels([f"{lo:g}", f"{hi:g}"], fontsize="small")
        gauge.xaxis.set_minor_locator(plt.NullLocator())
        gauge.tick_params(axis="x", length=2, pad=1)
        gauge.grid(False)
        word = "inside" if inside else "outside"
        what = r"$\Sigma_i\,\mathrm{E}[\kappa_i^2]$" if method in LEARNED_METHODS else r"$\Sigma_i\,\kappa_i^2$"
        gauge.set_title(f"{what} = {total:.3g}, {word} [{lo:g}, {hi:g}]", fontsize="small", pad=2,
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
    legend_below(ax, ncol=3)
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
            raise ValueError("learned must be a function (method, n_skips) -> N RMS gates, or None")
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
            values = _profile(method, kappa, n, self._learned_values(method, n))
            if values is None:
                self.status.value = "κ_i is learned by LS; no fixed value to sum."
            else:
                total = sum_kappa_squared(values)
                lo, hi = SUM_KAPPA2_BAND
                word = "inside" if lo <= total <= hi else "outside"
                what = "Σ E[κ<sub>i</sub><sup>2</sup>]" if method in LEARNED_METHODS else "Σ κ<sub>i</sub><sup>2</sup>"
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
        fig.text(0.01, -0.03, STATIC_NOTE, fontsize="small", style="italic", color="#555555", ha="left", va="top")
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
        learned: optional ``f(method, N) -> N values`` giving LS coefficients to show, the RMS gates
            (e.g. ``measured_kappas(model, x, t, statistic="rms")`` of an untrained model); results
            are cached per (method, N).

    Displaying the returned object (last line of a cell, or ``.show()``) shows the static figure
    first and the live widget below it.
    """
    return KappaExplorer(method, kappa, n_skips, learned)


__all__ = [
    "CONSTANT_METHODS", "LEARNED_METHODS", "METHOD_LABELS", "kappa_coefficients", "stream_coefficients",
    "kappa_table", "measured_kappas", "plot_kappas", "plot_cs_band", "KappaExplorer", "kappa_explorer",
]
