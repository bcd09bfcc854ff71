"""Tests of scalelong_edu.figures: colours per method, Lemma 3.2's figure, curves over training, forest plots
of intervals, points against the tail sum, robustness curves (Agg backend and closing: conftest.py)."""

import matplotlib.pyplot as plt
import pandas as pd
import pytest
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from scalelong_edu.evidence import MethodSummary, breakdown_rates
from scalelong_edu.figures import (
    method_colors,
    plot_against_tail_sum,
    plot_breakdown_pairs,
    plot_breakdown_search,
    plot_fd_curves,
    plot_intervals,
    plot_kappa_profile,
    plot_over_training,
    plot_ratio_sets,
    plot_robustness,
    plot_robustness_by_backbone,
    plot_seed_ratios,
    plot_seeds_and_median,
    plot_stability_maps,
    plot_sweep,
    plot_xt_ratio,
    result_colors,
)
from scalelong_edu.stats import mean_se, paired_test

LABELS = ["none", "CS", "LS"]


def legend_texts(legend):
    return [t.get_text() for t in legend.get_texts()]


def test_result_colors_follow_each_runs_method():
    from scalelong_edu.experiments import ExperimentResult
    from scalelong_edu.plotting import METHOD_COLORS

    runs = [{"label": label, "run": {"method": method}}
            for label, method in (("none", "none"), ("CS (kappa=0.5)", "cs"))]
    colors = result_colors(ExperimentResult(spec={}, provenance={}, runs=runs))
    assert colors == {"none": METHOD_COLORS["none"], "CS (kappa=0.5)": METHOD_COLORS["cs"]}


def test_method_colors_one_distinct_colour_per_label_in_order():
    colors = method_colors(LABELS)
    assert list(colors) == LABELS
    assert len(set(colors.values())) == 3
    assert method_colors(LABELS[:2]) == {k: colors[k] for k in LABELS[:2]}  # the same palette, prefix-stable


def test_plot_xt_ratio_draws_measured_band_and_expectation_per_dataset():
    frame = pd.DataFrame({"t": [0, 500, 999], "mean": [0.6, 0.8, 1.0], "q05": [0.4, 0.7, 0.9],
                          "q95": [0.8, 0.9, 1.1], "expected": [0.6, 0.8, 1.0]})
    ax = plot_xt_ratio({"digits": frame, "cifar": frame.assign(mean=frame["mean"] * 0.5)})
    assert isinstance(ax, Axes)
    # per dataset: measured + dashed expectation; the legend proxy; the y = 1 line
    assert len(ax.get_lines()) == 2 * 2 + 2
    assert len(ax.collections) == 2  # one band per dataset
    assert legend_texts(ax.get_legend()) == ["digits: measured", "cifar: measured", "exact expectation"]
    assert list(ax.get_lines()[2].get_ydata()) == [0.3, 0.4, 0.5]


def test_plot_xt_ratio_draws_into_a_given_axes():
    _, ax = plt.subplots()
    frame = pd.DataFrame({"t": [0, 1], "mean": [1.0, 1.0], "q05": [0.9, 0.9], "q95": [1.1, 1.1],
                          "expected": [1.0, 1.0]})
    assert plot_xt_ratio({"x": frame}, ax=ax) is ax


def _over_training():
    rows = [(label, seed, step, skip, (skip + seed) * (step + 1))
            for label in ("none", "CS") for seed in (0, 1) for step in (0, 10, 20) for skip in (1, 2, 3)]
    return pd.DataFrame(rows, columns=["label", "seed", "step", "skip", "norm"])


