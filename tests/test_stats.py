"""Tests of scalelong_edu.stats: mean ± standard error over seeds."""

import math

import pytest
import torch

from scalelong_edu.stats import MeanSE, mean_se, over_seeds


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
