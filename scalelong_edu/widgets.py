"""The kappa widgets of the book and their static figures (the theory they show: :mod:`.theory`).

* :func:`kappa_coefficients`, :func:`stream_coefficients` -- the coefficients each constant method
  puts on the long skips and on the decoder stream (only the block-output scaling of Hanin &
  Rolnick scales the stream), read from :mod:`scalelong_edu.scaling`, the one place that defines
  them; :func:`kappa_table` -- the resulting total factor on every path and ``sum_i kappa_i^2``.
* :func:`measured_kappas` -- the effective ``kappa_i`` a model applies to a batch (LS gates included).
* :func:`plot_kappas`, :func:`plot_cs_band`, :func:`plot_sum_kappa2` -- the static figures.
* :class:`FreshNorms`, :func:`norms_batch`, :func:`plot_hidden_norms` -- the squared norms of the
  hidden features ``h_i`` (decoder-block outputs) of a freshly initialised U-ViT with ``N`` skips
  on one fixed batch, for a method and for no scaling: the quantity of Theorem 3.1 at init.
* :func:`kappa_explorer` -- the ipywidgets control (method, kappa, N) that redraws
  :func:`plot_kappas` (with ``norms=True``: the profile, ``sum_i kappa_i^2`` against the band and
  the hidden-feature norms, three panels); :meth:`KappaExplorer.show` displays the static figure
  first and the live widget below it, so a static book shows the default state even without a kernel.
* :func:`prune_widget_state` -- keep in an executed notebook only the saved widget state that a
  displayed output needs, so that a page without a visible widget loads no widget manager.
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
from .models import PRESETS, UViT, build_model
from .plotting import legend_below, log_axis, method_color
from .probes import FeatureNorms
from .scaling import METHODS, Statistic, check_kappa, constant_scaling, make_scaling, path_factors
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


def _short_label(method: str) -> str:
    """:data:`METHOD_LABELS` without the long credit of block-output, for one-line summaries."""
    return "block-output" if method == "block-output" else METHOD_LABELS[method]


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
        label = {"cs": f"CS, κ = {k:g}", "block-output": f"block-output, η = {k:g}"}.get(method, _short_label(method))
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
                learned: Sequence[float] | None = None, band: tuple[float, float] = SUM_KAPPA2_BAND,
                gauge: bool = True):
    """Bars of the effective ``kappa_i`` for skips i = 1 .. N and a gauge of ``sum_i kappa_i^2`` against ``band``.

    The bars are the total factor on each skip's path (:func:`kappa_table`'s columns). For
    ``block-output`` the skips themselves are unscaled and the bars come from the factor ``eta`` on
    the stream at every merge; the legend adds the bottleneck path's ``eta ** N``.
    For LS the coefficients are learned: pass ``learned``, the RMS gates ``sqrt(E[kappa_i^2])`` (e.g.
    ``measured_kappas(model, x, t, statistic="rms")`` of an untrained model), to draw them hatched;
    otherwise the figure says that they are learned and draws no bars.

    ``gauge=False`` leaves the gauge out (the explorer's three-panel figure draws the sum in a
    panel of its own, :func:`plot_sum_kappa2`).

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
    color = method_color(method)
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

    if values is not None and gauge:
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


def _sum_kappa2_curve(method: str, n: int, grid: np.ndarray) -> np.ndarray:
    """``sum_i kappa_i^2`` of a constant method with ``N = n`` at every base in ``grid``."""
    if method in ("cs", "block-output"):  # the same skip-path factors kappa^(i-1) (eta^(i-1))
        return np.array([cs_sum_kappa_squared(float(k), n) for k in grid])
    return np.full(len(grid), sum_kappa_squared(path_factors(method, 1.0, n)[:n]))  # kappa is not used