def test_plot_over_training_one_panel_per_frame_and_method_one_line_per_skip():
    frame = _over_training()
    fig = plot_over_training({"gentle": frame, "stress": frame}, "norm", ["none", "CS"], "norm")
    assert isinstance(fig, Figure)
    axes = fig.get_axes()
    assert len(axes) == 4
    assert all(len(ax.get_lines()) == 3 for ax in axes)
    assert axes[0].get_title() == "none\ngentle" and axes[3].get_title() == "CS\nstress"
    assert all(ax.get_yscale() == "log" for ax in axes)
    assert len(fig.legends) == 1 and legend_texts(fig.legends[0]) == ["skip 1", "skip 2", "skip 3"]
    mean = axes[0].get_lines()[0].get_ydata()  # none, skip 1: mean over seeds 0 and 1 of (1 + seed) * (step + 1)
    assert list(mean) == pytest.approx([1.5, 16.5, 31.5])


def test_plot_over_training_linear_axes_on_request():
    fig = plot_over_training({"gentle": _over_training()}, "norm", ["CS"], "norm", log=False)
    assert [ax.get_yscale() for ax in fig.get_axes()] == ["linear"]


def _summaries(diverged_ls=0, ls_interval=True):
    return {"none": MethodSummary("none", mean_se([1.0, 1.2, 1.1]), 0, 3),
            "CS": MethodSummary("CS", mean_se([0.5, 0.6, 0.7]), 0, 3),
            "LS": MethodSummary("LS", mean_se([0.4, 0.5]) if ls_interval else None, diverged_ls, 3)}


def test_plot_intervals_one_panel_per_setting_and_hidden_extra_panels():
    panels = {"U-ViT gentle": _summaries(), "U-ViT stress": _summaries(1), "UNet gentle": _summaries(2, False)}
    fig = plot_intervals(panels, "final loss")
    axes = fig.get_axes()
    assert len(axes) == 4 and [ax.get_visible() for ax in axes] == [True, True, True, False]
    assert [ax.get_title() for ax in axes[:3]] == list(panels)
    assert all(ax.get_xlabel() == "final loss" for ax in axes[:3])
    # per method with an interval: the bar, the mean, the seeds
    assert len(axes[0].get_lines()) == 3 * 3 and len(axes[2].get_lines()) == 2 * 3
    assert [t.get_text() for t in axes[2].texts] == ["no interval"]
    assert not axes[0].texts
    bar = axes[0].get_lines()[0]
    assert list(bar.get_xdata()) == pytest.approx(panels["U-ViT gentle"]["none"].summary.interval())
    assert list(axes[0].get_lines()[2].get_xdata()) == [1.0, 1.2, 1.1]  # one tick per seed


