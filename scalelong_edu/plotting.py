"""One visual style for every figure of the book, and the figures the chapters share.

* :func:`use_book_style`, :data:`METHOD_COLORS` (:func:`method_color`), :func:`legend_below` -- the look every chapter
  uses: one style, text no smaller than :data:`MIN_FONT_SIZE`, legends that cover no curve;
* :func:`pretty` -- a run label as a reader sees it (``CS (kappa=0.5)`` -> ``CS (κ = 0.5)``);
* :func:`image_grid`, :func:`show_images` -- a batch of images in [-1, 1] as one tiled picture
  (``torchvision.utils.make_grid`` underneath);
* :func:`plot_forward_process` -- images noised to several ``t`` by ``q(x_t | x_0)``;
* :func:`plot_schedules` -- ``sqrt(abar_t)`` (signal) and ``sqrt(1 - abar_t)`` (noise) over ``t``;
* :func:`plot_mean_band` -- a mean curve with a quantile band, for per-``t`` statistics;
* :func:`log_axis` -- a log-scale axis labelled with plain numbers (0.05, not 5e-02);
* :class:`LiveLossPlot` -- a :class:`~scalelong_edu.train.Trainer` callback that redraws the
  training loss in place while a notebook cell runs, and leaves the final figure as the output.
"""

from __future__ import annotations

import math
import re
from typing import TYPE_CHECKING, Any, Mapping, Sequence

import matplotlib as mpl
import matplotlib.ticker as mticker
import matplotlib.transforms as mtransforms
import numpy as np
import seaborn as sns
import torch
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.legend import Legend

from .diffusion import DiscreteSchedule, q_sample
from .train import Callback

if TYPE_CHECKING:
    from .train import Trainer

METHOD_COLORS = {
    "none": "#4d4d4d",
    "sqrt2-cs": "#1f77b4",
    "cs": "#d62728",
    "ls": "#2ca02c",
    "ls-per-skip": "#17becf",
    "block-output": "#9467bd",
}
"""A fixed colour per skip-scaling method, so a method looks the same in every chapter."""


def method_color(method: str) -> str:
    """:data:`METHOD_COLORS` of ``method``; dark grey for a method without a colour of its own."""
    return METHOD_COLORS.get(method, "#333333")


SCHEDULE_COLORS = {"linear": "#1f77b4", "cosine": "#ff7f0e", "vpsde": "#2ca02c"}
"""Colours of the noise schedules in :func:`plot_schedules` (others get seaborn's palette)."""


MAX_FIGURE_WIDTH = 7.0
"""Inches: the widest figure the book draws, about the text column at 100 dpi."""

MIN_FONT_SIZE = 9.0
"""Points: no text in a book figure is smaller. A 7-inch figure shrinks to about half on a 390 px
phone, so 9 pt (12.5 px at 100 dpi) is the least that stays readable there; the style's ``small``
(0.833 x 11 pt) is the smallest relative size the package uses."""

BOOK_RC = {
    "figure.figsize": (MAX_FIGURE_WIDTH, 3.6), "figure.dpi": 100, "savefig.dpi": 150, "savefig.bbox": "tight",
    "font.size": 11, "axes.titlesize": 12, "axes.labelsize": 11, "xtick.labelsize": 10, "ytick.labelsize": 10,
    "legend.fontsize": 10, "legend.title_fontsize": 10, "figure.titlesize": 12, "axes.titleweight": "bold",
    "legend.loc": "best", "legend.frameon": True, "legend.framealpha": 0.85, "legend.edgecolor": "0.8",
}
"""The rcParams of :func:`use_book_style`: sizes that stay readable on a phone, and legends with a
light frame so that one placed over data (``loc="best"``) still lets the curves show through."""


def use_book_style() -> None:
    """Seaborn's ``whitegrid`` with the book's font sizes (none below :data:`MIN_FONT_SIZE`), a figure
    width of at most :data:`MAX_FIGURE_WIDTH` and framed legends: one style for every figure."""
    sns.set_theme(style="whitegrid", context="notebook", rc=BOOK_RC)


