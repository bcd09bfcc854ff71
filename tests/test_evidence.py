"""Tests of scalelong_edu.evidence on hand-built results whose answers are known exactly: features and tail
sums, the per-run table, summaries over seeds and verdicts, the theorem constants, Adam and robustness
tables, Lemma 3.2 on real images, the claims table."""

import math
import warnings
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest
import torch

from scalelong_edu import evidence
from scalelong_edu.data import load_dataset
from scalelong_edu.diffusion import DiscreteSchedule, linear_schedule
from scalelong_edu.evidence import (
    MethodSummary,
    adam_table,
    by_method,
    feature_constants,
    output_constants,
    feature_ranges,
    features,
    gradient_constants,
    robustness_table,
    compare,
    compare_breakdowns,
    run_table,
    trajectory,
    spread_by,
    xt_norm_ratio,
)
from scalelong_edu.experiments import CONFIRMATIONS, ExperimentResult
from scalelong_edu.probes import COLUMNS
from scalelong_edu.stats import absent_chance, decision_chance, mean_se, oscillation, paired_power, paired_test
from scalelong_edu.theory import robustness_factor

LN2 = math.log(2)


# -- hand-built results -----------------------------------------------------------------------------
def row(step, probe, block, skip, quantity, value, sigma=None):
    return dict(step=step, probe=probe, block=block, skip=skip, sigma=sigma, quantity=quantity, value=float(value))


def feature_rows(step, norms_b, kappa_rms, kappa=None, norms_a=None):
    """The features probe of one step: b (and a) norms with sq_norm = norm^2, kappa and kappa_rms per skip."""
    norms_a = norms_a or [100.0] * len(norms_b)
    kappa = kappa or [0.9 * k for k in kappa_rms]  # the mean gate differs from the RMS
    rows = []
    for i, (a, b) in enumerate(zip(norms_a, norms_b), start=1):
        rows += [row(step, "features", "a", i, "norm", a), row(step, "features", "a", i, "sq_norm", a * a),
                 row(step, "features", "b", i, "norm", b), row(step, "features", "b", i, "sq_norm", b * b)]
    rows += [row(step, "features", None, i, "kappa", k) for i, k in enumerate(kappa, start=1)]
    rows += [row(step, "features", None, i, "kappa_rms", k) for i, k in enumerate(kappa_rms, start=1)]
    return rows


def grad_rows(step, grads_b, model=50.0):
    rows = [row(step, "grads", "a", i, "grad_norm", 1000.0) for i in range(1, len(grads_b) + 1)]
    rows += [row(step, "grads", "b", i, "grad_norm", g) for i, g in enumerate(grads_b, start=1)]
    return rows + [row(step, "grads", "model", None, "grad_norm", model)]


def record(label, seed, rows, history=None, diverged_at=None):
    """A run record as experiments.train_run writes it, from probe rows and a {column: list} history."""
    history = history or {"step": [1, 2], "loss": [1.0, 1.0], "grad_norm": [1.0, 1.0], "lr": [1e-3, 1e-3]}
    run = {"label": label, "seed": seed, "backbone": "uvit", "method": "none", "kappa": 0.5, "lr_scale": 1.0,
           "lr": 1e-3, "model_overrides": []}
    return {"label": label, "run": run, "parameters": 10, "diverged_at": diverged_at,
            "wall_time_s": 1.0, "history": history,
            "probes": {c: [r[c] for r in rows] for c in COLUMNS}, "samples": None if diverged_at else []}


def result(runs, steps, eval_every=4):
    spec = {"experiment": {"name": "test"}, "profile": {"steps": steps, "eval_every": eval_every, "uvit": "uvit-ci"}}
    return ExperimentResult(spec=spec, provenance={}, runs=runs)


def pd_isna(value):
    return value is None or (isinstance(value, float) and math.isnan(value))


def history(losses, grad_norms):
    n = len(losses)
    return {"step": list(range(1, n + 1)), "loss": list(losses), "grad_norm": list(grad_norms), "lr": [1e-3] * n}


# -- features ---------------------------------------------------------------------------------------
def test_features_tail_sums_of_kappa_rms_per_step_and_only_the_block_asked_for():
    rows = feature_rows(0, [3.0, 2.0, 1.0], [1.0, 0.5, 0.25], norms_a=[7.0, 8.0, 9.0])
    rows += feature_rows(10, [3.0, 2.0, 1.0], [1.0, 1.0, 1.0])
    frame = features(result([record("LS", 0, rows)], 10))
    assert list(frame.columns) == ["label", "seed", "step", "skip", "norm", "sq_norm", "kappa", "S"]
    first = frame[frame.step == 0].sort_values("skip")
    assert first.S.tolist() == pytest.approx([1.3125, 0.3125, 0.0625])
    assert first.kappa.tolist() == pytest.approx([1.0, 0.5, 0.25])  # the RMS kappa, not the mean gate
    assert first.norm.tolist() == [3.0, 2.0, 1.0] and first.sq_norm.tolist() == [9.0, 4.0, 1.0]
    assert frame[frame.step == 10].sort_values("skip").S.tolist() == pytest.approx([3.0, 2.0, 1.0])
    encoder = features(result([record("LS", 0, rows)], 10), block="a")
    assert encoder[encoder.step == 0].sort_values("skip").norm.tolist() == [7.0, 8.0, 9.0]
    assert len(frame) == len(encoder) == 6


def test_features_keep_runs_apart():
    runs = [record("none", 0, feature_rows(0, [1.0, 1.0], [1.0, 1.0])),
            record("none", 1, feature_rows(0, [2.0, 2.0], [1.0, 0.5])),
            record("CS", 0, feature_rows(0, [4.0, 4.0], [1.0, 0.25]))]
    frame = features(result(runs, 10)).set_index(["label", "seed", "skip"])
    assert frame.loc[("none", 0, 1), "S"] == 2.0 and frame.loc[("none", 1, 1), "S"] == 1.25
    assert frame.loc[("CS", 0, 1), "S"] == 1.0625 and frame.loc[("CS", 0, 2), "norm"] == 4.0


# -- run_table --------------------------------------------------------------------------------------
def _finished(label, seed, scale=1.0):
    """20 steps, probes every 4: late half (step > 10) is steps 12, 16, 20. Skip 1 alternates 1, 2, 1
    (log_step ln 2), skip 2 alternates 1, 4, 1 (ln 4); the early probes swing wildly and must not count."""
    late_b = {12: [1.0, 1.0], 16: [2.0, 4.0], 20: [1.0, 1.0]}
    rows = []
    for step in (0, 4, 8, 12, 16, 20):
        rows += feature_rows(step, [scale * n for n in late_b.get(step, [50.0 * (step + 1), 0.01])], [1.0, 0.5])
        # grads: skip 1 flat, skip 2 grows by e per probe in the late half (log_step 1)
        rows += grad_rows(step, [3.0, math.exp(step / 4)] if step > 10 else [1e3, 1e-3])
        rows.append(row(step, "fixed", "model", None, "loss", 0.5 - step / 100))
    losses = [1.0] * 18 + [0.2, 0.4]  # the last 10%: 2 steps, mean 0.3
    grad_norm = [100.0] * 10 + [1.0] * 7 + [10.0, 3.5, 2.9]  # late median 1: 2 spikes of 10 late steps
    return record(label, seed, rows, history(losses, grad_norm))


def _diverged(label, seed):
    rows = feature_rows(0, [1.0, 1.0], [1.0, 1.0]) + grad_rows(0, [1.0, 1.0])
    rows += feature_rows(4, [1.0, 1e6], [1.0, 1.0]) + grad_rows(4, [1.0, 1.0])
    rows.append(row(0, "fixed", "model", None, "loss", 1.0))
    return record(label, seed, rows, history([1.0] * 6, [1.0] * 6), diverged_at=7)


def test_run_table_reduces_each_run_to_its_numbers():
    table = run_table(result([_finished("none", 0), _finished("none", 1, scale=3.0), _diverged("CS", 0)], 20))
    settings = ["experiment", "label", "method", "backbone", "scaling", "kappa", "N", "lr_scale", "lr", "sum_kappa2",
                "seed", "diverged_at", "wall_time_s"]
    endpoints = ["loss", "fixed_loss", "feature_osc", "grad_osc", "spikes",
                 *(f"{s}_{q}" for s in ("feature", "grad") for q in evidence.FIG1), "broke_down"]
    assert set(settings + endpoints) <= set(table.columns) and list(table.columns[:len(settings)]) == settings
    assert table.label.tolist() == ["none", "none", "CS"] and table.seed.tolist() == [0, 1, 0]
    assert table.broke_down.tolist() == [False, False, True] and table.experiment[0] == "test"
    first = table.iloc[0]
    assert first.feature_osc == pytest.approx(1.5 * LN2)  # mean of ln 2 and ln 4 over the two skips
    assert first.feature_osc == pytest.approx((oscillation([1, 2, 1], 3).log_step
                                               + oscillation([1, 4, 1], 3).log_step) / 2)
    assert first.grad_osc == pytest.approx(0.5)  # mean of 0 and 1
    assert first.loss == pytest.approx(0.3)
    assert first.spikes == pytest.approx(0.2)  # the share of late steps (10 and 3.5 > 3; 2.9 is not)
    assert first.fixed_loss == pytest.approx(0.3)  # the fixed-batch loss at step 20
    assert pd_isna(first.diverged_at)
    assert table.iloc[1].feature_osc == pytest.approx(1.5 * LN2)  # the oscillation does not depend on scale
    # Fig. 1's statistics of ||h_i||^2, geometric means over the two skips (see _finished):
    # skip 1: 2500, 62500, 202500, 1, 4, 1; skip 2: 1e-4 (three times), 1, 16, 1
    assert first.feature_level == pytest.approx(1.0) and first.feature_growth == pytest.approx(2.0)
    assert first.feature_peak == pytest.approx(math.sqrt(202500 * 16))
    assert first.feature_range_late == pytest.approx(math.sqrt(3 * 15))
    # late 1, 4, 1 (and 1, 16, 1) around their flat least-squares line: mean |residual| 4/9 ln 4 (and 4/9 ln 16)
    assert first.feature_detrended == pytest.approx(4 / 9 * math.sqrt(math.log(4) * math.log(16)))
    assert table.iloc[1].feature_level == pytest.approx(9.0)  # norms 3x: squared norms 9x


