"""Pictures and tables that describe a model's long skip connections.

* :func:`draw_unet` -- the paper's Eq. (3) as a diagram: encoder blocks ``a_1 .. a_N`` down the
  left, decoder blocks ``b_1 .. b_N`` up the right, the bottleneck ``f_N`` at the bottom, and every
  long skip ``i`` (i = 1 outermost) labelled with the coefficient ``kappa_i`` that multiplies it.
* :func:`draw_calibration` -- the data flow of LS's calibration network (the paper's Eq. 9): from a
  skip's features to one gate per sample and channel/token, and back onto the skip.
* :func:`skip_features` -- the encoder outputs ``a_1(x) .. a_N(x)`` of one forward pass.
* :func:`skip_summary` -- one row per skip: the shape of ``a_i(x)`` and the width of the gated axis.
* :func:`parameter_table` -- parameter counts of model presets for each skip-scaling method,
  counted on PyTorch's ``meta`` device so that even the 44M-parameter U-ViT costs no memory.
* :func:`init_norms` -- output and hidden-feature norms of freshly initialised models against
  ``sum_i kappa_i^2``, one row per method: the intuition before the paper's Theorem 3.1.
"""

from __future__ import annotations

import math
import numbers
from typing import Sequence

import pandas as pd
import torch
from torch import Tensor, nn

from .models import build_model, count_parameters
from .plotting import MAX_FIGURE_WIDTH
from .probes import FeatureNorms
from .scaling import METHODS, check_n_skips

KAPPA_COLOR = "#b2182b"  # skip arrows and their kappa labels
STREAM_COLOR = "#4d4d4d"  # encoder/decoder stream arrows


def _format_label(value, symbol: str, i: int) -> str:
    """``kappa_i = 0.5`` for a number, the string itself for a string, ``kappa_i`` for None."""
    if value is None:
        return rf"${symbol}_{{{i}}}$"
    if isinstance(value, str):
        return value
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{symbol}_{i} must be a finite number > 0 or a string label, got {value!r}")
    return rf"${symbol}_{{{i}}} = {float(value):.4g}$"


def _check_labels(values, n: int, name: str) -> list:
    if values is None:
        return [None] * n
    message = f"{name} must be a sequence of {n} values (one per skip, i = 1 first), got {values!r}"
    if isinstance(values, (str, bytes)):
        raise ValueError(message)
    try:
        values = list(values)
    except TypeError:
        raise ValueError(message) from None
    values = [v.item() if hasattr(v, "item") and not isinstance(v, str) else v for v in values]
    if len(values) != n:
        raise ValueError(f"{name} has {len(values)} values but n_skips = {n}; give one per skip, i = 1 first")
    return values


