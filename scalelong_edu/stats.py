"""Numbers with error bars, and the book's one procedure for deciding a claim from paired runs.

A statistic of one random draw (64 samples, one training run) does not say how far another draw
would move it. :func:`over_seeds` repeats a measurement under several seeds and :class:`MeanSE`
summarises the values; format it like a float to print both numbers::

    result = over_seeds(lambda seed: roughness(sample(seed)), seeds=range(5))
    print(f"roughness {result:.3f}")        # roughness 0.151 ± 0.002 (n = 5)

Runs of two methods with the same seed start from the same weights and see the same batches, so
the book compares methods *pair by pair* (:func:`paired_test`): the mean paired difference, its
95% interval, a paired t-test with an exact Wilcoxon test beside it, and one of the
:data:`VERDICTS` against a margin declared with the claim. A chapter's claims are one family,
corrected with Holm's method (:func:`holm`). Breakdowns are outcomes, tested as paired rates
(:func:`paired_rates`, an exact McNemar test). The tests are scipy's and statsmodels'; this
module only fixes how they are used. :func:`oscillation` measures "how much a quantity
oscillates during training" one way everywhere.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Callable, Iterable, Sequence

import torch

if TYPE_CHECKING:
    import numpy as np


@dataclass(frozen=True)
class MeanSE:
    """The mean of ``values`` and its standard error ``sd / sqrt(n)`` (``sd`` with ``n - 1``)."""

    mean: float
    se: float
    values: tuple[float, ...]

    @property
    def n(self) -> int:
        """How many values."""
        return len(self.values)

    def interval(self, level: float = 0.95) -> tuple[float, float]:
        """The ``level`` confidence interval of the mean: ``mean ± t * se``, Student's t with ``n - 1``
        degrees of freedom (3 seeds: ``t = 4.30`` at 95%, so the interval is wide, as it should be)."""
        if not 0 < level < 1:
            raise ValueError(f"level must be in (0, 1), e.g. 0.95, got {level!r}")
        from scipy.stats import t

        half = float(t.ppf((1 + level) / 2, self.n - 1)) * self.se
        return self.mean - half, self.mean + half

    def __format__(self, spec: str) -> str:
        """``spec`` applied to mean and standard error: ``f"{r:.3f}"`` -> ``0.151 ± 0.002 (n = 5)``."""
        return f"{self.mean:{spec or '.4g'}} ± {self.se:{spec or '.2g'}} (n = {self.n})"

    def __str__(self) -> str:
        return format(self, "")


def mean_se(values: Iterable[float]) -> MeanSE:
    """Mean and standard error of at least two finite values."""
    values = tuple(float(v) for v in values)
    if len(values) < 2:
        raise ValueError(f"a standard error needs at least 2 values (e.g. 2 seeds), got {len(values)}")
    if not all(math.isfinite(v) for v in values):
        raise ValueError(f"values must be finite, got {values}; did a run diverge? Count it, don't average it")
    mean = math.fsum(values) / len(values)
    variance = math.fsum((v - mean) ** 2 for v in values) / (len(values) - 1)
    return MeanSE(mean, math.sqrt(variance / len(values)), values)


def over_seeds(measure: Callable[[int], float], seeds: Iterable[int] = range(5)) -> MeanSE:
    """Run ``measure(seed)`` for every seed and return the mean ± standard error of the results.

    Before each call torch's global generator is seeded with ``seed`` too, so code that draws
    from it repeats exactly; pass the seed on to any generator of your own.
    """
    values = []
    for seed in seeds:
        torch.manual_seed(seed)
        values.append(measure(seed))
    return mean_se(values)


@dataclass(frozen=True)
class Oscillation:
    """How much a positive series (a norm over training) moves from one evaluation to the next.

    Attributes:
        log_step: mean ``|log x_{k+1} - log x_k|``: the typical relative change per evaluation
            (0.1 means about 10%), whatever the series' scale. A steady trend adds its rate, so
            compare series over the same stretch of training.
        window_ratio: mean over sliding windows of ``window`` points of ``max / min``: how far
            the series swings within a window (1 = flat).
        window: the window length used.
    """

    log_step: float
    window_ratio: float
    window: int


def oscillation(series: Iterable[float], window: int = 5) -> Oscillation:
    """The book's one oscillation statistic of a series of positive values ``x_0 .. x_K`` (see
    :class:`Oscillation`), e.g. a hidden-feature norm probed on a fixed batch every ``eval_every``
    steps.

    Raises:
        ValueError: fewer than ``window`` (>= 2) values, or a value that is not finite and > 0
            (a diverged run is counted as diverged, not summarised).
    """
    x = torch.tensor([float(v) for v in series], dtype=torch.float64)
    if isinstance(window, bool) or not isinstance(window, int) or window < 2:
        raise ValueError(f"window must be an int >= 2, got {window!r}")
    if len(x) < window:
        raise ValueError(f"need at least window = {window} values, got {len(x)}")
    if not (torch.isfinite(x).all() and (x > 0).all()):
        raise ValueError("values must be finite and > 0 (norms); count a diverged run instead of summarising it")
    log = x.log()
    windows = x.unfold(0, window, 1)
    ratio = (windows.amax(1) / windows.amin(1)).mean()
    return Oscillation(log.diff().abs().mean().item(), ratio.item(), window)



def detrended(series: Iterable[float]) -> float:
    """How much a positive series oscillates *around its trend*: the mean absolute residual of
    ``log x_k`` around the least-squares line through them. Unlike :func:`oscillation`'s
    ``log_step``, a steady rise or decay (geometric growth is a line in log) adds nothing; 0.1
    means the series sits about 10% off its trend. Same input rules as :func:`oscillation`
    (at least 3 values)."""
    import numpy as np

    x = np.asarray([float(v) for v in series])
    if len(x) < 3:
        raise ValueError(f"need at least 3 values to see an oscillation around a line, got {len(x)}")
    if not (np.isfinite(x).all() and (x > 0).all()):
        raise ValueError("values must be finite and > 0 (norms); count a diverged run instead of summarising it")
    k, log = np.arange(len(x)), np.log(x)
    slope, level = np.polyfit(k, log, 1)
    return float(np.abs(log - (level + slope * k)).mean())


VERDICTS = ("reproduced", "contradicted", "absent", "undecided", "not tested here")
"""What a claim can come to. For a comparison (:func:`paired_test`): *reproduced*, the difference is
significant (Holm-adjusted within its family) on the paper's side; *contradicted*, significant on
the other side; *absent* (at this scale), the 95% interval lies inside the declared margin, so any
effect is smaller than it; *undecided*, none of these (the test says how many seeds would decide
it). *not tested here* is set by a chapter for a claim whose data this machine lacks."""
ALPHA = 0.05
"""The level of every test: two-sided 5%, 95% intervals."""
POWER = 0.8
"""The power :attr:`PairedTest.seeds_needed` sizes for."""
DIRECTIONS = ("less", "greater")


def _decide(significant: bool, on_claimed_side: bool, inside_margin: bool) -> str:
    if significant:
        return "reproduced" if on_claimed_side else "contradicted"
    return "absent" if inside_margin else "undecided"


@dataclass(frozen=True)
class PairedTest:
    """A paired comparison of one endpoint, treatment against baseline, run by run.

    Attributes:
        estimate: the mean paired difference, treatment - baseline (in the units passed, e.g. a
            log ratio for norms).
        ci: its 95% interval (Student's t with ``n - 1`` degrees of freedom).
        p: the two-sided paired t-test's p-value; ``p_exact`` the exact Wilcoxon signed-rank
            test's beside it (a check that no outlier pair carries the t-test).
        p_holm: ``p`` adjusted by :func:`holm` within the claim's family (``None`` before).
        n: pairs; ``sd``: the standard deviation of the paired differences.
        margin: the declared equivalence margin (same units); ``direction``: the paper's sign,
            ``"less"`` (the treatment lowers the endpoint) or ``"greater"``.
        censored: pairs whose value is a bound, not a measurement (e.g. a run that never reached
            a target, counted at its last step): such a test may be significant, never *absent*.
    Properties: ``seeds_needed``, the pairs that would decide the claim: those a paired t-test
    needs for :data:`POWER` at a true difference of the larger of ``|estimate|`` and ``margin``,
    given the observed ``sd`` (:func:`seeds_needed`): enough to detect the difference seen if it
    is real, or, if it is smaller than the margin, to rule out one of the margin's size;
    ``verdict``, one of the first four :data:`VERDICTS`, from ``p_holm`` when set, else ``p``.
    """

    estimate: float
    ci: tuple[float, float]
    p: float
    p_exact: float
    n: int
    sd: float
    margin: float
    direction: str
    p_holm: float | None = None
    censored: int = 0

    @property
    def seeds_needed(self) -> int:
        return seeds_needed(self.sd, max(abs(self.estimate), self.margin))

    @property
    def verdict(self) -> str:
        p = self.p if self.p_holm is None else self.p_holm
        claimed = self.estimate < 0 if self.direction == "less" else self.estimate > 0
        inside = -self.margin < self.ci[0] and self.ci[1] < self.margin and not self.censored
        return _decide(p < ALPHA, claimed, inside)


def _pairs(baseline: Sequence[float], treatment: Sequence[float]):
    import numpy as np

    base, treat = np.asarray(baseline, dtype=float), np.asarray(treatment, dtype=float)
    if base.ndim != 1 or base.shape != treat.shape:
        raise ValueError(f"baseline and treatment must be two equal-length 1-d arrays paired by seed, got shapes "
                         f"{base.shape} and {treat.shape}")
    if len(base) < 2:
        raise ValueError(f"a paired test needs at least 2 pairs (seeds), got {len(base)}")
    if not (np.isfinite(base).all() and np.isfinite(treat).all()):
        raise ValueError("values must be finite: a diverged or broken-down run is an outcome; count it and test "
                         "the rates with paired_rates, don't drop it or average it")
    return base, treat


def _check(margin: float, direction: str) -> None:
    if direction not in DIRECTIONS:
        raise ValueError(f"direction must be one of {DIRECTIONS} (the paper's claimed sign), got {direction!r}")
    if not (isinstance(margin, (int, float)) and math.isfinite(margin) and margin > 0):
        raise ValueError(f"margin must be a finite number > 0, declared with the claim, got {margin!r}")


def paired_power(effect_size: float, pairs: int, alpha: float = ALPHA) -> float:
    """The power of a two-sided paired t-test at level ``alpha`` on ``pairs`` pairs when the true
    mean difference is ``effect_size`` standard deviations of the paired differences: the chance
    that the t statistic, noncentral with ``effect_size * sqrt(pairs)``, falls beyond either
    critical value. Each tail is scipy's survival function (statsmodels' ``TTestPower`` takes the
    far tail as a CDF, which is NaN for large effects, e.g. 4.5 SDs on 6 pairs)."""
    from scipy import stats

    df, shift = pairs - 1, abs(effect_size) * math.sqrt(pairs)
    critical = stats.t.isf(alpha / 2, df)
    return float(stats.nct.sf(critical, df, shift) + stats.nct.sf(critical, df, -shift))


def _simulated_decisions(mean: float, sd: float, pairs: int, margin: float, alpha: float, draws: int,
                         seed: int) -> tuple[np.ndarray, np.ndarray]:
    """For ``draws`` simulated experiments of ``pairs`` normal paired differences (``mean``,
    ``sd``): whether :func:`paired_test`'s t-test is significant at level ``alpha``, and whether
    its 95% interval lies inside ``(-margin, margin)``."""
    import numpy as np
    from scipy import stats

    if pairs < 2 or sd <= 0 or margin <= 0:
        raise ValueError(f"need pairs >= 2, sd > 0 and margin > 0, got {pairs}, {sd}, {margin}")
    diff = np.random.default_rng(seed).normal(mean, sd, (draws, pairs))
    centre, se = diff.mean(axis=1), diff.std(axis=1, ddof=1) / math.sqrt(pairs)
    significant = np.abs(centre) / se > stats.t.isf(alpha / 2, pairs - 1)
    half = stats.t.isf(ALPHA / 2, pairs - 1) * se
    return significant, (centre - half > -margin) & (centre + half < margin)


def decision_chance(mean: float, sd: float, pairs: int, margin: float, alpha: float = ALPHA, draws: int = 20_000,
                    seed: int = 0) -> float:
    """The chance that :func:`paired_test` on ``pairs`` pairs decides a claim, when the paired
    differences are normal with this ``mean`` and ``sd``: that its t-test is significant at level
    ``alpha`` (e.g. ``ALPHA / k`` in a Holm family of ``k``, a lower bound), or that its 95% interval
    lies inside ``(-margin, margin)`` (*absent*, :data:`VERDICTS`). :func:`paired_power` counts the
    first only, :func:`absent_chance` the second where the first fails; a confirmation of a claim
    that leans to *absent* is sized by both. Estimated from ``draws`` simulated experiments
    (standard error at most ``0.5 / sqrt(draws)``)."""
    significant, inside = _simulated_decisions(mean, sd, pairs, margin, alpha, draws, seed)
    return float((significant | inside).mean())


def absent_chance(mean: float, sd: float, pairs: int, margin: float, alpha: float = ALPHA, draws: int = 20_000,
                  seed: int = 0) -> float:
    """The part of :func:`decision_chance` (same arguments, same draws) that is a verdict of
    *absent*: the 95% interval inside ``(-margin, margin)`` and the t-test not significant."""
    significant, inside = _simulated_decisions(mean, sd, pairs, margin, alpha, draws, seed)
    return float((inside & ~significant).mean())


def seeds_needed(sd: float, margin: float) -> int:
    """Pairs (at least 2) a two-sided paired t-test at :data:`ALPHA` needs for :data:`POWER` against
    a true mean difference of ``margin`` when the paired differences have standard deviation ``sd``
    (the smallest ``n`` whose :func:`paired_power` reaches it; found by bisection)."""
    if sd <= 0:
        return 2

    def enough(n: int) -> bool:
        return paired_power(margin / sd, n) >= POWER

    lo, hi = 2, 2
    while not enough(hi):
        lo, hi = hi, hi * 2
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if enough(mid) else (mid + 1, hi)
    return lo


def paired_test(baseline: Sequence[float], treatment: Sequence[float], margin: float,
                direction: str = "less") -> PairedTest:
    """Test one endpoint, treatment against baseline, on runs paired by seed (see :class:`PairedTest`).

    ``baseline[k]`` and ``treatment[k]`` are the same seed's runs, already on the scale that is
    tested (log for norms, ratios and Lipschitz factors); ``margin`` is in the same units.

    Raises:
        ValueError: unequal lengths, fewer than 2 pairs, a non-finite value, a bad margin or
            direction.
    """
    import numpy as np
    from scipy.stats import t as student, ttest_rel, wilcoxon

    _check(margin, direction)
    base, treat = _pairs(baseline, treatment)
    diff = treat - base
    n, mean, sd = len(diff), float(diff.mean()), float(diff.std(ddof=1))
    if sd == 0:  # every pair moved by the same amount: no spread to test against
        p = 1.0 if mean == 0 else 0.0
        ci = (mean, mean)
    else:
        p = float(ttest_rel(treat, base).pvalue)
        half = float(student.ppf(1 - ALPHA / 2, n - 1)) * sd / math.sqrt(n)
        ci = (mean - half, mean + half)
    p_exact = 1.0 if not np.any(diff) else float(wilcoxon(diff, zero_method="zsplit").pvalue)
    return PairedTest(mean, ci, p, p_exact, n, sd, float(margin), direction)


@dataclass(frozen=True)
class RateTest:
    """A paired comparison of a rate (e.g. of breakdowns), treatment against baseline.

    Attributes:
        events, n: per arm ``(baseline, treatment)``: runs with the event, and runs.
        discordant: the pairs in which only one run had the event, ``(baseline only, treatment only)``.
        ci: per arm, the exact (Clopper-Pearson) 95% interval of the rate.
        p: the exact McNemar test (a binomial test on the pairs that disagree), two-sided.
        p_holm: ``p`` adjusted within the family (:func:`holm`), or ``None``.
        margin: a rate the paper's effect would have to exceed to matter: *absent* when both
            arms' upper bounds lie below it. ``direction``: ``"less"`` (the treatment has fewer
            events) or ``"greater"``.
    Properties: ``seeds_needed``, the pairs that would decide the claim: those the exact McNemar
    test needs for :data:`POWER` (:func:`mcnemar_pairs_needed`) at the observed share of discordant
    pairs and their split, or, where the observed rates are closer than ``margin``, at a rate
    difference of ``margin``; ``verdict`` as for :class:`PairedTest`.
    """

    events: tuple[int, int]
    n: int
    discordant: tuple[int, int]
    ci: tuple[tuple[float, float], tuple[float, float]]
    p: float
    margin: float
    direction: str
    p_holm: float | None = None

    @property
    def seeds_needed(self) -> int:
        share = sum(self.discordant) / self.n
        if abs(self.estimate) >= self.margin:
            return mcnemar_pairs_needed(share, max(self.discordant) / sum(self.discordant))
        share = max(share, self.margin)  # the smallest difference that matters: margin = share (2 towards - 1)
        return mcnemar_pairs_needed(share, (1 + self.margin / share) / 2)

    @property
    def estimate(self) -> float:
        """The difference of the rates, treatment - baseline."""
        return (self.events[1] - self.events[0]) / self.n

    @property
    def verdict(self) -> str:
        p = self.p if self.p_holm is None else self.p_holm
        claimed = self.estimate < 0 if self.direction == "less" else self.estimate > 0
        return _decide(p < ALPHA, claimed, max(self.ci[0][1], self.ci[1][1]) < self.margin)


@functools.lru_cache(maxsize=None)
def exact_interval(events: int, runs: int) -> tuple[float, float]:
    """The exact (Clopper-Pearson) 95% interval of a rate: ``events`` of ``runs`` (scipy)."""
    from scipy.stats import binomtest

    return tuple(float(v) for v in binomtest(events, runs).proportion_ci(method="exact"))


def _mcnemar_rejects(discordant_pairs: int, towards: float) -> float:
    """The probability that the exact McNemar test (two-sided, level :data:`ALPHA`) rejects on
    ``discordant_pairs`` pairs that disagree, each going one arm's way with probability ``towards``."""
    import numpy as np
    from scipy.stats import binom

    c = np.arange(discordant_pairs + 1)
    return float(binom.pmf(c, discordant_pairs, towards)[_mcnemar_p(c, discordant_pairs) < ALPHA].sum())


