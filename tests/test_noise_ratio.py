"""Tests of scalelong_edu.noise_ratio: r = ||eps||^2 / ||x_t||^2 (the paper's Section 4.1 and Fig. 3(b)),
its sampling over (image, t, eps), its summaries and the large-m prediction 1 / (abar s + 1 - abar)."""

import math

import numpy as np
import pytest
import torch

from scalelong_edu.diffusion import DiscreteSchedule, VPSDE, linear_schedule
from scalelong_edu.noise_ratio import (RatioDraws, compare_variants, noise_ratio, predicted_ratio, predicted_ratios,
                                       image_bootstrap, ratio_of_means, sample_noise_ratios, sample_ratios_from_energies,
                                       summarize_ratios, to_unit_range, x0_sq_ratios)


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# -- noise_ratio: known answers ---------------------------------------------------------------------
def test_zero_image_gives_one_over_one_minus_abar():
    noise = torch.randn(5, 3, 4, 4, generator=_gen(), dtype=torch.float64)
    abar = torch.tensor([0.0, 0.1, 0.5, 0.9, 0.999], dtype=torch.float64)
    r = noise_ratio(torch.zeros(5, 3, 4, 4), abar, noise)
    assert r.dtype == torch.float64 and r.shape == (5,)
    torch.testing.assert_close(r, 1 / (1 - abar), rtol=1e-12, atol=0)


def test_abar_limits():
    x0 = torch.rand(3, 1, 8, 8, generator=_gen(1)) * 2 - 1
    noise = torch.randn(3, 1, 8, 8, generator=_gen(2))
    # abar = 0: x_t = eps, the ratio is exactly 1
    torch.testing.assert_close(noise_ratio(x0, torch.zeros(3), noise), torch.ones(3, dtype=torch.float64))
    # abar = 1: x_t = x_0, the ratio is ||eps||^2 / ||x_0||^2
    expected = noise.double().square().sum((1, 2, 3)) / x0.double().square().sum((1, 2, 3))
    torch.testing.assert_close(noise_ratio(x0, torch.ones(3), noise), expected)


def test_noise_ratio_on_hand_made_vectors():
    x0 = torch.ones(2, 4)
    noise = torch.tensor([[1.0, -1.0, 1.0, -1.0], [1.0, 1.0, 1.0, 1.0]])
    # abar = 1/2: x_t = (x_0 + eps) / sqrt(2) -> [2, 0, 2, 0] / sqrt(2) (norm^2 4) and [2, 2, 2, 2] / sqrt(2) (8)
    r = noise_ratio(x0, torch.tensor([0.5, 0.5]), noise)
    torch.testing.assert_close(r, torch.tensor([1.0, 0.5], dtype=torch.float64))


def test_noise_ratio_works_in_float64_for_float32_input():
    x0 = torch.full((1, 3), 1e-4, dtype=torch.float32)
    noise = torch.tensor([[1.0, 2.0, 3.0]])
    abar = torch.tensor([0.3], dtype=torch.float64)
    r = noise_ratio(x0, abar, noise)
    x0d, nd, a = x0.double(), noise.double(), 0.3
    expected = nd.square().sum() / (math.sqrt(a) * x0d + math.sqrt(1 - a) * nd).square().sum()
    assert r.dtype == torch.float64
    assert r.item() == pytest.approx(expected.item(), rel=1e-13)


@pytest.mark.parametrize("x0, abar, noise, match", [
    (torch.zeros(2, 3), torch.zeros(3), torch.zeros(2, 3), "alpha_bar must have shape"),
    (torch.zeros(2, 3), torch.tensor([0.5, 1.5]), torch.zeros(2, 3), r"\[0, 1\]"),
    (torch.zeros(2, 3), torch.zeros(2), torch.zeros(2, 4), "noise must be"),
    (torch.zeros(2, 3), torch.zeros(2), None, "noise must be"),
    (np.zeros((2, 3)), torch.zeros(2), torch.zeros(2, 3), "tensor"),
    (torch.zeros(3), torch.zeros(3), torch.zeros(3), r"\(N, \.\.\.\)"),
    (torch.tensor([[0.0, math.nan]]), torch.zeros(1), torch.zeros(1, 2), "finite"),
    (torch.zeros(2, 3, dtype=torch.int64), torch.zeros(2), torch.zeros(2, 3), "floating"),
    (torch.zeros(2, 3), torch.zeros(2), torch.tensor([[0.0, math.nan, 1.0], [1.0, 1.0, 1.0]]), "noise must be finite"),
    (torch.zeros(2, 3), torch.zeros(2), torch.full((2, 3), math.inf), "noise must be finite"),
    (torch.zeros(2, 3), torch.zeros(2), torch.ones(2, 3, dtype=torch.int64), "noise must be finite floating-point"),
])
def test_noise_ratio_rejects_bad_input(x0, abar, noise, match):
    with pytest.raises(ValueError, match=match):
        noise_ratio(x0, abar, noise)