def test_run_table_gives_a_diverged_run_nan_and_keeps_its_step():
    table = run_table(result([_finished("none", 0), _diverged("CS", 0)], 20))
    diverged = table.iloc[1]
    assert diverged.diverged_at == 7
    for column in ("loss", "fixed_loss", "feature_osc", "grad_osc", "spikes", "feature_level", "grad_peak"):
        assert math.isnan(diverged[column]), column
    assert diverged.broke_down


def test_run_table_of_a_run_too_short_for_two_late_probes_has_nan_oscillation():
    rows = feature_rows(0, [1.0], [1.0]) + grad_rows(0, [1.0]) + feature_rows(10, [2.0], [1.0]) + grad_rows(10, [2.0])
    rows += [row(0, "fixed", "model", None, "loss", 1.0), row(10, "fixed", "model", None, "loss", 0.7)]
    table = run_table(result([record("none", 0, rows, history([0.5] * 10, [1.0] * 10))], 10, eval_every=10))
    assert math.isnan(table.feature_osc[0]) and math.isnan(table.grad_osc[0])
    assert table.loss[0] == 0.5 and table.fixed_loss[0] == 0.7 and table.spikes[0] == 0.0



def _sweep_run(scale, seed, loss, diverged_at=None):
    rows = feature_rows(0, [1.0], [1.0]) + [row(0, "fixed", "model", None, "loss", 1.0)]
    run = record(f"none, lr x{scale}", seed, rows, history([loss] * 10, [1.0] * 10), diverged_at)
    run["run"]["lr_scale"] = scale
    return run


def test_stress_scale_is_the_largest_scale_where_every_run_trains():
    runs = [_sweep_run(1, 0, 0.32), _sweep_run(1, 1, 0.25), _sweep_run(4, 0, 0.2), _sweep_run(4, 1, 0.29),
            _sweep_run(8, 0, 0.2), _sweep_run(8, 1, 0.2, diverged_at=5), _sweep_run(16, 0, 0.5)]
    # best loss 0.2, limit 1.5 * 0.2 = 0.3: x1 has 0.32, x8 a diverged run, x16 0.5
    assert evidence.stress_scale(result(runs, 10)) == 4.0
    assert evidence.stress_scale(result(runs, 10), tolerance=1.7) == 4.0  # 0.32 < 0.34: x1 too, x4 still larger
    assert evidence.stress_scale(result(runs, 10), tolerance=3.0) == 16.0  # 0.5 < 0.6
    with pytest.raises(ValueError, match="no learning rate of the sweep"):
        evidence.stress_scale(result([_sweep_run(1, 0, 0.2), _sweep_run(1, 1, 0.2, diverged_at=2)], 10))


def test_breakdown_scale_is_the_smallest_scale_where_20_to_80_percent_break_down():
    losses = {16: [0.1] * 5, 24: [0.1] * 4 + [0.9], 32: [0.1, 0.1, 0.9, 0.9, 0.9], 48: [0.9] * 5}
    runs = [_sweep_run(k, seed, loss) for k, seeds in losses.items() for seed, loss in enumerate(seeds)]
    assert evidence.breakdown_scale(result(runs, 10)) == 24.0  # 1/5 = 20% is inside the band
    assert evidence.breakdown_scale(result(runs, 10), low=0.4) == 32.0
    runs[0] = _sweep_run(16, 0, 0.1, diverged_at=3)  # a run stopped by the NaN guard broke down too
    assert evidence.breakdown_scale(result(runs, 10)) == 16.0
    with pytest.raises(ValueError, match=r"x16: 20%, x24: 20%, x32: 60%, x48: 100%.*widen or refine"):
        evidence.breakdown_scale(result(runs, 10), low=0.7, high=0.9)


def test_fig1_paths_are_geometric_means_over_the_skips_of_each_step():
    rows = feature_rows(0, [1.0, 4.0], [1.0, 1.0]) + feature_rows(10, [2.0, 8.0], [1.0, 1.0])
    rows += [row(step, "grads", "b", skip, "grad_norm", g) for step, gs in ((0, (1.0, 9.0)), (10, (2.0, 2.0)))
             for skip, g in zip((1, 2), gs)]
    paths = evidence.fig1_paths(result([record("none", 0, rows, history([0.5] * 10, [1.0] * 10))], 10))
    assert list(paths.columns) == ["label", "seed", "step", "series", "value"]
    feature, grad = (paths[paths.series == s].set_index("step").value for s in ("feature", "grad"))
    assert feature.to_dict() == pytest.approx({0: 2.0, 10: 4.0}) and grad.to_dict() == pytest.approx({0: 3.0, 10: 2.0})


def test_curves_by_backbone_keep_the_seeds_every_label_finished_one_series_per_backbone():
    runs = {"uvit": [record("none", 0, []), record("CS", 0, []), record("none", 1, [])],
            "unet": [record("none", 3, []), record("CS", 3, [])]}

    def curves(records):
        return pd.DataFrame([{"label": x["label"], "seed": x["run"]["seed"], "step": 0, "value": 1.0}
                             for x in records])

    frame = evidence.curves_by_backbone({b: curves(rs) for b, rs in runs.items()})
    assert list(zip(frame.series, frame.seed)) == [("uvit", 0), ("uvit", 0), ("unet", 3), ("unet", 3)]


def test_complete_seeds_keeps_the_seeds_every_method_has():
    table = pd.DataFrame({"method": ["none", "CS", "none", "CS", "none"], "seed": [0, 0, 1, 1, 2]})
    assert list(evidence.complete_seeds(table).seed) == [0, 0, 1, 1]


def test_seed_ratios_divide_each_run_by_its_seeds_baseline_at_the_same_setting():
    table = pd.DataFrame({"method": ["none", "CS", "none", "CS", "none", "CS", "CS"],
                          "N": [2, 2, 8, 8, 2, 2, 8], "seed": [0, 0, 0, 0, 1, 1, 1],
                          "loss": [2.0, 1.0, 4.0, 6.0, 5.0, 5.0, 3.0],
                          "broke_down": [False] * 7})
    ratios = evidence.seed_ratios(table, "loss", by=("N",))
    cs = ratios[ratios.method == "CS"].set_index(["seed", "N"]).value
    assert cs.to_dict() == {(0, 2): 0.5, (0, 8): 1.5, (1, 2): 1.0}  # seed 1 at N = 8 has no baseline run
    assert set(ratios[ratios.method == "none"].value) == {1.0}
    grid = table[table.N == 2].assign(kappa=[1.0, 0.5, 1.0, 0.5])
    assert list(evidence.seed_ratios(grid, "loss", baseline=1.0, arm="kappa").value) == [1.0, 0.5, 1.0, 1.0]
    broken = table.assign(broke_down=[False, True] + [False] * 5)
    assert (0, 2) not in evidence.seed_ratios(broken, "loss", by=("N",)).query("method == 'CS'").set_index(
        ["seed", "N"]).index
    with pytest.raises(ValueError, match="pair by more keys"):
        evidence.seed_ratios(table, "loss")  # without N, seed 0 has two baseline runs
    with pytest.raises(ValueError, match="no runs of the baseline 'LS'"):
        evidence.seed_ratios(table, "loss", baseline="LS")
    assert evidence.seed_ratios(pd.DataFrame(), "loss").empty


# -- by_method, MethodSummary, verdict --------------------------------------------------------------
def _table(rows):
    import pandas as pd

    return pd.DataFrame(rows, columns=["label", "seed", "diverged_at", "loss"])


def test_by_method_counts_diverged_runs_and_keeps_label_order():
    nan = float("nan")
    table = _table([("LS", 0, None, 1.0), ("none", 0, None, 2.0), ("LS", 1, None, 3.0), ("none", 1, 5, nan),
                    ("none", 2, None, 4.0), ("CS", 0, 9, nan), ("CS", 1, None, 1.0)])
    summaries = by_method(table, "loss")
    assert list(summaries) == ["LS", "none", "CS"]
    ls, none, cs = summaries.values()
    assert (ls.label, ls.diverged, ls.runs, ls.summary.values) == ("LS", 0, 2, (1.0, 3.0))
    assert (none.diverged, none.runs, none.summary.mean) == (1, 3, 3.0)
    assert (cs.diverged, cs.runs, cs.summary) == (1, 2, None)  # one finished run: no interval
    assert format(cs) == "no interval (fewer than 2 runs finished), 1 of 2 diverged"
    lo, hi = ls.summary.interval()
    assert format(ls, ".2f") == f"2.00 [{lo:.2f}, {hi:.2f}]"


def test_by_method_counts_an_infinite_value_as_a_divergence_not_a_silent_drop():
    table = _table([("LS", 0, None, 0.2), ("LS", 1, None, 0.3), ("LS", 2, None, math.inf), ("none", 0, None, 0.2),
                    ("none", 1, 4, math.inf), ("none", 2, None, 0.4)])
    ls, none = by_method(table, "loss").values()
    assert (ls.diverged, ls.runs, ls.summary.values) == (1, 3, (0.2, 0.3))
    assert format(ls, ".2f").endswith(", 1 of 3 diverged")
    assert none.diverged == 1  # already diverged: counted once


def test_by_method_rejects_an_unknown_column():
    with pytest.raises(KeyError, match="no column 'fid'"):
        by_method(_table([("LS", 0, None, 1.0)]), "fid")


