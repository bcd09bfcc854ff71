"""Tests of scalelong_edu.stats: mean ± standard error and intervals over seeds, the oscillation statistic."""

import math

import pytest
import torch

import numpy as np

from scalelong_edu.stats import (
    VERDICTS,
    MeanSE,
    absent_chance,
    decision_chance,
    fresh_rates_decision_chance,
    holm,
    mcnemar_pairs_needed,
    mcnemar_power,
    rates_decision_chance,
    rates_power,
    mean_se,
    detrended,
    oscillation,
    over_seeds,
    paired_power,
    paired_rates,
    paired_test,
    seeds_needed,
    trend_test,
)


def test_mean_se_of_known_values():
    result = mean_se([1.0, 2.0, 3.0, 4.0])
    assert result.mean == 2.5 and result.n == 4
    assert result.se == pytest.approx(math.sqrt(5 / 3) / 2)  # sd with n - 1 is sqrt(5/3)


def test_format_applies_the_spec_to_mean_and_error():
    result = MeanSE(0.15125, 0.00213, (0.15, 0.1525))
    assert f"{result:.3f}" == "0.151 ± 0.002 (n = 2)"
    assert str(result) == "0.1512 ± 0.0021 (n = 2)"


def test_over_seeds_passes_each_seed_and_seeds_torch():
    seen = []

    def measure(seed):
        seen.append(seed)
        return torch.rand(()).item()

    first = over_seeds(measure, seeds=[3, 7, 11])
    assert seen == [3, 7, 11]
    assert first.values == over_seeds(measure, seeds=[3, 7, 11]).values  # repeatable
    assert first.values[0] == torch.rand((), generator=torch.Generator().manual_seed(3)).item()
    assert first.se > 0


@pytest.mark.parametrize("values, match", [([1.0], "at least 2"), ([], "at least 2"), ([1.0, math.nan], "finite")])
def test_bad_values_raise_clear_errors(values, match):
    with pytest.raises(ValueError, match=match):
        mean_se(values)


def test_the_interval_uses_students_t():
    three = mean_se([1.0, 2.0, 3.0])  # mean 2, se 1/sqrt(3), t(0.975, 2) = 4.3027
    lo, hi = three.interval()
    assert (lo, hi) == pytest.approx((2 - 4.3027 / 3**0.5, 2 + 4.3027 / 3**0.5), rel=1e-4)
    assert three.interval(0.5)[1] - three.interval(0.5)[0] < hi - lo
    with pytest.raises(ValueError, match="level must be in"):
        three.interval(95)


def test_oscillation_of_series_with_known_answers():
    flat = oscillation([2.0] * 8)
    assert (flat.log_step, flat.window_ratio) == (0.0, 1.0)
    growth = oscillation([1.1**k for k in range(10)], window=4)  # steady 10% growth
    assert growth.log_step == pytest.approx(math.log(1.1)) and growth.window_ratio == pytest.approx(1.1**3)
    zigzag = oscillation([1.0, 4.0] * 5, window=3)  # up 4x, down 4x
    assert zigzag.log_step == pytest.approx(math.log(4)) and zigzag.window_ratio == pytest.approx(4.0)
    assert oscillation([1.0, 1.5, 1.0, 1.5, 1.0]).log_step < zigzag.log_step
    for bad, match in [([1.0, float("nan"), 1.0], "finite and > 0"), ([1.0, 0.0, 1.0], "finite and > 0"),
                       ([1.0, 2.0], "at least window"), ([1.0] * 5, "window must be")]:
        with pytest.raises(ValueError, match=match):
            oscillation(bad, window=1 if match == "window must be" else 3)


def draws(effect, sd, n, rng, spread=1.0):
    """Paired data: seed effects shared by both arms (spread), plus the treatment's effect and noise."""
    seed = rng.normal(0, spread, n)
    return seed, seed + effect + rng.normal(0, sd, n)


def verdict_rates(effect, sd, n, margin, direction="less", draws_=2000, seed=0):
    rng = np.random.default_rng(seed)
    verdicts = [paired_test(*draws(effect, sd, n, rng), margin, direction).verdict for _ in range(draws_)]
    return {v: verdicts.count(v) / draws_ for v in VERDICTS}