# -- x0_sq_ratios, to_unit_range -------------------------------------------------------------------
def test_x0_sq_ratios_and_the_data_range():
    black, grey = -torch.ones(1, 1, 4, 4), torch.zeros(1, 1, 4, 4)
    images = torch.cat([black, grey, torch.ones(1, 1, 4, 4)])
    torch.testing.assert_close(x0_sq_ratios(images), torch.tensor([1.0, 0.0, 1.0], dtype=torch.float64))
    unit = to_unit_range(images)
    torch.testing.assert_close(unit.flatten(1)[:, 0], torch.tensor([0.0, 0.5, 1.0]))
    # in [0, 1] a black image has no energy and mid-grey has s = 1/4
    torch.testing.assert_close(x0_sq_ratios(unit), torch.tensor([0.0, 0.25, 1.0], dtype=torch.float64))


def test_to_unit_range_rejects_images_outside_minus_one_one():
    with pytest.raises(ValueError, match=r"\[-1, 1\]"):
        to_unit_range(torch.full((1, 1, 2, 2), 2.0))


# -- sample_noise_ratios ----------------------------------------------------------------------------
def test_sampling_is_reproducible_and_seed_sensitive():
    images = torch.rand(6, 1, 8, 8, generator=_gen()) * 2 - 1
    sched = linear_schedule(T=50)
    a = sample_noise_ratios(images, sched, draws=3, generator=_gen(7))
    b = sample_noise_ratios(images, sched, draws=3, generator=_gen(7))
    c = sample_noise_ratios(images, sched, draws=3, generator=_gen(8))
    for field in ("t", "image_index", "eps_sq", "xt_sq"):
        assert torch.equal(getattr(a, field), getattr(b, field))
    assert not torch.equal(a.eps_sq, c.eps_sq)


def test_sampling_shapes_dtypes_and_order():
    images = torch.zeros(4, 3, 2, 2)
    draws = sample_noise_ratios(images, linear_schedule(T=20), draws=5, t_min=7, generator=_gen(), chunk_size=3)
    assert draws.t.shape == draws.image_index.shape == draws.eps_sq.shape == draws.xt_sq.shape == (20,)
    assert draws.t.dtype == torch.int64 and draws.eps_sq.dtype == draws.xt_sq.dtype == torch.float64
    assert draws.ratio.shape == (20,) and draws.ratio.dtype == torch.float64
    assert torch.equal(draws.image_index, torch.arange(20) % 4)  # draw k of image i is entry k * N + i
    assert int(draws.t.min()) >= 7 and int(draws.t.max()) <= 20


def test_sampled_t_is_ddpm_one_based_and_maps_to_alpha_bar_t_minus_one():
    """With x_0 = 0 every draw has r = 1 / (1 - abar): this pins t = 1..T to alpha_bars[t - 1]."""
    sched = linear_schedule(T=30)
    draws = sample_noise_ratios(torch.zeros(200, 1, 3, 3), sched, generator=_gen(3))
    assert int(draws.t.min()) >= 1 and int(draws.t.max()) <= 30
    torch.testing.assert_close(draws.ratio, 1 / (1 - sched.alpha_bars[draws.t - 1]), rtol=1e-12, atol=0)


def test_sampled_t_is_uniform_over_t_min_to_T():
    sched = DiscreteSchedule(torch.tensor([0.9, 0.6, 0.3, 0.1], dtype=torch.float64))
    t = sample_noise_ratios(torch.zeros(1, 1, 1, 1), sched, draws=8000, generator=_gen()).t
    freq = torch.bincount(t, minlength=5)[1:].double() / t.numel()
    torch.testing.assert_close(freq, torch.full((4,), 0.25, dtype=torch.float64), atol=0.02, rtol=0)
    t = sample_noise_ratios(torch.zeros(1, 1, 1, 1), sched, draws=2000, t_min=3, generator=_gen()).t
    assert set(t.tolist()) == {3, 4}