def test_trajectory_of_a_series_with_known_answers():
    steps = [0, 5, 10, 25, 50, 75, 100, 125, 150, 175, 200]  # dense early probes, then every 25
    values = [1.0, 8.0, 4.0, 2.0, 2.0, 2.0, 2.0, 4.0, 2.0, 4.0, 2.0]
    out = trajectory(steps, values, regular=25)
    assert (out["level"], out["growth"], out["peak"], out["range"]) == (2.0, 2.0, 8.0, 7.0)
    assert out["range_late"] == 2.0 and out["log_step"] == pytest.approx(LN2)  # late: 125 .. 200
    assert out["detrended"] > 0
    trend_only = trajectory(steps, [1.1**k for k in range(11)], regular=25)
    assert trend_only["detrended"] < 1e-9 < trend_only["log_step"]  # a steady trend is not an oscillation
    short = trajectory([0, 25, 50], [1.0, 2.0, 3.0], regular=25)
    assert math.isnan(short["detrended"]) and math.isnan(short["log_step"])  # one late point
    assert math.isnan(trajectory([0], [1.0], regular=25)["range_late"])


def _paired_table(values, method="CS", broke=()):
    import pandas as pd

    rows = []
    for seed, (base, treat) in enumerate(values):
        rows += [{"method": "none", "seed": seed, "N": 6, "loss": base, "broke_down": seed in broke},
                 {"method": method, "seed": seed, "N": 6, "loss": treat, "broke_down": False}]
    return pd.DataFrame(rows)


def test_compare_pairs_runs_by_seed_on_the_log_scale():
    table = _paired_table([(1.0, 0.5), (2.0, 1.1), (4.0, 1.9), (8.0, 4.2)])
    test = compare(table, "loss", "CS")
    expected = paired_test([0.0, LN2, 2 * LN2, 3 * LN2], [math.log(v) for v in (0.5, 1.1, 1.9, 4.2)],
                           math.log1p(0.05))
    assert test == expected and test.verdict == "reproduced"
    assert compare(table, "loss", "CS", direction="greater").verdict == "contradicted"
    linear = compare(table, "loss", "CS", log=False, margin=0.1)
    assert linear.estimate == pytest.approx(-1.825) and linear.margin == 0.1
    shuffled = table.sample(frac=1, random_state=0)  # row order does not matter: seeds pair the runs
    assert compare(shuffled, "loss", "CS") == test


def test_compare_refuses_duplicated_unpaired_and_broken_runs():
    import pandas as pd

    table = _paired_table([(1.0, 0.5), (2.0, 1.1), (4.0, 1.9)])
    with pytest.raises(ValueError, match="same seed"):
        compare(pd.concat([table, table]), "loss", "CS")  # e.g. two experiments in one table
    with pytest.raises(ValueError, match="same seeds"):
        compare(table.iloc[:-1], "loss", "CS")
    with pytest.raises(ValueError, match="compare_breakdowns"):
        compare(_paired_table([(1.0, 0.5), (2.0, 1.1), (4.0, 1.9)], broke=(1,)), "loss", "CS")
    with pytest.raises(ValueError, match="no runs of 'LS'"):
        compare(table, "loss", "LS")
    with pytest.raises(KeyError, match="no column 'depth'"):
        compare(table, "loss", "CS", depth=6)
    assert compare(table, "loss", "CS", N=6).n == 3
    two_depths = pd.concat([table, table.assign(N=8)])
    with pytest.raises(ValueError, match="pair_by"):
        compare(two_depths, "loss", "CS")
    assert compare(two_depths, "loss", "CS", pair_by=("N", "seed")).n == 6  # each (depth, seed) one pair


def test_compare_breakdowns_pairs_each_setting_and_seed():
    table = _paired_table([(1.0, 0.5)] * 8, broke=range(8))
    test = compare_breakdowns(table, "CS")
    assert test.events == (8, 0) and test.verdict == "reproduced"
    with pytest.raises(ValueError, match="same settings and seeds"):
        compare_breakdowns(table.iloc[:-1], "CS")


def test_claims_on_landing_runs_use_only_the_finished_pairs_and_stay_undecided_until_all_land():
    full = _paired_table([(1.0, 0.5), (2.0, 1.1), (4.0, 1.9), (8.0, 4.2)])
    partial = full.iloc[:-1]  # seed 3 has the baseline's run only
    claim = evidence.paired_claim(3, "CS lowers the loss", partial, "loss", "CS", planned=4, what="CS/none")
    assert claim.test == compare(full.iloc[:-2], "loss", "CS") and claim.test.verdict == "reproduced"
    assert claim.landing and claim.decided == "undecided" and claim.measured.startswith("CS/none 0.5")
    done = evidence.paired_claim(3, "CS lowers the loss", full, "loss", "CS", planned=4)
    assert not done.landing and done.decided == "reproduced" and done.margin == "5%"
    early = evidence.paired_claim(3, "CS lowers the loss", full.iloc[:3], "loss", "CS", planned=4)
    assert early.test is None and early.landing and early.measured == "runs landing: 1 of 4 seeds"
    rates = evidence.breakdown_claim(3, "CS breaks down less", _paired_table([(1.0, 0.5)] * 8, broke=range(8)),
                                     "CS", planned=8)
    assert rates.decided == "reproduced" and rates.measured.startswith("broke down: none 8/8") and rates.family == ""
    confirmation = evidence.breakdown_claim(3, "CS breaks down less", full.iloc[:1], "CS", planned=8, family="c")
    assert confirmation.family == "c" and confirmation.landing
    assert evidence.breakdown_claim(3, "CS breaks down less", full.iloc[:1], "CS", planned=8).test is None
    nothing = evidence.paired_claim(3, "CS lowers the loss", pd.DataFrame(), "loss", "CS", planned=4, N=8)
    assert nothing.landing and nothing.measured == "runs landing: 0 of 4 seeds"


def test_seed_means_average_a_seeds_log_values_over_settings_and_keep_complete_seeds_only():
    import pandas as pd

    two_depths = pd.concat([_paired_table([(1.0, 0.5), (4.0, 1.0)]).assign(N=n) for n in (2, 8)])
    two_depths.loc[(two_depths.N == 8) & (two_depths.method == "CS"), "loss"] *= 4  # CS: 2.0 and 4.0 at N = 8
    means = evidence.seed_means(two_depths, "loss", "N", (2, 8)).set_index(["method", "seed"]).loss
    assert means["CS", 0] == pytest.approx(1.0) and means["CS", 1] == pytest.approx(2.0)  # sqrt(0.5 * 2), sqrt(1 * 4)
    test = compare(evidence.seed_means(two_depths, "loss", "N", (2, 8)), "loss", "CS")
    assert test.n == 2 and test.estimate == pytest.approx(-LN2 / 2)  # seed ratios 1/1 and 2/4
    partial = two_depths.iloc[:-1]  # (N = 8, seed 1) has no CS run yet: that seed's CS drops out
    assert set(evidence.seed_means(partial, "loss", "N", (2, 8)).query("method == 'CS'").seed) == {0}
    broke = two_depths.assign(broke_down=(two_depths.N == 2) & (two_depths.seed == 1))
    assert evidence.seed_means(broke, "loss", "N", (2, 8)).set_index(["method", "seed"]).broke_down["none", 1]
    assert evidence.seed_means(pd.DataFrame(), "loss", "N", (2, 8)).empty


def test_a_confirmed_claim_names_its_fresh_seeds_inside_its_settings_parenthesis():
    assert evidence.confirmed("CS lowers ‖h‖ (U-ViT, N = 8)", "depth-osc-confirm") == (
        "CS lowers ‖h‖ (U-ViT, N = 8, declared confirmation on 28 fresh seeds, its own family)")
    with pytest.raises(ValueError, match=r"ends in its setting's parenthesis"):
        evidence.confirmed("CS lowers ‖h‖", "depth-osc-confirm")
    with pytest.raises(KeyError):
        evidence.confirmed("CS lowers ‖h‖ (U-ViT)", "no-such-confirmation")


def test_early_speed_claims_test_a_confirmations_arms_by_seed_in_their_own_family(monkeypatch):
    import pandas as pd

    two_depths = pd.concat([_paired_table([(1.0, 0.5), (4.0, 1.0), (2.0, 1.0)]).assign(N=n) for n in (2, 4, 6, 8)])
    ls = two_depths[two_depths.method == "CS"].assign(method="LS")
    landed = {"depth-speed-confirm": pd.concat([two_depths.replace("CS", "CS (kappa=0.5)"), ls])}
    monkeypatch.setattr(evidence, "landed", lambda name: landed.get(name, pd.DataFrame()))
    papers = {"CS (kappa=0.5)": "CS trains faster (U-ViT)", "LS": "LS trains faster (U-ViT)"}
    claim = evidence.early_speed_claims("depth-speed-confirm", papers)["CS (kappa=0.5)"]
    assert claim.family == "depth-speed-confirm" and claim.chapter == 8 and claim.planned == 12
    assert claim.paper == "CS trains faster (U-ViT, declared confirmation on 12 fresh seeds, its own family)"
    assert claim.test.n == 3 and claim.test.estimate == pytest.approx(np.log([0.5, 0.25, 0.5]).mean())
    assert claim.landing and claim.decided == "undecided"  # 3 of 12 seeds have landed
    papers = dict.fromkeys(["1/sqrt(2)-CS", "LS"], "x (conv UNet)")
    waiting = evidence.early_speed_claims("depth-unet-speed-confirm", papers, 7)
    assert waiting["LS"].measured == "runs landing: 0 of 12 seeds" and waiting["LS"].chapter == 7
    with pytest.raises(ValueError, match=r"as one Holm family: give a claim for each"):
        evidence.early_speed_claims("depth-speed-confirm", {"LS": "LS trains faster"})