def plot_sum_kappa2(method: str, kappa: float = 0.5, n_skips: int = 6, ax=None, *,
                    learned: Sequence[float] | None = None, band: tuple[float, float] = SUM_KAPPA2_BAND,
                    kappa_max: float | None = None):
    """``sum_i kappa_i^2`` of one method and ``N`` against the base ``kappa``, the band shaded, the
    current ``kappa`` marked: the gauge of :func:`plot_kappas` as a panel of its own.

    The curve sums the squared skip-path factors (:func:`kappa_table`'s last column) over a grid of
    ``kappa`` in ``(0, kappa_max]`` (default ``max(1.5, 1.1 * kappa)``); for ``none`` and ``sqrt2-cs``,
    which do not use ``kappa``, it is flat. LS draws the flat line of ``sum_i E[kappa_i^2]`` of the
    RMS gates ``learned``, or says that the gates are learned. Log-scaled ``y``.

    Returns:
        The Axes; the marker of the current value has gid ``"current"`` and the title (gid
        ``"sum_kappa2"``) states the sum and whether it lies inside ``band``.
    """
    _check_method(method)
    kappa, n = check_kappa(kappa), check_n_skips(n_skips)
    lo, hi = check_band(band)
    kappa_max = check_kappa(kappa_max, "kappa_max") if kappa_max is not None else max(1.5, 1.1 * kappa)
    values = _profile(method, kappa, n, learned)
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(6.6, 3.6))
    color = method_color(method)
    ax.axhspan(lo, hi, color="#1a9850", alpha=0.15, lw=0, label=f"target band [{lo:g}, {hi:g}]")
    ax.axvspan(*PAPER_KAPPA_RANGE, color="#999999", alpha=0.15, lw=0,
               label=f"paper's κ range [{PAPER_KAPPA_RANGE[0]:g}, {PAPER_KAPPA_RANGE[1]:g}]")
    ax.set_xlim(0, kappa_max)
    ax.set_xlabel(r"CS base $\kappa$ ($\eta$ for block-output)")
    ax.set_ylabel(r"$\Sigma_i\,\kappa_i^2$")
    if values is None:
        ax.set_ylim(0.5, 2 * hi)
        ax.text(0.5, 0.5, r"LS learns $\kappa_i$: no fixed sum", transform=ax.transAxes, ha="center", va="center",
                color="#444444")
        ax.set_title(r"$\Sigma_i\,\mathrm{E}[\kappa_i^2]$ depends on the learned gates", gid="sum_kappa2")
    else:
        total = sum_kappa_squared(values)
        grid = np.linspace(0.01, kappa_max, 300)
        if method in LEARNED_METHODS:
            curve = np.full(len(grid), total)
            label = rf"{METHOD_LABELS[method]}: $\Sigma_i\,\mathrm{{E}}[\kappa_i^2]$, untrained (κ not used)"
        else:
            curve = _sum_kappa2_curve(method, n, grid)
            unused = "" if method in ("cs", "block-output") else " (κ not used)"
            label = f"{METHOD_LABELS[method]}, N = {n}{unused}"
        ax.plot(grid, curve, color=color, lw=1.8, label=label)
        inside = lo <= total <= hi
        ax.plot([kappa], [total], "o", color=color, markersize=8, markeredgecolor="black", gid="current",
                label=f"this setting, κ = {kappa:g}")
        log_axis(ax, "y")
        ax.set_ylim(min(0.8, 0.7 * float(min(curve.min(), total))), max(2 * hi, 1.6 * total))
        word = "inside" if inside else "outside"
        what = r"$\Sigma_i\,\mathrm{E}[\kappa_i^2]$" if method in LEARNED_METHODS else r"$\Sigma_i\,\kappa_i^2$"
        ax.set_title(f"{what} = {total:.3g}, {word} the band [{lo:g}, {hi:g}]",
                     color="#1a9850" if inside else "#d73027", gid="sum_kappa2")
    legend_below(ax, ncol=2)
    return ax


# --------------------------------------------------------------------------------------------
# hidden-feature norms of a freshly initialised model (Theorem 3.1 at init)
# --------------------------------------------------------------------------------------------

NORMS_PRESET = "uvit-ci"
"""The backbone of :class:`FreshNorms`: a small U-ViT (patch 4, width 64), ``depth = 2N``."""

NORMS_SEED = 0
"""The seed of every model :class:`FreshNorms` builds (the same backbone weights for every method)."""