def draw_unet(
    n_skips: int,
    kappas: Sequence[float | str] | None = None,
    ax=None,
    *,
    stream_factors: Sequence[float | str] | None = None,
    encoder_notes: Sequence[str] | None = None,
    title: str | None = None,
):
    """Draw a UNet with ``N`` long skips in the paper's Eq. (3) form and label where ``kappa_i`` enters.

    Encoder blocks ``a_1 .. a_N`` run down the left, decoder blocks ``b_1 .. b_N`` up the right,
    the bottleneck ``f_N`` sits at the bottom. Skip ``i`` runs from ``a_i`` to ``b_i`` (i = 1 is the
    outermost, top one) and carries the label of its coefficient; the arrow's width grows with
    ``kappa_i`` so a weak skip looks thin.

    Args:
        n_skips: ``N`` >= 1.
        kappas: ``N`` coefficients (numbers > 0, drawn as ``kappa_i = value``) or string labels,
            i = 1 first; ``None`` writes the symbols ``kappa_1 .. kappa_N``.
        ax: the matplotlib Axes to draw into; a new figure when ``None``.
        stream_factors: optional ``N`` factors (numbers or strings) on the decoder stream arriving
            at ``b_i`` -- for the block-output scaling of Hanin & Rolnick, ``eta`` at every merge
            (:func:`scalelong_edu.widgets.stream_coefficients`).
        encoder_notes: optional ``N`` short strings written left of ``a_i`` (e.g. feature shapes).
        title: optional axes title.

    Returns:
        The Axes. The skip labels are Text objects with gid ``"kappa_<i>"``, the stream labels
        ``"stream_<i>"``, the blocks ``"a_<i>"``, ``"b_<i>"`` and ``"bottleneck"``.
    """
    n = check_n_skips(n_skips)
    kappa_values = _check_labels(kappas, n, "kappas")
    kappa_labels = [_format_label(v, r"\kappa", i) for i, v in enumerate(kappa_values, start=1)]
    stream_labels = None
    if stream_factors is not None:
        stream_values = _check_labels(stream_factors, n, "stream_factors")
        stream_labels = [_format_label(v, r"\eta", i) for i, v in enumerate(stream_values, start=1)]
    notes = _check_labels(encoder_notes, n, "encoder_notes")

    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyBboxPatch

    bw, bh, dy, indent = 1.3, 0.56, 1.0, 0.6  # box size, vertical step, inward step per level
    inner_gap = 3.3  # horizontal room for the innermost skip's label
    width = 2 * (n - 1) * indent + bw + inner_gap
    xe = [(i - 1) * indent for i in range(1, n + 1)]
    xd = [width - x for x in xe]
    ys = [-(i - 1) * dy for i in range(1, n + 1)]
    xb, yb, wb = width / 2, -n * dy - 0.15, 3.3  # the bottleneck's centre and width

    if ax is None:
        _, ax = plt.subplots(figsize=(min(MAX_FIGURE_WIDTH, 0.75 * width + 3.0), 1.0 + 0.62 * (n + 2)))

    def box(x, y, text, gid, face, w=bw, size=11):
        ax.add_patch(FancyBboxPatch((x - w / 2, y - bh / 2), w, bh, boxstyle="round,pad=0.02,rounding_size=0.12",
                                    facecolor=face, edgecolor="#333333", linewidth=1.0, zorder=2))
        ax.text(x, y, text, ha="center", va="center", fontsize=size, zorder=3, gid=gid)

    def arrow(x0, y0, x1, y1, color=STREAM_COLOR, lw=1.3):
        ax.annotate("", xy=(x1, y1), xytext=(x0, y0), zorder=1,
                    arrowprops=dict(arrowstyle="-|>", color=color, lw=lw, shrinkA=0, shrinkB=0, mutation_scale=12))

    for i in range(1, n + 1):
        x, y = xe[i - 1], ys[i - 1]
        box(x, y, rf"$a_{{{i}}}$", f"a_{i}", "#d1e5f0")
        box(xd[i - 1], y, rf"$b_{{{i}}}$", f"b_{i}", "#fddbc7")
        if notes[i - 1]:
            ax.text(x - bw / 2 - 0.15, y, str(notes[i - 1]), ha="right", va="center", fontsize="small",
                    color="#555555")
        # the long skip i: a_i -> b_i, width growing with kappa_i
        k = kappa_values[i - 1]
        lw = 0.7 + 2.3 * min(float(k), 1.0) if isinstance(k, numbers.Real) else 1.8
        arrow(x + bw / 2, y, xd[i - 1] - bw / 2, y, KAPPA_COLOR, lw)
        ax.text((x + xd[i - 1]) / 2, y + 0.04, kappa_labels[i - 1], ha="center", va="center", fontsize=10,
                color=KAPPA_COLOR, gid=f"kappa_{i}", zorder=4,
                bbox=dict(boxstyle="round,pad=0.2", facecolor="white", edgecolor=KAPPA_COLOR, linewidth=0.8))
        # encoder stream down, decoder stream up
        if i < n:
            arrow(x, y - bh / 2, xe[i], ys[i] + bh / 2)
            x0, y0 = xd[i], ys[i] + bh / 2
        else:
            arrow(x, y - bh / 2, xb - wb / 4, yb + bh / 2)
            x0, y0 = xb + wb / 4, yb + bh / 2
        x1, y1 = xd[i - 1], y - bh / 2
        arrow(x0, y0, x1, y1)
        if stream_labels is not None:
            ax.text(x1 + bw / 2 + 0.05, (y0 + y1) / 2, stream_labels[i - 1], ha="left", va="center", fontsize=9,
                    color="#5e3c99", gid=f"stream_{i}")
    box(xb, yb, rf"bottleneck $f_{{{n}}}$", "bottleneck", "#e0e0e0", w=wb, size=10)

    top = bh / 2 + 0.75
    arrow(xe[0], top, xe[0], bh / 2)
    ax.text(xe[0], top + 0.05, r"input $x_t$", ha="center", va="bottom", fontsize=10)
    arrow(xd[0], bh / 2, xd[0], top)
    ax.text(xd[0], top + 0.05, r"output $f_0(x_t)$", ha="center", va="bottom", fontsize=10)

    left = -bw / 2 - (1.9 if any(notes) else 0.3)
    ax.set_xlim(left, width + bw / 2 + (1.7 if stream_labels else 0.3))
    ax.set_ylim(yb - bh / 2 - 0.3, top + 0.45)
    ax.set_aspect("equal")
    ax.axis("off")
    if title:
        ax.set_title(title)
    return ax