def test_interaction_claim_compares_a_methods_ratio_between_two_settings_seed_by_seed():
    import pandas as pd

    rows = []
    for seed, (shallow, deep) in enumerate([(1.0, 0.8), (1.1, 0.85), (0.95, 0.8), (1.0, 0.9)]):
        for n, ratio in ((2, shallow), (8, deep)):
            base = 1.0 + seed  # seeds differ; the ratio is what the test sees
            rows += [{"method": "sqrt2", "N": n, "seed": seed, "loss": base, "broke_down": False},
                     {"method": "CS", "N": n, "seed": seed, "loss": base * ratio, "broke_down": False}]
    table = pd.DataFrame(rows)
    claim = evidence.interaction_claim(8, "CS gains with depth", table, "loss", "CS", "sqrt2", planned=4)
    expected = paired_test([math.log(r) for r in (1.0, 1.1, 0.95, 1.0)], [math.log(r) for r in (0.8, 0.85, 0.8, 0.9)],
                           math.log1p(0.05))
    assert (claim.test.estimate, claim.test.p) == pytest.approx((expected.estimate, expected.p))
    assert claim.test.n == 4 and claim.decided == "reproduced" and "at N = 8 over N = 2" in claim.measured
    landing = evidence.interaction_claim(8, "CS gains", table[table.seed < 3], "loss", "CS", "sqrt2", planned=4)
    assert landing.landing and landing.decided == "undecided" and landing.test.n == 3
    none = evidence.interaction_claim(8, "CS gains", table[table.N == 2], "loss", "CS", "sqrt2", planned=4)
    assert none.test is None and none.measured == "runs landing: 0 of 4 seeds"
    assert evidence.interaction_claim(8, "CS gains", pd.DataFrame(), "loss", "CS", "sqrt2", planned=4).test is None
    with pytest.raises(ValueError, match="broke down"):
        evidence.interaction_claim(8, "CS gains", table.assign(broke_down=True), "loss", "CS", "sqrt2", planned=4)


def test_landed_is_empty_before_any_run_of_an_experiment_has_finished(tmp_path, monkeypatch):
    monkeypatch.setenv("SCALELONG_RESULTS", str(tmp_path))
    assert evidence.landed("long-uvit", "ci").empty


def test_landed_keeps_a_confirmations_fresh_seeds(monkeypatch):
    from scalelong_edu import experiments

    table = _paired_table([(1.0, 0.5)] * 4)
    monkeypatch.setattr(experiments, "finished_so_far", lambda name, profile=None: name)
    monkeypatch.setattr(evidence, "run_table", lambda result: table)
    fresh = evidence.landed("breakdown-confirm", "ci", seeds_from=2)
    assert sorted(fresh.seed.unique()) == [2, 3] and len(fresh) == 4 and list(fresh.index) == [0, 1, 2, 3]
    assert evidence.landed("breakdown-confirm", "ci").equals(table)


def test_a_confirmation_tests_its_fresh_seeds_alone_in_its_own_family(monkeypatch):
    from scalelong_edu import ledger
    from scalelong_edu.experiments import CONFIRMATIONS
    from scalelong_edu.stats import rates_power

    pilot = _paired_table([(1.0, 0.5)] * 10, broke=range(4))  # none 4 of 10, CS 0 of 10
    runs = _paired_table([(1.0, 0.5)] * 40, broke=range(0, 40, 2))  # fresh: none breaks down in 15 of 30
    monkeypatch.setattr(evidence, "run_table", lambda result: runs)
    monkeypatch.setattr("scalelong_edu.experiments.finished_so_far", lambda name, profile=None: name)
    confirm = evidence.confirmation("stability-confirm", pilot, "CS")
    declared = CONFIRMATIONS["stability-confirm"]
    assert confirm.seeds == range(declared.first, declared.first + declared.fresh)
    assert set(confirm.fresh.seed) == set(confirm.seeds)  # the pilot's seeds are not tested again
    assert confirm.power == rates_power(declared.fresh, 0.4, 0.0)
    assert confirm.cautious_power == rates_power(declared.fresh, 0.4, declared.cautious)
    claim = confirm.claim(8, "CS breaks down less often (U-ViT)")
    assert claim.paper == "CS breaks down less often (U-ViT, declared confirmation on 30 fresh seeds, its own family)"
    assert claim.family == "stability-confirm" and claim.test.discordant == (15, 0) and not claim.landing
    values = confirm.glue_values(ledger.decide([claim])[0])
    assert values["baseline"] == "15 of 30" and values["treatment"] == "0 of 30" and values["verdict"] == "reproduced"
    assert (values["first"], values["last"], values["p"], values["landed"]) == (10, 39, claim.test.p, 30)
    monkeypatch.setattr(evidence, "run_table", lambda result: runs.iloc[:41])  # seed 20 has none's run only
    landing = evidence.confirmation("stability-confirm", pilot, "CS")
    assert landing.claim(8, "CS (U-ViT)").landing and set(landing.fresh.seed) == set(range(10, 20))
    partial = landing.glue_values(landing.claim(8, "CS (U-ViT)"))
    assert partial["baseline"] == "5 of 10" and partial["landed"] == 10  # complete pairs

    def nothing_yet(name, profile=None):
        raise FileNotFoundError(name)

    monkeypatch.setattr("scalelong_edu.experiments.finished_so_far", nothing_yet)
    unstarted = evidence.confirmation("stability-confirm", pilot, "CS")
    assert unstarted.fresh.empty and list(unstarted.fresh.columns) == list(pilot.columns)  # plots as empty
    values = unstarted.glue_values(unstarted.claim(8, "CS (U-ViT)"))
    assert (values["landed"], values["baseline"], values["verdict"]) == (0, "no run yet", "runs landing, verdict held")


def test_a_confirmation_gives_its_chance_of_a_decision_and_nan_for_a_pilot_without_runs(monkeypatch):
    """Sized at the pilot's rates (both arms trained on the fresh seeds), or at a rate given; a
    pilot with no runs yet (a confirmation of a confirmation, under the ci profile) sizes nothing."""
    import math

    from scalelong_edu.stats import fresh_rates_decision_chance

    pilot = _paired_table([(1.0, 0.5)] * 10, broke=range(4))  # none 4 of 10, CS 0 of 10
    monkeypatch.setattr("scalelong_edu.experiments.finished_so_far", lambda name, profile=None: name)
    monkeypatch.setattr(evidence, "run_table", lambda result: pilot.iloc[:0])  # nothing landed
    confirm = evidence.confirmation("stability-confirm", pilot, "CS")
    assert confirm.decision_chance() == fresh_rates_decision_chance(30, 0.4, 0.0, evidence.BREAKDOWN_MARGIN)
    assert confirm.decision_chance(0.5) == fresh_rates_decision_chance(30, 0.4, 0.5, 0.25)
    empty = evidence.confirmation("stability-confirm", pilot.iloc[:0], "CS")
    assert math.isnan(empty.decision_chance()) and math.isnan(empty.decision_chance(0.5))
    assert math.isnan(empty.power) and math.isnan(empty.cautious_power) and empty.fresh.empty


def test_confirmations_read_the_fresh_runs_once_for_all_arms(monkeypatch):
    import pandas as pd

    pilot = pd.concat([_paired_table([(1.0, 0.5)] * 10, broke=range(4)),
                       _paired_table([(1.0, 0.5)] * 10, "LS").query("method == 'LS'")])
    runs = pd.concat([_paired_table([(1.0, 0.5)] * 40),
                      _paired_table([(1.0, 0.5)] * 40, "LS").query("method == 'LS'")])
    reads = []
    monkeypatch.setattr(evidence, "run_table", lambda result: reads.append(result) or runs)
    monkeypatch.setattr("scalelong_edu.experiments.finished_so_far", lambda name, profile=None: name)
    arms = evidence.confirmations("stability-confirm", pilot, ["CS", "LS"])
    assert reads == ["stability-confirm"] and list(arms) == ["CS", "LS"]
    assert [arm.treatment for arm in arms.values()] == ["CS", "LS"] and arms["CS"].fresh is arms["LS"].fresh
    one, ls = evidence.confirmation("stability-confirm", pilot, "LS"), arms["LS"]
    assert (one.treatment, one.power, one.cautious_power) == (ls.treatment, ls.power, ls.cautious_power)
    assert one.fresh.equals(ls.fresh)


def test_breakdown_rates_count_per_method_with_exact_intervals():
    rates = evidence.breakdown_rates(_paired_table([(1.0, 0.5)] * 10, broke=range(5)))
    assert list(rates.index) == ["none", "CS"]
    assert rates.loc["none", ["broke", "runs"]].tolist() == [5, 10] and rates.loc["CS", "broke"] == 0
    assert rates.loc["none", "lo"] == pytest.approx(0.187, abs=1e-3) and rates.loc["CS", "hi"] == pytest.approx(
        0.308, abs=1e-3)  # Clopper-Pearson, 5/10 and 0/10


# -- trend, spread_by -------------------------------------------------------------------------------
def test_spread_by_is_the_ratio_of_geometric_means():
    import pandas as pd

    frame = pd.DataFrame({"method": ["A"] * 4 + ["B"] * 4, "skip": [1, 2, 3, 4] * 2,
                          "c": [1.0, 4.0, 1.0, 4.0, 2.0, 8.0, 2.0, 8.0]})
    spread = spread_by(frame, "c", ["method", "skip"])
    assert spread == {"method": pytest.approx(2.0), "skip": pytest.approx(4.0)}
    frame["c"] = 3.0
    assert spread_by(frame, "c", ["method"]) == {"method": pytest.approx(1.0)}


@pytest.mark.parametrize("bad", [0.0, -1.0, math.inf])
def test_spread_by_refuses_a_constant_that_is_not_positive_and_finite(bad):
    import pandas as pd

    frame = pd.DataFrame({"method": ["A", "A", "B", "B"], "c": [1.0, bad, 2.0, 2.0]})
    with pytest.raises(ValueError, match=r"spread_by needs 'c' finite and > 0, but 1 of 4 rows are not"):
        spread_by(frame, "c", ["method"])


