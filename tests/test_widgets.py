"""Tests of scalelong_edu.widgets and .theory: coefficients, the sum of kappa_i^2 and its band, figures, the widget."""

import math

import pytest
import torch

from scalelong_edu.diagrams import init_norms, skip_features
from scalelong_edu.models import build_model
from scalelong_edu.scaling import METHODS, path_factors
from scalelong_edu.theory import SUM_KAPPA2_BAND, cs_kappa_range, cs_sum_kappa_squared, sum_kappa_squared
from scalelong_edu.widgets import (
    FreshNorms,
    KappaExplorer,
    kappa_coefficients,
    kappa_explorer,
    kappa_table,
    measured_kappas,
    norms_batch,
    plot_cs_band,
    plot_hidden_norms,
    plot_kappas,
    plot_sum_kappa2,
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
    assert list(table.index) == ["none", "CS, κ = 0.5", "CS, κ = 0.8", "block-output, η = 0.5"]
    assert list(table.columns) == [f"skip {i}" for i in range(1, 7)] + ["B", "Σκ_i² (paths)"]
    assert table.loc["CS, κ = 0.5", "skip 6"] == pytest.approx(0.03125)
    assert table.loc["CS, κ = 0.5", "Σκ_i² (paths)"] == pytest.approx(cs_sum_kappa_squared(0.5, 6))
    assert table.loc["CS, κ = 0.8", "Σκ_i² (paths)"] == pytest.approx(cs_sum_kappa_squared(0.8, 6))
    assert table.loc["none", "Σκ_i² (paths)"] == 6
    # block-output: the same skip-path factors as CS at eta = kappa, the bottleneck at eta ** 6
    block = table.loc["block-output, η = 0.5"]
    assert list(block.iloc[:6]) == pytest.approx(list(table.loc["CS, κ = 0.5"].iloc[:6]))
    assert block["B"] == pytest.approx(0.5**6) and table.loc["CS, κ = 0.5", "B"] == 1.0
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


# --- panel (c): hidden-feature norms of a freshly initialised U-ViT ---------------------------


@pytest.fixture(scope="module")
def tiny_batch():
    """Four random images in [-1, 1] at 16 px and model times spread over the schedule."""
    g = torch.Generator().manual_seed(0)
    return torch.rand(4, 1, 16, 16, generator=g) * 2 - 1, torch.tensor([0.0, 333.0, 666.0, 999.0])


@pytest.fixture(scope="module")
def book_norms():
    """The explorer's default FreshNorms: 16 test digits, t spread over the schedule, uvit-ci, seed 0."""
    return FreshNorms()


def _decoder_sq_norms(model, x, t):
    """Direct computation: batch mean of ||b_i(.)||^2 / batch mean of ||x||^2, i = 1 first."""
    out = {}
    handles = [block.register_forward_hook(lambda m, inp, o, i=i: out.__setitem__(i, o.detach()))
               for i, block in enumerate(model.decoder_blocks, start=1)]
    with torch.no_grad():
        model(x, t)
    for handle in handles:
        handle.remove()
    x_sq = x.flatten(1).square().sum(1).mean()
    return [(out[i].flatten(1).square().sum(1).mean() / x_sq).item() for i in sorted(out)]


@pytest.mark.parametrize("method, kappa, n", [("cs", 0.5, 3), ("cs", 0.8, 2), ("none", 0.5, 3),
                                              ("block-output", 0.5, 2), ("ls-per-skip", 0.5, 2)])
def test_fresh_norms_equal_a_direct_computation(tiny_batch, method, kappa, n):
    x, t = tiny_batch
    fresh = FreshNorms(x, t, seed=3)
    fresh("none", 0.5, n)  # the constant methods then reuse this backbone with their scaling swapped in
    values = fresh(method, kappa, n)
    torch.manual_seed(3)
    model = build_model("uvit-ci", 1, 16, method, kappa, depth=2 * n).eval()
    assert values == pytest.approx(_decoder_sq_norms(model, x, t), rel=1e-5)
    table = init_norms("uvit-ci", x, t, [method], kappa=kappa, seed=3, depth=2 * n)
    assert values == pytest.approx([table.loc[method, f"hidden_sq_{i}"] for i in range(1, n + 1)], rel=1e-6)
    # the same backbone: the encoder outputs a_i(x) (skip_features) do not depend on the method
    for got, want in zip(skip_features(fresh.model(method, kappa, n), x, t), skip_features(model, x, t)):
        assert torch.allclose(got, want)


def test_fresh_norms_are_seeded_and_leave_the_global_random_state_alone(tiny_batch):
    x, t = tiny_batch
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    first = FreshNorms(x, t)("cs", 0.5, 2)
    assert torch.equal(torch.rand(3), expected)
    assert FreshNorms(x, t)("cs", 0.5, 2) == first
    assert FreshNorms(x, t, seed=1)("cs", 0.5, 2) != first


def test_norms_batch_is_fixed_and_stratified_over_time():
    x_t, t = norms_batch(n=8)
    again, _ = norms_batch(n=8)
    assert x_t.shape == (8, 1, 16, 16) and torch.equal(x_t, again)
    assert t.tolist() == sorted(t.tolist()) and t[0] == 0 and t[-1] == 999


@pytest.mark.parametrize("n", [1, 2, 4, 8])
@pytest.mark.parametrize("kappa", [0.5, 0.8])
def test_cs_shrinks_the_hidden_norms_of_skips_two_and_deeper_at_init(book_norms, n, kappa):
    # checked, not assumed: on the book's batch this held for seeds 0-5, N = 1..16, kappa = 0.3..0.9;
    # the outermost feature h_1 (kappa_1 = 1) stays within a few per cent of none's
    cs, none = book_norms("cs", kappa, n), book_norms("none", kappa, n)
    assert all(c < z for c, z in zip(cs[1:], none[1:]))
    assert cs[0] == pytest.approx(none[0], rel=0.05)


def test_explorer_norms_panel_redraws_with_n_points(tiny_batch):
    fresh = FreshNorms(*tiny_batch)
    explorer = kappa_explorer("cs", 0.5, 3, norms=fresh)
    assert len(explorer.axes) == 3 and explorer.ax is explorer.axes[0]
    panel = explorer.axes[2]

    def line(gid):
        return next((ln for ln in explorer.axes[2].get_lines() if ln.get_gid() == gid), None)

    assert list(line("norms_method").get_ydata()) == pytest.approx(fresh("cs", 0.5, 3))
    assert list(line("norms_none").get_ydata()) == pytest.approx(fresh("none", 0.5, 3))
    assert "‖h" in explorer.status.value
    assert r"\|h_i\|^2 / \|x_t\|^2" in panel.get_ylabel() and "decoder block" in panel.get_xlabel()

    explorer.n_control.value = 5
    assert explorer.redraws == 2 and explorer.axes[2] is not panel
    assert list(line("norms_method").get_xdata()) == [1, 2, 3, 4, 5]
    assert list(line("norms_method").get_ydata()) == pytest.approx(fresh("cs", 0.5, 5))
    assert len(line("norms_none").get_ydata()) == 5 and len(explorer.ax.containers[0]) == 5
    current = next(ln for ln in explorer.axes[1].get_lines() if ln.get_gid() == "current")
    assert current.get_ydata()[0] == pytest.approx(cs_sum_kappa_squared(0.5, 5))
    assert f"{cs_sum_kappa_squared(0.5, 5):.3g}, inside" in explorer.axes[1].get_title()

    explorer.kappa_control.value = 0.8
    assert list(line("norms_method").get_ydata()) == pytest.approx(fresh("cs", 0.8, 5))
    explorer.method_control.value = "none"  # no reference line against itself
    assert line("norms_none") is None and len(line("norms_method").get_ydata()) == 5
    explorer.method_control.value = "ls"  # learned gates: panel (c) still measures a fresh model
    assert list(line("norms_method").get_ydata()) == pytest.approx(fresh("ls", 0.8, 5))
    assert "could not draw" not in explorer.status.value


def test_explorer_static_figure_has_three_panels_and_is_reproducible(tiny_batch):
    explorer = kappa_explorer("cs", 0.5, 3, norms=FreshNorms(*tiny_batch))
    fig = explorer.static_figure()
    assert len(fig.axes) == 3
    assert [ax.get_title()[:3] for ax in fig.axes] == ["(a)", "(b)", "(c)"]
    note = next(text for text in fig.texts if "Static view" in text.get_text())
    fig.draw_without_rendering()
    assert note.get_window_extent().y1 <= fig.axes[2].get_tightbbox().y0 + 1  # below panel (c)'s legend
    again = kappa_explorer("cs", 0.5, 3, norms=FreshNorms(*tiny_batch))
    assert bytes(again.image.value) == bytes(explorer.image.value)  # seeded: the same picture
    assert len(kappa_explorer("cs", 0.5, 3).static_figure().axes) == 1  # without norms: as before


def test_plot_sum_kappa2_curve_and_current_value():
    ax = plot_sum_kappa2("cs", 0.5, 6)
    curve = next(ln for ln in ax.get_lines() if ln.get_gid() != "current")
    x, y = curve.get_xdata(), curve.get_ydata()
    assert y[-1] == pytest.approx(cs_sum_kappa_squared(x[-1], 6))
    assert "1.33, inside" in ax.get_title()
    flat = plot_sum_kappa2("none", 0.5, 6)
    assert set(next(ln for ln in flat.get_lines() if ln.get_gid() != "current").get_ydata()) == {6.0}
    assert "= 6, outside" in flat.get_title()
    assert "learned" in plot_sum_kappa2("ls", 0.5, 4).get_title()


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda f: f("cs", 0.5, 0), "n_skips must be >= 1"),
        (lambda f: f("cs", 0.0, 3), "kappa must be a finite number > 0"),
        (lambda f: f("cs", -0.5, 3), "kappa must be a finite number > 0"),
        (lambda f: f("cosine", 0.5, 3), "unknown skip-scaling method"),
        (lambda f: kappa_explorer("cs", 0.5, 0, norms=f), "n_skips must be >= 1"),
        (lambda f: kappa_explorer("cs", 0.0, 3, norms=f), "kappa must be"),
        (lambda f: kappa_explorer("cs", 0.5, 3, norms="yes"), "norms must be True, False or a FreshNorms"),
        (lambda f: FreshNorms(f.x_t), "pass both x_t and t"),
        (lambda f: FreshNorms(f.x_t[0], f.t), "x_t must be a batch of images"),
        (lambda f: FreshNorms(f.x_t, f.t[:2]), "one model time per image"),
        (lambda f: FreshNorms(f.x_t, f.t, preset="unet-ci"), "U-ViT preset"),
        (lambda f: plot_hidden_norms([], "cs"), "norms is empty"),
        (lambda f: plot_hidden_norms([0.1, 0.2], "cs", reference=[0.1]), "reference must hold 2"),
        (lambda f: plot_hidden_norms([0.1, -1.0], "cs"), "finite numbers > 0"),
        (lambda f: plot_sum_kappa2("cs", 0.5, 0), "n_skips must be >= 1"),
        (lambda f: plot_sum_kappa2("cs", 0.0, 3), "kappa must be"),
    ],
)
def test_norms_panel_bad_inputs_raise_clear_errors(tiny_batch, call, match):
    with pytest.raises(ValueError, match=match):
        call(FreshNorms(*tiny_batch))