def _mcnemar_p(towards: np.ndarray, discordant: np.ndarray | int) -> np.ndarray:
    """The exact McNemar test's two-sided p-value when ``towards`` of ``discordant`` pairs that
    disagree go one arm's way (as scipy's ``binomtest`` at 0.5 gives it; 1 with no such pair)."""
    import numpy as np
    from scipy.stats import binom

    return np.minimum(1.0, 2 * np.minimum(binom.cdf(towards, discordant, 0.5), binom.sf(towards - 1, discordant, 0.5)))


def _check_probabilities(**values: float) -> None:
    outside = {name: value for name, value in values.items() if not 0 <= value <= 1}
    if outside:
        raise ValueError(f"probabilities must lie in [0, 1], got {outside}")


def mcnemar_power(pairs: int, discordant: float, towards: float) -> float:
    """The exact power of the McNemar test (two-sided, level :data:`ALPHA`) on ``pairs`` pairs when
    a pair is discordant with probability ``discordant`` and a discordant pair goes one arm's way
    with probability ``towards``: summed over the binomial number of discordant pairs."""
    _check_probabilities(discordant=discordant, towards=towards)
    return _power([_mcnemar_rejects(d, towards) for d in range(pairs + 1)], discordant)


def _power(rejects: list[float], discordant: float) -> float:
    """The power on ``len(rejects) - 1`` pairs, given the rejection probability for each number
    of discordant pairs (:func:`_mcnemar_rejects`)."""
    import numpy as np
    from scipy.stats import binom

    pairs = len(rejects) - 1
    return float(binom.pmf(np.arange(pairs + 1), pairs, discordant) @ np.array(rejects))