# -- theorem constants and ranges -------------------------------------------------------------------
def _constant_rows():
    rows = []
    for step, norms, loss in ((0, [2.0, 1.0], 0.5), (10, [4.0, 2.0], 0.25), (20, [6.0, 1.0], 0.2)):
        rows += feature_rows(step, norms, [1.0, 0.5]) + grad_rows(step, [norms[0] * 3, norms[1] * 3])
        rows.append(row(step, "fixed", "model", None, "loss", loss))
    return rows


def test_feature_constants_divide_by_x_t_and_the_tail_sum():
    frame = feature_constants(result([record("none", 0, _constant_rows())], 20), x_t_sq=2.0)
    frame = frame.set_index(["step", "skip"])
    assert frame.loc[(0, 1), "c"] == pytest.approx(4.0 / (2.0 * 1.25))
    assert frame.loc[(10, 2), "c"] == pytest.approx(4.0 / (2.0 * 0.25))
    assert frame.loc[(20, 1), "c"] == pytest.approx(36.0 / 2.5)
    assert len(frame) == 6


def test_output_constants_divide_the_output_by_x_t_and_the_sum_of_all_kappa_squared():
    rows = _constant_rows()
    with pytest.raises(ValueError, match="no output_sq_norm probes"):
        output_constants(result([record("none", 0, rows)], 20), x_t_sq=2.0)
    rows += [row(step, "fixed", "model", None, "output_sq_norm", out) for step, out in ((0, 0.5), (20, 10.0))]
    frame = output_constants(result([record("none", 0, rows)], 20), x_t_sq=2.0).set_index("step")
    assert frame.c_out.to_dict() == {0: pytest.approx(0.5 / (2.0 * 1.25)), 20: pytest.approx(10.0 / (2.0 * 1.25))}


def test_feature_ranges_over_the_late_half():
    frame = feature_ranges(result([record("none", 0, _constant_rows())], 20), x_t_sq=2.0)
    frame = frame.set_index("skip")
    # late half (step > 10): only step 20 for steps 20 -> a single probe, range 0
    assert frame.loc[1, "low"] == frame.loc[1, "high"] == 18.0 and frame.loc[1, "range"] == 0.0
    frame = feature_ranges(result([record("none", 0, _constant_rows())], 18), x_t_sq=2.0).set_index("skip")
    # steps 18: late half is step > 9, probes 10 and 20: ||h_1||^2 / ||x_t||^2 in {8, 18}, ||h_2||^2 in {2, 0.5}
    assert (frame.loc[1, "low"], frame.loc[1, "high"], frame.loc[1, "range"]) == (8.0, 18.0, 10.0)
    assert (frame.loc[2, "low"], frame.loc[2, "high"], frame.loc[2, "range"]) == (0.5, 2.0, 1.5)
    assert frame.loc[1, "S"] == 1.25 and frame.loc[2, "S"] == 0.25
    assert set(frame.columns) >= {"label", "seed", "S", "low", "high", "range"}


def test_gradient_constants_divide_by_loss_x_t_and_the_tail_sum():
    frame = gradient_constants(result([record("none", 0, _constant_rows())], 20), x_t_sq=2.0)
    assert list(frame.columns) == ["label", "seed", "step", "skip", "grad_norm", "loss", "S", "g"]
    frame = frame.set_index(["step", "skip"])
    assert len(frame) == 6  # the block-b gradients only, one per probe and skip
    assert frame.loc[(0, 1), "g"] == pytest.approx(6.0 / (0.5 * 2.0 * 1.25))
    assert frame.loc[(10, 2), "g"] == pytest.approx(6.0 / (0.25 * 2.0 * 0.25))
    assert frame.loc[(20, 1), "grad_norm"] == 18.0 and frame.loc[(20, 1), "loss"] == 0.2


# -- adam_table -------------------------------------------------------------------------------------
def _adam_rows(values_by_step, blocks=(("model", None),)):
    rows = []
    for step, value in values_by_step.items():
        for block, skip in blocks:
            offset = 0.0 if block == "model" else 100.0 * skip
            rows += [row(step, "adam", block, skip, q, value + offset + k) for k, q in enumerate(
                ("exp_avg_abs", "exp_avg_sq", "update_size", "log_v_std", "m_sign_flip"))]
    return rows


def test_adam_table_averages_the_late_half_and_blanks_diverged_runs():
    blocks = (("model", None), ("b", 1), ("b", 2))
    finished = record("none", 0, _adam_rows({5: 100.0, 10: 1.0, 15: 2.0, 20: 6.0}, blocks))
    diverged = record("CS", 0, _adam_rows({5: 1.0, 10: 1.0}, blocks), diverged_at=12)
    table = adam_table(result([finished, diverged], 20))
    assert table.label.tolist() == ["none", "CS"] and table.diverged_at.tolist()[1] == 12
    assert table.method.tolist() == ["none", "CS"] and table.broke_down.tolist() == [False, True]  # pairs as run_table
    assert table.loc[0, "exp_avg_abs"] == pytest.approx(4.0)  # mean over steps 15 and 20
    assert table.loc[0, "m_sign_flip"] == pytest.approx(8.0)  # + 4 for the fifth quantity
    assert all(math.isnan(table.loc[1, q]) for q in ("exp_avg_abs", "exp_avg_sq", "update_size"))
    decoder = adam_table(result([finished], 20), block="b")
    assert decoder.loc[0, "exp_avg_abs"] == pytest.approx(4.0 + 150.0)  # the mean over b_1 (+100) and b_2 (+200)


# -- robustness_table -------------------------------------------------------------------------------
def _robust_rows(step, kappas, block_lips, model_lip, changes):
    rows = [row(0, "features", None, i, "kappa", 1.0) for i in range(1, len(kappas) + 1)]  # an earlier probe
    rows += [row(step, "features", None, i, "kappa", k) for i, k in enumerate(kappas, start=1)]
    rows += [row(step, "features", None, i, "kappa_rms", 2 * k) for i, k in enumerate(kappas, start=1)]
    for sigma, (output, loss) in changes.items():
        rows += [row(step, "robustness", "model", None, "output_change", output, sigma),
                 row(step, "robustness", "model", None, "loss_change", loss, sigma),
                 row(step, "robustness", "model", None, "loss", 9.0, sigma)]
    for (block, i), lip in block_lips.items():
        rows.append(row(step, "lipschitz", block, i, "jacobian_norm", lip))
    return rows + [row(step, "lipschitz", "model", None, "jacobian_norm", model_lip)]


def test_robustness_table_picks_sigma_and_computes_the_bound():
    lips = {("a", 1): 1.5, ("a", 2): 2.0, ("b", 1): 3.0, ("b", 2): 0.5}
    finished = record("CS", 0, _robust_rows(20, [1.0, 0.5], lips, 7.0, {0.1: (0.3, 0.01), 0.2: (0.6, 0.04)}))
    diverged = record("none", 0, feature_rows(0, [1.0, 1.0], [1.0, 1.0]), diverged_at=3)
    table = robustness_table(result([finished, diverged], 20), sigma=0.2)
    assert list(table.columns) == ["label", "seed", "diverged_at", "output_change", "loss_change", "jacobian", "m0",
                                   "bound", "m0_median", "bound_median"]
    assert table.label.tolist() == ["CS", "none"] and table.diverged_at[1] == 3
    assert table.iloc[1][["output_change", "loss_change", "jacobian", "m0", "bound"]].isna().all()  # no end probes
    only = table.iloc[0]
    assert (only.output_change, only.loss_change, only.jacobian, only.m0) == (0.6, 0.04, 7.0, 3.0)
    assert only.bound == pytest.approx(robustness_factor([1.0, 0.5], 3.0)) and only.bound == pytest.approx(7.5)
    assert only.m0_median == 1.75 and only.bound_median == pytest.approx(1.75 + 0.5 * 1.75**2)
    assert robustness_table(result([finished], 20), sigma=0.1).output_change.item() == 0.3


def test_robustness_table_names_the_sigmas_it_has():
    lips = {("a", 1): 1.0, ("b", 1): 1.0}
    finished = record("CS", 0, _robust_rows(20, [1.0], lips, 1.0, {0.1: (0.3, 0.01), 0.5: (0.6, 0.04)}))
    with pytest.raises(ValueError, match=r"sigma 0.3 was not probed; .* have \[.*0\.1.*, .*0\.5.*\]"):
        robustness_table(result([finished], 20), sigma=0.3)


def test_robustness_table_lists_the_sigmas_as_plain_numbers():
    lips = {("a", 1): 1.0, ("b", 1): 1.0}
    finished = record("CS", 0, _robust_rows(20, [1.0], lips, 1.0, {0.1: (0.3, 0.01), 0.5: (0.6, 0.04)}))
    with pytest.raises(ValueError, match=r" have \[0\.1, 0\.5\]$"):
        robustness_table(result([finished], 20), sigma=0.3)


def test_robustness_table_when_the_last_feature_probe_is_before_the_end():
    lips = {("a", 1): 2.0, ("b", 1): 2.0}
    rows = _robust_rows(20, [1.0, 0.5], lips, 1.0, {0.1: (0.3, 0.01)})
    rows = [dict(r, step=25) if r["probe"] in ("robustness", "lipschitz") else r for r in rows]  # 25 % 10 != 0
    table = robustness_table(result([record("CS", 0, rows)], 25), sigma=0.1)
    assert table.bound.item() == pytest.approx(robustness_factor([1.0, 0.5], 2.0))


# -- xt_norm_ratio (Lemma 3.2 on real images) -------------------------------------------------------
@pytest.fixture(scope="module")
def digits():
    return load_dataset("digits8x8", image_size=16).tensors()[0]


