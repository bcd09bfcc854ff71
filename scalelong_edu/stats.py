"""Numbers with error bars: a measurement repeated over seeds, as mean ± standard error.

A statistic of one random draw (64 samples, one training run) does not say how far another draw
would move it. :func:`over_seeds` repeats a measurement under several seeds and :class:`MeanSE`
summarises the values; format it like a float to print both numbers::

    result = over_seeds(lambda seed: roughness(sample(seed)), seeds=range(5))
    print(f"roughness {result:.3f}")        # roughness 0.151 ± 0.002 (n = 5)
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


__all__ = ["MeanSE", "mean_se", "over_seeds"]
