"""Tests of scalelong_edu.plotting: image grids, schedule and forward-process figures, live loss plot."""

import matplotlib
import matplotlib.pyplot as plt
import numpy as np
import pytest
import torch

from scalelong_edu import plotting
from scalelong_edu.diffusion import VPSDE, cosine_schedule, linear_schedule
from scalelong_edu.models import build_model
from scalelong_edu.diagrams import draw_unet
from scalelong_edu.plotting import (
    MAX_FIGURE_WIDTH,
    MIN_FONT_SIZE,
    LiveLossPlot,
    image_grid,
    legend_below,
    log_axis,
    plot_forward_process,
    plot_mean_band,
    plot_schedules,
    show_images,
)
from scalelong_edu.train import Callback, TrainConfig, Trainer
from scalelong_edu.widgets import plot_cs_band, plot_kappas


# -- image_grid / show_images -----------------------------------------------------------------------
def test_grid_shape_and_layout_grey():
    images = torch.full((5, 1, 4, 3), -1.0)
    grid = image_grid(images, nrow=3, padding=1)
    # 2 rows of 4 px + 3 padding rows; 3 columns of 3 px + 4 padding columns
    assert grid.shape == (2 * 4 + 3, 3 * 3 + 4)
    assert grid[1:5, 1:4].max() == 0.0  # the first image, -1 -> black
    assert grid[0].min() == 1.0 and grid[:, 0].min() == 1.0  # padding is white
    assert grid[6:10, 9:12].min() == 1.0  # the empty sixth cell is padding


def test_grid_maps_minus_one_to_one_onto_zero_to_one_and_clips():
    values = torch.tensor([-1.0, -0.5, 0.0, 0.5, 1.0, 3.0, -7.0]).view(1, 1, 1, 7)
    grid = image_grid(values, padding=0)
    np.testing.assert_allclose(grid, [[0.0, 0.25, 0.5, 0.75, 1.0, 1.0, 0.0]])


def test_grid_places_images_row_by_row():
    images = torch.stack([torch.full((1, 2, 2), v) for v in (-1.0, 0.0, 1.0, 0.5)])
    grid = image_grid(images, nrow=2, padding=0)
    np.testing.assert_allclose(grid, [[0, 0, 0.5, 0.5], [0, 0, 0.5, 0.5], [1, 1, 0.75, 0.75], [1, 1, 0.75, 0.75]])


def test_grid_colour_and_channelless_and_numpy_inputs():
    rgb = torch.zeros(4, 3, 5, 5)
    rgb[:, 0] = 1.0  # pure red
    grid = image_grid(rgb, padding=2)
    assert grid.shape == (2 * 5 + 3 * 2, 2 * 5 + 3 * 2, 3)  # default nrow = ceil(sqrt(4)) = 2
    np.testing.assert_allclose(grid[2, 2], [1.0, 0.5, 0.5])
    assert image_grid(np.zeros((3, 6, 6)), nrow=3, padding=0).shape == (6, 18)


def test_grid_is_torchvisions_make_grid_of_the_rescaled_batch():
    from torchvision.utils import make_grid

    images = torch.randn(5, 3, 4, 6, dtype=torch.float64) * 1.5
    expected = make_grid((images.clamp(-1, 1) + 1) / 2, nrow=2, padding=2, pad_value=0.3)
    np.testing.assert_allclose(image_grid(images, nrow=2, padding=2, pad_value=0.3), expected.permute(1, 2, 0))
    assert image_grid(torch.zeros(1, 1, 3, 5), padding=2).shape == (3, 5)  # one image: no frame


@pytest.mark.parametrize(
    "images, kwargs, match",
    [
        (torch.zeros(2, 2, 4, 4), {}, "1 \\(grey\\) or 3 \\(RGB\\) channels"),
        (torch.zeros(4, 4), {}, "batch"),
        (torch.zeros(0, 1, 4, 4), {}, "empty"),
        (torch.full((1, 1, 2, 2), float("nan")), {}, "NaN"),
        (torch.zeros(2, 1, 4, 4), {"nrow": 0}, "nrow"),
        (torch.zeros(2, 1, 4, 4), {"padding": -1}, "padding"),
        (torch.zeros(2, 1, 4, 4), {"pad_value": 2.0}, "pad_value"),
    ],
)
def test_grid_rejects_bad_input_clearly(images, kwargs, match):
    with pytest.raises(ValueError, match=match):
        image_grid(images, **kwargs)