def test_paired_test_matches_scipy_and_a_hand_computation():
    from scipy.stats import ttest_rel, wilcoxon

    base = [1.0, 2.0, 3.0, 4.0, 5.0]
    treat = [0.8, 1.9, 2.5, 3.9, 4.6]
    test = paired_test(base, treat, margin=0.5)
    diff = np.subtract(treat, base)
    assert test.estimate == pytest.approx(diff.mean()) and test.n == 5 and test.sd == pytest.approx(diff.std(ddof=1))
    half = 2.7764451 * diff.std(ddof=1) / 5**0.5  # t(0.975, 4)
    assert test.ci == pytest.approx((diff.mean() - half, diff.mean() + half), rel=1e-6)
    assert test.p == pytest.approx(ttest_rel(treat, base).pvalue) and test.p_exact == pytest.approx(
        wilcoxon(diff).pvalue)
    assert test.verdict == "reproduced" and test.p_holm is None
    assert paired_test(base, treat, margin=0.5, direction="greater").verdict == "contradicted"


def test_a_true_effect_of_one_and_a_half_paired_sds_with_12_pairs_is_reproduced_in_80_percent():
    rates = verdict_rates(effect=-1.5, sd=1.0, n=12, margin=0.5)
    assert rates["reproduced"] >= 0.8 and rates["contradicted"] == 0


@pytest.mark.parametrize("direction", ["less", "greater"])
def test_a_null_effect_is_reproduced_or_contradicted_at_most_at_the_nominal_level(direction):
    rates = verdict_rates(effect=0.0, sd=1.0, n=8, margin=0.5, direction=direction, draws_=4000)
    assert rates["reproduced"] <= 0.05 / 2 + 0.01 and rates["contradicted"] <= 0.05 / 2 + 0.01  # two-sided 5%
    assert rates["reproduced"] + rates["contradicted"] > 0.02  # ... and the test is not simply mute


def test_a_null_effect_with_a_small_paired_sd_is_absent():
    rates = verdict_rates(effect=0.0, sd=0.05, n=12, margin=0.5)
    assert rates["absent"] >= 0.9


def test_pairing_buys_power_when_seeds_differ_a_lot():
    rng = np.random.default_rng(1)
    base, treat = draws(-0.5, 0.2, 6, rng, spread=3.0)
    assert paired_test(base, treat, 0.1).verdict == "reproduced"
    from scipy.stats import ttest_ind

    assert ttest_ind(treat, base).pvalue > 0.05  # unpaired, the seeds' spread hides it


def test_an_undecided_test_says_how_many_seeds_would_decide_it():
    from statsmodels.stats.power import TTestPower

    test = paired_test([0.0, 1.0, 2.0], [0.5, 0.8, 2.9], margin=0.2)
    assert test.verdict == "undecided"
    assert test.estimate == pytest.approx(0.4)  # larger than the margin: the seeds to detect a difference that size
    assert test.seeds_needed == math.ceil(TTestPower().solve_power(0.4 / test.sd, alpha=0.05, power=0.8))
    assert seeds_needed(0.01, 1.0) == 2 and seeds_needed(1.0, 0.01) > 70_000  # no convergence trouble
    assert seeds_needed(1.0, 1.0) == 10 and seeds_needed(0.0, 1.0) == 2  # d = 1: 10 pairs for 80%
    assert seeds_needed(1.0, 0.5) > seeds_needed(1.0, 1.0)


def test_holm_keeps_a_familys_false_positive_rate_at_five_percent(monkeypatch):
    import gc

    monkeypatch.setattr(gc, "collect", lambda *a: 0)  # statsmodels' multipletests collects garbage at every call
    rng = np.random.default_rng(2)
    family_errors, raw_errors = 0, 0
    for _ in range(1000):
        tests = [paired_test(*draws(0.0, 1.0, 8, rng), 0.5) for _ in range(6)]
        raw_errors += any(t.verdict in ("reproduced", "contradicted") for t in tests)
        family_errors += any(t.verdict in ("reproduced", "contradicted") for t in holm(tests))
    assert family_errors / 1000 <= 0.05 + 0.015 and raw_errors / 1000 > 0.15  # six raw tests: ~26%