def rates_power(pairs: int, baseline: float, treatment: float) -> float:
    """:func:`mcnemar_power` on ``pairs`` pairs whose two runs have the event independently, with
    probabilities ``baseline`` and ``treatment``: a pair disagrees with probability
    ``b (1 - t) + t (1 - b)``, towards the treatment with ``t (1 - b)`` of it (no power when no pair
    can disagree). For sizing a confirmation on a pilot's rates."""
    _check_probabilities(baseline=baseline, treatment=treatment)
    discordant = treatment * (1 - baseline) + baseline * (1 - treatment)
    return mcnemar_power(pairs, discordant, treatment * (1 - baseline) / discordant) if discordant else 0.0


def mcnemar_pairs_needed(discordant: float, towards: float, limit: int = 5000) -> int:
    """Pairs (at least 2) the exact McNemar test needs for :data:`POWER` (:func:`mcnemar_power`):
    the smallest ``n`` whose power reaches it, the rejection probability of each number of
    discordant pairs computed once.

    Raises:
        ValueError: probabilities outside (0, 1] and [0, 1], or no ``n`` up to ``limit`` has the power.
    """
    _check_probabilities(discordant=discordant, towards=towards)
    if discordant == 0:
        raise ValueError("need discordant > 0: pairs that never disagree cannot decide anything")
    rejects = []  # given d discordant pairs, the probability that the test rejects
    for n in range(limit + 1):
        rejects.append(_mcnemar_rejects(n, towards))
        if n >= 2 and _power(rejects, discordant) >= POWER:
            return n
    raise ValueError(f"no number of pairs up to {limit} gives the exact McNemar test {POWER:.0%} power here")


