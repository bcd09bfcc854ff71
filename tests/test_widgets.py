"""Tests of scalelong_edu.widgets and .theory: coefficients, the sum of kappa_i^2 and its band, figures, the widget."""

import math

import pytest
import torch

from scalelong_edu.models import build_model
from scalelong_edu.scaling import METHODS, path_factors
from scalelong_edu.theory import SUM_KAPPA2_BAND, cs_kappa_range, cs_sum_kappa_squared, sum_kappa_squared
from scalelong_edu.widgets import (
    KappaExplorer,
    kappa_coefficients,
    kappa_explorer,
    kappa_table,
    measured_kappas,
    plot_cs_band,
    plot_kappas,
    stream_coefficients,
)


def test_kappa_coefficients_of_every_constant_method():
    assert kappa_coefficients("none", 0.5, 4) == [1.0] * 4
    assert kappa_coefficients("sqrt2-cs", 0.5, 3) == pytest.approx([2**-0.5] * 3)
    assert kappa_coefficients("cs", 0.5, 6) == pytest.approx([1, 0.5, 0.25, 0.125, 0.0625, 0.03125])
    assert kappa_coefficients("block-output", 0.5, 3) == [1.0] * 3  # the skips stay unscaled
    assert stream_coefficients("block-output", 0.5, 3) == [0.5] * 3  # one eta at every merge
    assert stream_coefficients("cs", 0.5, 3) == [1.0] * 3


@pytest.mark.parametrize("method", ["ls", "ls-per-skip"])
def test_learned_methods_have_no_fixed_coefficients(method):
    with pytest.raises(ValueError, match="measured_kappas"):
        kappa_coefficients(method, 0.5, 6)


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: kappa_coefficients("cs", 0.5, 0), "n_skips must be >= 1"),
        (lambda: kappa_coefficients("cs", 0.5, 2.5), "whole number"),
        (lambda: kappa_coefficients("cs", 0.0, 6), "kappa must be a finite number > 0"),
        (lambda: kappa_coefficients("cs", -1, 6), "kappa must be a finite number > 0"),
        (lambda: kappa_coefficients("none", 0.0, 6), "kappa must be a finite number > 0"),
        (lambda: kappa_coefficients("cosine", 0.5, 6), "unknown skip-scaling method 'cosine'"),
        (lambda: plot_kappas("cosine", 0.5, 6), "unknown skip-scaling method"),
        (lambda: plot_kappas("cs", 0.5, 0), "n_skips must be >= 1"),
        (lambda: plot_kappas("cs", 0.0, 6), "kappa must be"),
        (lambda: plot_kappas("ls", 0.5, 3, learned=[0.5, 0.5]), "learned must hold 3"),
        (lambda: kappa_explorer("cosine"), "unknown skip-scaling method"),
        (lambda: kappa_explorer("cs", 0.0), "kappa must be"),
        (lambda: kappa_explorer("cs", 0.5, 0), "n_skips must be >= 1"),
        (lambda: sum_kappa_squared([]), "empty"),
        (lambda: sum_kappa_squared("abc"), "sequence of numbers"),
        (lambda: sum_kappa_squared([1.0, math.nan]), "finite"),
        (lambda: cs_sum_kappa_squared(0.0, 3), "kappa must be"),
        (lambda: cs_kappa_range(0), "n_skips must be >= 1"),
        (lambda: cs_kappa_range(6, 5.0, 1.22), "lo < hi"),
        (lambda: cs_kappa_range(6, 0.2, 0.9), "hi must exceed 1"),
        (lambda: cs_kappa_range(1, 1.22, 5.0), "N = 1"),
    ],
)
def test_bad_inputs_raise_clear_errors(call, match):
    with pytest.raises(ValueError, match=match):
        call()


@pytest.mark.parametrize("n", [1, 2, 6, 13])
@pytest.mark.parametrize("kappa", [0.3, 0.5, 0.95, 1.0, 1.2])
def test_sum_of_squares_matches_the_closed_form(n, kappa):
    direct = sum_kappa_squared(kappa_coefficients("cs", kappa, n))
    assert direct == pytest.approx(cs_sum_kappa_squared(kappa, n), rel=1e-12)
    if kappa != 1.0:
        assert direct == pytest.approx((1 - kappa ** (2 * n)) / (1 - kappa**2), rel=1e-12)


def test_sum_of_squares_accepts_tensors_and_constant_methods():
    assert sum_kappa_squared(torch.tensor([1.0, 0.5])) == pytest.approx(1.25)
    assert sum_kappa_squared(kappa_coefficients("sqrt2-cs", 0.5, 6)) == pytest.approx(3.0)
    assert sum_kappa_squared(kappa_coefficients("none", 0.5, 6)) == 6.0