def test_holm_adjusts_p_values_as_statsmodels_does():
    rng = np.random.default_rng(3)
    tests = [paired_test(*draws(e, 1.0, 10, rng), 0.5) for e in (-2.0, -0.3, 0.0)]
    adjusted = holm(tests)
    ps = sorted(t.p for t in tests)
    assert sorted(t.p_holm for t in adjusted) == pytest.approx([min(1, 3 * ps[0]), min(1, max(3 * ps[0], 2 * ps[1])),
                                                                 min(1, max(3 * ps[0], 2 * ps[1], ps[2]))])
    assert [t.p for t in adjusted] == [t.p for t in tests] and holm([]) == []


@pytest.mark.parametrize("base, treat, margin, direction, match", [
    ([1.0, 2.0], [1.0], 0.1, "less", "equal-length"),
    ([1.0], [2.0], 0.1, "less", "at least 2 pairs"),
    ([1.0, math.nan], [1.0, 2.0], 0.1, "less", "diverged"),
    ([1.0, 2.0], [1.0, math.inf], 0.1, "less", "finite"),
    ([1.0, 2.0], [1.0, 2.0], 0.0, "less", "margin"),
    ([1.0, 2.0], [1.0, 2.0], 0.1, "lower", "direction"),
])
def test_paired_test_rejects_bad_input(base, treat, margin, direction, match):
    with pytest.raises(ValueError, match=match):
        paired_test(base, treat, margin, direction)


def test_identical_shifts_have_no_spread_and_decide_by_their_sign():
    assert paired_test([1.0, 2.0, 3.0], [0.5, 1.5, 2.5], 0.5).verdict == "reproduced"
    same = paired_test([1.0, 2.0, 3.0], [1.0, 2.0, 3.0], 0.5)
    assert same.verdict == "absent" and same.p == 1.0 and same.p_exact == 1.0


def test_paired_rates_are_an_exact_mcnemar_test_with_exact_intervals():
    from scipy.stats import binomtest

    base = np.array([True] * 8 + [False] * 8)
    treat = np.array([False] * 8 + [False] * 8)
    test = paired_rates(base, treat, margin=0.25)
    assert test.events == (8, 0) and test.n == 16 and test.estimate == -0.5
    assert test.p == pytest.approx(binomtest(0, 8, 0.5).pvalue) and test.verdict == "reproduced"
    assert test.ci[1][0] == 0.0 and 0 < test.ci[1][1] < 0.25  # 0 of 16: [0, 0.206]
    assert paired_rates(base, treat, 0.25, direction="greater").verdict == "contradicted"
    none = paired_rates(np.zeros(16, bool), np.zeros(16, bool), margin=0.25)
    assert none.p == 1.0 and none.verdict == "absent"  # both upper bounds 0.206 < 0.25
    assert paired_rates(np.zeros(4, bool), np.zeros(4, bool), margin=0.25).verdict == "undecided"  # 0/4: up to 0.6
    with pytest.raises(ValueError, match="bools"):
        paired_rates([0.5, 1.0], [1.0, 0.0], 0.25)


def test_detrended_ignores_a_steady_trend_and_sees_a_zigzag():
    assert detrended([2.0 * 1.1**k for k in range(8)]) == pytest.approx(0.0, abs=1e-12)
    zigzag = [1.0, 4.0] * 4  # +-ln 2 around a (nearly) flat line
    assert detrended(zigzag) == pytest.approx(math.log(2), rel=0.05)
    assert detrended([v * 1.5**k for k, v in enumerate(zigzag)]) == pytest.approx(detrended(zigzag))
    for bad, match in [([1.0, 2.0], "at least 3"), ([1.0, -1.0, 2.0], "finite and > 0")]:
        with pytest.raises(ValueError, match=match):
            detrended(bad)


# -- trend_test: Spearman over independent runs -------------------------------------------------
def correlated(rho, n, rng):
    """``n`` runs of a bivariate normal with Pearson correlation ``rho``."""
    x = rng.standard_normal(n)
    return x, rho * x + math.sqrt(1 - rho**2) * rng.standard_normal(n)