def light_png(fig: Figure, colors: int = 256) -> bytes:
    """``fig`` as the PNG a notebook shows (tight box, the figure's dpi) reduced to ``colors``
    colours (Pillow's octree, no dithering). Lines, text and images look the same, and the file is
    3-4 times smaller: the thin, translucent seed lines of the book's figures otherwise make each
    PNG hold tens of thousands of colours, and the pages heavy on a phone."""
    import io

    from IPython.core.pylabtools import print_figure
    from PIL import Image

    drawn = Image.open(io.BytesIO(print_figure(fig, "png", bbox_inches="tight"))).convert("RGBA")
    flat = Image.alpha_composite(Image.new("RGBA", drawn.size, "white"), drawn).convert("RGB")
    out = io.BytesIO()
    flat.quantize(colors, method=Image.Quantize.FASTOCTREE, dither=Image.Dither.NONE).save(out, "png", optimize=True)
    return out.getvalue()


PRETTY = ((r"1/sqrt\(2\)", "1/√2"), (r"(?<!\\)\bkappa\s*=\s*", "κ = "), (r"(?<!\\)\bkappa\b", "κ"),
          (r"(?<!\\)\beta\s*=\s*", "η = "), (r"(?<!\\)\beta\b", "η"), (r"\bN\s*=\s*", "N = "),
          (r"\blr x(?=\d)", "lr ×"))
"""What :func:`pretty` rewrites: the ASCII of the run labels (which key the cached results, so
they stay as they are) into the symbols of the text; mathtext such as ``$\\kappa$`` is left alone."""


def pretty(label: str) -> str:
    """``label`` as figures and tables print it: ``1/sqrt(2)-CS`` -> ``1/√2-CS``, ``CS (kappa=0.5)``
    -> ``CS (κ = 0.5)``, ``eta=0.3`` -> ``η = 0.3``, ``N=8`` -> ``N = 8``, ``lr x16`` -> ``lr ×16``."""
    for pattern, symbol in PRETTY:
        label = re.sub(pattern, symbol, label)
    return label


def legend_below(ax: Axes, ncol: int = 2, **kwargs: Any) -> Legend:
    """A legend centred under ``ax``, below its tick labels and axis label, so it covers no curve;
    its entries go through :func:`pretty`.

    The offset is computed in points from the current tick and label sizes, so it holds at any
    figure size; a figure saved with ``bbox_inches="tight"`` (Jupyter's default) keeps it in view.
    ``kwargs`` go to :meth:`~matplotlib.axes.Axes.legend`.
    """
    rc = mpl.rcParams
    tick = mpl.font_manager.FontProperties(size=rc["xtick.labelsize"]).get_size_in_points()
    label = mpl.font_manager.FontProperties(size=rc["axes.labelsize"]).get_size_in_points()
    drop = rc["xtick.major.size"] + rc["xtick.major.pad"] + 1.2 * tick + rc["axes.labelpad"] + 1.2 * label + 4
    below = ax.transAxes + mtransforms.ScaledTranslation(0, -drop / 72, ax.figure.dpi_scale_trans)
    kwargs = {"loc": "upper center", "bbox_to_anchor": (0.5, 0.0), "bbox_transform": below, "ncol": ncol,
              "frameon": False, **kwargs}
    if "handles" not in kwargs:
        handles, names = ax.get_legend_handles_labels()
        kwargs.update(handles=handles, labels=[pretty(name) for name in names])
    return ax.legend(**kwargs)


# -- image grids ---------------------------------------------------------------------------------
def _as_image_batch(images: Any) -> torch.Tensor:
    """``images`` as a float64 CPU tensor (B, C, H, W) with C in {1, 3}; clear errors otherwise."""
    if isinstance(images, torch.Tensor):
        batch = images.detach().to("cpu", torch.float64)
    else:
        batch = torch.as_tensor(np.asarray(images, dtype=np.float64))
    if batch.dim() == 3:  # (B, H, W): grey images without a channel axis
        batch = batch[:, None]
    if batch.dim() != 4:
        raise ValueError(
            f"images must be a batch (B, C, H, W) or (B, H, W), got shape {tuple(batch.shape)}; "
            "for a single image use images[None]"
        )
    if batch.shape[0] == 0:
        raise ValueError("images is an empty batch; pass at least one image")
    if batch.shape[1] not in (1, 3):
        raise ValueError(
            f"images must have 1 (grey) or 3 (RGB) channels, got {batch.shape[1]} in shape {tuple(batch.shape)}"
        )
    if not torch.isfinite(batch).all():
        raise ValueError("images contain NaN or infinite values; did training diverge? Check the loss first")
    return batch


