"""Numbers with error bars: a measurement repeated over seeds, as mean ± standard error.

A statistic of one random draw (64 samples, one training run) does not say how far another draw
would move it. :func:`over_seeds` repeats a measurement under several seeds and :class:`MeanSE`
summarises the values; format it like a float to print both numbers::

    result = over_seeds(lambda seed: roughness(sample(seed)), seeds=range(5))
    print(f"roughness {result:.3f}")        # roughness 0.151 ± 0.002 (n = 5)

The book's evidence protocol compares methods by 95% intervals over seeds
(:meth:`MeanSE.interval`, :func:`differ`) and measures "how much a quantity oscillates during
training" one way everywhere (:func:`oscillation`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Iterable

import torch


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


def differ(a: MeanSE, b: MeanSE, level: float = 0.95) -> bool:
    """Whether two means differ by the book's rule: their ``level`` intervals do not overlap.

    Stricter than a two-sample test at the same level (non-overlapping 95% intervals correspond
    to p well below 0.05), which suits a textbook: a difference it reports is one a reader's
    own seeds will reproduce.
    """
    (a_lo, a_hi), (b_lo, b_hi) = a.interval(level), b.interval(level)
    return a_hi < b_lo or b_hi < a_lo


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


__all__ = ["MeanSE", "Oscillation", "differ", "mean_se", "oscillation", "over_seeds"]
