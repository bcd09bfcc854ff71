"""The figures of the theorem chapters: evidence from cached runs, drawn one way.

Every function takes the tidy frames of :mod:`scalelong_edu.evidence` and returns the figure or
axes it drew, in the book's style (:func:`scalelong_edu.plotting.use_book_style`). Methods keep
one colour across all figures (:func:`method_colors`), and legends sit below the axes so that
they cover no curve.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Mapping, Sequence

import matplotlib.pyplot as plt
import numpy as np
import seaborn as sns

from .plotting import legend_below, log_axis, method_color, pretty

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from .evidence import MethodSummary
    from .experiments import ExperimentResult
    from .stats import PairedTest


def method_colors(labels: Sequence[str]) -> dict[str, tuple]:
    """One colour per method label, in legend order (seaborn's ``colorblind`` palette)."""
    return dict(zip(labels, sns.color_palette("colorblind", len(labels))))


def result_colors(result: ExperimentResult) -> dict[str, str]:
    """Each label of ``result`` in the fixed colour of its runs' method
    (:data:`scalelong_edu.plotting.METHOD_COLORS`): the colours of chapter 3's opening figure, for
    results with one label per method, such as the main comparisons."""
    return {r["label"]: method_color(r["run"]["method"]) for r in result.runs}


def plot_xt_ratio(frames: Mapping[str, pd.DataFrame], ax: Axes | None = None) -> Axes:
    """Lemma 3.2: measured ``||x_t||^2 / m`` (mean, 5-95% band) and its exact expectation (dashed)
    against ``t``, one colour per dataset (:func:`scalelong_edu.evidence.xt_norm_ratio` frames)."""
    if ax is None:
        _, ax = plt.subplots()
    for (name, frame), color in zip(frames.items(), sns.color_palette("colorblind", len(frames))):
        ax.plot(frame.t, frame["mean"], color=color, lw=2, label=f"{name}: measured")
        ax.fill_between(frame.t, frame.q05, frame.q95, color=color, alpha=0.2, lw=0)
        ax.plot(frame.t, frame.expected, color="black", lw=1, ls="--")
    ax.plot([], [], color="black", lw=1, ls="--", label="exact expectation")
    ax.axhline(1.0, color="grey", lw=0.8, ls=":")
    ax.set_xlabel("diffusion step $t$")
    ax.set_ylabel(r"$\|x_t\|_2^2 / m$")
    legend_below(ax, ncol=2)
    return ax


def plot_over_training(
    frames: Mapping[str, pd.DataFrame], value: str, labels: Sequence[str], ylabel: str, log: bool = True
) -> Figure:
    """A grid of panels, one row per frame (e.g. regime) and one column per method: ``value``
    against step, one line per skip (mean over seeds, band from the lowest to the highest seed).
    Each frame needs ``label, seed, step, skip`` and ``value`` columns."""
    fig, axes = plt.subplots(len(frames), len(labels), figsize=(10, 2.4 * len(frames) + 0.7), sharex=True,
                             sharey="row", squeeze=False)
    skips = sorted({s for f in frames.values() for s in f.skip.dropna().unique()})
    colors = dict(zip(skips, sns.color_palette("viridis", len(skips))))
    for row, (title, frame) in zip(axes, frames.items()):
        for ax, label in zip(row, labels):
            for skip in skips:
                by_step = frame[(frame.label == label) & (frame.skip == skip)].groupby("step")[value]
                mean, low, high = by_step.mean(), by_step.min(), by_step.max()
                ax.plot(mean.index, mean, color=colors[skip], lw=1.3, label=f"skip {skip}")
                ax.fill_between(mean.index, low, high, color=colors[skip], alpha=0.15, lw=0)
            ax.set_title(f"{pretty(label)}\n{title}", fontsize=10)
            if log:
                log_axis(ax)
        row[0].set_ylabel(ylabel)
    for ax in axes[-1]:
        ax.set_xlabel("step")
    handles, names = axes[0, 0].get_legend_handles_labels()
    fig.legend(handles, names, loc="lower center", ncol=min(len(skips), 6), frameon=False)
    fig.tight_layout(rect=(0, 0.6 / fig.get_figheight(), 1, 1))
    return fig


def draw_seeds_and_median(ax: Axes, frame: pd.DataFrame, labels: Sequence[str], colors: Mapping[str, str],
                          alpha: float = 0.35, x: str = "step", marker: str | None = None) -> dict[str, int]:
    """``value`` against ``x`` of ``frame`` (columns ``label, seed, value`` and ``x``) on ``ax``:
    every seed of every label in ``labels`` a thin line, the median over seeds bold (with
    ``marker`` at each ``x``), one colour per label. Returns each label's number of seeds."""
    counts = {}
    for label in labels:
        runs = frame[frame.label == label].pivot_table(index=x, columns="seed", values="value")
        counts[label] = runs.shape[1]
        ax.plot(runs.index, runs.to_numpy(), color=colors[label], lw=0.6, alpha=alpha)
        ax.plot(runs.index, runs.median(axis=1), color=colors[label], lw=2.2, marker=marker, label=pretty(label))
    return counts


def _seeds_title(title: str | None, counts: Mapping[str, int]) -> str:
    """A panel's title, then how many seeds each label's median pools (once, if all the same)."""
    n = next(iter(counts.values()), 0)
    seeds = (f"median of {n} seed{'s' * (n != 1)}" if len(set(counts.values())) == 1
             else "seeds: " + ", ".join(f"{pretty(label)} {count}" for label, count in counts.items()))
    return "\n".join(filter(None, [title, seeds]))


def _legend_under(fig: Figure, ncol: int) -> None:
    """The panels' legend entries, each once, centred under the whole figure, below its panels."""
    entries = {}
    for ax in fig.axes:
        for handle, name in zip(*ax.get_legend_handles_labels()):
            entries.setdefault(name, handle)
    fig.tight_layout(rect=(0, 0.35 / fig.get_figheight(), 1, 1))
    fig.legend(list(entries.values()), list(entries), loc="lower center", bbox_to_anchor=(0.5, 0), ncol=ncol,
               frameon=False)


def plot_seeds_and_median(paths: pd.DataFrame, labels: Sequence[str], series: Sequence[tuple[str, str]],
                          colors: Mapping[str, str], titles: Mapping[str, str] | None = None,
                          log: bool = True) -> Figure:
    """One panel per ``(series, ylabel)`` of ``paths`` (:func:`scalelong_edu.evidence.fig1_paths`),
    :func:`draw_seeds_and_median` (on a log axis unless ``log`` is false). Each panel's title says
    how many seeds its medians pool (panels may hold different seeds), after ``titles[series]``."""
    fig, axes = plt.subplots(1, len(series), figsize=(7.0, 3.4), sharex=True, squeeze=False)
    for ax, (name, ylabel) in zip(axes[0], series):
        counts = draw_seeds_and_median(ax, paths[paths.series == name], labels, colors)
        ax.set_title(_seeds_title((titles or {}).get(name), counts), fontsize=10)
        if log:
            log_axis(ax)
        ax.set_xlabel("step")
        ax.set_ylabel(ylabel)
    _legend_under(fig, min(len(labels), 3))
    return fig


def plot_seed_ratios(panels: Sequence[tuple[str, pd.DataFrame, str, str]], colors: Mapping[str, str],
                     ylabel: str) -> Figure:
    """One panel per ``(title, frame, x, xlabel)``: each seed's ratio to its baseline run
    (:func:`scalelong_edu.evidence.seed_ratios`, with a ``label`` column) against the setting
    ``x`` (e.g. the depth ``N`` or ``kappa``), drawn by :func:`draw_seeds_and_median` for the labels
    of ``colors`` that the frame holds, on a log axis with no difference (ratio 1) dotted. A seed's
    line going up means that run lost ground to its baseline as ``x`` changed."""
    fig, axes = plt.subplots(1, len(panels), figsize=(7.0, 3.4), sharey=True, squeeze=False)
    for ax, (title, frame, x, xlabel) in zip(axes[0], panels):
        labels = [label for label in colors if label in set(frame.label)]
        counts = draw_seeds_and_median(ax, frame, labels, colors, x=x, marker="o")
        ax.axhline(1.0, color="grey", lw=0.8, ls=":")
        ax.set_xticks(sorted(frame[x].unique()))
        ax.set_title(_seeds_title(title, counts), fontsize=10)
        ax.set_xlabel(xlabel)
        log_axis(ax)
    axes[0, 0].set_ylabel(ylabel)
    _legend_under(fig, min(len(colors), 3))
    return fig


def plot_ratio_sets(sets: Mapping[str, tuple[Sequence[float], PairedTest]], color: str, ylabel: str,
                    ax: Axes | None = None) -> Axes:
    """Paired ratios measured on separate sets of seeds, side by side (e.g. a pilot and the declared
    confirmations that re-test it on fresh seeds): per set ``name: (ratios, test)``, every seed's
    ratio to its baseline run as a dot (spread sideways in order of size, so that none hides
    another), and beside them the geometric mean with its 95% interval from the set's log-scale
    paired test (:func:`scalelong_edu.evidence.compare`), on a log axis with no difference (ratio 1)
    dotted. Each set's tick says how many seeds it holds.

    Raises:
        ValueError: a set's ratios are not the ``test.n`` pairs its test was run on.
    """
    if ax is None:
        _, ax = plt.subplots(figsize=(5.0, 3.4))
    for x, (name, (ratios, test)) in enumerate(sets.items()):
        ratios = np.sort(np.asarray(ratios, dtype=float))
        if len(ratios) != test.n:
            raise ValueError(f"set {name!r}: {len(ratios)} ratios but its test has {test.n} pairs; pass the ratios "
                             "of the seeds the test was run on")
        ax.plot(x + np.linspace(-0.2, 0.1, len(ratios)), ratios, "o", color=color, alpha=0.5, ms=4)
        mean, (lo, hi) = np.exp(test.estimate), np.exp(test.ci)
        ax.errorbar(x + 0.25, mean, yerr=[[mean - lo], [hi - mean]], fmt="D", color="black", ms=5, capsize=4)
    ax.axhline(1.0, color="grey", lw=0.8, ls=":")
    ax.set_xticks(range(len(sets)), [f"{name}\n{test.n} seeds" for name, (_, test) in sets.items()])
    ax.set_xlim(-0.5, max(len(sets), 1) - 0.5)
    ax.set_ylabel(ylabel)
    log_axis(ax)
    return ax


def plot_intervals(
    panels: Mapping[str, Mapping[str, MethodSummary]], xlabel: str | Sequence[str],
    colors: Mapping[str, tuple] | None = None, ncols: int = 2,
) -> Figure:
    """Forest plot: per method a dot at the mean over seeds and a bar for its 95% interval, one
    panel per setting (e.g. backbone and regime), ``ncols`` panels a row; ``xlabel`` is shared or
    one per panel. Methods with diverged runs say how many in their label."""
    nrows, rows = -(-len(panels) // ncols), max(len(p) for p in panels.values())
    fig, axes = plt.subplots(nrows, min(ncols, len(panels)), figsize=(9, nrows * (0.42 * rows + 1.3)), squeeze=False)
    for ax in axes.flat[len(panels):]:
        ax.set_visible(False)
    xlabels = [xlabel] * len(panels) if isinstance(xlabel, str) else list(xlabel)
    colors = colors or method_colors(list(dict.fromkeys(label for p in panels.values() for label in p)))
    for ax, (title, summaries), label_x in zip(axes.flat, panels.items(), xlabels):
        for y, (label, s) in enumerate(summaries.items()):
            if s.summary is None:
                ax.annotate("no interval", (0.5, y), xycoords=("axes fraction", "data"), ha="center", va="center",
                            fontsize=10, color="grey")
                continue
            lo, hi = s.summary.interval()
            ax.plot([lo, hi], [y, y], color=colors[label], lw=3, solid_capstyle="butt")
            ax.plot(s.summary.mean, y, "o", color=colors[label], ms=7)
            ax.plot(s.summary.values, [y] * s.summary.n, "|", color="black", ms=8)
        names = [f"{label} ({s.diverged} diverged)" if s.diverged else label for label, s in summaries.items()]
        ax.set_yticks(range(len(summaries)), [pretty(name) for name in names])
        ax.invert_yaxis()
        ax.set_title(title, fontsize=11)
        ax.set_xlabel(label_x)
    fig.tight_layout()
    return fig


def plot_against_tail_sum(
    frame: pd.DataFrame, value: str, ylabel: str, colors: Mapping[str, tuple], marker_by: str | None = None
) -> Axes:
    """``value`` against ``S_i = sum_{j >= i} kappa_j^2`` on log-log axes, one point per row,
    coloured by method and, with ``marker_by``, one marker shape per value of that column (e.g.
    backbone and regime): the comparison Theorems 3.1 and 3.3 invite."""
    _, ax = plt.subplots(figsize=(7, 4.4))
    groups = list(dict.fromkeys(frame[marker_by])) if marker_by else [None]
    markers = dict(zip(groups, "os^Dv<>p"))
    for label, rows in frame.groupby("label", sort=False):
        for group in groups:
            part = rows if marker_by is None else rows[rows[marker_by] == group]
            if len(part):
                ax.scatter(part.S, part[value], s=22, color=colors[label], marker=markers[group], alpha=0.8,
                           edgecolor="none")
    log_axis(ax, "x")
    log_axis(ax, "y")
    ax.set_xlabel(r"$S_i = \sum_{j \geq i} \kappa_j^2$")
    ax.set_ylabel(ylabel)
    handles = [plt.Line2D([], [], ls="", marker="o", color=c, label=pretty(label)) for label, c in colors.items()
               if label in set(frame.label)]
    if marker_by:
        handles += [plt.Line2D([], [], ls="", marker=markers[g], color="grey", label=str(g)) for g in groups]
    legend_below(ax, ncol=3, handles=handles)
    return ax


def plot_robustness(
    frame: pd.DataFrame, quantity: str, ylabel: str, colors: Mapping[str, tuple], ax: Axes | None = None
) -> Axes:
    """Theorem 3.4 / paper Fig. 3c: ``quantity`` against ``sigma``, per method the mean over seeds
    and its 95% interval (``frame``: robustness probe rows with ``label, seed, sigma``), on ``ax``
    or a new figure."""
    from scipy.stats import t as student

    if ax is None:
        _, ax = plt.subplots(figsize=(7, 4))
    rows = frame[frame.quantity == quantity]
    for label, by_label in rows.groupby("label", sort=False):
        stats = by_label.groupby("sigma").value.agg(["mean", "sem", "count"])
        half = stats["sem"].fillna(0) * student.ppf(0.975, np.maximum(stats["count"] - 1, 1))
        ax.plot(stats.index, stats["mean"], "o-", color=colors[label], label=label, ms=4)
        ax.fill_between(stats.index, stats["mean"] - half, stats["mean"] + half, color=colors[label], alpha=0.15, lw=0)
    ax.set_xlabel(r"extra noise $\sigma_\delta$")
    ax.set_ylabel(ylabel)
    legend_below(ax, ncol=3)
    return ax


def plot_robustness_by_backbone(frames: Mapping[str, pd.DataFrame], quantity: str, ylabel: str,
                                colors: Mapping[str, tuple]) -> Figure:
    """:func:`plot_robustness` side by side, one panel per ``frames`` entry (title: its key, e.g.
    the backbone's name), a shared y axis and one legend, under the first panel."""
    fig, axes = plt.subplots(1, len(frames), figsize=(10, 4), sharey=True, squeeze=False)
    for ax, (title, frame) in zip(axes[0], frames.items()):
        plot_robustness(frame, quantity, ylabel, colors, ax=ax)
        ax.set_title(title)
    for ax in axes[0, 1:]:
        ax.get_legend().remove()
    return fig


def plot_fd_curves(curves: pd.DataFrame, colors: Mapping[str, tuple], ax: Axes | None = None) -> Axes:
    """The Frechet classifier distance against training step (:func:`scalelong_edu.evidence.fd_curves`):
    per method the mean over seeds and a band from the lowest to the highest seed, log scale."""
    if ax is None:
        _, ax = plt.subplots(figsize=(7, 4))
    for label, rows in curves.groupby("label", sort=False):
        by_step = rows.groupby("step").fcd
        mean = by_step.mean()
        ax.plot(mean.index, mean, "o-", ms=3, color=colors[label], label=label)
        ax.fill_between(mean.index, by_step.min(), by_step.max(), color=colors[label], alpha=0.12, lw=0)
    log_axis(ax)
    ax.set_xlabel("training step")
    ax.set_ylabel("Fréchet classifier distance")
    legend_below(ax, ncol=3)
    return ax


def plot_kappa_profile(
    kappas: pd.DataFrame, colors: Mapping[str, tuple], references: Mapping[str, Sequence[float]],
    ax: Axes | None = None,
) -> Axes:
    """Effective ``kappa_i`` against skip ``i``: per method (``kappas``: columns ``label, seed, skip,
    kappa``) the mean over seeds with the seeds as small dots, and dashed ``references`` (name ->
    ``kappa_1 .. kappa_N``, e.g. a CS profile), on a log scale where a geometric profile is a line."""
    if ax is None:
        _, ax = plt.subplots(figsize=(7, 4))
    for label, rows in kappas.groupby("label", sort=False):
        mean = rows.groupby("skip").kappa.mean()
        ax.plot(mean.index, mean, "o-", color=colors[label], label=label)
        ax.plot(rows.skip, rows.kappa, ".", color=colors[label], alpha=0.5, ms=4)
    for (name, values), style in zip(references.items(), ("--", ":", "-.")):
        ax.plot(range(1, len(values) + 1), values, style, color="black", lw=1, label=name)
    log_axis(ax)
    ax.set_xlabel("skip $i$ (1 = outermost)")
    ax.set_ylabel(r"effective $\kappa_i$")
    legend_below(ax, ncol=2)
    return ax


__all__ = ["method_colors", "plot_against_tail_sum", "plot_fd_curves", "plot_intervals", "plot_kappa_profile",
           "plot_over_training", "plot_robustness", "plot_xt_ratio"]


def plot_sweep(
    summary: pd.DataFrame, x: str, colors: Mapping[str, tuple], ax: Axes | None = None, ylabel: str = ""
) -> Axes:
    """A sweep's summary (:func:`scalelong_edu.sweeps.summarize`) against the swept setting ``x``
    (e.g. ``"N"`` or ``"kappa"``): per method the mean over seeds with its 95% interval as error
    bars, slightly offset sideways so that the bars of different methods do not hide each other."""
    if ax is None:
        _, ax = plt.subplots(figsize=(7, 4))
    methods = list(dict.fromkeys(summary.method))
    values = np.sort(summary[x].unique())
    step = np.diff(values).min() if len(values) > 1 else 1.0
    for k, method in enumerate(methods):
        rows = summary[summary.method == method].sort_values(x)
        shift = (k - (len(methods) - 1) / 2) * 0.06 * step
        ax.errorbar(rows[x] + shift, rows["mean"], yerr=[rows["mean"] - rows.lo, rows.hi - rows["mean"]],
                    fmt="o-", ms=4, capsize=3, color=colors[method], label=method)
    ax.set_xticks(values)
    ax.set_xlabel(x)
    ax.set_ylabel(ylabel)
    legend_below(ax, ncol=min(4, len(methods)))
    return ax


def plot_stability_maps(stability: pd.DataFrame, ncols: int = 2) -> Figure:
    """One heat map per method of :func:`scalelong_edu.sweeps.stability_map`: learning-rate factor
    (rows) by number of long skips ``N`` (columns), coloured by the share of seeds whose training
    was unstable and annotated ``unstable / runs``."""
    methods = list(dict.fromkeys(stability.method))
    nrows = -(-len(methods) // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(3.6 * ncols, 2.8 * nrows), squeeze=False,
                             sharex=True, sharey=True, constrained_layout=True)
    for ax, method in zip(axes.flat, methods):
        rows = stability[stability.method == method]
        share = rows.pivot(index="lr_scale", columns="N", values="share").sort_index(ascending=False)
        text = rows.unstable.astype(str) + "/" + rows.runs.astype(str)
        notes = rows.assign(text=text).pivot(index="lr_scale", columns="N", values="text").loc[share.index]
        sns.heatmap(share, vmin=0, vmax=1, cmap="rocket_r", annot=notes, fmt="", cbar=False, ax=ax,
                    linewidths=0.5, linecolor="white")
        ax.set_title(pretty(method))
        ax.set_xlabel("N (long skips)")
        ax.set_ylabel("learning rate ×")
        ax.set_yticklabels([f"{v:g}" for v in share.index], rotation=0)
    for ax in axes.flat[len(methods):]:
        ax.set_visible(False)
    return fig


def plot_breakdown_search(table: pd.DataFrame, threshold: float, chosen: float | None = None,
                          ax: Axes | None = None) -> Axes:
    """The map of a stress search (``run_table`` of ``stress-search-uvit``): every run's final
    training loss against its learning-rate factor ``lr_scale`` (log axes), runs that broke down as
    crosses, the breakdown ``threshold`` dashed, ``broke down / runs`` above each factor, and the
    factor the rule ``chosen`` (:func:`scalelong_edu.evidence.breakdown_scale`) shaded. A diverged
    run, which has no final loss, is drawn at the top of the axes."""
    if ax is None:
        _, ax = plt.subplots(figsize=(6.0, 3.4))
    scales = np.sort(table.lr_scale.unique())
    top = max(float(table.loss.max()), threshold) * 2
    for broke, marker, name in ((False, "o", "trains"), (True, "x", "breaks down")):
        rows = table[table.broke_down == broke]
        if len(rows):
            ax.scatter(rows.lr_scale, rows.loss.fillna(top), marker=marker, s=28, alpha=0.8,
                       color="C3" if broke else "C0", label=name, zorder=3)
    ax.axhline(threshold, ls="--", lw=1, color="0.4", label=f"breakdown threshold {threshold:g}")
    for scale, rows in table.groupby("lr_scale"):
        ax.annotate(f"{int(rows.broke_down.sum())}/{len(rows)}", (scale, 1.0), xycoords=("data", "axes fraction"),
                    xytext=(0, 2), textcoords="offset points", ha="center", va="bottom")
    if chosen is not None:
        ax.axvspan(chosen / 1.08, chosen * 1.08, color="C2", alpha=0.2, lw=0, label=f"chosen: ×{chosen:g}")
    ax.set_xscale("log")
    ax.set_xticks(scales, [f"×{s:g}" for s in scales])
    ax.tick_params(axis="x", which="minor", bottom=False, labelbottom=False)
    log_axis(ax)
    ax.set_ylim(top=top * 1.3)
    ax.set_xlabel("learning rate, in multiples of the gentle one")
    ax.set_ylabel("final training loss")
    legend_below(ax, ncol=2)
    return ax


def plot_breakdown_pairs(table: pd.DataFrame, labels: Sequence[str], seeds: Sequence[int], rates: pd.DataFrame,
                         colors: Mapping[str, tuple]) -> Figure:
    """A stress comparison run by run (``run_table`` of ``breakdown-uvit``) and as rates. Left: one
    row per method in ``labels``, one column per planned seed (``seeds``, e.g. ``range(10)``; the
    pairs an exact McNemar test compares; more than 12 are labelled every fifth and drawn smaller),
    a dot for a run that trained, a black cross for one that broke down,
    nothing where the run has not landed. Right: each method's breakdown rate with its exact 95%
    interval (``rates``, from :func:`scalelong_edu.evidence.breakdown_rates`), ``broke / runs``
    beside it."""
    seeds = list(seeds)
    size = min(1.0, 12 / len(seeds))  # markers shrink as the columns crowd
    fig, (grid, bars) = plt.subplots(1, 2, figsize=(7.0, 0.5 * len(labels) + 1.4), sharey=True,
                                     gridspec_kw={"width_ratios": (3, 2)})
    for y, label in enumerate(labels):
        mine = table[table.label == label]
        trained, broke = mine.seed[~mine.broke_down], mine.seed[mine.broke_down]
        grid.scatter(trained, np.full(len(trained), y), s=34 * size, color=colors[label], zorder=3)
        grid.scatter(broke, np.full(len(broke), y), marker="x", s=50 * size, lw=1 + size, color="k", zorder=3)
        if len(mine):
            r = rates.loc[mine.method.iloc[0]]
            bars.errorbar(r.rate, y, xerr=[[r.rate - r.lo], [r.hi - r.rate]], fmt="o", color=colors[label], capsize=3)
            bars.annotate(f"{int(r.broke)}/{int(r.runs)}", (1.0, y), xycoords=("axes fraction", "data"),
                          xytext=(4, 0), textcoords="offset points", va="center")
    grid.set_xticks(seeds if len(seeds) <= 12 else [s for s in seeds if s % 5 == 0])
    grid.set_xlim(min(seeds) - 0.6, max(seeds) + 0.6)
    grid.set_yticks(range(len(labels)), [pretty(label) for label in labels])
    grid.set_ylim(len(labels) - 0.5, -0.5)
    grid.set_xlabel("seed (× = broke down)")
    grid.grid(False)
    bars.set_xlim(0, 1)
    bars.set_xlabel("breakdown rate")
    fig.tight_layout()
    return fig