def draw_calibration(width: int, length: int, hidden: int, ax=None, *, gated: str = "tokens", pooled: str = "dim"):
    """Draw LS's calibration network ``zeta_phi`` (the paper's Eq. 9) as a data flow with shapes.

    A skip feature ``x_i`` of shape (B, G, L) -- G gated channels/tokens, L the axis that is
    averaged (H x W of a conv map, the embedding of a U-ViT token) -- goes through global average
    pooling over L to (B, G), ``Linear(G, hidden)``, ReLU, ``Linear(hidden, G)`` and a sigmoid to the
    gates (B, G, 1), which multiply ``x_i`` element-wise, broadcast over L.

    Args:
        width, length: G and L of the skip feature.
        hidden: width of the hidden layer (:class:`scalelong_edu.scaling.Calibration`).
        ax: the matplotlib Axes; a new figure when ``None``.
        gated, pooled: the names of the G and L axes written in the boxes.

    Returns:
        The Axes; each stage's Text has gid ``"stage_<k>"``, k = 0 .. 6.
    """
    for name, value in (("width", width), ("length", length), ("hidden", hidden)):
        if not isinstance(value, numbers.Integral) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyBboxPatch

    stages = [
        (rf"skip $x_i$" + "\n" + f"(B, {width} {gated}, {length} {pooled})", "#d1e5f0"),
        (f"average over {pooled}" + "\n" + f"(B, {width})", "#f0f0f0"),
        (f"Linear {width}→{hidden}, ReLU" + "\n" + f"(B, {hidden})", "#f0f0f0"),
        (f"Linear {hidden}→{width}" + "\n" + f"(B, {width})", "#f0f0f0"),
        ("sigmoid: gates" + "\n" + f"(B, {width}, 1) in (0, 1)", "#fddbc7"),
        (rf"$\kappa_i \odot x_i$" + "\n" + f"(B, {width}, {length})", "#d1e5f0"),
        ("decoder block $b_i$", "#fddbc7"),
    ]
    if ax is None:
        _, ax = plt.subplots(figsize=(min(MAX_FIGURE_WIDTH, 7.5), 4.6))
    bw, bh = 3.4, 0.62
    xs = [0, 0, 0, 0, 0, 4.2, 4.2]
    ys = [6, 4.8, 3.6, 2.4, 1.2, 1.2, 6]
    for k, ((text, face), x, y) in enumerate(zip(stages, xs, ys)):
        ax.add_patch(FancyBboxPatch((x - bw / 2, y - bh / 2), bw, bh, boxstyle="round,pad=0.02,rounding_size=0.1",
                                    facecolor=face, edgecolor="#333333", linewidth=1.0, zorder=2))
        ax.text(x, y, text, ha="center", va="center", fontsize=9, zorder=3, gid=f"stage_{k}")

    def arrow(x0, y0, x1, y1, color=STREAM_COLOR):
        ax.annotate("", xy=(x1, y1), xytext=(x0, y0), zorder=1,
                    arrowprops=dict(arrowstyle="-|>", color=color, lw=1.3, shrinkA=0, shrinkB=0, mutation_scale=12))

    for k in range(4):
        arrow(0, ys[k] - bh / 2, 0, ys[k + 1] + bh / 2)
    arrow(bw / 2, ys[4], xs[5] - bw / 2, ys[5])
    arrow(xs[5], ys[5] + bh / 2, xs[6], ys[6] - bh / 2, KAPPA_COLOR)
    ax.plot([bw / 2, bw / 2 + 0.35, bw / 2 + 0.35], [ys[0], ys[0], ys[5] + bh / 2 + 0.5], color=KAPPA_COLOR, lw=1.3)
    arrow(bw / 2 + 0.35, ys[5] + bh / 2 + 0.5, xs[5] - 0.6, ys[5] + bh / 2, KAPPA_COLOR)
    ax.text(bw / 2 + 0.45, 3.9, "the skip itself", fontsize=8, color=KAPPA_COLOR, rotation=90, va="center")
    ax.set_xlim(-bw / 2 - 0.2, xs[5] + bw / 2 + 0.2)
    ax.set_ylim(ys[4] - bh, ys[0] + bh)
    ax.set_aspect("equal")
    ax.axis("off")
    return ax