@pytest.mark.parametrize("n", [2, 3, 6, 8, 10, 20])
@pytest.mark.parametrize("band", [SUM_KAPPA2_BAND, (1.5, 3.0), (2.0, 40.0)])
def test_cs_kappa_range_brackets_the_band(n, band):
    lo, hi = band
    k_lo, k_hi = cs_kappa_range(n, lo, hi)
    assert 0 < k_lo < k_hi
    # plugging the ends back gives the band's ends ...
    assert cs_sum_kappa_squared(k_lo, n) == pytest.approx(lo, rel=1e-9)
    assert cs_sum_kappa_squared(k_hi, n) == pytest.approx(hi, rel=1e-9)
    # ... just inside the interval the sum is inside the band, just outside it is outside
    eps = 1e-6
    assert lo <= cs_sum_kappa_squared(k_lo + eps, n) <= hi
    assert lo <= cs_sum_kappa_squared(k_hi - eps, n) <= hi
    assert cs_sum_kappa_squared(k_lo - eps, n) < lo
    assert cs_sum_kappa_squared(k_hi + eps, n) > hi


def test_cs_kappa_range_for_the_papers_setting():
    k_lo, k_hi = cs_kappa_range(6)
    assert k_lo == pytest.approx(0.4247, abs=1e-4)
    assert k_hi == pytest.approx(0.9626, abs=1e-4)
    assert cs_kappa_range(2, 1.0, 5.0) == (0.0, pytest.approx(2.0))  # lo <= 1: every small kappa works
    assert cs_kappa_range(1, 0.5, 2.0) == (0.0, math.inf)


@pytest.mark.parametrize("method", ["none", "sqrt2-cs", "cs", "block-output"])
@pytest.mark.parametrize("n", [1, 6, 12])
def test_plot_kappas_bar_heights_are_the_skip_path_factors(method, n):
    ax = plot_kappas(method, 0.7, n)
    heights = [bar.get_height() for bar in ax.containers[0]]
    assert heights == pytest.approx(path_factors(method, 0.7, n)[:n])
    assert [bar.get_x() + bar.get_width() / 2 for bar in ax.containers[0]] == pytest.approx(range(1, n + 1))
    gauge_titles = [child.get_title() for child in ax.child_axes]
    expected = sum_kappa_squared(path_factors(method, 0.7, n)[:n])
    assert any(f"= {expected:.3g}," in title for title in gauge_titles)


def test_plot_kappas_block_output_shows_the_paths_and_the_bottleneck():
    ax = plot_kappas("block-output", 0.5, 4)
    assert [bar.get_height() for bar in ax.containers[0]] == pytest.approx([1, 0.5, 0.25, 0.125])
    assert "0.0625" in ax.get_legend().get_texts()[0].get_text()  # the bottleneck path: eta ** 4
    assert "1.33, inside" in ax.child_axes[0].get_title()  # not the 4 of unscaled skips


def test_plot_kappas_for_ls_says_it_is_learned():
    ax = plot_kappas("ls", 0.5, 4)
    assert not ax.containers
    assert any("learned" in text.get_text() for text in ax.texts)
    gates = [0.4, 0.5, 0.6, 0.55]
    ax = plot_kappas("ls-per-skip", 0.5, 4, learned=gates)
    assert [bar.get_height() for bar in ax.containers[0]] == pytest.approx(gates)
    assert "learned" in ax.get_title()


def test_plot_kappas_gauge_reports_inside_and_outside():
    inside = plot_kappas("cs", 0.5, 6).child_axes[0].get_title()
    outside = plot_kappas("none", 0.5, 6).child_axes[0].get_title()
    assert "1.33, inside" in inside and "= 6, outside" in outside


def test_plot_cs_band_draws_one_curve_per_n():
    ax = plot_cs_band((2, 6))
    labels = [line.get_label() for line in ax.get_lines()]
    assert "N = 2" in labels and "N = 6" in labels
    curve = next(line for line in ax.get_lines() if line.get_label() == "N = 6")
    x, y = curve.get_xdata(), curve.get_ydata()
    assert y[-1] == pytest.approx(cs_sum_kappa_squared(x[-1], 6))


def test_kappa_table_rows_and_sums():
    table = kappa_table(6, 0.5, ["none", "cs", ("cs", 0.8), "block-output"])
    assert list(table.index) == ["none", "cs, κ=0.5", "cs, κ=0.8", "block-output, η=0.5"]
    assert list(table.columns) == [f"skip {i}" for i in range(1, 7)] + ["B", "Σκ_i² (paths)"]
    assert table.loc["cs, κ=0.5", "skip 6"] == pytest.approx(0.03125)
    assert table.loc["cs, κ=0.5", "Σκ_i² (paths)"] == pytest.approx(cs_sum_kappa_squared(0.5, 6))
    assert table.loc["cs, κ=0.8", "Σκ_i² (paths)"] == pytest.approx(cs_sum_kappa_squared(0.8, 6))
    assert table.loc["none", "Σκ_i² (paths)"] == 6
    # block-output: the same skip-path factors as CS at eta = kappa, the bottleneck at eta ** 6
    block = table.loc["block-output, η=0.5"]
    assert list(block.iloc[:6]) == pytest.approx(list(table.loc["cs, κ=0.5"].iloc[:6]))
    assert block["B"] == pytest.approx(0.5**6) and table.loc["cs, κ=0.5", "B"] == 1.0
    assert block["Σκ_i² (paths)"] == pytest.approx(cs_sum_kappa_squared(0.5, 6))
    with pytest.raises(ValueError, match="learns kappa_i"):
        kappa_table(6, 0.5, ["ls"])