def test_sampled_noise_is_standard_normal():
    draws = sample_noise_ratios(torch.zeros(50, 1, 16, 16), linear_schedule(T=10), draws=4, generator=_gen())
    # ||eps||^2 / m is chi^2_m / m: mean 1, sd sqrt(2 / m) = 0.088 per draw, 0.0044 over 200 draws
    assert float(draws.eps_sq.mean()) == pytest.approx(1.0, abs=0.02)
    assert float(draws.eps_sq.std()) == pytest.approx(math.sqrt(2 / 256), rel=0.15)


@pytest.mark.parametrize("kwargs, match", [
    (dict(draws=0), "draws"), (dict(draws=True), "draws"), (dict(draws=1.5), "draws"),
    (dict(t_min=0), "t_min"), (dict(t_min=11), "t_min"), (dict(chunk_size=0), "chunk_size"),
])
def test_sampling_rejects_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        sample_noise_ratios(torch.zeros(2, 1, 2, 2), linear_schedule(T=10), **kwargs)


def test_sampling_needs_a_discrete_schedule():
    with pytest.raises(ValueError, match="discretize"):
        sample_noise_ratios(torch.zeros(2, 1, 2, 2), VPSDE())
    draws = sample_noise_ratios(torch.zeros(2, 1, 2, 2), VPSDE().discretize(10), generator=_gen())
    assert draws.t.shape == (2,)


# -- the two averages and the summary ---------------------------------------------------------------
def test_mean_of_ratio_and_ratio_of_means_differ_on_hand_made_draws():
    draws = RatioDraws(t=torch.tensor([1, 2]), image_index=torch.tensor([0, 0]),
                       eps_sq=torch.tensor([1.0, 1.0], dtype=torch.float64),
                       xt_sq=torch.tensor([0.5, 2.0], dtype=torch.float64))
    assert float(draws.ratio.mean()) == pytest.approx(1.25)  # (2 + 0.5) / 2
    assert ratio_of_means(draws) == pytest.approx(0.8)  # 2 / 2.5


def test_summary_of_a_hand_made_sample():
    summary = summarize_ratios(torch.tensor([1.0, 2.0, 3.0, 4.0, 10.0]), threshold=5.0, quantiles=(0.0, 0.5, 1.0))
    assert (summary.n, summary.mean, summary.median) == (5, 4.0, 3.0)
    assert summary.quantiles == {0.0: 1.0, 0.5: 3.0, 1.0: 10.0}
    assert summary.frac_below == 0.8
    assert summarize_ratios([1.0, 2.0, 3.0, 4.0, 10.0], threshold=4.0).frac_below == 0.6  # strictly below
    row = summarize_ratios([1.0, 3.0], quantiles=(0.97,)).as_row()
    assert set(row) == {"n", "mean", "median", "q97", "frac_below"}
    assert row["q97"] == pytest.approx(1.0 + 0.97 * 2.0)


def test_summary_counts_infinite_ratios_as_above_the_threshold():
    summary = summarize_ratios([1.0, math.inf])
    assert summary.frac_below == 0.5 and summary.mean == math.inf


def test_summary_quantiles_towards_infinite_ratios_are_infinite_not_nan():
    both = summarize_ratios([math.inf, math.inf])
    assert both.median == math.inf and list(both.quantiles.values()) == [math.inf] * 4
    assert summarize_ratios([1.0, math.inf], quantiles=(0.0, 0.25, 0.5, 1.0)).quantiles == {
        0.0: 1.0, 0.25: math.inf, 0.5: math.inf, 1.0: math.inf}
    on_a_value = summarize_ratios([1.0, 1.0, math.inf], quantiles=(0.5,))  # q = 0.5 falls on the second 1.0
    assert on_a_value.quantiles == {0.5: 1.0} and on_a_value.median == 1.0
    finite = summarize_ratios([1.0, 2.0, 3.0, 4.0], quantiles=(0.1, 0.9))  # finite samples: np.quantile itself
    assert finite.quantiles == {0.1: float(np.quantile([1.0, 2.0, 3.0, 4.0], 0.1)),
                                0.9: float(np.quantile([1.0, 2.0, 3.0, 4.0], 0.9))}


@pytest.mark.parametrize("threshold", [np.float32(5.0), np.array(5.0), torch.tensor(5.0), np.int64(5)])
def test_summary_accepts_numpy_and_0d_thresholds(threshold):
    summary = summarize_ratios([1.0, 6.0], threshold=threshold)
    assert summary.threshold == 5.0 and type(summary.threshold) is float and summary.frac_below == 0.5