def image_grid(images: Any, nrow: int | None = None, padding: int = 1, pad_value: float = 1.0) -> np.ndarray:
    """Tile a batch of images in [-1, 1] into one picture with values in [0, 1].

    A thin layer over ``torchvision.utils.make_grid``: pixel value ``v`` maps to ``(v + 1) / 2``;
    values outside [-1, 1] (e.g. noisy ``x_t``) are clipped. Images fill the grid row by row,
    ``nrow`` to a row; empty cells of the last row and the ``padding`` pixels between and around
    images get ``pad_value``. A batch of one image comes back without padding (torchvision's rule).

    Args:
        images: a tensor or array (B, C, H, W) with C = 1 or 3, or (B, H, W) for grey images.
        nrow: images per row; default ``ceil(sqrt(B))``, a near-square grid.
        padding: pixels between neighbouring images and around the grid, >= 0.
        pad_value: colour of the padding in [0, 1] (1 = white).

    Returns:
        float64 array (rows * (H + p) + p, nrow * (W + p) + p) for grey images, with a trailing
        axis of 3 for colour images.
    """
    batch = _as_image_batch(images)
    if nrow is None:
        nrow = math.ceil(math.sqrt(batch.shape[0]))
    if isinstance(nrow, bool) or not isinstance(nrow, (int, np.integer)) or nrow < 1:
        raise ValueError(f"nrow must be a positive int (images per row), got {nrow!r}")
    if isinstance(padding, bool) or not isinstance(padding, (int, np.integer)) or padding < 0:
        raise ValueError(f"padding must be an int >= 0, got {padding!r}")
    if not 0.0 <= pad_value <= 1.0:
        raise ValueError(f"pad_value must lie in [0, 1], got {pad_value}")
    from torchvision.utils import make_grid  # imported here: torchvision takes seconds to import

    grid = make_grid(batch, nrow=int(nrow), padding=int(padding), normalize=True, value_range=(-1.0, 1.0),
                     pad_value=pad_value).numpy()
    return grid[0] if batch.shape[1] == 1 else grid.transpose(1, 2, 0)


def show_images(
    images: Any,
    nrow: int | None = None,
    title: str | None = None,
    ax: Axes | None = None,
    padding: int = 1,
) -> Axes:
    """Draw a batch of images in [-1, 1] as one grid (see :func:`image_grid`), without axes.

    Grey images use a grey colour map with -1 black and +1 white.

    Args:
        images: (B, C, H, W) with C = 1 or 3, or (B, H, W); a tensor (any device) or an array.
        nrow: images per row; default a near-square grid.
        title: axes title.
        ax: axes to draw on; default a new figure sized to the grid.

    Returns:
        The axes drawn on.
    """
    grid = image_grid(images, nrow=nrow, padding=padding)
    if ax is None:
        import matplotlib.pyplot as plt

        height, width = grid.shape[:2]
        scale = 4.0 / max(height, width)
        _, ax = plt.subplots(figsize=(max(width * scale, 1.5), max(height * scale, 1.5) + (0.3 if title else 0)))
    if grid.ndim == 2:
        ax.imshow(grid, cmap="gray", vmin=0.0, vmax=1.0, interpolation="nearest")
    else:
        ax.imshow(grid, interpolation="nearest")
    ax.set_axis_off()
    if title:
        ax.set_title(title)
    return ax