def rates_decision_chance(pairs: int, baseline_events: int, treatment: float, margin: float,
                          alpha: float = ALPHA) -> float:
    """The chance that :func:`paired_rates` on ``pairs`` pairs decides a claim when the baseline
    arm's runs are already trained (``baseline_events`` of them had the event) and each treatment
    run has it independently with probability ``treatment``: that the exact McNemar test is
    significant at level ``alpha`` (e.g. ``ALPHA / k`` in a Holm family of ``k``, a lower bound), or
    that both arms' exact upper bounds lie below ``margin`` (*absent*). Exact: summed over the
    treatment's events on the seeds where the baseline had one and on those where it had not."""
    import numpy as np
    from scipy.stats import binom

    _check_probabilities(treatment=treatment, margin=margin)
    if not 0 <= baseline_events <= pairs or pairs < 1:
        raise ValueError(f"need 0 <= baseline_events <= pairs and pairs >= 1, got {baseline_events}, {pairs}")
    rest = pairs - baseline_events
    with_base, alone = np.meshgrid(np.arange(baseline_events + 1), np.arange(rest + 1), indexing="ij")
    significant = _mcnemar_p(alone, baseline_events - with_base + alone) < alpha
    high = np.array([exact_interval(k, pairs)[1] for k in range(pairs + 1)])  # upper bound per count
    absent = np.maximum(high[baseline_events], high[with_base + alone]) < margin
    chance = binom.pmf(with_base, baseline_events, treatment) * binom.pmf(alone, rest, treatment)
    return float(chance[significant | absent].sum())