@pytest.mark.parametrize("ratios, kwargs, match", [
    ([], {}, "empty"), ([1.0, math.nan], {}, "NaN"), ([-1.0], {}, ">= 0"),
    ([1.0], dict(threshold=math.inf), "threshold"), ([1.0], dict(threshold="5"), "threshold"),
    ([1.0], dict(quantiles=(1.5,)), "quantiles"),
])
def test_summary_rejects_bad_input(ratios, kwargs, match):
    with pytest.raises(ValueError, match=match):
        summarize_ratios(ratios, **kwargs)


# -- the large-m prediction -------------------------------------------------------------------------
def test_predicted_ratio_formula_limits_and_broadcasting():
    assert predicted_ratio(0.0, 0.3).item() == 1.0  # pure noise
    assert predicted_ratio(1.0, 0.25).item() == 4.0  # x_t = x_0: 1 / s
    assert predicted_ratio(0.5, 0.0).item() == 2.0  # x_0 = 0: 1 / (1 - abar)
    assert predicted_ratio(0.5, 0.5).item() == pytest.approx(1 / 0.75)
    out = predicted_ratio(torch.tensor([0.1, 0.5, 0.9]), torch.tensor([[0.0], [1.0]]))
    assert out.shape == (2, 3) and out.dtype == torch.float64
    torch.testing.assert_close(out[1], torch.ones(3, dtype=torch.float64))  # s = 1: E||x_t||^2 = m at every t


@pytest.mark.parametrize("abar, s, match", [(1.5, 0.2, "alpha_bar"), (0.5, -0.1, "x0_sq_ratio"),
                                            (0.5, math.inf, "x0_sq_ratio")])
def test_predicted_ratio_rejects_bad_input(abar, s, match):
    with pytest.raises(ValueError, match=match):
        predicted_ratio(abar, s)


def test_predicted_ratios_grid_and_t_min():
    sched = linear_schedule(T=40)
    grid = predicted_ratios([0.0, 0.5], sched, t_min=11)
    assert grid.shape == (2 * 30,)
    torch.testing.assert_close(grid[:30], 1 / (1 - sched.alpha_bars[10:]))
    with pytest.raises(ValueError, match="t_min"):
        predicted_ratios([0.5], sched, t_min=41)
    with pytest.raises(ValueError, match="empty"):
        predicted_ratios([], sched)


def test_monte_carlo_agrees_with_the_large_m_prediction():
    """m = 3 x 32 x 32 (CIFAR-10's size): ||eps||^2 / m and the cross term fluctuate by ~2.5% per draw, so for
    the drawn (image, t) pairs both averages match (*) to about a percent."""
    images = (torch.rand(64, 3, 32, 32, generator=_gen()) * 2 - 1) * 0.6  # s ~ 0.12: a long tail at small t
    sched = linear_schedule()
    draws = sample_noise_ratios(images, sched, draws=8, generator=_gen(1))
    pred = predicted_ratio(sched.alpha_bars[draws.t - 1], x0_sq_ratios(images)[draws.image_index])
    assert float(draws.ratio.mean()) == pytest.approx(float(pred.mean()), rel=0.01)
    assert ratio_of_means(draws) == pytest.approx(1 / float((1 / pred).mean()), rel=0.01)
    # Jensen: the mean of the ratio exceeds the ratio of means
    assert float(draws.ratio.mean()) > ratio_of_means(draws) + 0.3


def test_ratios_from_energies_follow_the_same_distribution_as_ratios_from_images():
    """At m = 16 the large-m limit is far off, so only the exact decomposition of eps along x_0 and
    across it matches the ratios drawn from the images themselves; the same test tells the
    large-m prediction apart (it has power)."""
    from scipy.stats import ks_2samp

    images = torch.rand(400, 1, 4, 4, generator=_gen(2), dtype=torch.float64) * 2 - 1
    images[:100] *= 0.2  # a quarter of low-energy images: a long tail at small t
    sched = linear_schedule(T=100)
    direct = sample_noise_ratios(images, sched, draws=25, generator=_gen(3))
    s = x0_sq_ratios(images)
    from_s = sample_ratios_from_energies(s, 16, sched, draws=25, seed=4)
    assert ks_2samp(direct.ratio.numpy(), from_s.ratio.numpy()).pvalue > 0.001
    assert ratio_of_means(from_s) == pytest.approx(ratio_of_means(direct), rel=0.02)
    large_m = predicted_ratio(sched.alpha_bars[from_s.t - 1], s[from_s.image_index])
    assert ks_2samp(direct.ratio.numpy(), large_m.numpy()).pvalue < 1e-6
    assert torch.equal(from_s.image_index[:5], torch.arange(5)) and len(from_s.t) == 400 * 25
    zero = sample_ratios_from_energies([0.0] * 8, 16, sched, seed=0)
    torch.testing.assert_close(zero.ratio, 1 / (1 - sched.alpha_bars[zero.t - 1].double()), rtol=1e-12, atol=0)
    with pytest.raises(ValueError, match="finite energies"):
        sample_ratios_from_energies([0.1, -1.0], 16, sched)
    with pytest.raises(ValueError, match="m must be"):
        sample_ratios_from_energies([0.1], 1, sched)