def test_xt_norm_ratio_matches_its_expectation_on_digits(digits):
    frame = xt_norm_ratio(digits, linear_schedule(), [0, 100, 300, 600, 999])
    assert list(frame.columns) == ["t", "mean", "q05", "q95", "expected"]
    assert frame.t.tolist() == [0, 100, 300, 600, 999]
    assert ((frame["mean"] - frame.expected).abs() / frame.expected).max() < 0.01  # 1617 images: within 1%
    assert frame.expected.is_monotonic_increasing  # mostly-black digits: from E||x_0||^2 / m (about 0.56) up to 1
    assert ((frame.q05 < frame["mean"]) & (frame["mean"] < frame.q95)).all()
    x0 = digits.flatten(1).square().sum(1).mean().item() / digits[0].numel()
    assert frame.expected[0] == pytest.approx(x0, abs=2e-4)  # abar_0 = 1 - 1e-4
    assert frame.expected.iloc[-1] == pytest.approx(1.0, abs=1e-3)  # pure noise at the end
    again = xt_norm_ratio(digits, linear_schedule(), [0, 100, 300, 600, 999])
    assert again.equals(frame)  # seeded
    assert xt_norm_ratio(digits, linear_schedule(), [600], seed=1)["mean"][0] != frame["mean"][3]


def test_xt_norm_ratio_at_an_unnoised_step_is_the_datas_own_ratio(digits):
    schedule = DiscreteSchedule(torch.linspace(1.0, 0.01, 50, dtype=torch.float64))  # abar_0 = 1 exactly
    frame = xt_norm_ratio(digits, schedule, [0, 49])
    x0 = digits.flatten(1).square().sum(1).mean().item() / digits[0].numel()
    assert frame.expected[0] == x0
    assert frame["mean"][0] == pytest.approx(x0, rel=1e-6)
    assert frame.expected[1] == pytest.approx(0.01 * x0 + 0.99)


# -- Frechet distance over training, speed-up, the geometric fit -------------------------------------
def fd_result(curves, steps=(100, 200, 300, 400), diverged=()):
    """A result whose runs carry only what fd_curves/speedup read: {(label, seed): fcd values}."""
    runs = [{"label": label, "run": {"seed": seed}, "diverged_at": 250 if (label, seed) in diverged else None,
             "fd": {"step": list(steps)[:len(values)], "fcd": list(values)}}
            for (label, seed), values in curves.items()]
    return ExperimentResult({"profile": {"steps": steps[-1]}}, {}, runs)


def test_steps_to_reach_interpolates_between_evaluations():
    steps = [100, 200, 300]
    assert evidence.steps_to_reach(steps, [30, 20, 10], 15) == pytest.approx(250)
    assert evidence.steps_to_reach(steps, [30, 20, 10], 20) == 200
    assert evidence.steps_to_reach(steps, [12, 20, 10], 15) == 100  # already there at the first evaluation
    assert math.isnan(evidence.steps_to_reach(steps, [30, 20, 16], 15))
    assert evidence.steps_to_reach(steps, [30, 10, 20], 20) == pytest.approx(150)  # the first crossing counts
    with pytest.raises(ValueError, match="as many steps as values"):
        evidence.steps_to_reach(steps, [1, 2], 1)


def test_speedup_counts_the_steps_to_a_declared_target_paired_by_seed():
    result = fd_result({
        ("none", 0): [40, 30, 20, 10], ("none", 1): [40, 34, 20, 12],  # the target: median at step 200, 32
        ("CS", 0): [30, 10, 8, 6], ("CS", 1): [40, 36, 20, 11],
        ("LS", 0): [40, 36, 34, 33], ("LS", 1): [36, 34],  # LS seed 1 diverged after step 200
    }, diverged={("LS", 1)})
    table = evidence.speedup(result).set_index(["label", "seed"])
    assert (table.target == 32).all()
    assert list(table.loc[("none", 0), ["steps", "speedup"]]) == [pytest.approx(180), 1]
    assert table.loc[("none", 1), "steps"] == pytest.approx(200 + 100 * 2 / 14)
    assert table.loc[("CS", 0), "steps"] == 100 and table.loc[("CS", 0), "speedup"] == pytest.approx(1.8)
    assert table.loc[("CS", 1), "steps"] == pytest.approx(200 + 100 * 4 / 16)
    assert not table.loc[("LS", 0), "reached"] and math.isnan(table.loc[("LS", 0), "speedup"])
    assert not table.loc[("LS", 1), "reached"] and table.loc[("LS", 1), "diverged_at"] == 250
    assert (table["last"] == 400).all()  # the planned length, also for the run that diverged early
    assert by_method(table.reset_index(), "speedup")["LS"].diverged == 1
    ema = evidence.speedup(result, at=1.0).set_index(["label", "seed"])  # the target: median final value
    assert (ema.target == 11).all() and not ema.loc[("none", 1), "reached"]


def test_speedup_claim_pairs_only_seeds_both_arms_finished():
    curves = {("none", 0): [40, 30, 20, 10], ("none", 1): [40, 34, 20, 12], ("none", 2): [40, 30, 20, 10],
              ("CS", 0): [30, 10, 8, 6], ("CS", 1): [40, 20, 12, 11]}  # CS seed 2 has not landed
    claim = evidence.speedup_claim(6, "CS trains faster", evidence.speedup(fd_result(curves)), "CS", 3, family="f")
    assert claim.test.n == 2 and claim.landing and claim.decided == "undecided" and claim.family == "f"
    assert claim.measured.startswith("speed-up ") and claim.measured.endswith("n = 2")
    one = {k: v for k, v in curves.items() if k[1] == 0 or k[0] == "none"}
    early = evidence.speedup_claim(6, "CS trains faster", evidence.speedup(fd_result(one)), "CS", planned=3)
    assert early.test is None and early.measured == "runs landing: 1 of 3 seeds"
    none_yet = evidence.speedup_claim(6, "CS trains faster", pd.DataFrame(), "CS", planned=3, family="f")
    assert none_yet.test is None and none_yet.measured == "runs landing: 0 of 3 seeds" and none_yet.family == "f"


def test_speedup_recovers_a_known_speedup_and_finds_none_where_there_is_none():
    """Simulated training curves with a known answer: each seed's baseline decays on its own time
    scale (seeds differ), the method's curve is the same seed's decay ``k`` times faster, and every
    evaluation carries noise. The procedure must find k = 1.5 in most of 200 experiments of 16
    seeds and cover it with its 95% interval about 95% of the time, and at k = 1 call the method
    faster in no more than about 5%."""
    import numpy as np
    import pandas as pd

    steps = np.arange(100, 1201, 100)

    def experiment(rng, k, seeds=16):
        rows = []
        for seed in range(seeds):
            tau = 400 * rng.lognormal(0, 0.25)
            for label, scale in (("none", tau), ("CS", tau / k)):
                value = (40 + 400 * np.exp(-steps / scale)) * rng.lognormal(0, 0.03, len(steps))
                rows += [{"label": label, "seed": seed, "step": s, "value": v} for s, v in zip(steps, value)]
        curves = pd.DataFrame(rows)
        speed = evidence.steps_to_target(curves, evidence.speed_target(curves))
        return evidence.speedup_verdict(speed, "CS")[1]

    rng = np.random.default_rng(0)
    fast = [experiment(rng, 1.5) for _ in range(200)]
    assert np.mean([t.verdict == "reproduced" for t in fast]) > 0.9
    assert 0.9 < np.mean([t.ci[0] <= -math.log(1.5) <= t.ci[1] for t in fast]) <= 1
    same = [experiment(rng, 1.0) for _ in range(200)]
    assert np.mean([t.verdict == "reproduced" for t in same]) < 0.08


def test_fd_curves_need_an_experiment_that_measured_them():
    frame = evidence.fd_curves(fd_result({("none", 0): [3, 2, 1, 0.5]}))
    assert list(frame.columns) == ["label", "seed", "step", "fcd"] and frame.fcd.tolist() == [3, 2, 1, 0.5]
    with pytest.raises(ValueError, match="fd_points"):
        evidence.fd_curves(ExperimentResult({}, {}, [{"label": "none", "run": {"seed": 0}}]))
    with pytest.raises(ValueError, match="no runs labelled 'base'"):
        evidence.speedup(fd_result({("none", 0): [3, 2, 1, 0.5]}), baseline="base")


def test_fitted_kappas_fit_each_learned_runs_last_gates():
    runs = [record("LS", seed, feature_rows(0, [1.0] * 3, [1.0] * 3, kappa=[1.0] * 3)
                   + feature_rows(8, [1.0] * 3, [1.0] * 3, kappa=[0.8 * k**i for i in range(3)]))
            for seed, k in ((0, 0.5), (1, 0.7))]
    runs.append(record("none", 0, feature_rows(8, [1.0] * 3, [1.0] * 3, kappa=[1.0] * 3)))
    fits = evidence.fitted_kappas(result(runs, 8), ["LS"])
    assert fits.label.tolist() == ["LS", "LS"] and fits.seed.tolist() == [0, 1]
    assert fits.kappa.tolist() == pytest.approx([0.5, 0.7]) and fits.level.tolist() == pytest.approx([0.8, 0.8])
    with pytest.raises(ValueError, match="no learned coefficients of \\['LS per skip'\\]"):
        evidence.fitted_kappas(result(runs, 8), ["LS per skip"])


def test_geometric_fit_recovers_cs_and_measures_departures():
    kappa, level, r2 = evidence.geometric_fit([0.8 * 0.6**k for k in range(6)])
    assert (kappa, level, r2) == pytest.approx((0.6, 0.8, 1.0))
    kappa, _, r2 = evidence.geometric_fit([0.5, 0.9, 0.4, 0.8])  # zigzag: no geometric profile
    assert r2 < 0.2
    assert evidence.geometric_fit([0.7, 0.7, 0.7])[0] == pytest.approx(1) and math.isnan(
        evidence.geometric_fit([0.7, 0.7, 0.7])[2])
    for bad in ([1.0], [1.0, 0.0], [[1.0, 0.5]], [1.0, math.inf], [math.nan, 0.5]):
        with pytest.raises(ValueError, match="two positive"):
            evidence.geometric_fit(bad)


