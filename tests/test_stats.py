"""Tests of scalelong_edu.stats: mean ± standard error and intervals over seeds, the oscillation statistic."""

import math

import pytest
import torch

from scalelong_edu.stats import MeanSE, differ, mean_se, oscillation, over_seeds


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


def test_the_interval_uses_students_t_and_differ_needs_separate_intervals():
    three = mean_se([1.0, 2.0, 3.0])  # mean 2, se 1/sqrt(3), t(0.975, 2) = 4.3027
    lo, hi = three.interval()
    assert (lo, hi) == pytest.approx((2 - 4.3027 / 3**0.5, 2 + 4.3027 / 3**0.5), rel=1e-4)
    assert three.interval(0.5)[1] - three.interval(0.5)[0] < hi - lo
    assert differ(mean_se([1.0, 1.1, 0.9]), mean_se([5.0, 5.1, 4.9]))
    assert not differ(mean_se([1.0, 2.0, 3.0]), mean_se([2.5, 3.5, 4.5]))  # overlapping
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