def norms_batch(n: int = 16, image_size: int = 16, seed: int = 0, images: Tensor | None = None,
                dataset: str = "digits8x8") -> tuple[Tensor, Tensor]:
    """The fixed batch of :class:`FreshNorms`: ``(x_t, t)`` with ``t`` the model times.

    ``x0`` are the first ``n`` of ``images`` (default: the test split of the offline ``dataset`` at
    ``image_size``), ``t`` spreads evenly over the 1000 steps of the linear schedule and the noise
    comes from a generator seeded with ``seed`` (:func:`scalelong_edu.probes.probe_batch`); then
    ``x_t = q_sample(x0, t, eps)``. No global random state is used or changed.
    """
    from .data import load_dataset
    from .diffusion import linear_schedule, q_sample
    from .probes import probe_batch

    if images is None:
        images = load_dataset(dataset, "test", image_size=image_size).tensors()[0]
    schedule = linear_schedule()
    x0, t, eps = probe_batch(images, n, schedule, seed)
    return q_sample(x0, t, schedule, eps), schedule.model_time(t)


class FreshNorms:
    """``||h_i||^2 / ||x_t||^2`` of a freshly initialised U-ViT with ``N`` long skips, per skip i.

    ``h_i`` is the output of decoder block ``b_i`` (i = 1 outermost), the hidden feature whose
    squared norm Theorem 3.1 bounds by ``O(||x_t||^2 sum_{j >= i} kappa_j^2)``. Calling
    ``fresh(method, kappa, N)`` builds ``preset`` with ``depth = 2N`` under ``torch.manual_seed(seed)``
    (inside :func:`torch.random.fork_rng`, so the caller's random state is left alone), runs it once
    in eval mode on the fixed batch and returns the batch mean of the per-sample ``||h_i||^2``
    (:class:`scalelong_edu.probes.FeatureNorms`' ``sq_norm``), divided by the batch mean of
    ``||x_t||^2``, i = 1 first: exactly the ``hidden_sq_i`` columns of
    :func:`scalelong_edu.diagrams.init_norms` for ``depth=2N``.

    What it shows at init (checked in ``tests/test_widgets.py`` on the default batch): for
    ``kappa < 1`` CS gives smaller ``||h_i||^2`` than no scaling for every ``i >= 2``, while ``h_1``
    (``kappa_1 = 1``) stays within a few per cent; the means shrink far less than the bound's
    factor ``sum_{j >= i} kappa_j^2`` does, because the theorem bounds the norms, it does not give them.

    Every method gets the same backbone weights (a model creates its scaling's parameters last),
    so a constant method reuses the backbone of ``N`` with its own scaling swapped in; results are
    cached per (method, kappa, N) and the last few models per N, so a widget redraw costs one
    small forward pass at most.

    Args:
        x_t, t: the fixed batch (B, C, H, W) and its model times (B,); default :func:`norms_batch`.
        preset: a U-ViT key of :data:`scalelong_edu.models.PRESETS`; default :data:`NORMS_PRESET`.
        seed: seeds the initialisation; default :data:`NORMS_SEED`.
    """

    MAX_MODELS = 4

    def __init__(self, x_t: Tensor | None = None, t: Tensor | None = None, *, preset: str = NORMS_PRESET,
                 seed: int = NORMS_SEED):
        if (x_t is None) != (t is None):
            raise ValueError("pass both x_t and t (the model times), or neither for the default batch")
        if x_t is None:
            x_t, t = norms_batch()
        if not isinstance(x_t, Tensor) or x_t.dim() != 4:
            raise ValueError(f"x_t must be a batch of images (B, C, H, W), got {getattr(x_t, 'shape', x_t)!r}")
        if not isinstance(t, Tensor) or t.shape != x_t.shape[:1]:
            raise ValueError(f"t must hold one model time per image, shape ({x_t.shape[0]},), got {t!r}")
        if preset not in PRESETS or PRESETS[preset][0] is not UViT:
            uvits = [name for name, (cls, _) in PRESETS.items() if cls is UViT]
            raise ValueError(f"preset must be a U-ViT preset (depth = 2N), one of {', '.join(uvits)}; got {preset!r}")
        self.x_t, self.t, self.preset, self.seed = x_t.detach(), t.detach(), preset, int(seed)
        self.x_sq = self.x_t.flatten(1).square().sum(1).mean().item()
        self._models: dict[tuple, nn.Module] = {}
        self._results: dict[tuple, list[float]] = {}

    def _build(self, method: str, kappa: float, n: int) -> nn.Module:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed)
            model = build_model(self.preset, self.x_t.shape[1], self.x_t.shape[-1], method, kappa, depth=2 * n)
        return model.to(self.x_t.device).eval()

    def _cached_model(self, key: tuple, method: str, kappa: float, n: int) -> nn.Module:
        model = self._models.pop(key, None)
        if model is None:
            model = self._build(method, kappa, n)
        self._models[key] = model  # most recently used last
        while len(self._models) > self.MAX_MODELS:
            del self._models[next(iter(self._models))]
        return model

    def model(self, method: str, kappa: float, n_skips: int) -> nn.Module:
        """The freshly initialised model of (method, kappa, N), as :meth:`__call__` measures it.

        The constant methods share one cached backbone per N: the next call may swap its scaling.
        """
        _check_method(method)
        kappa, n = check_kappa(kappa), check_n_skips(n_skips)
        if method in LEARNED_METHODS:  # the gates' initialisation follows the backbone's: build it whole
            return self._cached_model((method, n), method, kappa, n)
        model = self._cached_model(("backbone", n), "none", kappa, n)
        scaling = make_scaling(method, kappa)
        scaling.bind(model.scaling.widths)
        model.scaling = scaling
        return model

    def __call__(self, method: str, kappa: float = 0.5, n_skips: int = 6) -> list[float]:
        """``||h_i||^2 / ||x_t||^2`` (batch means) for i = 1 .. N."""
        _check_method(method)
        kappa, n = check_kappa(kappa), check_n_skips(n_skips)
        key = (method, kappa if method in ("cs", "block-output") else None, n)  # others ignore kappa
        if key not in self._results:
            model = self.model(method, kappa, n)
            with torch.no_grad(), FeatureNorms(model) as probe:
                model(self.x_t, self.t)
            decoder = sorted((r["skip"], r["value"]) for r in probe.rows
                             if r["block"] == "b" and r["quantity"] == "sq_norm")
            self._results[key] = [value / self.x_sq for _, value in decoder]
        return list(self._results[key])