def fresh_rates_decision_chance(pairs: int, baseline: float, treatment: float, margin: float,
                                alpha: float = ALPHA) -> float:
    """:func:`rates_decision_chance` when the baseline's runs are to be trained too, each having the
    event independently with probability ``baseline``: averaged over the binomial number of the
    baseline's events. For sizing a confirmation that trains both arms on fresh seeds."""
    from scipy.stats import binom

    _check_probabilities(baseline=baseline)
    return float(sum(binom.pmf(k, pairs, baseline) * rates_decision_chance(pairs, k, treatment, margin, alpha)
                     for k in range(pairs + 1)))


def paired_rates(baseline: Sequence[bool], treatment: Sequence[bool], margin: float,
                 direction: str = "less") -> RateTest:
    """Compare how often an event (a breakdown) happens, run by run: ``baseline[k]`` and
    ``treatment[k]`` are the same seed's runs. The exact McNemar test (scipy's ``binomtest`` on the
    discordant pairs) and exact intervals per arm (see :class:`RateTest`)."""
    import numpy as np
    from scipy.stats import binomtest

    _check(margin, direction)
    base, treat = (np.asarray(x) for x in (baseline, treatment))
    if base.ndim != 1 or base.shape != treat.shape or len(base) < 1 or base.dtype != bool or treat.dtype != bool:
        raise ValueError("baseline and treatment must be equal-length, non-empty arrays of bools (did the run "
                         "break down?) paired by seed")
    only_treat, only_base = int((treat & ~base).sum()), int((base & ~treat).sum())
    discordant = only_treat + only_base
    p = 1.0 if discordant == 0 else float(binomtest(only_treat, discordant, 0.5).pvalue)
    events = (int(base.sum()), int(treat.sum()))
    ci = tuple(exact_interval(k, len(base)) for k in events)
    return RateTest(events, len(base), (only_base, only_treat), ci, p, float(margin), direction)