def test_measured_kappas_of_constant_and_learned_methods():
    torch.manual_seed(0)
    x, t = torch.randn(4, 1, 16, 16), torch.tensor([10.0, 200.0, 500.0, 900.0])
    assert measured_kappas(build_model("uvit-ci", 1, 16, "cs", 0.5), x, t) == pytest.approx([1.0, 0.5])
    gates = measured_kappas(build_model("unet-ci", 1, 16, "ls"), x, t)
    assert len(gates) == 2 and all(0 < g < 1 for g in gates)
    # the same value the model computes from its own skips inside forward
    model = build_model("uvit-ci", 1, 16, "ls-per-skip")
    seen = []
    model.scaling.register_forward_hook(lambda m, inp, out: seen.append((inp[2], (out[1] / inp[1]).mean().item())))
    got = measured_kappas(model, x, t)
    assert got == pytest.approx([v for _, v in sorted(seen)], rel=1e-4)


def test_measured_rms_kappas_square_to_the_mean_squared_gate():
    torch.manual_seed(0)
    x, t = torch.randn(4, 1, 16, 16), torch.tensor([10.0, 200.0, 500.0, 900.0])
    model = build_model("unet-ci", 1, 16, "ls-per-skip")
    with torch.no_grad():  # spread the gates of skip 1 so that E[k^2] and E[k]^2 differ clearly
        model.scaling.nets[0].fc2.bias.copy_(torch.linspace(-3.0, 3.0, 16))
    seen = {}
    model.scaling.register_forward_hook(lambda m, inp, out: seen.__setitem__(inp[2], out[1] / inp[1]))
    rms = measured_kappas(model, x, t, statistic="rms")
    mean = measured_kappas(model, x, t)
    assert [r * r for r in rms] == pytest.approx([seen[i].square().mean().item() for i in (1, 2)], rel=1e-4)
    assert [m * m for m in mean] == pytest.approx([seen[i].mean().item() ** 2 for i in (1, 2)], rel=1e-4)
    assert rms[0] ** 2 > mean[0] ** 2 + 0.05  # squaring the mean gate misses the variance
    assert measured_kappas(build_model("uvit-ci", 1, 16, "block-output", 0.5), x, t, "rms") == pytest.approx([1, 0.5])


def test_widget_builds_without_a_kernel_and_redraws_on_change():
    explorer = kappa_explorer("cs", 0.5, 6)
    assert isinstance(explorer, KappaExplorer)
    assert explorer.redraws == 1 and bytes(explorer.image.value).startswith(b"\x89PNG")
    first_image = bytes(explorer.image.value)
    assert [b.get_height() for b in explorer.ax.containers[0]] == pytest.approx(kappa_coefficients("cs", 0.5, 6))

    explorer.n_control.value = 9
    assert explorer.redraws == 2 and len(explorer.ax.containers[0]) == 9
    explorer.kappa_control.value = 0.8
    assert explorer.redraws == 3
    assert [b.get_height() for b in explorer.ax.containers[0]] == pytest.approx(kappa_coefficients("cs", 0.8, 9))
    assert bytes(explorer.image.value) != first_image
    assert f"{cs_sum_kappa_squared(0.8, 9):.4g}" in explorer.status.value
    explorer.method_control.value = "none"
    assert [b.get_height() for b in explorer.ax.containers[0]] == [1.0] * 9
    assert "outside" in explorer.status.value


def test_widget_shows_learned_gates_and_survives_a_failing_source():
    calls = []

    def learned(method, n):
        calls.append((method, n))
        return [0.5] * n

    explorer = kappa_explorer("ls", 0.5, 4, learned=learned)
    assert [b.get_height() for b in explorer.ax.containers[0]] == [0.5] * 4
    explorer.kappa_control.value = 0.7  # same (method, N): cached, not measured again
    assert calls == [("ls", 4)]

    def broken(method, n):
        raise RuntimeError("no data")

    explorer = kappa_explorer("ls", 0.5, 4, learned=broken)
    assert "no data" in explorer.status.value
    with pytest.raises(ValueError, match="learned must be a function"):
        kappa_explorer("ls", 0.5, 4, learned=[0.5] * 4)


def test_widget_static_figure_and_methods_menu():
    explorer = kappa_explorer("block-output", 0.5, 3)
    fig = explorer.static_figure()
    assert any("Static view" in text.get_text() for text in fig.texts)
    assert {value for _, value in explorer.method_control.options} == set(METHODS)


def test_cs_kappa_range_for_deep_networks_and_wide_bands():
    k_lo, k_hi = cs_kappa_range(2000, 1.22, 1e6)  # the search for the upper end must not overflow
    assert cs_sum_kappa_squared(k_hi, 2000) == pytest.approx(1e6, rel=1e-6)
    assert k_lo == pytest.approx(math.sqrt(1 - 1 / 1.22), rel=1e-6)  # the N -> infinity limit