def test_a_trend_test_with_the_runs_it_asks_for_has_about_80_percent_power():
    rng = np.random.default_rng(4)
    planned = trend_test(*correlated(0.5, 200, rng)).seeds_needed  # rho_s ~ 0.48 at Pearson 0.5
    assert 25 <= planned <= 40
    hits = [trend_test(*correlated(0.5, planned, rng)).verdict for _ in range(1000)]
    assert 0.72 <= hits.count("reproduced") / 1000 <= 0.92 and "contradicted" not in hits


@pytest.mark.parametrize("direction", ["greater", "less"])
def test_a_null_trend_is_decided_at_most_at_the_nominal_level(direction):
    rng = np.random.default_rng(5)
    says = [trend_test(*correlated(0.0, 12, rng), direction=direction).verdict for _ in range(2000)]
    assert says.count("reproduced") / 2000 <= 0.025 + 0.01 and says.count("contradicted") / 2000 <= 0.025 + 0.01


def test_a_null_trend_over_many_runs_is_absent_and_its_interval_is_a_correlation():
    rng = np.random.default_rng(6)
    says = [trend_test(*correlated(0.0, 400, rng)) for _ in range(200)]
    assert sum(t.verdict == "absent" for t in says) / 200 >= 0.9
    perfect = trend_test([1, 2, 3, 4, 5, 6], [1, 4, 9, 16, 25, 36])
    assert perfect.estimate == 1 and -1 < perfect.ci[0] < perfect.ci[1] < 1
    assert perfect.p == pytest.approx(2 / 720) and perfect.verdict == "reproduced"  # exact permutations


def test_the_permutation_p_value_is_scipys_permutation_test_of_spearmans_rho():
    """trend_test permutes ranks, vectorised; the p-value is that of permuting the values one
    resample at a time (exactly for 7 runs, with the same random resamples for 9), ties included."""
    from scipy.stats import permutation_test, spearmanr

    rng = np.random.default_rng(3)
    for n, resamples in ((7, np.inf), (9, 9999)):
        x, y = np.round(rng.normal(size=n), 1), rng.normal(size=n)
        slow = permutation_test((x,), lambda xs: spearmanr(xs, y).statistic, permutation_type="pairings",
                                n_resamples=resamples, rng=0)
        assert trend_test(x, y).p == pytest.approx(slow.pvalue, rel=1e-12)


def test_trend_test_refuses_what_is_no_evidence():
    with pytest.raises(ValueError, match="at least 4 runs"):
        trend_test([1, 2, 3], [1, 2, 3])
    with pytest.raises(ValueError, match="must both vary"):
        trend_test([1, 2, 3, 4], [2, 2, 2, 2])
    with pytest.raises(ValueError, match="margin must be a \\|rho\\| in \\(0, 1\\)"):
        trend_test([1, 2, 3, 4], [1, 2, 3, 5], margin=1.5)
    with pytest.raises(ValueError, match="finite"):
        trend_test([1, 2, 3, 4], [1, 2, 3, math.nan])


def test_an_undecided_rate_says_how_many_runs_would_decide_it():
    test = paired_rates(np.array([0, 0, 1, 0], bool), np.array([1, 0, 1, 1], bool), 0.25)
    assert test.verdict == "undecided"
    assert test.seeds_needed == mcnemar_pairs_needed(0.5, 1.0)  # 2 of 4 pairs discordant, both one way
    same = paired_rates(np.array([0, 0, 1, 0], bool), np.array([0, 0, 1, 0], bool), 0.25)
    assert same.seeds_needed == mcnemar_pairs_needed(0.25, 1.0)  # no difference: sized for the margin
    assert same.seeds_needed > test.seeds_needed  # rates a margin apart: harder to tell than 0.25 vs 0.75