# -- the forward process and schedules ------------------------------------------------------------
def plot_forward_process(
    images: torch.Tensor,
    schedule: DiscreteSchedule,
    ts: Sequence[int],
    noise: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
) -> Figure:
    """Noise each image to every ``t`` in ``ts`` with ``q(x_t | x_0)``; one row per image.

    Each image uses one noise draw ``eps`` for all its columns, so the same noise pattern fades in
    as ``t`` grows: column ``t`` shows ``sqrt(abar_t) x_0 + sqrt(1 - abar_t) eps`` (clipped to
    [-1, 1] for display).

    Args:
        images: clean images (B, C, H, W) in [-1, 1], B >= 1 (a few rows read best).
        schedule: a discrete schedule; every ``t`` must lie in ``0 .. T-1``.
        ts: the time steps of the columns.
        noise: ``eps`` of the same shape as ``images``; drawn from ``generator`` when omitted.

    Returns:
        The figure.
    """
    import matplotlib.pyplot as plt

    if not isinstance(images, torch.Tensor) or images.dim() != 4:
        raise ValueError(f"images must be a tensor (B, C, H, W), got {getattr(images, 'shape', type(images))}")
    ts = [int(t) for t in ts]
    if not ts:
        raise ValueError("ts is empty; pass the time steps to show, e.g. [0, 100, 500, 999]")
    bad = [t for t in ts if not 0 <= t < schedule.T]
    if bad:
        raise ValueError(f"time steps {bad} lie outside 0 .. {schedule.T - 1} of this schedule")
    images = images.detach().cpu().float()
    if noise is None:
        noise = torch.randn(images.shape, generator=generator)
    if noise.shape != images.shape:
        raise ValueError(f"noise shape {tuple(noise.shape)} differs from images shape {tuple(images.shape)}")
    B = images.shape[0]
    side = min(1.25, MAX_FIGURE_WIDTH / len(ts))  # inches per image, the figure no wider than the page
    fig, axes = plt.subplots(B, len(ts), figsize=(side * len(ts), side * B + 0.5), squeeze=False)
    for j, t in enumerate(ts):
        x_t = q_sample(images, torch.full((B,), t), schedule, noise=noise.float())
        for i in range(B):
            show_images(x_t[i : i + 1], ax=axes[i, j], padding=0)
        abar = float(schedule.alpha_bars[t])
        axes[0, j].set_title(f"t = {t}\n" + r"$\sqrt{\bar\alpha_t}$" + f" = {math.sqrt(abar):.2f}",
                             fontsize="small", fontweight="normal")
    fig.tight_layout()
    return fig


def plot_schedules(schedules: Mapping[str, DiscreteSchedule], ax: Axes | None = None) -> Axes:
    """``sqrt(abar_t)`` (solid: how much signal is left) and ``sqrt(1 - abar_t)`` (dashed: noise).

    Args:
        schedules: legend name -> schedule, e.g. ``{"linear": linear_schedule()}``.
        ax: axes to draw on; default a new figure.

    Returns:
        The axes drawn on.
    """
    if not schedules:
        raise ValueError("schedules is empty; pass e.g. {'linear': linear_schedule()}")
    if ax is None:
        import matplotlib.pyplot as plt

        _, ax = plt.subplots()
    palette = sns.color_palette(n_colors=max(len(schedules), 3))
    for k, (name, schedule) in enumerate(schedules.items()):
        if not isinstance(schedule, DiscreteSchedule):
            raise TypeError(f"schedule {name!r} is a {type(schedule).__name__}, not a DiscreteSchedule; "
                            "for a VPSDE pass vpsde.discretize(1000)")
        abar = schedule.alpha_bars.numpy()
        t = np.arange(schedule.T)
        color = SCHEDULE_COLORS.get(name, palette[k])
        ax.plot(t, np.sqrt(abar), color=color, lw=2, label=rf"{name}: $\sqrt{{\bar\alpha_t}}$ (signal)")
        ax.plot(t, np.sqrt(1 - abar), color=color, lw=2, ls="--", label=rf"{name}: $\sqrt{{1-\bar\alpha_t}}$ (noise)")
    ax.set_xlabel("time step $t$")
    ax.set_ylabel("coefficient")
    ax.set_ylim(-0.02, 1.02)
    legend_below(ax, ncol=2)
    return ax


def plot_mean_band(
    x: Any,
    values: Any,
    ax: Axes | None = None,
    label: str | None = None,
    quantiles: tuple[float, float] = (0.05, 0.95),
    color: Any = None,
) -> Axes:
    """The mean of ``values`` at each ``x`` as a line, with a shaded band between two quantiles.

    Args:
        x: positions (K,).
        values: samples (K, n): ``values[k]`` are the n measurements at ``x[k]``.
        ax: axes to draw on; default a new figure.
        label: legend entry of the mean line (the band is labelled with its quantiles).
        quantiles: lower and upper quantile of the band, 0 <= lo < hi <= 1.
        color: any matplotlib colour.

    Returns:
        The axes drawn on.
    """
    x = np.asarray(x.detach().cpu() if isinstance(x, torch.Tensor) else x, dtype=np.float64)
    values = np.asarray(values.detach().cpu() if isinstance(values, torch.Tensor) else values, dtype=np.float64)
    if x.ndim != 1 or values.ndim != 2 or values.shape[0] != x.shape[0]:
        raise ValueError(f"need x (K,) and values (K, n) with the same K, got {x.shape} and {values.shape}")
    lo, hi = quantiles
    if not 0 <= lo < hi <= 1:
        raise ValueError(f"quantiles must satisfy 0 <= lo < hi <= 1, got {quantiles}")
    if ax is None:
        import matplotlib.pyplot as plt

        _, ax = plt.subplots()
    (line,) = ax.plot(x, values.mean(axis=1), color=color, lw=2, label=label)
    ax.fill_between(x, np.quantile(values, lo, axis=1), np.quantile(values, hi, axis=1), color=line.get_color(),
                    alpha=0.25, lw=0, label=f"{lo:.0%}-{hi:.0%} of samples")
    return ax