def skip_features(model: nn.Module, x: Tensor, t: Tensor, **kwargs) -> list[Tensor]:
    """The encoder outputs ``a_1(x) .. a_N(x)`` of one forward pass (i = 1 first), detached.

    Registers a forward hook on each of ``model.encoder_blocks`` for one ``model(x, t, **kwargs)``
    under ``torch.no_grad()``, and removes the hooks afterwards.
    """
    blocks = getattr(model, "encoder_blocks", None)
    if not blocks:
        raise ValueError(f"{type(model).__name__} has no encoder_blocks; pass a UNet or UViT from scalelong_edu.models")
    found: dict[int, Tensor] = {}
    handles = [
        block.register_forward_hook(lambda module, inputs, output, i=i: found.__setitem__(i, output.detach()))
        for i, block in enumerate(blocks, start=1)
    ]
    try:
        with torch.no_grad():
            model(x, t, **kwargs)
    finally:
        for handle in handles:
            handle.remove()
    return [found[i] for i in range(1, len(blocks) + 1)]


def skip_summary(model: nn.Module, x: Tensor, t: Tensor, **kwargs) -> pd.DataFrame:
    """One row per long skip (index ``i``, 1 = outermost): the shape of ``a_i(x)`` without the batch
    axis, the width of the axis that LS gates (``model.scaling.widths``) and the mean ``kappa_i`` the
    model's skip scaling applies for this batch."""
    skips = skip_features(model, x, t, **kwargs)
    kappas = model.scaling.effective_kappas(skips).tolist()
    table = pd.DataFrame(
        {
            "a_i(x) shape": [" × ".join(str(s) for s in f.shape[1:]) for f in skips],
            "gated width": list(model.scaling.widths),
            "mean kappa_i": kappas,
        },
        index=pd.RangeIndex(1, len(skips) + 1, name="i"),
    )
    return table


def parameter_table(
    presets: Sequence[str],
    in_chans: int,
    img_size: int,
    methods: Sequence[str] = METHODS,
    kappa: float = 0.5,
) -> pd.DataFrame:
    """Trainable parameters of each preset (columns) with each skip-scaling method (rows).

    Models are built on the ``meta`` device: shapes only, no memory and no initialisation cost.
    """
    if isinstance(presets, str):
        presets = [presets]
    counts = {}
    for preset in presets:
        column = []
        for method in methods:
            with torch.device("meta"):
                column.append(count_parameters(build_model(preset, in_chans, img_size, method, kappa)))
        counts[preset] = column
    return pd.DataFrame(counts, index=pd.Index(list(methods), name="method"))