def test_speedup_verdict_pairs_the_steps_and_reports_unreached_seeds():
    def table(label, values):
        return pd.DataFrame({"label": label, "seed": range(len(values)), "diverged_at": None,
                             "reached": [v == v for v in values], "speedup": values, "base_steps": 100.0,
                             "steps": [100.0 / v if v == v else float("nan") for v in values], "last": 400.0,
                             "target": 7.0})

    import pandas as pd

    speed = pd.concat([table("fast", [1.5, 1.6, 1.55]), table("same", [0.8, 1.3, 1.0]),
                       table("slow", [0.5, 0.6, 0.55]), table("split", [1.2, float("nan"), 1.3]),
                       table("never", [float("nan")] * 3)])
    text, test = evidence.speedup_verdict(speed, "fast")
    assert test.verdict == "reproduced" and text.startswith("speed-up 1.55× [") and text.endswith("to reach 7, n = 3")
    assert test == paired_test([math.log(100.0)] * 3, [math.log(100 / v) for v in (1.5, 1.6, 1.55)],
                               math.log1p(0.05))
    assert evidence.speedup_verdict(speed, "same")[1].verdict == "undecided"
    assert evidence.speedup_verdict(speed, "slow")[1].verdict == "contradicted"
    text, test = evidence.speedup_verdict(speed, "split")  # the unreached seed counts at the run's length, 400
    assert text.endswith("(1 of 3 pairs with a run that never gets there: counted at the run's length)")
    assert test.censored == 1 and test.estimate == pytest.approx(
        (math.log(1 / 1.2) + math.log(4) + math.log(1 / 1.3)) / 3)
    never = evidence.speedup_verdict(speed, "never")[1]
    assert never.censored == 3 and never.verdict == "contradicted"  # 4x slower at least, in every seed
    tight = replace(paired_test([0.0, 0.1, 0.0, 0.1], [0.0, 0.1, 0.01, 0.1], 0.5), censored=1)
    assert tight.verdict == "undecided"  # inside the margin, but a bound cannot show a difference is absent
    with pytest.raises(KeyError, match="no runs labelled 'LS'"):
        evidence.speedup_verdict(speed, "LS")
    at_start = pd.concat([table("start", [1.0, 2.0, 1.0])]).assign(base_steps=[0.0, 100.0, 100.0],
                                                                   steps=[0.0, 50.0, 100.0])
    text, test = evidence.speedup_verdict(at_start, "start")  # seed 0 is there at the step-0 probe
    assert math.isfinite(test.estimate) and test.n == 3


def test_ratio_and_rate_texts_read_the_tests_back():
    test = compare(_paired_table([(1.0, 0.5), (2.0, 1.1), (4.0, 1.9), (8.0, 4.2)]), "loss", "CS")
    lo, hi = (math.exp(v) for v in test.ci)
    assert evidence.ratio_text(test, "loss") == f"loss {math.exp(test.estimate):.2f}× [{lo:.2f}, {hi:.2f}], n = 4"
    rates = compare_breakdowns(_paired_table([(1.0, 0.5)] * 8, broke=range(8)), "CS")
    assert evidence.rate_text(rates, ("none", "CS")).startswith("none 8/8 [0.63, 1.00], CS 0/8 [0.00, 0.37]")


def test_trend_over_a_run_table_skips_runs_without_the_value_and_needs_four():
    table = pd.DataFrame({"N": [2, 4, 6, 8, 2, 4], "osc": [1.0, 2.0, 3.0, 4.0, 1.5, None]})
    test = evidence.trend(table, "N", "osc")
    assert test.n == 5 and test.estimate > 0.9 and test.direction == "greater"
    assert evidence.trend(table.iloc[:3], "N", "osc") is None


def test_the_declared_powers_of_the_confirmations_of_endpoints_hold_on_their_committed_pilots():
    """experiments.CONFIRMATIONS states each confirmation's power at its pilot's effect."""
    from scalelong_edu.experiments import finished_so_far

    unet = evidence.run_table(finished_so_far("main-unet", "cpu"))
    uvit = evidence.run_table(finished_so_far("main-uvit", "cpu"))
    deep = evidence.run_table(finished_so_far("depth-trained", "cpu"))
    grid = evidence.complete_seeds(evidence.run_table(finished_so_far("kappa-trained", "cpu")))
    cs, sqrt2 = "CS (kappa=0.5)", "1/sqrt(2)-CS"
    declared = [  # (confirmation, its rows in the chapter's family, endpoint, pilot, treatment, baseline, where, power)
        ("unet-confirm", 2, "feature_level", unet, cs, "none", {}, 0.91),
        ("unet-confirm", 2, "feature_range_late", unet, cs, "none", {}, 0.85),
        ("uvit-confirm", 2, "feature_level", uvit, sqrt2, "none", {}, 0.62),  # chapter 3
        ("uvit-confirm", 2, "feature_level", uvit, cs, "none", {}, 0.40),
        ("uvit-confirm", 1, "grad_osc", uvit, cs, "none", {}, 0.90),  # chapter 4
        ("uvit-confirm", 2, "feature_range_late", uvit, "LS", "none", {}, 0.77),  # chapter 7
        ("uvit-confirm", 2, "feature_osc", uvit, "LS", "none", {}, 0.34),
        ("depth-confirm", 4, "ema_loss", deep, cs, sqrt2, {"N": 8}, 0.92),
        ("depth-confirm", 4, "feature_range_late", deep, cs, "none", {"N": 8}, 0.71),
        ("depth-confirm", 4, "feature_osc", deep, cs, "none", {"N": 8}, 0.52),
        ("depth-confirm", 4, "ema_loss", grid, cs, "CS (kappa=0.3)", {"N": 8}, 0.95)]
    for name, tests, column, pilot, treatment, baseline, where, power in declared:
        got = evidence.confirmation_power(name, pilot, column, treatment, baseline, tests=tests, **where)
        assert round(got, 2) == power, (name, column, treatment, baseline)
    fits = evidence.fitted_kappas(finished_so_far("scaling-uvit", "cpu"), ["LS per skip"])  # ls-confirm's pilot
    log_kappa = np.log(fits.kappa)
    effect, fresh = abs(log_kappa.mean()) / log_kappa.std(), CONFIRMATIONS["ls-confirm"].fresh
    assert round(effect, 1) == 4.5 and paired_power(effect, fresh) > 0.999
    assert round(paired_power(effect / 3, fresh), 2) == 0.95


def test_depth_speed_confirms_declared_powers_hold_on_its_pilot_by_seed():
    """experiments.CONFIRMATIONS states depth-speed-confirm's powers on its pilot's seed means."""
    from scalelong_edu.experiments import DEPTHS, finished_so_far

    depth = evidence.run_table(finished_so_far("depth-uvit", "cpu"))  # 3 seeds x N = 2, 4, 6, 8
    pilot = evidence.seed_means(depth, "loss", "N", DEPTHS)
    for treatment, power, half in (("LS", 0.54, 0.15), ("CS (kappa=0.5)", 0.57, 0.15)):
        test = compare(pilot, "loss", treatment)
        got = evidence.confirmation_power("depth-speed-confirm", pilot, "loss", treatment, tests=2)
        assert round(got, 2) == power, treatment
        assert round(paired_power(test.estimate / 2 / test.sd, 12, 0.025), 2) == half, treatment


def test_the_later_speed_confirmations_declared_powers_hold_on_their_pilots_by_seed():
    """experiments.CONFIRMATIONS states depth-unet-speed-confirm's powers and chances of a decision
    (at half the effects and twice the SDs), depth-sqrt2-speed-confirm's, depth-cs-speed-confirm's and
    depth-cs-speed-confirm-2's on their pilots."""
    from scalelong_edu.experiments import DEPTHS, finished_so_far
    from scalelong_edu.stats import ALPHA, decision_chance

    def pilot(name):
        return evidence.seed_means(evidence.run_table(finished_so_far(name, "cpu")), "loss", "N", DEPTHS)

    unet = pilot("depth-unet")
    for treatment, sd, chance in (("1/sqrt(2)-CS", 0.0074, 1.0), ("LS", 0.018, 0.87)):
        test = compare(unet, "loss", treatment)
        assert round(test.sd, 4 if sd < 0.01 else 3) == sd, treatment
        assert evidence.confirmation_power("depth-unet-speed-confirm", unet, "loss", treatment, tests=2) > 0.999
        assert paired_power(test.estimate / 2 / test.sd, 12, ALPHA / 2) > 0.999
        half = decision_chance(test.estimate / 2, 2 * test.sd, 12, math.log1p(0.05), ALPHA / 2)
        assert round(half, 2) == chance, treatment
    uvit = pilot("depth-uvit")
    test = compare(uvit, "loss", "1/sqrt(2)-CS")
    assert round(evidence.confirmation_power("depth-sqrt2-speed-confirm", uvit, "loss", "1/sqrt(2)-CS", tests=1),
                 2) == 0.52
    chances = [decision_chance(e, test.sd, 12, math.log1p(0.05)) for e in (test.estimate, test.estimate / 2)]
    assert [round(c, 2) for c in chances] == [0.58, 0.44]
    absent = [absent_chance(e, test.sd, 12, math.log1p(0.05)) for e in (test.estimate, test.estimate / 2)]
    assert [round(c, 2) for c in absent] == [0.07, 0.27]
    at_half_alpha = [f(test.estimate, test.sd, 12, math.log1p(0.05), ALPHA / 2)
                     for f in (decision_chance, absent_chance)]  # depth-speed-confirm's family level
    assert [round(c, 2) for c in at_half_alpha] == [0.46, 0.07]
    speed = pilot("depth-speed-confirm")  # depth-cs-speed-confirm's pilot: its CS row, undecided
    test = compare(speed, "loss", "CS (kappa=0.5)")
    assert (round(test.p, 3), round(test.sd, 3)) == (0.050, 0.077)
    assert round(evidence.confirmation_power("depth-cs-speed-confirm", speed, "loss", "CS (kappa=0.5)", tests=1),
                 2) == 0.77
    chances = [decision_chance(e, test.sd, 20, math.log1p(0.05)) for e in (test.estimate, test.estimate / 2)]
    assert [round(c, 2) for c in chances] == [0.79, 0.52]
    again = pilot("depth-cs-speed-confirm")  # depth-cs-speed-confirm-2's pilot: the same row, undecided again
    test = compare(again, "loss", "CS (kappa=0.5)")
    assert (round(test.p, 2), round(test.sd, 3)) == (0.16, 0.107)
    assert round(evidence.confirmation_power("depth-cs-speed-confirm-2", again, "loss", "CS (kappa=0.5)", tests=1),
                 2) == 0.53
    chances = [decision_chance(e, test.sd, 40, math.log1p(0.05)) for e in (test.estimate, test.estimate / 2, 0.0)]
    assert [round(c, 2) for c in chances] == [0.65, 0.58, 0.66]
    absent = [absent_chance(e, test.sd, 40, math.log1p(0.05)) for e in (test.estimate, test.estimate / 2, 0.0)]
    assert [round(c, 2) for c in absent] == [0.12, 0.41, 0.61]