def test_show_images_draws_the_grid_on_given_or_new_axes():
    images = torch.rand(6, 1, 4, 4) * 2 - 1
    _, ax = plt.subplots()
    assert show_images(images, nrow=3, title="samples", ax=ax) is ax
    assert ax.get_title() == "samples" and not ax.axison
    (im,) = ax.get_images()
    np.testing.assert_allclose(im.get_array(), image_grid(images, nrow=3))
    assert im.get_cmap().name == "gray" and im.get_clim() == (0.0, 1.0)
    new = show_images(torch.rand(2, 3, 4, 4))
    assert new.get_images()[0].get_array().shape[-1] == 3


# -- schedules and forward process ------------------------------------------------------------------
def test_plot_schedules_draws_signal_and_noise_per_schedule():
    linear = linear_schedule()
    ax = plot_schedules({"linear": linear, "cosine": cosine_schedule()})
    lines = ax.get_lines()
    assert len(lines) == 4
    np.testing.assert_allclose(lines[0].get_ydata(), linear.alpha_bars.sqrt().numpy())
    np.testing.assert_allclose(lines[1].get_ydata(), (1 - linear.alpha_bars).sqrt().numpy())
    with pytest.raises(TypeError, match="discretize"):
        plot_schedules({"sde": VPSDE()})
    with pytest.raises(ValueError, match="empty"):
        plot_schedules({})


def test_plot_forward_process_shows_q_sample_with_shared_noise():
    schedule = linear_schedule()
    images = torch.rand(2, 1, 4, 4) * 0.2  # stays within [-1, 1] at every t below
    noise = torch.randn(2, 1, 4, 4) * 0.1
    fig = plot_forward_process(images, schedule, [0, 500], noise=noise)
    axes = np.array(fig.axes).reshape(2, 2)
    abar = schedule.alpha_bars[500].float()
    expected = abar.sqrt() * images[1] + (1 - abar).sqrt() * noise[1]
    shown = axes[1, 1].get_images()[0].get_array()
    np.testing.assert_allclose(shown, (expected[0].numpy() + 1) / 2, atol=1e-6)
    assert axes[0, 1].get_title().startswith("t = 500")


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"ts": [0, 1000]}, "outside 0 .. 999"),
        ({"ts": []}, "empty"),
        ({"ts": [1], "noise": torch.zeros(1, 1, 4, 4)}, "noise shape"),
        ({"ts": [1], "images": torch.zeros(1, 4, 4)}, "\\(B, C, H, W\\)"),
    ],
)
def test_plot_forward_process_rejects_bad_input(kwargs, match):
    kwargs = {"images": torch.zeros(2, 1, 4, 4), "schedule": linear_schedule(), **kwargs}
    with pytest.raises(ValueError, match=match):
        plot_forward_process(**kwargs)


def test_plot_mean_band_draws_mean_and_quantile_band():
    x = np.arange(3)
    values = np.array([[0.0, 1.0, 2.0], [1.0, 1.0, 1.0], [5.0, 6.0, 7.0]])
    ax = plot_mean_band(x, torch.tensor(values), label="mean")
    np.testing.assert_allclose(ax.get_lines()[0].get_ydata(), [1.0, 1.0, 6.0])
    band = ax.collections[0].get_paths()[0].vertices
    assert band[:, 1].min() == pytest.approx(np.quantile(values[0], 0.05))
    with pytest.raises(ValueError, match="same K"):
        plot_mean_band(x, values[:2])
    with pytest.raises(ValueError, match="quantiles"):
        plot_mean_band(x, values, quantiles=(0.9, 0.1))


def test_log_axis_uses_plain_tick_labels():
    _, ax = plt.subplots()
    ax.plot([0, 1], [0.03, 1.2])
    assert log_axis(ax) is ax and ax.get_yscale() == "log"
    ax.figure.canvas.draw()  # the formatters decide what to label from the view limits
    major, minor = ax.yaxis.get_major_formatter(), ax.yaxis.get_minor_formatter()
    assert (major(0.1), major(1.0)) == ("0.1", "1")  # plain numbers, not 10^-1
    assert [minor(v) for v in (0.03, 0.04, 0.05, 0.2, 0.3, 0.6)] == ["", "", "0.05", "0.2", "", ""]
    log_axis(ax, "x")
    assert ax.get_xscale() == "log"
    with pytest.raises(ValueError, match="'x' or 'y'"):
        log_axis(ax, "z")