@torch.no_grad()
def init_norms(preset: str, x_t: Tensor, t: Tensor, methods: Sequence[str] = METHODS, kappa: float = 0.5,
               seed: int = 0, **overrides) -> pd.DataFrame:
    """Output and hidden-feature norms of freshly initialised models against ``sum_i kappa_i^2``.

    The intuition before the paper's Theorem 3.1, which bounds ``||h_i||^2`` by
    ``O(||x_t||^2 sum_{j >= i} kappa_j^2)`` (and Section 4.1 reads the output norm the same way):
    for each method, ``preset`` is built under ``torch.manual_seed(seed)`` -- the same backbone
    weights for every method, since a model creates its scaling's parameters last -- and run once
    on ``(x_t, t)`` in eval mode. Squared norms are batch means divided by the batch mean of
    ``||x_t||^2``:

    * ``sum_kappa2`` -- ``sum_i kappa_i^2`` of the effective ``kappa_i`` (total factor on skip ``i``'s
      path); for LS ``sum_i E[kappa_i^2]`` of this batch;
    * ``output_sq`` -- ``||f_0(x_t)||^2 / ||x_t||^2``, the network output;
    * ``tail_kappa2_mean`` -- the mean over ``i`` of ``sum_{j >= i} kappa_j^2``, the factor Theorem 3.1
      puts on ``||x_t||^2`` in its bound on ``||h_i||^2``, averaged over the decoder blocks;
    * ``hidden_sq_i`` -- ``||h_i||^2 / ||x_t||^2`` with ``h_i`` the output of decoder block ``b_i``
      (recorded by :class:`scalelong_edu.probes.FeatureNorms`), and ``hidden_sq_mean`` their mean.

    Args:
        preset: a key of :data:`scalelong_edu.models.PRESETS`.
        x_t: a fixed batch of network inputs (B, C, H, W); C and H set the model's size.
        t: the model times (B,) that go with it.
        methods: skip-scaling methods, one row each.
        kappa: the CS base and the block-output ``eta``.
        seed: seeds the initialisation.
        overrides: passed to :func:`scalelong_edu.models.build_model` (e.g. ``depth=20``).

    Returns:
        One row per method (index ``method``): ``sum_kappa2``, ``tail_kappa2_mean``, ``output_sq``,
        ``hidden_sq_mean``, ``hidden_sq_1 .. hidden_sq_N``.
    """
    if x_t.dim() != 4:
        raise ValueError(f"x_t must be a batch of images (B, C, H, W), got shape {tuple(x_t.shape)}")
    x_sq = x_t.flatten(1).square().sum(1).mean().item()
    rows = {}
    for method in methods:
        torch.manual_seed(seed)
        model = build_model(preset, x_t.shape[1], x_t.shape[-1], method, kappa, **overrides).eval()
        with FeatureNorms(model) as probe:
            out = model(x_t, t)
        kappas = model.scaling.effective_kappas(skip_features(model, x_t, t), "rms")
        decoder = sorted((r["skip"], r["value"]) for r in probe.rows
                         if r["block"] == "b" and r["quantity"] == "sq_norm")
        hidden = {f"hidden_sq_{i}": value / x_sq for i, value in decoder}
        k2 = kappas.square()
        rows[method] = {
            "sum_kappa2": k2.sum().item(),
            "tail_kappa2_mean": k2.flip(0).cumsum(0).mean().item(),
            "output_sq": out.flatten(1).square().sum(1).mean().item() / x_sq,
            "hidden_sq_mean": sum(hidden.values()) / len(hidden),
            **hidden,
        }
    return pd.DataFrame.from_dict(rows, orient="index").rename_axis("method")


__all__ = ["draw_unet", "skip_features", "skip_summary", "parameter_table", "init_norms"]