def plot_hidden_norms(norms: Sequence[float], method: str = "cs", kappa: float = 0.5, ax=None, *,
                      reference: Sequence[float] | None = None):
    """``||h_i||^2 / ||x_t||^2`` per skip i at initialisation (:class:`FreshNorms`), log scale.

    ``norms`` are the method's values (i = 1 first), ``reference`` the same for ``none`` (drawn
    dashed; left out when ``method`` is ``none``). The legend's title compares the mean over i of
    the two with the ratio of their ``sum_i kappa_i^2`` (constant methods), the factor that
    Theorem 3.1 puts on ``||x_t||^2`` in its bound.

    Returns:
        The Axes; the lines have gids ``"norms_method"`` and ``"norms_none"``.
    """
    _check_method(method)
    kappa = check_kappa(kappa)
    values = [float(v) for v in norms]
    if not values:
        raise ValueError("norms is empty: give one value per skip, i = 1 first")
    n = len(values)
    if not all(math.isfinite(v) and v > 0 for v in values):
        raise ValueError(f"norms must be finite numbers > 0, one per skip, got {values}")
    if method == "none":
        reference = None
    if reference is not None:
        reference = [float(v) for v in reference]
        if len(reference) != n or not all(math.isfinite(v) and v > 0 for v in reference):
            raise ValueError(f"reference must hold {n} finite numbers > 0 (the norms of none), got {reference}")
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(6.6, 3.6))
    idx = np.arange(1, n + 1)
    if reference is not None:
        ax.plot(idx, reference, "s--", color=method_color("none"), lw=1.4, markersize=5, gid="norms_none",
                label="none")
    ax.plot(idx, values, "o-", color=method_color(method), lw=1.8, markersize=6,
            gid="norms_method", label=METHOD_LABELS[method])
    log_axis(ax, "y")
    ax.set_xlim(0.4, n + 0.6)
    ax.set_xticks(idx if n <= 16 else idx[:: math.ceil(n / 16)])
    ax.set_xlabel(r"long skip i  ($h_i$ = output of decoder block $b_i$)")
    ax.set_ylabel(r"$\|h_i\|^2 / \|x_t\|^2$ (batch mean)")
    ax.set_title(f"hidden features of a fresh U-ViT, N = {n}")
    title = None
    if reference is not None:
        mean_ratio = float(np.mean(values) / np.mean(reference))
        title = f"mean over i: {_short_label(method)} / none = {mean_ratio:.2g}"
        if method not in LEARNED_METHODS:
            k2 = sum_kappa_squared(path_factors(method, kappa, n)[:n])
            title += rf";  $\Sigma_i\,\kappa_i^2$: {k2:.3g} / {n} = {k2 / n:.2g}"
    legend_below(ax, ncol=2, title=title)
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

    With ``norms`` (``True`` for the default :class:`FreshNorms`, or a :class:`FreshNorms`), the
    figure has three panels, one above the other: (a) the ``kappa_i`` profile
    (:func:`plot_kappas` without its gauge), (b) ``sum_i kappa_i^2`` against ``kappa`` and the band
    (:func:`plot_sum_kappa2`), (c) ``||h_i||^2 / ||x_t||^2`` of a freshly initialised U-ViT with N
    skips, for the method and for ``none`` (:func:`plot_hidden_norms`).

    Attributes:
        method_control, kappa_control, n_control: the Dropdown and sliders.
        image: the ``ipywidgets.Image`` with the current figure.
        status: an ``ipywidgets.HTML`` line with ``sum kappa_i^2`` (or what went wrong).
        widget: the whole ``ipywidgets.VBox``.
        figure, ax: the matplotlib figure and the profile's axes of the last redraw.
        axes: all axes of the last redraw, ``(ax,)`` or the three panels (a), (b), (c).
        norms: the :class:`FreshNorms` of panel (c), or None.
        redraws: how many times the figure was drawn.
    """

    def __init__(self, method: str = "cs", kappa: float = 0.5, n_skips: int = 6,
                 learned: LearnedKappas | None = None, *, norms: bool | FreshNorms = False):
        import ipywidgets as w

        _check_method(method)
        kappa, n = check_kappa(kappa), check_n_skips(n_skips)
        if learned is not None and not callable(learned):
            raise ValueError("learned must be a function (method, n_skips) -> N RMS gates, or None")
        if not isinstance(norms, (bool, FreshNorms)):
            raise ValueError(f"norms must be True, False or a FreshNorms, got {norms!r}")
        self.norms: FreshNorms | None = FreshNorms() if norms is True else (norms or None)
        self.learned = learned
        self._learned_cache: dict[tuple[str, int], list[float] | None] = {}
        self.redraws = 0
        self.figure = self.ax = None
        self.axes: tuple = ()
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

    @property
    def figsize(self) -> tuple[float, float]:
        """The figure size: one panel, or three stacked."""
        return (6.6, 11.4) if self.norms is not None else (6.6, 3.6)

    def _learned_values(self, method: str, n: int) -> list[float] | None:
        if method not in LEARNED_METHODS or self.learned is None:
            return None
        if (method, n) not in self._learned_cache:
            self._learned_cache[(method, n)] = [float(v) for v in self.learned(method, n)]
        return self._learned_cache[(method, n)]

    def hidden_norms(self) -> tuple[list[float], list[float]]:
        """Panel (c)'s numbers at the current state: ``||h_i||^2 / ||x_t||^2`` for the method and for
        ``none``, i = 1 first."""
        if self.norms is None:
            raise RuntimeError("this explorer has no norms panel; build it with norms=True")
        method, kappa, n = self.state
        return self.norms(method, kappa, n), self.norms("none", kappa, n)

    def _subplots(self, fig):
        """The axes of the figure: one, or the three panels stacked."""
        if self.norms is None:
            return (fig.subplots(),)
        # a fixed layout (room for each panel's legend below it): a third faster than constrained layout
        return tuple(fig.subplots(3, 1, gridspec_kw=dict(height_ratios=(1.0, 1.0, 1.15), hspace=0.62, top=0.97,
                                                          bottom=0.06, left=0.12, right=0.97)))

    def draw(self, ax) -> None:
        """Draw the current state into ``ax``: one Axes gets the profile with its gauge, a sequence
        of three gets panels (a), (b) and (c)."""
        method, kappa, n = self.state
        learned = self._learned_values(method, n)
        if not isinstance(ax, (list, tuple, np.ndarray)):
            plot_kappas(method, kappa, n, ax, learned=learned)
            return
        axes = list(ax)
        if len(axes) != 3 or self.norms is None:
            raise ValueError("draw takes one Axes, or three (a, b, c) when the explorer has norms=True")
        plot_kappas(method, kappa, n, axes[0], learned=learned, gauge=False)
        plot_sum_kappa2(method, kappa, n, axes[1], learned=learned)
        values, reference = self.hidden_norms()
        plot_hidden_norms(values, method, kappa, axes[2], reference=reference)
        for letter, panel in zip("abc", axes):
            panel.set_title(f"({letter}) {panel.get_title()}")

    def _status(self) -> str:
        method, kappa, n = self.state
        values = _profile(method, kappa, n, self._learned_values(method, n))
        if values is None:
            line = "κ_i is learned by LS; no fixed value to sum."
        else:
            total = sum_kappa_squared(values)
            lo, hi = SUM_KAPPA2_BAND
            word = "inside" if lo <= total <= hi else "outside"
            what = "Σ E[κ<sub>i</sub><sup>2</sup>]" if method in LEARNED_METHODS else "Σ κ<sub>i</sub><sup>2</sup>"
            line = f"{what} = {total:.4g}, {word} the band [{lo:g}, {hi:g}] of the paper's Section 4.1"
        if self.norms is None:
            return line
        mine, none = (float(np.mean(v)) for v in self.hidden_norms())
        head = "fresh U-ViT, mean over i of ‖h<sub>i</sub>‖²/‖x<sub>t</sub>‖²:"
        if method == "none":
            return f"{line}<br>{head} {none:.3g}"
        return f"{line}<br>{head} {_short_label(method)} {mine:.3g}, none {none:.3g} (×{mine / none:.2g})"

    def redraw(self) -> None:
        """Draw the current state into a fresh figure and put it into the image widget."""
        from matplotlib.figure import Figure

        fig = Figure(figsize=self.figsize)
        axes = self._subplots(fig)
        try:
            self.draw(axes[0] if len(axes) == 1 else axes)
            status = self._status()
        except Exception as exc:  # a failing `learned` callable must not kill the widget
            for panel in axes:
                panel.clear()
            axes[0].text(0.5, 0.5, f"could not draw: {exc}", ha="center", va="center", transform=axes[0].transAxes,
                         wrap=True)
            self.status.value = f"<span style='color:#d73027'>{type(exc).__name__}: {exc}</span>"
        else:
            self.status.value = status
        buffer = io.BytesIO()
        fig.savefig(buffer, format="png", dpi=100, bbox_inches="tight")
        self.image.value = buffer.getvalue()
        self.figure, self.ax, self.axes = fig, axes[0], axes
        self.redraws += 1

    def _on_change(self, change) -> None:
        self.redraw()

    def static_figure(self):
        """A pyplot figure of the current state with a note that it is static; returns the figure."""
        import matplotlib.pyplot as plt

        fig = plt.figure(figsize=self.figsize)
        axes = self._subplots(fig)
        self.draw(axes[0] if len(axes) == 1 else axes)
        y = -0.03
        if len(axes) > 1:  # below panel (c)'s legend, wherever the style's font sizes put it
            fig.draw_without_rendering()
            y = axes[-1].get_tightbbox().y0 / fig.bbox.height - 0.005
        fig.text(0.01, y, STATIC_NOTE, fontsize="small", style="italic", color="#555555", ha="left", va="top")
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
                   learned: LearnedKappas | None = None, *, norms: bool | FreshNorms = False) -> KappaExplorer:
    """A :class:`KappaExplorer` at the given state: pick a method, move kappa and N, watch
    ``kappa_i`` and ``sum_i kappa_i^2`` (and, with ``norms``, the hidden features of a fresh model).

    Args:
        method: the initial method (a name from :data:`scalelong_edu.scaling.METHODS`).
        kappa: the initial CS base (also ``eta`` for ``block-output``), > 0.
        n_skips: the initial ``N`` >= 1.
        learned: optional ``f(method, N) -> N values`` giving LS coefficients to show, the RMS gates
            (e.g. ``measured_kappas(model, x, t, statistic="rms")`` of an untrained model); results
            are cached per (method, N).
        norms: ``True`` adds panels (b) ``sum_i kappa_i^2`` against ``kappa`` and the band and (c)
            ``||h_i||^2 / ||x_t||^2`` of a freshly initialised U-ViT with N skips (:class:`FreshNorms`:
            ``uvit-ci``, ``depth = 2N``, seed 0, 16 test digits at 16 px with ``t`` spread over the
            schedule), for the method and for ``none``; or pass a :class:`FreshNorms` of your own
            (another batch, preset or seed). Every number is seeded, so the figure is reproducible.

    Displaying the returned object (last line of a cell, or ``.show()``) shows the static figure
    first and the live widget below it.
    """
    return KappaExplorer(method, kappa, n_skips, learned, norms=norms)


WIDGET_STATE = "application/vnd.jupyter.widget-state+json"
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
HIDDEN_OUTPUT_TAGS = frozenset({"remove-output", "remove-cell"})


def _displayed_views(nb) -> set[str]:
    """Model ids of the widget views in the outputs that the book shows (not tagged remove-output)."""
    return {output["data"][WIDGET_VIEW]["model_id"]
            for cell in nb.cells if cell.cell_type == "code"
            and not HIDDEN_OUTPUT_TAGS & set(cell.metadata.get("tags", []))
            for output in cell.get("outputs", []) if WIDGET_VIEW in output.get("data", {})}


def _referenced_models(state: dict) -> set[str]:
    """The model ids that a widget model's state names (its children, layout, style: ``IPY_MODEL_<id>``)."""
    found: set[str] = set()
    stack: list = [state]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, str) and item.startswith("IPY_MODEL_"):
            found.add(item.removeprefix("IPY_MODEL_"))
    return found