SPEARMAN_VARIANCE = 1.06
"""Fieller, Hartley and Pearson's (1957) factor: the Fisher z of Spearman's rho has variance about
1.06 / (n - 3), slightly more than Pearson's 1 / (n - 3)."""


@dataclass(frozen=True)
class TrendTest:
    """Whether an endpoint grows (or falls) with a setting over independent runs: Spearman's rho.

    Attributes:
        estimate: Spearman's rank correlation over the ``n`` runs.
        ci: its 95% interval through Fisher's z with :data:`SPEARMAN_VARIANCE` (always in (-1, 1)).
        p: two-sided; from permutations below 10 runs (exact up to 7), where the usual
            approximation claims significance for a perfect ranking of three.
        margin: the |rho| below which a trend is negligible, declared with the claim: *absent*
            when the interval lies inside +-margin. ``direction``: the paper's sign, ``"greater"``
            (the endpoint grows with the setting) or ``"less"``.
        p_holm: ``p`` adjusted within the family (:func:`holm`), or ``None``.
    Properties: ``seeds_needed``, the runs that would decide the claim: those a correlation test
    needs for :data:`POWER` at the larger of ``|rho|`` and ``margin`` (statsmodels'
    ``NormalIndPower`` on Fisher's z, plus 3); ``verdict`` as for :class:`PairedTest`.
    """

    estimate: float
    ci: tuple[float, float]
    p: float
    n: int
    margin: float
    direction: str
    p_holm: float | None = None

    @property
    def seeds_needed(self) -> int:
        from statsmodels.stats.power import NormalIndPower

        z = math.atanh(min(max(abs(self.estimate), self.margin), 0.999)) / math.sqrt(SPEARMAN_VARIANCE)
        return math.ceil(NormalIndPower().solve_power(z, alpha=ALPHA, power=POWER, ratio=0)) + 3

    @property
    def verdict(self) -> str:
        p = self.p if self.p_holm is None else self.p_holm
        claimed = self.estimate > 0 if self.direction == "greater" else self.estimate < 0
        return _decide(p < ALPHA, claimed, -self.margin < self.ci[0] and self.ci[1] < self.margin)