def test_mcnemar_pairs_needed_is_exact_where_the_answer_is_known_and_matches_a_simulation():
    from scipy.stats import binom

    # every discordant pair one way: the exact test rejects once 6 pairs disagree (2 / 2^6 < 0.05)
    known = next(n for n in range(2, 200) if binom.sf(5, n, 0.4) >= 0.8)
    assert mcnemar_pairs_needed(0.4, 1.0) == known
    assert mcnemar_pairs_needed(0.4, 0.9) > known > mcnemar_pairs_needed(0.8, 1.0)
    rng = np.random.default_rng(0)
    n = mcnemar_pairs_needed(0.5, 0.85)

    def power(pairs: int) -> float:  # breakdowns drawn pair by pair, tested as the book tests them
        hits = 0
        for _ in range(2000):
            disagree = rng.random(pairs) < 0.5
            treat_only = disagree & (rng.random(pairs) < 0.85)
            base = disagree & ~treat_only
            hits += paired_rates(base, treat_only, 0.25).p < 0.05
        return hits / 2000

    assert power(n) >= 0.77 and power(n - 4) < 0.8
    assert abs(power(n) - mcnemar_power(n, 0.5, 0.85)) < 0.03  # 2000 draws: SE about 0.009
    assert mcnemar_power(30, 0.4, 1.0) == pytest.approx(binom.sf(5, 30, 0.4))
    assert mcnemar_power(n, 0.5, 0.85) >= 0.8 > mcnemar_power(n - 1, 0.5, 0.85)
    assert mcnemar_power(30, 0.0, 0.5) == 0.0  # no pair ever disagrees
    # the declared confirmations' sizes (experiments.CONFIRMATIONS): their pilots' rates
    assert rates_power(30, 0.6, 1.0) == pytest.approx(binom.sf(5, 30, 0.4)) and rates_power(30, 0.6, 1.0) > 0.99
    assert round(rates_power(30, 0.6, 0.95), 2) == 0.88 and round(rates_power(24, 0.2, 0.7), 2) == 0.91
    assert rates_power(10, 1.0, 1.0) == 0.0
    with pytest.raises(ValueError, match="baseline"):
        rates_power(10, 1.5, 0.5)  # a percentage where a probability belongs
    with pytest.raises(ValueError, match="discordant"):
        mcnemar_pairs_needed(0.0, 0.5)
    with pytest.raises(ValueError, match="no number of pairs"):
        mcnemar_pairs_needed(0.3, 0.5, limit=50)  # no difference between the arms: no power


def test_rates_decision_chance_is_the_share_of_experiments_paired_rates_decides():
    """A known answer: the baseline's runs fixed, the treatment's drawn, each decided by
    paired_rates' own verdict; and the chances breakdown-scaled-confirm was declared with."""
    from scipy import integrate
    from scipy.stats import beta

    rng = np.random.default_rng(5)
    for events, pairs, rate in ((1, 24, 0.05), (1, 24, 0.3), (21, 30, 0.95)):
        base = np.arange(pairs) < events
        decided = np.mean([paired_rates(base, rng.random(pairs) < rate, 0.25).verdict != "undecided"
                           for _ in range(1500)])  # SE at most 0.013
        assert abs(decided - rates_decision_chance(pairs, events, rate, 0.25)) < 0.05, (events, rate)
    assert rates_decision_chance(24, 1, 0.0, 0.25) == 1.0  # neither arm ever above the margin's bound
    assert rates_decision_chance(30, 21, 0.7, 0.25) < 0.01  # the same rate: nothing to find, nor absent
    declared = [round(rates_decision_chance(24, 1, rate, 0.25, 0.025), 2) for rate in (0.02, 0.05, 0.1, 0.2)]
    assert declared == [0.92, 0.66, 0.29, 0.09]
    averaged = [integrate.quad(lambda t: beta.pdf(t, k + 1, 11 - k) * rates_decision_chance(24, 1, t, 0.25, 0.025),
                               0, 1, limit=100)[0] for k in (0, 1)]  # over the pilot's 0 and 1 of 10
    assert [round(a, 2) for a in averaged] == [0.56, 0.33]
    with pytest.raises(ValueError, match="baseline_events"):
        rates_decision_chance(24, 25, 0.1, 0.25)
    with pytest.raises(ValueError, match="treatment"):
        rates_decision_chance(24, 1, 5.0, 0.25)  # a percentage where a probability belongs