def test_image_bootstrap_brackets_the_estimate_and_narrows_with_more_images():
    sched = linear_schedule(T=100)
    rng = np.random.default_rng(0)
    widths = {}
    for n in (200, 800):  # energies of a mixed data set: dark images carry the tail above 5
        s = np.where(rng.random(n) < 0.2, 0.05, 0.5)
        draws = sample_ratios_from_energies(s, 64, sched, draws=50, seed=1)
        intervals = image_bootstrap(draws, n_boot=1000)
        lo, hi = intervals["frac_below"]
        assert lo < float((draws.ratio < 5).double().mean()) < hi
        lo_r, hi_r = intervals["ratio_of_means"]
        assert lo_r < ratio_of_means(draws) < hi_r
        lo_m, hi_m = intervals["mean"]
        assert hi_r < lo_m < float(draws.ratio.mean()) < hi_m  # the tail lifts the mean of the ratio above the other
        widths[n] = hi - lo
    assert 1.4 < widths[200] / widths[800] < 2.8  # about sqrt(4): the images, not the draws, set it
    uneven = sample_ratios_from_energies([0.1, 0.2], 64, sched, draws=3)
    uneven = RatioDraws(uneven.t[:-1], uneven.image_index[:-1], uneven.eps_sq[:-1], uneven.xt_sq[:-1])
    with pytest.raises(ValueError, match="same number of draws"):
        image_bootstrap(uneven)


def test_predicted_ratios_average_exactly_over_t_and_images():
    sched = linear_schedule(T=50)
    s = torch.tensor([0.0, 0.2, 1.0], dtype=torch.float64)
    grid = predicted_ratios(s, sched).view(3, 50)
    torch.testing.assert_close(grid[0], 1 / (1 - sched.alpha_bars))
    torch.testing.assert_close(grid[2], torch.ones(50, dtype=torch.float64))
    summary = summarize_ratios(predicted_ratios(s, sched))
    assert summary.mean == pytest.approx(float(grid.mean()))


# -- compare_variants -------------------------------------------------------------------------------
def test_compare_variants_rows_and_what_they_show():
    # dark images (mostly -1, like MNIST): s ~ 1 in [-1, 1] but ~ 0 in [0, 1]
    images = -torch.ones(16, 1, 8, 8)
    images[:, :, 3:5, 3:5] = 1.0
    sched = {"linear": linear_schedule(T=100)}
    rows = compare_variants(images, sched, t_mins=(1, 21), draws=4, seed=0)
    assert len(rows) == 4
    by_key = {(r["range"], r["t_min"]): r for r in rows}
    for key in ("schedule", "range", "t_min", "n", "mean", "median", "q97", "frac_below", "ratio_of_means",
                "pred_mean", "pred_ratio_of_means", "pred_frac_below"):
        assert key in rows[0]
    assert by_key[("[-1,1]", 1)]["frac_below"] == 1.0  # s = 0.875: r <= ~1 / s
    assert by_key[("[0,1]", 1)]["frac_below"] < 0.9  # s = 1/16: r -> 16 at small t
    assert by_key[("[0,1]", 21)]["mean"] < by_key[("[0,1]", 1)]["mean"]  # dropping small t cuts the tail
    for row in rows:
        assert row["mean"] >= row["ratio_of_means"]
    assert compare_variants(images, sched, seed=3) == compare_variants(images, sched, seed=3)
    assert compare_variants(images, sched, t_mins=np.array([1, 21]), draws=4, seed=0) == rows


@pytest.mark.parametrize("kwargs, match", [(dict(ranges=("[0,255]",)), "ranges"), (dict(ranges=()), "ranges"),
                                           (dict(schedules={}), "schedules"), (dict(t_mins=[]), "t_mins"),
                                           (dict(t_mins=()), "non-empty"), (dict(t_mins=1), "t_mins"),
                                           (dict(t_mins="1"), "t_mins")])
def test_compare_variants_rejects_bad_choices(kwargs, match):
    args = dict(schedules={"linear": linear_schedule(T=10)}) | kwargs
    with pytest.raises(ValueError, match=match):
        compare_variants(torch.zeros(2, 1, 2, 2), **args)
