"""Tests of scalelong_edu.theory's Lemma 3.2 and Theorem 3.1/3.3/3.4 quantities: tail sums, the robustness
factor, the expected ||x_t||^2 / m."""

import math

import numpy as np
import pytest
import torch

from scalelong_edu.theory import expected_xt_sq_ratio, robustness_factor, sum_kappa_squared, tail_sums


# -- tail_sums --------------------------------------------------------------------------------------
def test_tail_sums_of_known_kappas():
    assert tail_sums([1.0, 0.5, 0.25]) == [1.3125, 0.3125, 0.0625]
    assert tail_sums([1.0] * 4) == [4.0, 3.0, 2.0, 1.0]  # standard UNet: S_i = N - i + 1
    assert tail_sums([0.7]) == pytest.approx([0.49])


def test_tail_sums_accept_tensors_and_start_at_the_full_sum():
    kappas = torch.tensor([[1.0, 0.5], [0.25, 0.125]])  # flattened like sum_kappa_squared
    sums = tail_sums(kappas)
    assert sums == pytest.approx([1.328125, 0.328125, 0.078125, 0.015625])
    assert sums[0] == pytest.approx(sum_kappa_squared(kappas))
    assert all(a >= b for a, b in zip(sums, sums[1:]))  # non-increasing


@pytest.mark.parametrize("bad, match", [([], "empty"), ([1.0, math.nan], "finite"), ("0.5", "sequence"),
                                        (None, "sequence"), ([1.0, "x"], "sequence")])
def test_tail_sums_reject_bad_kappas(bad, match):
    with pytest.raises(ValueError, match=match):
        tail_sums(bad)


# -- robustness_factor ------------------------------------------------------------------------------
def test_robustness_factor_of_known_values():
    assert robustness_factor([1.0, 1.0, 1.0], 2.0) == 14.0  # 2 + 4 + 8
    assert robustness_factor([1.0, 0.5], 3.0) == 7.5  # 3 + 0.5 * 9
    assert robustness_factor([1.0, 0.5, 0.25], 1) == 1.75  # M_0 = 1: the plain sum of kappas
    assert robustness_factor(torch.tensor([1.0, 0.5]), 0.5) == 0.625  # 0.5 + 0.5 * 0.25
    assert robustness_factor([1.0, 1.0], np.float64(2.0)) == 6.0  # what a pandas max gives


def test_robustness_factor_grows_with_m0_and_cs_keeps_it_smaller():
    none, cs = [1.0] * 6, [0.5**i for i in range(6)]
    assert robustness_factor(none, 3.0) > robustness_factor(none, 2.0)
    assert robustness_factor(cs, 2.0) < robustness_factor(none, 2.0)
    assert robustness_factor(cs, 2.0) == pytest.approx(12.0)  # kappa * M_0 = 1 per skip after the first: 2 + 5 * 2


@pytest.mark.parametrize("m0", [0, 0.0, -1.0, math.nan, math.inf, "2", None])
def test_robustness_factor_rejects_a_bad_m0(m0):
    with pytest.raises(ValueError, match="m0 must be a finite number > 0"):
        robustness_factor([1.0, 0.5], m0)


@pytest.mark.parametrize("bad, match", [([], "empty"), ([1.0, math.inf], "finite"), ("11", "sequence")])
def test_robustness_factor_rejects_bad_kappas(bad, match):
    with pytest.raises(ValueError, match=match):
        robustness_factor(bad, 2.0)


# -- expected_xt_sq_ratio ---------------------------------------------------------------------------
def test_expected_xt_sq_ratio_at_the_ends_and_in_between():
    assert expected_xt_sq_ratio(1.0, 0.3) == 0.3  # t = 0: the data itself
    assert expected_xt_sq_ratio(0.0, 0.3) == 1.0  # pure noise: E||eps||^2 / m = 1
    assert expected_xt_sq_ratio(0.5, 1 / 3) == pytest.approx(2 / 3)
    assert expected_xt_sq_ratio(0.25, 1) == 1.0  # unit-power data stays at 1 at every t
    assert expected_xt_sq_ratio(0.9, 0) == pytest.approx(0.1)


def test_expected_xt_sq_ratio_broadcasts_over_a_tensor_of_alpha_bars():
    abar = torch.tensor([1.0, 0.5, 0.0], dtype=torch.float64)
    out = expected_xt_sq_ratio(abar, 0.6)
    assert isinstance(out, torch.Tensor)
    assert out.tolist() == pytest.approx([0.6, 0.8, 1.0])


@pytest.mark.parametrize("ratio", [-0.1, math.nan, math.inf, "0.3", None])
def test_expected_xt_sq_ratio_rejects_a_bad_data_ratio(ratio):
    with pytest.raises(ValueError, match="x0_sq_ratio must be a finite number >= 0"):
        expected_xt_sq_ratio(0.5, ratio)


@pytest.mark.parametrize("abar", [1.5, -0.1, math.nan, torch.tensor([0.2, 1.2]), np.array([0.5, -1.0])])
def test_expected_xt_sq_ratio_rejects_an_alpha_bar_outside_zero_one(abar):
    with pytest.raises(ValueError, match=r"alpha_bar must lie in \[0, 1\]"):
        expected_xt_sq_ratio(abar, 0.3)


@pytest.mark.parametrize("abar", ["0.5", None, True, [0.5], torch.tensor([True])])
def test_expected_xt_sq_ratio_rejects_an_alpha_bar_that_is_not_numbers(abar):
    with pytest.raises(ValueError, match="alpha_bar must be a number, tensor or array"):
        expected_xt_sq_ratio(abar, 0.3)


@pytest.mark.parametrize("abar, ratio", [(0.5, np.float32(0.25)), (np.float32(0.5), 0.25), (np.float64(0.5), 0.25),
                                         (np.array(0.5), np.array(0.25)), (0.5, torch.tensor(0.25)),
                                         (0.5, np.int64(0))])
def test_expected_xt_sq_ratio_accepts_numpy_scalars_and_0d_values(abar, ratio):
    assert expected_xt_sq_ratio(abar, ratio) == pytest.approx(0.5 * float(ratio) + 0.5)


def test_expected_xt_sq_ratio_broadcasts_over_a_numpy_array():
    assert expected_xt_sq_ratio(np.array([1.0, 0.0]), 0.6).tolist() == pytest.approx([0.6, 1.0])


def test_robustness_factor_accepts_a_0d_m0():
    assert robustness_factor([1.0, 1.0], np.array(2.0)) == 6.0
    assert robustness_factor([1.0, 1.0], torch.tensor(2.0)) == 6.0