def trend_test(x: Sequence[float], y: Sequence[float], margin: float = 0.3, direction: str = "greater") -> TrendTest:
    """Test "``y`` grows with ``x``" (``direction="greater"``; ``"less"``: falls) over independent
    runs, one value each (see :class:`TrendTest`). Never pass values of one run at several skips
    or steps, or a few method means: they are not independent runs.

    Raises:
        ValueError: unequal lengths, fewer than 4 runs, a non-finite value, a constant ``x`` or
            ``y``, a margin outside (0, 1) or a bad direction.
    """
    import numpy as np
    from scipy.stats import permutation_test, rankdata, spearmanr

    x, y = _pairs(x, y)
    if direction not in DIRECTIONS:
        raise ValueError(f"direction must be one of {DIRECTIONS} (the paper's claimed sign), got {direction!r}")
    if not (isinstance(margin, (int, float)) and 0 < margin < 1):
        raise ValueError(f"margin must be a |rho| in (0, 1), declared with the claim, got {margin!r}")
    if len(x) < 4:
        raise ValueError(f"a trend test needs at least 4 runs (its smallest p over 3 is 0.33), got {len(x)}")
    if np.ptp(x) == 0 or np.ptp(y) == 0:
        raise ValueError("x and y must both vary: a constant series has no rank correlation")
    rho, p = (float(v) for v in spearmanr(x, y))
    n = len(x)
    if n < 10:  # Spearman's rho is Pearson's r of the (average) ranks: permute the ranks of x, all at once
        ranks_y = rankdata(y)
        test = permutation_test((rankdata(x),), lambda ranks, axis: _pearson_r(ranks, ranks_y, axis),
                                permutation_type="pairings", vectorized=True,
                                n_resamples=math.inf if n <= 7 else 9999, rng=0)
        p = float(test.pvalue)
    z, half = math.atanh(min(max(rho, -0.999999), 0.999999)), 1.959964 * math.sqrt(SPEARMAN_VARIANCE / max(n - 3, 1))
    return TrendTest(rho, (math.tanh(z - half), math.tanh(z + half)), p, n, float(margin), direction)