def test_uvit_ls_osc_confirms_declared_power_and_decision_chances_hold_on_its_pilot():
    """experiments.CONFIRMATIONS states uvit-ls-osc-confirm's power and chances of a decision on
    its pilot, uvit-confirm's LS row (chapter 7)."""
    from scalelong_edu.stats import decision_chance

    pilot = evidence.landed("uvit-confirm", "cpu")
    test = compare(pilot, "feature_osc", "LS")
    assert (round(math.exp(test.estimate), 2), round(test.p, 3), round(test.sd, 3)) == (1.13, 0.053, 0.294)
    assert round(evidence.confirmation_power("uvit-ls-osc-confirm", pilot, "feature_osc", "LS", tests=1), 2) == 0.81
    fresh = CONFIRMATIONS["uvit-ls-osc-confirm"].fresh
    chances = [decision_chance(e, test.sd, fresh, math.log1p(0.05)) for e in (test.estimate, test.estimate / 2)]
    assert [round(c, 2) for c in chances] == [0.81, 0.30]


def test_depth_osc_confirms_declared_power_and_decision_chances_hold_on_its_pilot():
    """experiments.CONFIRMATIONS states depth-osc-confirm's power and chances of a decision on its
    pilot, depth-confirm's CS row of the feature oscillation at N = 8 (chapter 8)."""
    from scalelong_edu.stats import decision_chance

    pilot = evidence.landed("depth-confirm", "cpu")
    test = compare(pilot, "feature_osc", "CS (kappa=0.5)")
    assert (round(math.exp(test.estimate), 2), round(test.p, 3), round(test.sd, 3)) == (1.48, 0.023, 0.711)
    assert round(evidence.confirmation_power("depth-osc-confirm", pilot, "feature_osc", "CS (kappa=0.5)",
                                             tests=1), 2) == 0.80
    fresh = CONFIRMATIONS["depth-osc-confirm"].fresh
    chances = [decision_chance(e, test.sd, fresh, math.log1p(0.05)) for e in (test.estimate, test.estimate / 2)]
    assert [round(c, 2) for c in chances] == [0.80, 0.30]


def test_unet_flips_confirms_declared_power_and_decision_chances_hold_on_its_pilot():
    """experiments.CONFIRMATIONS states unet-flips-confirm's power and chances of a decision on its
    pilot, unet-confirm's conv UNet row of the sign flips of Adam's m (chapter 4)."""
    from scalelong_edu.stats import decision_chance

    pilot = evidence.landed("unet-confirm", "cpu", measure=evidence.adam_table)
    test = compare(pilot, "m_sign_flip", "CS (kappa=0.5)", share=True)
    assert (round(math.exp(test.estimate), 2), round(test.p, 2), round(test.sd, 3)) == (1.03, 0.21, 0.107)
    assert round(evidence.confirmation_power("unet-flips-confirm", pilot, "m_sign_flip", "CS (kappa=0.5)",
                                             tests=1, share=True), 2) == 0.51
    fresh = CONFIRMATIONS["unet-flips-confirm"].fresh
    chances = [decision_chance(e, test.sd, fresh, math.log1p(0.05)) for e in (test.estimate, test.estimate / 2, 0)]
    assert [round(c, 2) for c in chances] == [0.82, 0.86, 0.92]
    absent = [absent_chance(e, test.sd, fresh, math.log1p(0.05)) for e in (test.estimate, test.estimate / 2, 0)]
    assert [round(c, 2) for c in absent] == [0.31, 0.69, 0.87]


def test_unet_fcd_confirms_declared_powers_and_decision_chances_hold_on_its_pilot():
    """experiments.CONFIRMATIONS states, for unet-fcd-confirm, each row's power and (where a row
    leans to absent) its chance of a decision, and the decided rows expected at the pilot's effects
    and at half of them."""
    from scalelong_edu.experiments import finished_so_far

    pilot = finished_so_far("main-unet", "cpu")
    table, speed = evidence.run_table(pilot), evidence.speedup(pilot)
    cs = "CS (kappa=0.5)"
    declared = [  # (test on the pilot, its family's size, power, chance of a decision or None)
        (evidence.speedup_verdict(speed, "1/sqrt(2)-CS")[1], 3, 0.97, None),  # chapter 6
        (evidence.speedup_verdict(speed, cs)[1], 3, 0.09, 0.35),
        (compare(table, "fcd", cs), 3, 0.10, 0.37),
        (evidence.speedup_verdict(speed, "LS")[1], 2, 0.63, None),  # chapter 7
        (compare(table, "feature_osc", "LS"), 2, 0.41, None),
        (compare(table, "grad_osc", cs), 1, 0.33, None)]  # chapter 4
    fresh, margin = CONFIRMATIONS["unet-fcd-confirm"].fresh, math.log1p(0.05)
    expected = {1.0: 0.0, 0.5: 0.0}
    for test, tests, power, chance in declared:
        assert round(paired_power(abs(test.estimate) / test.sd, fresh, 0.05 / tests), 2) == power
        for scale in expected:
            decided = decision_chance(scale * test.estimate, test.sd, fresh, margin, 0.05 / tests)
            expected[scale] += decided
            if scale == 1.0 and chance is not None:
                assert round(decided, 2) == chance
    assert (round(expected[1.0], 1), round(expected[0.5], 1)) == (3.1, 2.3)


def test_uvit_fcd_confirms_declared_powers_and_decision_chances_hold_on_its_pilot():
    """experiments.CONFIRMATIONS states, for uvit-fcd-confirm's family of two and for the LS row it
    leaves out, each pilot speed-up, its SD, power and chance of a decision, and that 1 of the
    pilot's 16 pairs had a run that never reached the target."""
    from scalelong_edu.experiments import finished_so_far

    speed = evidence.speedup(finished_so_far("main-uvit", "cpu"))
    fresh, margin = CONFIRMATIONS["uvit-fcd-confirm"].fresh, math.log1p(0.05)
    declared = {"1/sqrt(2)-CS": (0.98, 0.060, 0.29, 0.82, 1), "CS (kappa=0.5)": (0.99, 0.104, 0.03, 0.24, 0),
                "LS": (1.10, 0.37, None, 0.15, 0)}
    for label, (ratio, sd, power, chance, censored) in declared.items():
        test = evidence.speedup_verdict(speed, label)[1]
        assert round(math.exp(-test.estimate), 2) == ratio and test.sd == pytest.approx(sd, abs=0.005)
        assert test.censored == censored and test.n == 16
        if power is not None:
            assert round(paired_power(abs(test.estimate) / test.sd, fresh, 0.025), 2) == power
        assert round(decision_chance(test.estimate, test.sd, fresh, margin, 0.025), 2) == chance


def test_block_output_confirms_declared_powers_hold_on_its_pilot_at_eta_one_half():
    """experiments.CONFIRMATIONS states block-output-confirm's power on CS's feature oscillation
    (at the pilot's effect and at half of it) and its chance of deciding the EMA loss."""
    import pandas as pd

    from scalelong_edu.experiments import finished_so_far

    grid = evidence.run_table(finished_so_far("kappa-trained", "cpu"))
    block = evidence.run_table(finished_so_far("block-output-trained", "cpu"))
    pilot = pd.concat([grid[grid.kappa == 0.5], block[block.kappa == 0.5]])
    cs, bo, fresh = "CS (kappa=0.5)", "block-output (eta=0.5)", CONFIRMATIONS["block-output-confirm"].fresh
    osc, loss = (compare(pilot, column, cs, bo) for column in ("feature_osc", "ema_loss"))
    assert (round(math.exp(osc.estimate), 2), round(osc.sd, 2)) == (0.57, 0.42)
    assert round(evidence.confirmation_power("block-output-confirm", pilot, "feature_osc", cs, bo, tests=2), 2) == 1.0
    assert round(paired_power(abs(osc.estimate) / 2 / osc.sd, fresh, 0.025), 2) == 0.69
    assert round(decision_chance(loss.estimate, loss.sd, fresh, math.log1p(0.05), 0.025), 2) == 0.13


def test_a_paired_claim_carries_its_family_landed_or_not():
    table = _paired_table([(1.0, 0.5), (1.0, 0.6), (1.0, 0.55)])
    assert evidence.paired_claim(3, "CS lowers it", table, "loss", "CS", 3, family="f").family == "f"
    assert evidence.paired_claim(3, "CS lowers it", table.iloc[:2], "loss", "CS", 3, family="f").family == "f"


def test_seeds_landed_counts_the_seeds_every_method_has_finished():
    import pandas as pd

    table = _paired_table([(1.0, 0.5)] * 3)
    assert evidence.seeds_landed(table) == 3 and evidence.seeds_landed(table.iloc[:-1]) == 2
    assert evidence.seeds_landed(pd.DataFrame()) == 0