# -- LiveLossPlot -----------------------------------------------------------------------------------
def fake_history(n, start=1):
    return [{"step": s, "loss": 1.0 / s, "grad_norm": 1.0, "lr": 1e-3} for s in range(start, start + n)]


def test_live_plot_is_a_callback_and_displays_nothing_outside_ipython():
    live = LiveLossPlot(every=5)
    assert isinstance(live, Callback) and live.every == 5
    assert live.display is False  # pytest is not a Jupyter kernel


def test_live_plot_records_each_step_once_and_smooths():
    live = LiveLossPlot(every=2, smoothing=0.5, display=False)
    assert live.record(fake_history(3)) == 3
    assert live.record(fake_history(5)) == 2  # steps 1-3 are not recorded twice
    assert live.steps == [1, 2, 3, 4, 5]
    assert live.losses == [1.0, 0.5, 1 / 3, 0.25, 0.2]
    assert live.running[0] == pytest.approx(1.0)  # bias-corrected EMA starts at the first loss
    assert live.running[1] == pytest.approx((0.25 * 1.0 + 0.5 * 0.5) / 0.75)
    with pytest.raises(ValueError, match="'step' and 'loss'"):
        live.record([{"step": 9}])


def test_live_plot_smooths_over_a_fortieth_of_the_run_by_default():
    long_run = LiveLossPlot(total=400, display=False)
    long_run.record(fake_history(3))
    assert long_run.smoothing == pytest.approx(0.9)
    short_run = LiveLossPlot(total=30, display=False)
    short_run.record(fake_history(3))
    assert short_run.smoothing == 0.0 and short_run.running == short_run.losses


def test_live_plot_redraws_during_training_without_ipython():
    torch.manual_seed(0)
    model = build_model("unet-ci", 1, 8)
    live = LiveLossPlot(every=3, display=False)
    trainer = Trainer(model, torch.rand(16, 1, 8, 8) * 2 - 1, linear_schedule(),
                      TrainConfig(steps=7, batch_size=4, warmup=1), device="cpu", callbacks=[live], progress=False)
    trainer.fit()  # draws at steps 3 and 6, then at the end of fit for step 7
    assert live.n_draws == 3 and live.steps == list(range(1, 8))
    live.on_fit_end(trainer)  # nothing new: no redraw
    assert live.n_draws == 3
    ax = live.figure.axes[0]
    np.testing.assert_allclose(ax.get_lines()[0].get_ydata(), [h["loss"] for h in trainer.history])
    assert ax.get_xlim() == (0, 7) and "step 7 of 7" in ax.get_title()
    assert ax.get_yscale() == "log"


def test_live_plot_updates_one_display_handle_in_ipython(monkeypatch):
    calls = []

    class Handle:
        def update(self, obj):
            calls.append(("update", obj))

    def fake_display(obj, display_id=False):
        calls.append(("display", obj))
        assert display_id is True
        return Handle()

    monkeypatch.setattr("IPython.display.display", fake_display)
    live = LiveLossPlot(every=1, display=True)
    for n in (2, 4, 6):
        live.record(fake_history(n))
        live.draw()
    assert [c[0] for c in calls] == ["display", "update", "update"]
    assert all(obj is live.figure for _, obj in calls)


def test_live_plot_detects_a_kernel(monkeypatch):
    class Shell:
        kernel = object()

    monkeypatch.setattr("IPython.get_ipython", lambda: Shell())
    assert plotting._in_notebook() is True
    monkeypatch.setattr("IPython.get_ipython", lambda: object())  # terminal IPython: no kernel
    assert plotting._in_notebook() is False


@pytest.mark.parametrize(
    "kwargs, match",
    [({"every": 0}, "every"), ({"every": 2.5}, "every"), ({"smoothing": 1.0}, "smoothing"), ({"total": 0}, "total")],
)
def test_live_plot_rejects_bad_settings(kwargs, match):
    with pytest.raises(ValueError, match=match):
        LiveLossPlot(**kwargs)


