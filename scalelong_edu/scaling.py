"""Long-skip scaling: how each long skip connection enters its decoder block.

The paper writes a UNet with ``N`` long skip connections (LSCs) recursively (its Eq. 3)::

    f_{i-1}(x) = b_i( kappa_i * a_i(x) + f_i(a_i(x)) ),    i = 1 .. N,

with encoder blocks ``a_i``, decoder blocks ``b_i``, the bottleneck ``f_N`` and the UNet output
``f_0(x_t)``. **Skip i = 1 is the outermost** (highest resolution, first encoder block, last
decoder block); skip ``N`` sits next to the bottleneck. Our models merge by concatenation
(``b_i`` starts with a linear map of ``[h, kappa_i * skip]``), which is the additive form with the
skip half of that map's weight absorbing the sum.

A :class:`SkipScaling` object is handed to a model, which calls :meth:`SkipScaling.bind` once with
the width of every skip (channels for the conv UNet, tokens for the U-ViT) and then, at merge
``i``, ``h, skip = scaling(h, skip, i)``. A model may instead take LS's per-sample gate from
:meth:`SkipScaling.gate` and fold it into the weights of its merge (the conv UNet does so in
training, see :meth:`scalelong_edu.models.unet.DecoderBlock.gated_merge`). The methods:

================ ================================================ =====================
name             kappa_i                                          official ``scalelong``
================ ================================================ =====================
``none``         1                                                0
``sqrt2-cs``     1 / sqrt(2) for every skip                       1
``cs``           ``kappa ** (i - 1)`` (the paper's Eq. 8)         2
``ls``           a learned gate, one network for all skips        3
``ls-per-skip``  a learned gate, one network per skip             4
``block-output`` 1; the decoder stream is scaled by ``eta``       --
================ ================================================ =====================

``block-output`` is the block-output scaling of Hanin & Rolnick (2018), which the NeurIPS
reviewer asks to compare with: the skip is left alone and the stream arriving from the deeper
network, ``f_i(a_i(x))``, is multiplied by one constant ``eta`` at every merge
(:class:`BlockOutputScaling` says why constant).

**Paths.** Read Eq. (3) with linear blocks and the output ``f_0`` is a sum of ``N + 1`` paths: one
through each skip ``k`` (down ``a_1 .. a_k``, across, up ``b_k .. b_1``) and one through the
bottleneck. A path through skip ``k`` picks up ``kappa_k`` at merge ``k`` and the stream factor of
every merge ``k-1 .. 1`` it then rides through; the bottleneck path picks up the stream factors of
all ``N`` merges. :meth:`SkipScaling.effective_kappas` and :func:`path_factors` return these
totals; for every method but ``block-output`` they are just the ``kappa_i``.
"""

from __future__ import annotations