class _PlainLogFormatter(mticker.LogFormatter):
    """Log ticks labelled as plain numbers (``%g``); between decades only 2 and 5 when space is short."""

    def set_locs(self, locs=None) -> None:
        super().set_locs(locs)
        if self._sublabels is not None and 1 < len(self._sublabels) < self._base:
            self._sublabels = {1, 2, 5}  # matplotlib's subset (1, 2, 3, 4, 6) crowds a small figure

    def _num_to_string(self, x: float, vmin: float, vmax: float) -> str:
        return f"{x:g}"


def log_axis(ax: Axes, axis: str = "y") -> Axes:
    """Put ``axis`` (``"x"`` or ``"y"``) of ``ax`` on a log scale with tick labels such as 0.05 and 0.2.

    Between the powers of ten, ticks at 2 and 5 are labelled as well when the axis spans no
    more than about two decades (every tick below about half a decade), so a loss falling from
    0.9 to 0.04 still gets enough labels to be read off.
    """
    if axis not in ("x", "y"):
        raise ValueError(f"axis must be 'x' or 'y', got {axis!r}")
    getattr(ax, f"set_{axis}scale")("log")
    target = ax.yaxis if axis == "y" else ax.xaxis
    target.set_major_formatter(_PlainLogFormatter(labelOnlyBase=False))
    target.set_minor_formatter(_PlainLogFormatter(labelOnlyBase=False, minor_thresholds=(2, 0.6)))
    return ax


# -- live loss plot ---------------------------------------------------------------------------------
def _in_notebook() -> bool:
    """True inside a Jupyter kernel (where display handles update in place), False elsewhere."""
    try:
        from IPython import get_ipython
    except ImportError:  # pragma: no cover - IPython is a dependency of every notebook setup
        return False
    shell = get_ipython()
    return shell is not None and getattr(shell, "kernel", None) is not None


