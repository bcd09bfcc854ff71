"""Tests of scalelong_edu.sweeps: the settings of each run read back from a trained sweep,
summaries over seeds, the breakdown rule and the stability map."""

import math
from dataclasses import replace

import pandas as pd
import pytest

from scalelong_edu import evidence
from scalelong_edu import experiments as ex
from scalelong_edu import sweeps
from scalelong_edu.experiments import depth_overrides
from scalelong_edu.models import build_model
from scalelong_edu.profiles import PROFILES

TINY = replace(PROFILES["ci"], steps=4, eval_every=2, batch_size=8, n_samples=4, sample_steps=2, seeds=2)
SWEEP = ex.Experiment(
    "tiny-sweep", "two depths, three methods",
    tuple(ex.RunSpec(f"{label}, N={n}", "uvit", method, kappa, model_overrides=depth_overrides("uvit", n))
          for n in (1, 2) for label, method, kappa in (("none", "none", 1.0), ("CS (kappa=0.5)", "cs", 0.5),
                                                       ("LS", "ls", 1.0))),
    adam_stats=False, fd_points=1, end_probes=False,
)


@pytest.fixture(scope="module")
def table(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SCALELONG_RESULTS", str(tmp_path_factory.mktemp("results")))
        mp.setitem(ex.EXPERIMENTS, SWEEP.name, SWEEP)
        return evidence.run_table(ex.run_experiment(SWEEP.name, TINY, progress=False))


def test_run_table_reads_each_runs_setting(table):
    assert len(table) == 12 and set(table.seed) == {0, 1}
    assert list(dict.fromkeys(table.method)) == ["none", "CS (kappa=0.5)", "LS"]
    assert list(table.N[table.seed == 0]) == [1, 1, 1, 2, 2, 2]
    assert set(table.experiment) == {"tiny-sweep"} and set(table.lr_scale) == {1.0}
    assert table.fcd.notna().all() and (table.fcd > 0).all()  # the end-of-training Frechet distance
    assert (table.wall_time_s > 0).all()


def test_sum_kappa2_of_each_method_at_each_depth(table):
    none, cs, ls = (table[(table.method == m) & (table.N == 2)].sum_kappa2.iloc[0]
                    for m in ("none", "CS (kappa=0.5)", "LS"))
    assert none == 2 and cs == pytest.approx(1 + 0.25) and math.isnan(ls)
    assert sweeps.sum_kappa2("sqrt2-cs", 1.0, 8) == pytest.approx(4)
    assert sweeps.sum_kappa2("cs", 0.5, 8) == pytest.approx((1 - 0.25**8) / 0.75)
    # block-output leaves the skips alone but scales the stream: path k carries eta^(k-1), like CS
    assert sweeps.sum_kappa2("block-output", 0.5, 8) == pytest.approx(sweeps.sum_kappa2("cs", 0.5, 8))


@pytest.mark.parametrize("backbone, preset",
                         [("uvit", "uvit-s"), ("uvit", "uvit-m"), ("unet", "unet-s"), ("unet", "unet-m")])
@pytest.mark.parametrize("n", [2, 4, 6, 8])
def test_depth_overrides_give_n_skips(backbone, preset, n):
    run = {"model_overrides": [list(kv) for kv in depth_overrides(backbone, n)]}  # as cached (JSON)
    assert sweeps.n_skips(run, preset) == n
    assert build_model(preset, 1, 16, **dict(depth_overrides(backbone, n))).n_skips == n


def test_depth_overrides_refuse_an_odd_conv_unet():
    with pytest.raises(ValueError, match="two long skips per level"):
        depth_overrides("unet", 3)


def frame(rows):
    return pd.DataFrame(rows, columns=["method", "lr_scale", "N", "seed", "loss", "feature_osc", "diverged_at"])


def test_summarize_gives_mean_interval_and_counts_divergences():
    table = frame([("CS", 1, 2, 0, 0.1, 0, None), ("CS", 1, 2, 1, 0.3, 0, None), ("CS", 1, 2, 2, math.nan, 0, 17),
                   ("none", 1, 2, 0, 0.2, 0, None)])
    out = sweeps.summarize(table, "loss", by=("method", "N")).set_index("method")
    assert out.loc["CS", "mean"] == pytest.approx(0.2) and out.loc["CS", "lo"] < 0.1 < 0.3 < out.loc["CS", "hi"]
    assert tuple(out.loc["CS", ["finished", "diverged", "runs"]]) == (2, 1, 3)
    assert out.loc["none", "mean"] == 0.2 and math.isnan(out.loc["none", "lo"])  # one run: no interval
    with pytest.raises(KeyError, match="no column 'fcd'"):
        sweeps.summarize(table, "fcd")
    spread = frame([("CS", 1, 2, seed, loss, 0, None) for seed, loss in enumerate((0.01, 0.02, 0.5))])
    plain = sweeps.summarize(spread, "loss", by=("method",)).iloc[0]
    geometric = sweeps.summarize(spread, "loss", by=("method",), log=True).iloc[0]
    assert plain.lo < 0 < geometric.lo < geometric["mean"] < geometric.hi  # a loss's interval stays positive
    assert geometric["mean"] == pytest.approx((0.01 * 0.02 * 0.5) ** (1 / 3))


MAP = [("CS", 16, 2, 0, 0.97, 0.1, None), ("CS", 16, 2, 1, 0.09, 0.1, None), ("CS", 16, 4, 0, math.nan, math.nan, 40),
       ("CS", 16, 4, 1, 0.49, 0.1, None), ("none", 16, 2, 0, 0.08, 0.5, None), ("none", 16, 2, 1, 0.5, 0.1, None),
       ("none", 1, 2, 0, 0.1, 0.1, None), ("none", 1, 2, 1, 0.1, 0.2, None)]


def test_unstable_runs_diverged_broke_down_or_oscillated_beyond_their_depths_limit():
    table = frame(MAP + [("none", 1, 4, 0, 0.1, 0.4, None), ("CS", 16, 4, 2, 0.1, 0.5, None)])
    assert list(sweeps.unstable(table)) == [True, False, True, False, False, True, False, False, False, False]
    limits = sweeps.oscillation_limit(table)
    assert limits[2] == pytest.approx(3 * 0.15) and limits[4] == pytest.approx(3 * 0.4)  # per depth
    osc = sweeps.unstable(table, osc_limit=limits)
    assert list(osc) == [True, False, True, False, True, True, False, False, False, False]
    assert math.isnan(sweeps.oscillation_limit(table[table.lr_scale == 16])[2])  # nothing to set it from
    nan_limits = sweeps.oscillation_limit(table[table.lr_scale == 16])
    assert list(sweeps.unstable(table, osc_limit=nan_limits)) == list(sweeps.unstable(table))


def test_stability_map_counts_unstable_runs_per_setting():
    out = sweeps.stability_map(frame(MAP))
    assert list(out.columns) == ["method", "lr_scale", "N", "unstable", "runs", "share"]
    assert list(out.share) == [0.5, 0.5, 0.5, 0.0] and list(out.runs) == [2, 2, 2, 2]
    assert list(sweeps.stability_map(frame(MAP), limit=0.4).unstable) == [1, 2, 1, 0]
    limits = sweeps.oscillation_limit(frame(MAP))
    assert list(sweeps.stability_map(frame(MAP), osc_limit=limits).unstable) == [1, 1, 2, 0]


def test_stability_verdict_pairs_each_setting_and_seed():
    def runs(cs_unstable, none_unstable, n=12):
        rows = [("CS", 16, 8, seed, 0.97 if seed < cs_unstable else 0.1, 0.1, None) for seed in range(n)]
        rows += [("none", 16, 8, seed, 0.97 if seed < none_unstable else 0.1, 0.1, None) for seed in range(n)]
        return frame(rows)

    text, test = sweeps.stability_verdict(runs(0, 9), "CS")
    assert test.verdict == "reproduced" and text.startswith("0/12 vs 9/12 unstable, McNemar p = ")
    assert sweeps.stability_verdict(runs(9, 0), "CS")[1].verdict == "contradicted"
    assert sweeps.stability_verdict(runs(1, 2), "CS")[1].verdict == "undecided"  # too few to tell
    with pytest.raises(KeyError, match="no method 'LS'"):
        sweeps.stability_verdict(runs(0, 0), "LS")
    with pytest.raises(ValueError, match="several runs"):
        sweeps.stability_verdict(pd.concat([runs(0, 0), runs(0, 0)]), "CS")


def test_select_and_method_summary_of_one_setting():
    table = frame([("CS", 1, 8, 0, 0.1, 0, None), ("CS", 1, 8, 1, 0.3, 0, None), ("CS", 1, 4, 0, 0.9, 0, None),
                   ("none", 1, 8, 0, 0.2, 0, None), ("none", 1, 8, 1, 0.4, 0, None)])
    assert list(sweeps.select(table, method="CS", N=8).loss) == [0.1, 0.3]
    cs = sweeps.method_summary(table, "loss", method="CS", N=8)
    assert cs.label == "CS" and cs.summary.mean == pytest.approx(0.2) and cs.runs == 2
    none = sweeps.method_summary(table, "loss", method="none", N=8)
    assert none.summary.mean == pytest.approx(0.3)
    with pytest.raises(ValueError, match="no runs with"):
        sweeps.method_summary(table, "loss", method="LS")
    with pytest.raises(KeyError, match="no column 'depth'"):
        sweeps.select(table, depth=8)


def test_optimum_is_the_lowest_mean_with_an_interval_and_its_ties():
    summary = pd.DataFrame({"kappa": [0.3, 0.5, 0.7, 0.9], "mean": [5.0, 1.0, 2.0, 0.5],
                            "lo": [4.0, 0.5, 1.5, math.nan], "hi": [6.0, 1.6, 2.5, math.nan]})
    assert sweeps.optimum(summary, "kappa") == (0.5, {0.5, 0.7})  # 0.9 has no interval: not a candidate
    with pytest.raises(ValueError, match="no setting of 'kappa' has an interval"):
        sweeps.optimum(summary.assign(lo=math.nan), "kappa")


def test_paired_tests_each_method_at_each_setting_by_seed():
    table = pd.DataFrame({"N": [8] * 6, "method": ["none", "CS"] * 3, "seed": [0, 0, 1, 1, 2, 2],
                          "loss": [0.30, 0.25, 0.10, 0.08, 0.50, 0.41], "diverged_at": [None] * 6,
                          "broke_down": [False] * 6})
    out = sweeps.paired(table, "loss", by=("N",))
    row = out.iloc[0]
    assert list(out.columns) == ["N", "method", "estimate", "lo", "hi", "p", "pairs", "verdict", "test"]
    assert row.method == "CS" and row.pairs == 3 and row.hi < 1  # a ratio below 1 on every seed
    assert row.test == evidence.compare(table, "loss", "CS") and row.verdict == row.test.verdict
    assert row.estimate == pytest.approx(math.exp(row.test.estimate))
    linear = sweeps.paired(table, "loss", by=("N",), log=False, margin=0.01).iloc[0]
    assert linear.estimate == pytest.approx(-0.0533, abs=1e-4)
    diffs = sweeps.paired_differences(table, "loss", by=("N",))
    assert list(diffs.seed) == [0, 1, 2] and list(diffs["diff"].round(2)) == [-0.05, -0.02, -0.09]
    with pytest.raises(ValueError, match="no runs of 'LS'"):
        sweeps.paired(table, "loss", baseline="LS", by=("N",))


def test_a_duplicated_setting_method_and_seed_is_an_error_not_more_pairs():
    table = pd.DataFrame({"N": [8] * 4, "method": ["none", "CS"] * 2, "seed": [0, 0, 1, 1],
                          "loss": [0.3, 0.2, 0.1, 0.05], "diverged_at": [None] * 4, "broke_down": [False] * 4})
    doubled = pd.concat([table, table])  # e.g. one run in two experiments of the same table
    with pytest.raises(ValueError, match="share a"):
        sweeps.paired_differences(doubled, "loss", by=("N",))
    with pytest.raises(ValueError, match="share a"):
        sweeps.paired(doubled, "loss", by=("N",))


def test_paired_names_the_rows_and_experiments_that_share_a_setting_method_and_seed():
    one = pd.DataFrame({"experiment": "depth-uvit", "backbone": "uvit", "N": [8] * 4, "lr_scale": 1.0,
                        "method": ["none", "CS"] * 2, "seed": [0, 0, 1, 1], "loss": [0.3, 0.2, 0.1, 0.05],
                        "diverged_at": None, "broke_down": False})
    both = pd.concat([one, one.assign(experiment="stability-map", lr_scale=4.0)], ignore_index=True)
    message = (r"8 rows share a \(setting, method, seed\) with another row, e.g. rows \[0, 4\] \(experiments "
               r"\['depth-uvit', 'stability-map'\]\): method 'none', seed 0, backbone=uvit, N=8; a pair must be one "
               r"run each: select one experiment \(select\(table, experiment=...\)\) or add the setting")
    with pytest.raises(ValueError, match=message):
        sweeps.paired(both, "loss")
    assert list(sweeps.paired(both, "loss", by=("backbone", "N", "lr_scale")).pairs) == [2, 2]  # told apart
    with pytest.raises(KeyError, match="no column 'depth'"):
        sweeps.paired(one, "loss", by=("depth",))


@pytest.mark.parametrize("limit", [math.nan, math.inf, 0, -0.5, "0.5", None])
def test_unstable_refuses_a_limit_that_is_not_a_positive_number(limit):
    with pytest.raises(ValueError, match="limit must be a finite number > 0"):
        sweeps.unstable(frame(MAP), limit=limit)
    with pytest.raises(ValueError, match="limit must be a finite number > 0"):
        sweeps.stability_map(frame(MAP), limit=limit)


@pytest.mark.parametrize("factor", [-3, 0, math.nan, math.inf])
def test_oscillation_limit_refuses_a_factor_that_is_not_a_positive_number(factor):
    with pytest.raises(ValueError, match="factor must be a finite number > 0"):
        sweeps.oscillation_limit(frame(MAP), factor=factor)


def test_unstable_and_oscillation_limit_accept_numpy_numbers():
    import numpy as np

    table = frame(MAP)
    assert list(sweeps.unstable(table, np.float32(0.5))) == list(sweeps.unstable(table))
    assert sweeps.oscillation_limit(table, np.float64(3.0)).equals(sweeps.oscillation_limit(table))


def test_n_skips_of_an_unknown_preset_says_which_presets_exist():
    with pytest.raises(ValueError, match="unknown model preset 'nope'.*one of unet-ci, "):
        sweeps.n_skips({"model_overrides": []}, "nope")