def test_book_style_and_method_colours_are_kept():
    plotting.use_book_style()
    assert matplotlib.rcParams["figure.figsize"] == [7.0, 3.6]
    assert set(plotting.METHOD_COLORS) >= {"none", "sqrt2-cs", "cs", "ls"}


# -- one style for every figure ---------------------------------------------------------------------
def _book_figures():
    """The package's standard figures, drawn under the book style."""
    schedule = linear_schedule()
    yield plot_schedules({"linear": schedule, "cosine": cosine_schedule()}).figure
    yield plot_forward_process(torch.zeros(2, 1, 4, 4), schedule, range(0, 1000, 125))
    yield plot_kappas("block-output", 0.5, 6).figure
    yield plot_kappas("ls", 0.5, 6, learned=[0.5] * 6).figure
    yield plot_cs_band().figure
    yield draw_unet(6, [1, 0.5, 0.25, 0.125, 0.0625, 0.03], encoder_notes=["32 × 16 × 16"] * 6).figure
    live = LiveLossPlot(display=False, total=10)
    live.record(fake_history(10))
    yield live.draw()


def test_every_figure_fits_the_page_and_has_no_small_text():
    with matplotlib.rc_context():
        plotting.use_book_style()
        for fig in _book_figures():
            fig.canvas.draw()
            assert fig.get_figwidth() <= MAX_FIGURE_WIDTH + 1e-9
            small = [(t.get_text(), t.get_fontsize()) for t in fig.findobj(matplotlib.text.Text)
                     if t.get_visible() and t.get_text().strip() and t.get_fontsize() < MIN_FONT_SIZE]
            assert not small, f"text below {MIN_FONT_SIZE} pt: {small}"


def test_legend_below_sits_under_the_tick_and_axis_labels():
    with matplotlib.rc_context():
        plotting.use_book_style()
        ax = plot_schedules({"linear": linear_schedule(), "cosine": cosine_schedule()})
        ax.figure.canvas.draw()
        renderer = ax.figure.canvas.get_renderer()
        legend = ax.get_legend().get_window_extent(renderer)
        assert legend.y1 < ax.xaxis.label.get_window_extent(renderer).y0
        assert legend.y1 < ax.get_window_extent(renderer).y0
        assert len(ax.get_legend().get_texts()) == 4
        _, other = plt.subplots()
        other.plot([0, 1], label="a")
        assert legend_below(other, ncol=1, title="t").get_title().get_text() == "t"


def test_run_labels_read_as_the_text_writes_them():
    assert plotting.pretty("1/sqrt(2)-CS") == "1/√2-CS"
    assert plotting.pretty("CS (kappa=0.5), N=8, lr x16") == "CS (κ = 0.5), N = 8, lr ×16"
    assert plotting.pretty("block-output (eta=0.3)") == "block-output (η = 0.3)"
    math = r"$\kappa_i$ and $\eta^{i-1}$, beta, LS per skip"
    assert plotting.pretty(math) == math
    fig, ax = plt.subplots()
    ax.plot([0, 1], label="CS (kappa=0.5)")
    legend = plotting.legend_below(ax)
    assert [t.get_text() for t in legend.get_texts()] == ["CS (κ = 0.5)"]
    plt.close(fig)


def test_light_png_draws_the_same_picture_in_256_colours_and_a_fraction_of_the_bytes():
    import io

    from IPython.core.pylabtools import print_figure
    from PIL import Image

    fig, ax = plt.subplots()
    for seed in range(30):  # many thin translucent lines: the seed lines of the book's figures
        ax.plot(np.random.default_rng(seed).normal(size=200).cumsum(), lw=0.6, alpha=0.35)
    full = print_figure(fig, "png", bbox_inches="tight")
    light = plotting.light_png(fig)
    before, after = Image.open(io.BytesIO(full)), Image.open(io.BytesIO(light))
    assert after.mode == "P" and after.size == before.size and len(after.getcolors(256)) <= 256
    assert len(light) < len(full) / 2
    drawn = np.asarray(before.convert("RGB"), dtype=float)
    shown = np.asarray(after.convert("RGB"), dtype=float)
    assert np.abs(drawn - shown).mean() < 2  # within a couple of grey levels on average
    plt.close(fig)