class LiveLossPlot(Callback):
    """Redraw the training loss in place while :meth:`Trainer.fit` runs in a notebook cell.

    Every ``every`` steps it reads the new entries of ``trainer.history`` (so no step is missed)
    and redraws one figure: the loss of every step (thin) and its running mean, a bias-corrected
    exponential moving average (bold), on a log scale. In a Jupyter kernel the
    figure is shown once and then updated through its display handle, so the cell keeps a single
    output: after training it is the final figure, which is what a saved notebook stores. When
    ``fit`` ends, :meth:`on_fit_end` draws the steps after the last multiple of ``every`` too.
    Outside a kernel (a script, a test) it records and redraws the figure but displays nothing.

    Args:
        every: steps between redraws (each redraw renders a PNG: keep it to tens per run).
        smoothing: EMA weight in [0, 1) of the running mean; 0 = no smoothing. Default: an
            average over about 1/40 of the run, ``1 - 40 / total`` (0 for runs under 40 steps).
        total: the x-axis limit; default the trainer's ``config.steps``.
        title: title prefix; the current step and running loss follow it.
        log_y: log-scale loss axis.
        figsize: figure size in inches.
        display: show the figure; default only inside a Jupyter kernel.

    Attributes:
        steps, losses, running: what has been recorded so far (lists of equal length).
        figure: the :class:`~matplotlib.figure.Figure` (``None`` before the first draw).
        n_draws: how many times the figure was redrawn.
    """

    def __init__(
        self,
        every: int = 25,
        smoothing: float | None = None,
        total: int | None = None,
        title: str = "training loss",
        log_y: bool = True,
        figsize: tuple[float, float] = (6.5, 3.0),
        display: bool | None = None,
    ):
        if isinstance(every, bool) or not isinstance(every, (int, np.integer)) or every < 1:
            raise ValueError(f"every must be a positive int (steps between redraws), got {every!r}")
        if smoothing is not None and not 0.0 <= smoothing < 1.0:
            raise ValueError(f"smoothing must lie in [0, 1) or be None (automatic), got {smoothing}")
        if total is not None and total < 1:
            raise ValueError(f"total must be a positive number of steps or None, got {total}")
        self.every, self.smoothing, self.total = int(every), smoothing, total
        self.title, self.log_y, self.figsize = title, log_y, figsize
        self.display = _in_notebook() if display is None else display
        self.steps: list[int] = []
        self.losses: list[float] = []
        self.running: list[float] = []
        self.figure: Figure | None = None
        self.n_draws = 0
        self._ema, self._handle, self._drawn_step = 0.0, None, None

    # -- recording ---------------------------------------------------------------------------
    def record(self, history: Sequence[Mapping[str, float]]) -> int:
        """Append the entries of a trainer's history newer than the last recorded step.

        Returns:
            How many entries were added.
        """
        if self.smoothing is None:  # fixed at the first record, from the run's length when known
            self.smoothing = max(0.0, 1.0 - 40.0 / self.total) if self.total else 0.9
        last = self.steps[-1] if self.steps else 0
        added = 0
        for entry in history:
            if "step" not in entry or "loss" not in entry:
                raise ValueError(f"history entries need 'step' and 'loss', got keys {sorted(entry)}")
            step, loss = int(entry["step"]), float(entry["loss"])
            if step <= last:
                continue
            self._ema = self.smoothing * self._ema + (1 - self.smoothing) * loss
            self.steps.append(step)
            self.losses.append(loss)
            self.running.append(self._ema / (1 - self.smoothing ** len(self.steps)))  # bias-corrected
            last, added = step, added + 1
        return added

    # -- drawing -----------------------------------------------------------------------------
    def draw(self) -> Figure:
        """Redraw the figure from what has been recorded, and update the notebook output."""
        if self.figure is None:
            self.figure = Figure(figsize=self.figsize, layout="constrained")
            ax = self.figure.add_subplot()
            (self._raw_line,) = ax.plot([], [], lw=0.8, alpha=0.35, color="#1f77b4", label="loss per step")
            (self._run_line,) = ax.plot([], [], lw=2.2, color="#d62728", label="running mean")
            ax.set_xlabel("step")
            ax.set_ylabel(r"loss $\|\epsilon - \epsilon_\theta\|^2 / m$")
            if self.log_y:
                log_axis(ax)
            ax.legend(loc="best")
        ax = self.figure.axes[0]
        self._raw_line.set_data(self.steps, self.losses)
        self._run_line.set_data(self.steps, self.running)
        right = max(self.total or 0, self.steps[-1] if self.steps else 1)
        ax.set_xlim(0, right)
        if self.losses:
            lo, hi = min(self.losses), max(self.losses)
            if self.log_y:
                ax.set_ylim(lo / 1.15, hi * 1.15)
            else:
                ax.set_ylim(0, hi * 1.05)
            ax.set_title(f"{self.title}: step {self.steps[-1]:,} of {right:,}, running mean {self.running[-1]:.4f}",
                         fontsize="medium")
        else:
            ax.set_title(self.title, fontsize="medium")
        self.n_draws += 1
        self._drawn_step = self.steps[-1] if self.steps else None
        if self.display:
            from IPython.display import display

            if self._handle is None:
                self._handle = display(self.figure, display_id=True)
            else:
                self._handle.update(self.figure)
        return self.figure

    # -- callback hooks ----------------------------------------------------------------------
    def on_step_end(self, trainer: Trainer, step: int) -> None:
        if self.total is None:
            self.total = trainer.config.steps
        self.record(trainer.history)
        self.draw()

    def on_fit_end(self, trainer: Trainer) -> None:
        """Record the last steps and draw the final figure (only if something is new)."""
        if self.total is None:
            self.total = trainer.config.steps
        self.record(trainer.history)
        if self.figure is None or self._drawn_step != (self.steps[-1] if self.steps else None):
            self.draw()