def _pearson_r(a: np.ndarray, b: np.ndarray, axis: int = -1) -> np.ndarray:
    """Pearson's correlation of ``a`` and ``b`` along ``axis`` (``b`` broadcast against ``a``)."""
    import numpy as np

    a = a - a.mean(axis=axis, keepdims=True)
    b = np.broadcast_to(b - b.mean(), a.shape)
    return (a * b).sum(axis=axis) / np.sqrt((a * a).sum(axis=axis) * (b * b).sum(axis=axis))


def holm(tests: Sequence[PairedTest | RateTest | TrendTest]) -> list[PairedTest | RateTest | TrendTest]:
    """The tests of one pre-declared family with their ``p_holm`` set by Holm's step-down method
    (statsmodels' ``multipletests``): the family's chance of any false "reproduced" or
    "contradicted" stays at most :data:`ALPHA`."""
    from statsmodels.stats.multitest import multipletests

    if not tests:
        return []
    adjusted = multipletests([t.p for t in tests], alpha=ALPHA, method="holm")[1]
    return [replace(t, p_holm=float(p)) for t, p in zip(tests, adjusted)]


__all__ = ["ALPHA", "POWER", "VERDICTS", "MeanSE", "Oscillation", "PairedTest", "RateTest", "TrendTest",
           "absent_chance", "decision_chance", "detrended", "holm", "mcnemar_pairs_needed", "mean_se", "oscillation",
           "over_seeds", "paired_power", "paired_rates", "paired_test", "seeds_needed", "trend_test"]