def test_fresh_rates_decision_chance_is_the_share_of_experiments_paired_rates_decides():
    """A known answer with both arms drawn, each experiment decided by paired_rates' own verdict;
    and the chances breakdown-sqrt2-confirm was declared with."""
    rng = np.random.default_rng(6)
    for pairs, base, rate in ((40, 0.05, 0.05), (40, 0.1, 0.3), (24, 0.5, 0.5)):
        decided = np.mean([paired_rates(rng.random(pairs) < base, rng.random(pairs) < rate, 0.25).verdict
                           != "undecided" for _ in range(1500)])  # SE at most 0.013
        assert abs(decided - fresh_rates_decision_chance(pairs, base, rate, 0.25)) < 0.05, (base, rate)
    assert fresh_rates_decision_chance(24, 0.0, 0.0, 0.25) == 1.0  # no run ever breaks down: absent
    declared = [round(fresh_rates_decision_chance(60, 1 / 24, rate, 0.25), 2) for rate in (2 / 24, 0.15)]
    assert declared == [0.97, 0.79]
    with pytest.raises(ValueError, match="baseline"):
        fresh_rates_decision_chance(24, 2.0, 0.1, 0.25)

def test_paired_power_matches_the_paired_t_test_it_sizes():
    from scipy.stats import ttest_1samp

    rng = np.random.default_rng(3)
    diffs = rng.normal(0.7, 1.0, size=(4000, 16))  # an effect of 0.7 SD on 16 pairs
    simulated = float((ttest_1samp(diffs, 0.0, axis=1).pvalue < 0.025).mean())
    assert abs(simulated - paired_power(0.7, 16, alpha=0.025)) < 0.025  # 4000 draws: SE about 0.008
    assert paired_power(0.0, 16) == pytest.approx(0.05)  # no effect: the test's level
    n = seeds_needed(1.0, 0.7)
    assert paired_power(0.7, n) >= 0.8 > paired_power(0.7, n - 1)


def test_decision_chance_is_the_share_of_experiments_paired_test_decides():
    """A known answer: simulated experiments, each decided by paired_test's own verdict."""
    margin = math.log1p(0.05)
    for mean in (0.0, 0.02, 0.05):  # decided 49%, 45%, 76%: mostly absent, either, mostly significant
        rng = np.random.default_rng(7)
        verdicts = [paired_test(np.zeros(24), rng.normal(mean, 0.09, 24), margin).verdict for _ in range(600)]
        decided = 1 - verdicts.count("undecided") / len(verdicts)  # SE at most 0.02
        assert abs(decided - decision_chance(mean, 0.09, 24, margin)) < 0.07, mean
        absent = verdicts.count("absent") / len(verdicts)
        assert abs(absent - absent_chance(mean, 0.09, 24, margin)) < 0.07, mean
    assert absent_chance(0.0, 0.09, 24, margin) > 0.4 > absent_chance(0.05, 0.09, 24, margin)  # as labelled above
    tiny = 1e-6  # no interval fits inside: only significance decides, as paired_power counts it
    assert decision_chance(0.7, 1.0, 16, tiny, alpha=0.025) == pytest.approx(paired_power(0.7, 16, 0.025), abs=0.02)
    with pytest.raises(ValueError, match="sd > 0"):
        decision_chance(0.1, 0.0, 24, margin)


def test_paired_power_holds_for_effects_far_larger_than_the_spread():
    """A large effect on few pairs (chapter 7's LS per skip: 4.5 SDs) has power near 1, not NaN;
    sizing must not climb past the pairs that already suffice."""
    from scipy.stats import ttest_1samp

    diffs = np.random.default_rng(4).normal(4.5, 1.0, size=(4000, 3))
    simulated = float((ttest_1samp(diffs, 0.0, axis=1).pvalue < 0.05).mean())
    assert abs(simulated - paired_power(4.5, 3)) < 0.02
    assert all(0.999 < paired_power(4.5, n) <= 1.0 for n in (6, 8, 40))
    assert seeds_needed(0.013, 0.0586) == 3