import math
import numbers
from typing import Literal, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def check_kappa(kappa: float, name: str = "kappa") -> float:
    """Return ``kappa`` as a float, or raise a ValueError that says what a valid value is."""
    try:
        value = float(kappa)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a number, got {kappa!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a finite number > 0 (the paper suggests 0.5 to 0.95), got {kappa!r}")
    return value


def check_n_skips(n_skips: int) -> int:
    """``n_skips`` as an int, or a ValueError saying what N must be."""
    if isinstance(n_skips, bool) or not isinstance(n_skips, numbers.Integral):
        raise ValueError(f"n_skips must be a whole number >= 1 (the number of long skips N), got {n_skips!r}")
    if n_skips < 1:
        raise ValueError(f"n_skips must be >= 1: a UNet needs at least one long skip, got {n_skips}")
    return int(n_skips)


def cs_coefficients(kappa: float, n_skips: int) -> list[float]:
    """The paper's Eq. (8): ``kappa_i = kappa ** (i - 1)`` for i = 1 (outermost) .. N."""
    kappa, n = check_kappa(kappa), check_n_skips(n_skips)
    return [kappa**i for i in range(n)]


Statistic = Literal["mean", "rms"]


def _scaled(x: Tensor, factor: Tensor | float) -> Tensor:
    """``factor * x``, returning ``x`` itself for the plain float 1 (no copy, bit-for-bit unscaled)."""
    return x if isinstance(factor, float) and factor == 1.0 else x * factor


class SkipScaling(nn.Module):
    """No scaling (``kappa_i = 1``) and the interface every method shares.

    Subclasses override :meth:`kappa` (the coefficient applied to skip ``i``) and/or
    :meth:`stream_factor` (the one applied to the decoder stream at merge ``i``).
    """

    method = "none"

    def __init__(self):
        super().__init__()
        self.widths: tuple[int, ...] = ()

    @property
    def n_skips(self) -> int:
        """``N``, known once a model has called :meth:`bind`."""
        return len(self.widths)

    def bind(self, widths: Sequence[int]) -> None:
        """Called by the model with the width of each skip, i = 1 .. N (channels or tokens)."""
        widths = tuple(int(w) for w in widths)
        if not widths or min(widths) < 1:
            raise ValueError(f"a model needs at least one skip of positive width, got {widths}")
        self.widths = widths

    def _check_index(self, i: int) -> None:
        if not self.widths:
            raise RuntimeError(f"{type(self).__name__} is not bound to a model yet; pass it to a model first")
        if not 1 <= i <= self.n_skips:
            raise IndexError(f"skip index must be in 1 .. {self.n_skips} (1 = outermost), got {i}")

    def kappa(self, skip: Tensor, i: int) -> Tensor | float:
        """The coefficient of skip ``i``: a float, or a tensor broadcastable to ``skip``."""
        return 1.0

    def stream_factor(self, i: int) -> float:
        """The factor on the decoder stream ``f_i(a_i(x))`` entering merge ``i``: 1 unless overridden."""
        return 1.0

    def gate(self, skip: Tensor, i: int) -> Tensor | None:
        """``kappa_i`` as a per-sample gate (B, G) that a merge can fold into its weights, or None.

        Only LS has a gate (this base class and the constant methods return None). A model that takes
        it merges the unscaled stream and skip with the gate instead of calling :meth:`forward`:
        LS scales nothing but the skip.
        """
        return None

    def outward_factor(self, i: int) -> float:
        """``prod_{j=1..i} stream_factor(j)``: the total factor on what enters the stream at merge ``i``
        (the output of ``b_{i+1}``; ``i = N``: the bottleneck) on its way to the output; 1 for ``i = 0``."""
        return math.prod(self.stream_factor(j) for j in range(1, i + 1))

    def forward(self, h: Tensor, skip: Tensor, i: int) -> tuple[Tensor, Tensor]:
        """Scale the inputs of decoder block ``b_i``: returns ``(stream_factor(i) * h, kappa_i * skip)``.

        Args:
            h: the decoder stream ``f_i(a_i(x))`` arriving at merge ``i``.
            skip: the encoder feature ``a_i(x)``, (B, G, ...) with G the gated axis
                (channels of a conv feature map, tokens of a U-ViT sequence).
        """
        self._check_index(i)
        return _scaled(h, self.stream_factor(i)), _scaled(skip, self.kappa(skip, i))

    @torch.no_grad()
    def effective_kappas(self, skips: Sequence[Tensor], statistic: Statistic = "mean") -> Tensor:
        """The effective ``kappa_i`` of every skip for this batch, (N,) float64, i = 1 first.

        The effective ``kappa_i`` is the total factor on the path through skip ``i`` (see the module
        docstring): ``kappa_i * outward_factor(i - 1)``. It is ``kappa_i`` for the skip-scaling
        methods and ``eta ** (i - 1)`` for ``block-output``. LS gates vary over samples and
        channels/tokens, so a statistic summarises them:

        * ``"mean"`` -- the mean gate;
        * ``"rms"`` -- ``sqrt(E[kappa_i^2])`` over samples and channels/tokens, whose squares sum to
          ``sum_i E[kappa_i^2]``: the paper's ``sum_i kappa_i^2`` (Theorem 3.1) for gated skips, since
          a gate multiplies each channel/token's share of ``||a_i(x)||^2`` by its square (the plain
          average is exact when the channels/tokens carry equal shares). Squaring the mean gate
          instead misses the gates' variance: ``E[k^2] = E[k]^2 + Var[k]``.

        For constant methods both statistics are the coefficient itself.

        Args:
            skips: the encoder features ``a_1(x) .. a_N(x)`` of one batch.
            statistic: ``"mean"`` or ``"rms"``.
        """
        if statistic not in ("mean", "rms"):
            raise ValueError(f"statistic must be 'mean' or 'rms', got {statistic!r}")
        if len(skips) != self.n_skips:
            raise ValueError(f"expected {self.n_skips} skip features, got {len(skips)}")
        values = []
        for i, skip in enumerate(skips, start=1):
            self._check_index(i)
            k = torch.as_tensor(self.kappa(skip, i), dtype=torch.float64)
            value = k.mean() if statistic == "mean" else k.square().mean().sqrt()
            values.append(value.item() * self.outward_factor(i - 1))
        return torch.tensor(values, dtype=torch.float64)

    def extra_repr(self) -> str:
        return f"method={self.method!r}, n_skips={self.n_skips}"


class ConstantScaling(SkipScaling):
    """Fixed coefficients: ``sqrt2-cs`` (all ``1/sqrt(2)``) or ``cs`` (``kappa ** (i-1)``, Eq. 8)."""

    def __init__(self, kappa: float = 0.5, exponential: bool = True):
        super().__init__()
        self.kappa_value = check_kappa(kappa)
        self.exponential = exponential
        self.method = "cs" if exponential else "sqrt2-cs"
        self.coefficients: tuple[float, ...] = ()

    def bind(self, widths: Sequence[int]) -> None:
        super().bind(widths)
        n = self.n_skips
        self.coefficients = tuple(cs_coefficients(self.kappa_value, n) if self.exponential else [self.kappa_value] * n)

    def kappa(self, skip: Tensor, i: int) -> float:
        return self.coefficients[i - 1]

    def extra_repr(self) -> str:
        return super().extra_repr() + f", kappa={self.kappa_value:g}"


class Calibration(nn.Module):
    """The LS calibration network ``zeta_phi`` (the paper's Eq. 9), squeeze-and-excitation shaped.

    ``gate = sigmoid(W2 relu(W1 GAP(x)))`` where GAP averages every axis after the gated one:
    for a U-ViT skip (B, L, D) it averages the embedding and gates the L tokens; for a conv skip
    (B, C, H, W) it averages H x W and gates the C channels.

    Args:
        width: size G of the gated axis.
        reduction: hidden size is ``G // reduction`` (the paper uses 16), but at least
            :attr:`MIN_HIDDEN`: on narrow skips a single hidden ReLU can die, which would freeze
            every gate at a constant. The book's ``ci`` and ``cpu`` presets have narrow skips (conv
            UNets 16 or 32 channels, U-ViTs 17 tokens), so both backbones use the minimum of 4
            there; ``unet-m`` gets 6 and ``uvit-m`` at 32 px 16.
    """

    MIN_HIDDEN = 4

    def __init__(self, width: int, reduction: int = 16):
        super().__init__()
        hidden = max(width // reduction, self.MIN_HIDDEN)
        self.fc1 = nn.Linear(width, hidden)
        self.fc2 = nn.Linear(hidden, width)

    def gate(self, x: Tensor) -> Tensor:
        """Eq. (9)'s gates in (0, 1), shape (B, G), for a skip ``x`` of shape (B, G, ...).

        GAP is a sum divided by the count, which equals the mean but whose backward passes on a
        broadcast view of the gradient; the backward of ``mean`` writes a full (B, G, ...) tensor.
        """
        pooled = x.flatten(2).sum(-1) / math.prod(x.shape[2:])
        return torch.sigmoid(self.fc2(F.relu(self.fc1(pooled))))

    def forward(self, x: Tensor) -> Tensor:
        """Gates in (0, 1), shape (B, G, 1, ...) broadcastable to ``x`` of shape (B, G, ...)."""
        gate = self.gate(x)
        return gate.view(*gate.shape, *([1] * (x.dim() - 2)))


class LearnableScaling(SkipScaling):
    """LS: ``kappa_i`` predicted per sample and per channel/token by a calibration network.

    Args:
        per_skip: one :class:`Calibration` per skip (official ``scalelong=4``) instead of one
            shared by all skips (``scalelong=3``). Sharing needs every skip to have the same width.
        reduction: the calibration network's reduction ratio.
        n_skips: optional; when given, binding to a model with a different ``N`` raises.
    """

    def __init__(self, per_skip: bool = False, reduction: int = 16, n_skips: int | None = None):
        super().__init__()
        if reduction < 1:
            raise ValueError(f"reduction must be >= 1, got {reduction}")
        self.per_skip, self.reduction, self.expected_n = per_skip, reduction, n_skips
        self.method = "ls-per-skip" if per_skip else "ls"
        self.nets = nn.ModuleList()

    def bind(self, widths: Sequence[int]) -> None:
        if len(self.nets):
            raise RuntimeError("this LearnableScaling already belongs to a model; create a new one per model")
        super().bind(widths)
        if self.expected_n is not None and self.expected_n != self.n_skips:
            raise ValueError(
                f"LS was created with n_skips={self.expected_n} but the model has N = {self.n_skips} long skips; "
                f"use n_skips={self.n_skips} or leave it out"
            )
        if self.per_skip:
            self.nets.extend(Calibration(w, self.reduction) for w in self.widths)
        elif len(set(self.widths)) > 1:
            raise ValueError(
                f"shared LS needs every skip to have the same width, got {list(self.widths)}; "
                "use method 'ls-per-skip', or a model whose skips share one width"
            )
        else:
            self.nets.append(Calibration(self.widths[0], self.reduction))

    def net(self, i: int) -> Calibration:
        """The calibration network of skip ``i``: its own (``per_skip``) or the shared one."""
        self._check_index(i)
        return self.nets[i - 1 if self.per_skip else 0]

    def kappa(self, skip: Tensor, i: int) -> Tensor:
        """The gates of skip ``i`` (B, G), shaped (B, G, 1, ...) to broadcast against ``skip``."""
        return self.net(i)(skip)

    def gate(self, skip: Tensor, i: int) -> Tensor:
        """The gates of skip ``i``, (B, G): ``kappa_i`` unshaped, for a merge that folds them in."""
        return self.net(i).gate(skip)

    def extra_repr(self) -> str:
        return super().extra_repr() + f", reduction={self.reduction}"


class BlockOutputScaling(SkipScaling):
    """Block-output scaling after Hanin & Rolnick (2018): the deeper branch is scaled, not the skip.

    In a ResNet ``x_{l+1} = x_l + eta_l F_l(x_l)`` the residual modules sit in series, so ``eta_l`` is
    the total factor on module ``l``'s contribution, and Hanin & Rolnick choose them (e.g.
    geometric, ``b ** l``) so that the sum of the branch scales stays bounded. In a UNet (Eq. 3) the
    "residual branch" at merge ``i`` is the whole deeper network ``f_i``, which contains every
    branch below it: the modules are *nested*, so factors multiply along a path. The analogue of
    the per-module factor is therefore one constant ``eta`` at every merge,

        f_{i-1}(x) = b_i( a_i(x) + eta * f_i(a_i(x)) ),

    and the total factor of a path comes from the nesting: the path through skip ``k`` rides the
    stream through merges ``k-1 .. 1`` and carries ``eta ** (k - 1)`` -- the profile CS gives
    ``kappa_k`` when ``eta = kappa`` -- and the bottleneck path carries ``eta ** N`` (1 under CS). What
    differs from CS is where the factor acts: besides the skips it damps everything the decoder
    blocks add, ``b_j``'s contribution by ``eta ** (j - 1)``, and the bottleneck. (A factor
    ``eta ** i`` at merge ``i``, a per-module reading of ``b ** l``, would compound to
    ``eta ** (k (k - 1) / 2)`` on skip ``k`` and ``eta ** (N (N + 1) / 2)`` on the bottleneck.)
    """

    method = "block-output"

    def __init__(self, eta: float = 0.5):
        super().__init__()
        self.eta = check_kappa(eta, "eta")

    def stream_factor(self, i: int) -> float:
        """``eta``, the factor on the decoder stream ``f_i(a_i(x))`` at every merge ``i``."""
        self._check_index(i)
        return self.eta

    def extra_repr(self) -> str:
        return super().extra_repr() + f", eta={self.eta:g}"


METHODS = ("none", "sqrt2-cs", "cs", "ls", "ls-per-skip", "block-output")


def make_scaling(method: str, kappa: float = 0.5, **kwargs) -> SkipScaling:
    """Build a skip-scaling object by name (see the module docstring for the table).

    Args:
        method: one of :data:`METHODS`.
        kappa: the CS base ``kappa`` (``cs``) or the Hanin-Rolnick ``eta`` (``block-output``);
            ignored by the others.
        kwargs: passed to :class:`LearnableScaling` (``reduction``, ``n_skips``).
    """
    if kwargs and method not in ("ls", "ls-per-skip"):
        raise TypeError(f"method {method!r} takes no options besides kappa, got {sorted(kwargs)}")
    if method == "none":
        return SkipScaling()
    if method == "sqrt2-cs":
        return ConstantScaling(2**-0.5, exponential=False)
    if method == "cs":
        return ConstantScaling(kappa, exponential=True)
    if method in ("ls", "ls-per-skip"):
        return LearnableScaling(per_skip=method == "ls-per-skip", **kwargs)
    if method == "block-output":
        return BlockOutputScaling(kappa)
    raise ValueError(f"unknown skip-scaling method {method!r}; choose one of {', '.join(METHODS)}")


def constant_scaling(method: str, kappa: float = 0.5, n_skips: int = 6) -> SkipScaling:
    """A constant method's scaling object, bound to ``N`` skips (of width 1: constants ignore it).

    Raises:
        ValueError: for ``ls`` and ``ls-per-skip``, whose coefficients depend on the data.
    """
    n = check_n_skips(n_skips)
    check_kappa(kappa)
    if method in ("ls", "ls-per-skip"):
        raise ValueError(
            f"method {method!r} learns kappa_i (a gate per sample and channel/token); there is no fixed value. "
            "Measure it on a model and a batch with scalelong_edu.widgets.measured_kappas(model, x, t)"
        )
    scaling = make_scaling(method, kappa)
    scaling.bind([1] * n)
    return scaling


def path_factors(method: str, kappa: float = 0.5, n_skips: int = 6) -> list[float]:
    """The total factor on every path of Eq. (3): skips 1 .. N (outermost first), then the bottleneck.

    The path through skip ``k`` carries ``kappa_k`` times the stream factors of merges ``k-1 .. 1``;
    the bottleneck path carries the stream factors of all ``N`` merges (module docstring). So
    ``none``: all 1; ``sqrt2-cs``: ``1/sqrt(2)`` on every skip, 1 on the bottleneck; ``cs``:
    ``kappa ** (k - 1)``, 1; ``block-output``: ``eta ** (k - 1)``, ``eta ** N``. For LS the factors are
    the learned gates, which depend on the data: it raises, pointing to ``measured_kappas``.

    Args:
        method: a constant method of :data:`METHODS`.
        kappa: the CS base (``cs``) or ``eta`` (``block-output``); > 0 for every method.
        n_skips: ``N`` >= 1.

    Returns:
        ``N + 1`` floats.
    """
    scaling = constant_scaling(method, kappa, n_skips)
    unit = [torch.ones(1, 1)] * scaling.n_skips
    return scaling.effective_kappas(unit).tolist() + [scaling.outward_factor(scaling.n_skips)]