def prune_widget_state(nb) -> int:
    """Drop from ``nb.metadata.widgets`` every saved widget model that no displayed output needs.

    Executing a notebook with ``store_widget_state=True`` saves the state of every widget alive in the
    kernel, also of widgets whose output the book removes (tag ``remove-output``); myst-nb then loads
    RequireJS and the 4 MB widget manager for state nobody sees. Kept: the models of the widget views
    of shown outputs and every model they reference. With nothing to keep, ``metadata.widgets`` goes.
    Returns the number of models dropped; ``nb`` (an ``nbformat`` notebook) is changed in place.
    """
    saved = nb.metadata.get("widgets", {}).get(WIDGET_STATE, {}).get("state", {})
    keep, todo = set(), list(_displayed_views(nb))
    while todo:
        model = todo.pop()
        if model in saved and model not in keep:
            keep.add(model)
            todo.extend(_referenced_models(saved[model]))
    dropped = len(saved) - len(keep)
    if keep:
        nb.metadata["widgets"][WIDGET_STATE]["state"] = {m: saved[m] for m in saved if m in keep}
    else:
        nb.metadata.pop("widgets", None)
    return dropped


__all__ = [
    "CONSTANT_METHODS", "LEARNED_METHODS", "METHOD_LABELS", "kappa_coefficients", "stream_coefficients",
    "kappa_table", "measured_kappas", "plot_kappas", "plot_cs_band", "plot_sum_kappa2", "NORMS_PRESET", "NORMS_SEED",
    "norms_batch", "FreshNorms", "plot_hidden_norms", "KappaExplorer", "kappa_explorer",
    "prune_widget_state",
]