def test_plot_intervals_marks_diverged_runs_and_puts_the_first_method_on_top():
    ax = plot_intervals({"U-ViT stress": _summaries(1)}, "final loss").get_axes()[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["none", "CS", "LS (1 diverged)"]
    assert ax.yaxis_inverted()  # legend order top to bottom


def test_plot_intervals_each_panel_shows_its_own_diverged_counts():
    axes = plot_intervals({"gentle": _summaries(0), "stress": _summaries(1)}, "loss", ncols=1).get_axes()
    assert [t.get_text() for t in axes[0].get_yticklabels()] == ["none", "CS", "LS"]
    assert [t.get_text() for t in axes[1].get_yticklabels()] == ["none", "CS", "LS (1 diverged)"]


def test_plot_intervals_first_method_on_top_with_two_panels():
    axes = plot_intervals({"gentle": _summaries(), "stress": _summaries()}, "loss").get_axes()
    assert all(ax.yaxis_inverted() for ax in axes)


def test_plot_intervals_one_xlabel_per_panel_and_given_colours():
    colors = {"none": (1, 0, 0), "CS": (0, 1, 0), "LS": (0, 0, 1)}
    fig = plot_intervals({"a": _summaries(), "b": _summaries()}, ["loss", "oscillation"], colors=colors, ncols=1)
    axes = fig.get_axes()
    assert len(axes) == 2 and [ax.get_xlabel() for ax in axes] == ["loss", "oscillation"]
    assert axes[0].get_lines()[3].get_color() == (0, 1, 0)  # CS's bar


def test_plot_intervals_with_different_methods_per_panel():
    fig = plot_intervals({"a": {"none": _summaries()["none"]}, "b": {"CS": _summaries()["CS"]}}, "loss")
    assert len(fig.get_axes()) == 2


def _points():
    return pd.DataFrame({"label": ["none"] * 3 + ["CS"] * 3, "S": [3.0, 2.0, 1.0, 1.3, 0.3, 0.06],
                         "c": [1.0, 2.0, 3.0, 0.5, 0.7, 0.9]})


def test_plot_against_tail_sum_one_scatter_per_method_on_log_axes():
    colors = method_colors(["none", "CS"])
    ax = plot_against_tail_sum(_points(), "c", "constant", colors)
    assert isinstance(ax, Axes)
    assert len(ax.collections) == 2
    assert ax.get_xscale() == ax.get_yscale() == "log"
    assert legend_texts(ax.get_legend()) == ["none", "CS"]
    assert ax.collections[1].get_offsets().tolist() == [[1.3, 0.5], [0.3, 0.7], [0.06, 0.9]]
    assert ax.get_ylabel() == "constant"


def test_plot_against_tail_sum_marks_each_setting_with_its_own_marker():
    frame = _points().assign(setting=["gentle", "stress"] * 3)
    ax = plot_against_tail_sum(frame, "c", "constant", method_colors(["none", "CS"]), marker_by="setting")
    assert len(ax.collections) == 4  # method x setting
    assert legend_texts(ax.get_legend()) == ["none", "CS", "gentle", "stress"]
    shapes = {tuple(c.get_offsets().tolist()[0]): c.get_paths()[0].vertices.shape for c in ax.collections}
    assert shapes[(3.0, 1.0)] != shapes[(2.0, 2.0)]  # none/gentle and none/stress differ in marker


def test_plot_robustness_draws_on_given_axes():
    rows = [(label, 0, sigma, "output_change", sigma) for label in ("none", "CS") for sigma in (0.0, 0.1)]
    frame = pd.DataFrame(rows, columns=["label", "seed", "sigma", "quantity", "value"])
    _, ax = plt.subplots()
    assert plot_robustness(frame, "output_change", "change", method_colors(["none", "CS"]), ax=ax) is ax
    assert len(ax.lines) == 2


def test_plot_robustness_one_curve_per_method_mean_over_seeds():
    rows = [(label, seed, sigma, q, v * (1 + seed) * sigma)
            for label, v in (("none", 2.0), ("CS", 1.0)) for seed in (0, 1, 2) for sigma in (0.0, 0.1, 0.2)
            for q in ("output_change", "loss_change")]
    frame = pd.DataFrame(rows, columns=["label", "seed", "sigma", "quantity", "value"])
    ax = plot_robustness(frame, "output_change", "output change", method_colors(["none", "CS"]))
    assert len(ax.get_lines()) == 2 and len(ax.collections) == 2
    assert legend_texts(ax.get_legend()) == ["none", "CS"]
    assert list(ax.get_lines()[0].get_xdata()) == [0.0, 0.1, 0.2]
    assert list(ax.get_lines()[0].get_ydata()) == pytest.approx([0.0, 0.4, 0.8])  # mean of 2 * (1..3) * sigma


def test_plot_fd_curves_draws_the_mean_over_seeds_and_the_seed_range():
    curves = pd.DataFrame({"label": ["none"] * 4 + ["CS"] * 4, "seed": [0, 0, 1, 1] * 2,
                           "step": [100, 200] * 4, "fcd": [40, 20, 60, 30, 30, 10, 50, 20]})
    ax = plot_fd_curves(curves, method_colors(["none", "CS"]))
    lines = {line.get_label(): line for line in ax.get_lines()}
    assert list(lines["none"].get_ydata()) == [50, 25] and list(lines["CS"].get_ydata()) == [40, 15]
    band = ax.collections[0].get_paths()[0].vertices[:, 1]
    assert min(band) == 20 and max(band) == 60  # lowest and highest seed of "none"
    assert ax.get_yscale() == "log" and legend_texts(ax.get_legend()) == ["none", "CS"]


def test_plot_kappa_profile_means_over_seeds_with_references():
    kappas = pd.DataFrame({"label": ["LS"] * 4, "seed": [0, 0, 1, 1], "skip": [1, 2, 1, 2],
                           "kappa": [0.5, 0.2, 0.7, 0.4]})
    ax = plot_kappa_profile(kappas, method_colors(["LS"]), {"CS, kappa = 0.5": [1, 0.5]})
    lines = {line.get_label(): line for line in ax.get_lines() if not line.get_label().startswith("_")}
    assert list(lines["LS"].get_ydata()) == pytest.approx([0.6, 0.3])
    assert list(lines["CS, kappa = 0.5"].get_ydata()) == [1, 0.5]
    assert legend_texts(ax.get_legend()) == ["LS", "CS, κ = 0.5"]


def test_plot_sweep_one_errorbar_line_per_method_at_the_swept_values():
    summary = pd.DataFrame({"method": ["none", "none", "CS", "CS"], "N": [2, 4, 2, 4], "mean": [1.0, 2.0, 1.0, 1.5],
                            "lo": [0.5, 1.5, 0.8, 1.0], "hi": [1.5, 2.5, 1.2, 2.0]})
    ax = plot_sweep(summary, "N", method_colors(["none", "CS"]), ylabel="FCD")
    assert legend_texts(ax.get_legend()) == ["none", "CS"] and list(ax.get_xticks()) == [2, 4]
    lines = [container.lines[0] for container in ax.containers]  # the data line of each errorbar
    assert sorted(tuple(line.get_ydata()) for line in lines) == [(1.0, 1.5), (1.0, 2.0)]
    assert all(line.get_xdata()[0] != 2 for line in lines)  # offset so that the error bars do not overlap


def test_plot_stability_maps_one_heat_map_per_method_annotated_unstable_over_runs():
    stability = pd.DataFrame({"method": ["none"] * 4 + ["CS"] * 4, "lr_scale": [1, 1, 16, 16] * 2,
                              "N": [2, 4] * 4, "unstable": [0, 0, 1, 2, 0, 0, 0, 2], "runs": [2] * 8})
    stability["share"] = stability.unstable / stability.runs
    fig = plot_stability_maps(stability)
    visible = [ax for ax in fig.axes if ax.get_visible()]
    assert [ax.get_title() for ax in visible] == ["none", "CS"]
    texts = [t.get_text() for t in visible[0].texts]
    assert texts == ["1/2", "2/2", "0/2", "0/2"]  # the highest learning rate on top


def test_plot_seeds_and_median_draws_every_seed_thin_and_the_median_bold():
    paths = pd.DataFrame([{"label": label, "seed": seed, "step": step, "series": series,
                           "value": (1 + seed) * (2 if label == "none" else 1) * (1 + step)}
                          for label in ("none", "CS") for seed in range(3) for step in (0, 10, 20)
                          for series in ("feature", "grad")])
    fig = plot_seeds_and_median(paths, ["none", "CS"], [("feature", "h"), ("grad", "g")],
                                {"none": "black", "CS": "red"})
    left, right = fig.axes[:2]
    assert [ax.get_ylabel() for ax in (left, right)] == ["h", "g"] and left.get_yscale() == "log"
    lines = left.get_lines()
    assert len(lines) == 2 * (3 + 1)  # per method: three seeds, then the median
    thin, median = lines[:3], lines[3]
    assert all(line.get_linewidth() < median.get_linewidth() for line in thin)
    assert list(median.get_ydata()) == [4.0, 44.0, 84.0]  # seed 1 of none: 2 * 2 * (1 + step)
    assert legend_texts(fig.legends[0]) == ["none", "CS"]
    assert [ax.get_title() for ax in (left, right)] == ["median of 3 seeds"] * 2


def test_plot_seeds_and_median_counts_the_seeds_of_each_panel_apart():
    paths = pd.DataFrame([{"label": label, "seed": seed, "step": step, "series": series, "value": 1.0 + step}
                          for series, seeds in (("uvit", 3), ("unet", 2)) for label in ("none", "CS")
                          for seed in range(seeds - (series == "unet" and label == "CS")) for step in (0, 10)])
    fig = plot_seeds_and_median(paths, ["none", "CS"], [("uvit", "g"), ("unet", "g")],
                                {"none": "black", "CS": "red"}, titles={"uvit": "U-ViT"}, log=False)
    assert [ax.get_title() for ax in fig.axes[:2]] == ["U-ViT\nmedian of 3 seeds", "seeds: none 2, CS 1"]
    assert fig.axes[0].get_yscale() == "linear"


def test_plot_seed_ratios_draws_each_seeds_ratio_against_the_setting_with_ratio_one_dotted():
    depth = pd.DataFrame([{"label": label, "seed": seed, "N": n, "value": (1 + seed / 10) * (n / 2 if label == "CS"
                                                                                             else 1.0)}
                          for label in ("none", "CS") for seed in range(3) for n in (2, 8)])
    grid = pd.DataFrame([{"label": "CS", "seed": seed, "kappa": k, "value": 1 + k - seed / 10}
                         for seed in range(2) for k in (0.5, 1.0)])
    fig = plot_seed_ratios([("depth", depth, "N", "long skips N"), ("κ grid", grid, "kappa", "κ")],
                           {"none": "black", "CS": "red"}, "loss / none")
    left, right = fig.axes[:2]
    assert len(left.get_lines()) == 2 * (3 + 1) + 1  # per label three seeds and the median, then ratio 1
    median = left.get_lines()[7]
    assert list(median.get_xdata()) == [2, 8] and list(median.get_ydata()) == pytest.approx([1.1, 4.4])
    assert left.get_lines()[-1].get_linestyle() == ":" and left.get_yscale() == "log"
    assert [t.get_text() for t in left.get_xticklabels()] == ["2", "8"]
    assert [ax.get_title() for ax in (left, right)] == ["depth\nmedian of 3 seeds", "κ grid\nmedian of 2 seeds"]
    assert left.get_ylabel() == "loss / none" and right.get_xlabel() == "κ"
    assert legend_texts(fig.legends[0]) == ["none", "CS"]  # each label once, from both panels


def test_plot_breakdown_search_marks_breakdowns_counts_them_and_shades_the_choice():
    table = pd.DataFrame({"lr_scale": [16, 16, 48, 48, 64, 64],
                          "loss": [0.07, 0.08, 0.3, 0.7, 0.9, float("nan")],
                          "broke_down": [False, False, False, True, True, True]})
    ax = plot_breakdown_search(table, 0.5, chosen=48)
    trains, breaks = ax.collections[:2]
    assert len(trains.get_offsets()) == 3 and len(breaks.get_offsets()) == 3
    assert breaks.get_offsets()[:, 1].max() > 0.9  # the diverged run drawn at the top, not dropped
    assert [t.get_text() for t in ax.texts] == ["0/2", "1/2", "2/2"]
    assert ax.get_xscale() == ax.get_yscale() == "log"
    assert [t.get_text() for t in ax.get_xticklabels()] == ["×16", "×48", "×64"]
    assert legend_texts(ax.get_legend())[-1] == "chosen: ×48"
    assert len(plot_breakdown_search(table, 0.5).patches) == 0  # no rule's choice: nothing shaded


def test_plot_breakdown_pairs_puts_each_run_at_its_seed_and_method_and_leaves_missing_runs_empty():
    table = pd.DataFrame({"label": ["none", "CS", "none", "CS", "none"], "method": ["none", "CS"] * 2 + ["none"],
                          "seed": [0, 0, 1, 1, 2], "broke_down": [True, False, False, False, True]})
    colors = dict(zip(["none", "CS", "LS"], ["C0", "C1", "C2"]))
    fig = plot_breakdown_pairs(table, ["none", "CS", "LS"], range(4), breakdown_rates(table), colors)
    grid, bars = fig.axes
    dots = {tuple(p) for c in grid.collections[0::2] for p in c.get_offsets()}
    crosses = {tuple(p) for c in grid.collections[1::2] for p in c.get_offsets()}
    assert dots == {(1.0, 0.0), (0.0, 1.0), (1.0, 1.0)} and crosses == {(0.0, 0.0), (2.0, 0.0)}
    assert [t.get_text() for t in grid.get_yticklabels()] == ["none", "CS", "LS"]
    assert list(grid.get_xticks()) == [0, 1, 2, 3]  # the planned seeds, landed or not
    assert [t.get_text() for t in bars.texts] == ["2/3", "0/2"]  # LS has no run yet: no rate
    later = plot_breakdown_pairs(table.assign(seed=table.seed + 10), ["none", "CS"], range(10, 40),
                                 breakdown_rates(table), colors).axes[0]
    assert list(later.get_xticks()) == [10, 15, 20, 25, 30, 35] and later.get_xlim() == pytest.approx((9.4, 39.6))


def test_plot_robustness_by_backbone_one_panel_each_and_one_legend():
    frame = pd.DataFrame([{"label": label, "seed": seed, "sigma": sigma, "quantity": "loss_change",
                           "value": sigma * (1 + seed)} for label in ("none", "CS") for seed in range(2)
                          for sigma in (0.0, 0.1)])
    fig = plot_robustness_by_backbone({"U-ViT": frame, "conv UNet": frame}, "loss_change", "rise",
                                      {"none": "black", "CS": "red"})
    assert [ax.get_title() for ax in fig.axes] == ["U-ViT", "conv UNet"]
    assert fig.axes[0].get_legend() is not None and fig.axes[1].get_legend() is None


def test_plot_ratio_sets_puts_each_sets_seeds_beside_its_geometric_mean_and_interval():
    import numpy as np

    ratios = {"pilot": [0.5, 0.7, 0.6], "confirmation": [1.2, 1.5, 1.3, 1.4]}
    sets = {name: (r, paired_test(np.zeros(len(r)), np.log(r), margin=0.05)) for name, r in ratios.items()}
    ax = plot_ratio_sets(sets, "C1", "oscillation / no scaling")
    dots = [line for line in ax.lines if line.get_marker() == "o"]
    assert [sorted(line.get_ydata()) for line in dots] == [sorted(r) for r in ratios.values()]
    assert [line.get_xdata().mean() < x for line, x in zip(dots, (0.25, 1.25))] == [True, True]  # left of the mean
    means = [line for line in ax.lines if line.get_marker() == "D"]
    for line, (_, test) in zip(means, sets.values()):
        assert line.get_ydata()[0] == pytest.approx(np.exp(test.estimate))
    bars = [c for c in ax.collections if c.get_segments()]
    lows_highs = sorted(tuple(np.sort(seg[:, 1])) for bar in bars for seg in bar.get_segments())
    assert lows_highs == sorted(tuple(np.exp(t.ci)) for _, t in sets.values())
    assert [t.get_text() for t in ax.get_xticklabels()] == ["pilot\n3 seeds", "confirmation\n4 seeds"]
    assert ax.get_yscale() == "log" and any(line.get_linestyle() == ":" for line in ax.lines)
    with pytest.raises(ValueError, match="3 ratios but its test has 4 pairs"):
        plot_ratio_sets({"x": (ratios["pilot"], sets["confirmation"][1])}, "C1", "y")
