"""A convolutional UNet written in the paper's Eq. (3) form, ``N`` long skips, i = 1 outermost.

Layout for ``channel_mults = (1, 1, 1)`` and ``blocks_per_level = 2`` (``N = 6``)::

    stem conv                                   final GroupNorm-SiLU-conv
    a_1 = Res            (R)  --skip 1-->  b_1 = Merge + Res                (R)
    a_2 = Res            (R)  --skip 2-->  b_2 = Merge + Res                (R)
    a_3 = Down + Res   (R/2)  --skip 3-->  b_3 = Merge + Res + Up   (R/2 -> R)
    a_4 = Res          (R/2)  --skip 4-->  b_4 = Merge + Res              (R/2)
    a_5 = Down + Res   (R/4)  --skip 5-->  b_5 = Merge + Res + Up (R/4 -> R/2)
    a_6 = Res          (R/4)  --skip 6-->  b_6 = Merge + Res              (R/4)
                 bottleneck f_N = Res + Attention + Res (R/4)

Every encoder block ``a_i`` emits one skip; decoder block ``b_i`` merges the decoder stream with
``kappa_i * skip`` by a 1x1 convolution of their concatenation (the skip-scaling object decides
``kappa_i``) and runs a time-conditioned residual block, at the resolution of ``a_i``. ``b_i``
ends with an upsampling exactly when ``a_i`` began with a downsampling (here ``b_3`` and ``b_5``),
so the stream it hands to ``b_{i-1}`` is at ``a_{i-1}``'s resolution and the two sides mirror.
With autograd on (training), LS's per-sample, per-channel gate is folded into the merge's weights
instead of multiplying the skip (:meth:`DecoderBlock.gated_merge`); the result is the same.
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..scaling import SkipScaling
from .embedding import timestep_embedding


def group_norm(channels: int, min_group: int = 4) -> nn.GroupNorm:
    """GroupNorm with the most groups (<= 32) that divide ``channels`` into groups of >= ``min_group``.

    Groups of a single channel would be instance norm, which subtracts each channel's mean and so
    erases the per-channel time embedding a residual block adds: the network could not see ``t``.
    """
    groups = max(g for g in range(1, 33) if channels % g == 0 and channels // g >= min(min_group, channels))
    return nn.GroupNorm(groups, channels)


class ResBlock(nn.Module):
    """Time-conditioned residual block: GN-SiLU-conv, add time, GN-SiLU-dropout-conv, shortcut."""

    def __init__(self, in_ch: int, out_ch: int, time_dim: int, dropout: float = 0.0):
        super().__init__()
        self.norm1, self.conv1 = group_norm(in_ch), nn.Conv2d(in_ch, out_ch, 3, padding=1)
        self.time = nn.Linear(time_dim, out_ch)
        self.norm2, self.dropout = group_norm(out_ch), nn.Dropout(dropout)
        self.conv2 = nn.Conv2d(out_ch, out_ch, 3, padding=1)
        nn.init.zeros_(self.conv2.weight)  # each block starts as (close to) its shortcut
        self.shortcut = nn.Conv2d(in_ch, out_ch, 1) if in_ch != out_ch else nn.Identity()

    def forward(self, x: Tensor, temb: Tensor) -> Tensor:
        h = self.conv1(F.silu(self.norm1(x))) + self.time(temb)[:, :, None, None]
        h = self.conv2(self.dropout(F.silu(self.norm2(h))))
        return self.shortcut(x) + h


class SelfAttention(nn.Module):
    """Multi-head self-attention over the H x W positions of a feature map, residual."""

    def __init__(self, channels: int, head_dim: int = 32):
        super().__init__()
        self.heads = max(channels // head_dim, 1)
        self.norm = group_norm(channels)
        self.qkv = nn.Conv2d(channels, 3 * channels, 1)
        self.proj = nn.Conv2d(channels, channels, 1)
        nn.init.zeros_(self.proj.weight)

    def forward(self, x: Tensor, temb: Tensor | None = None) -> Tensor:
        B, C, H, W = x.shape
        q, k, v = self.qkv(self.norm(x)).view(B, 3, self.heads, C // self.heads, H * W).transpose(-1, -2).unbind(1)
        out = F.scaled_dot_product_attention(q, k, v).transpose(-1, -2).reshape(B, C, H, W)
        return x + self.proj(out)


class EncoderBlock(nn.Module):
    """``a_i``: optional 2x downsampling (strided conv), then a residual block."""

    def __init__(self, in_ch: int, out_ch: int, time_dim: int, down: bool, dropout: float):
        super().__init__()
        self.down = nn.Conv2d(in_ch, in_ch, 3, stride=2, padding=1) if down else None
        self.res = ResBlock(in_ch, out_ch, time_dim, dropout)

    def forward(self, x: Tensor, temb: Tensor) -> Tensor:
        return self.res(self.down(x) if self.down is not None else x, temb)


class DecoderBlock(nn.Module):
    """``b_i``: a linear merge of ``[h, kappa_i * skip]``, a residual block, optional 2x upsampling.

    The merge is a 1x1 convolution, the conv counterpart of U-ViT's ``Linear(2D -> D)``: it
    forms ``W_h h + kappa_i W_s a_i(x)``, the additive merge of Eq. (3). Feeding the
    concatenation straight into a residual block, as DDPM-style UNets do, would let the block's
    first GroupNorm, whose groups never straddle stream and skip channels, normalise ``kappa_i``
    away on the residual branch.
    """

    def __init__(self, in_ch: int, skip_ch: int, out_ch: int, time_dim: int, up: bool, dropout: float):
        super().__init__()
        self.merge = nn.Conv2d(in_ch + skip_ch, out_ch, 1)
        self.res = ResBlock(out_ch, out_ch, time_dim, dropout)
        self.up = nn.Conv2d(out_ch, out_ch, 3, padding=1) if up else None

    def forward(self, h: Tensor, skip: Tensor, temb: Tensor, gate: Tensor | None = None) -> Tensor:
        """``b_i`` on the stream ``h`` (B, C_h, H, W) and the scaled skip (B, C_s, H, W); given a
        ``gate`` (B, C_s), the skip is unscaled and enters as ``gate * skip`` (:meth:`gated_merge`)."""
        merged = self.merge(torch.cat([h, skip], dim=1)) if gate is None else self.gated_merge(h, skip, gate)
        h = self.res(merged, temb)
        return self.up(F.interpolate(h, scale_factor=2.0, mode="nearest")) if self.up is not None else h

    def gated_merge(self, h: Tensor, skip: Tensor, gate: Tensor) -> Tensor:
        """The merge of ``[h, g * skip]`` with the gate ``g`` folded into the merge's weight.

        Per sample ``b`` the 1x1 convolution is ``W_h h_b + W_s (g_b * skip_b) + bias`` over the H*W
        positions, and ``W_s (g_b * skip_b) = (W_s diag(g_b)) skip_b``: the gate scales the columns of
        the small (B, out, C_s) weight instead of the (B, C_s, H, W) skip, and two batched matrix
        products replace the concatenation. That spares the gated skip, the concatenation and, in
        the backward pass, the gate's two full-size products; the value is the same as merging
        ``cat([h, g[..., None, None] * skip])``, up to float rounding.

        Args:
            h: the decoder stream, (B, C_h, H, W).
            skip: the unscaled skip ``a_i(x)``, (B, C_s, H, W).
            gate: the per-sample, per-channel gate ``kappa_i``, (B, C_s).

        Returns:
            (B, out, H, W), as :attr:`merge` of the gated concatenation.
        """
        B, _, H, W = h.shape
        w_h, w_s = self.merge.weight.flatten(1).split([h.shape[1], skip.shape[1]], dim=1)
        out = torch.baddbmm(self.merge.bias[:, None], w_h.expand(B, -1, -1), h.flatten(2))
        out = torch.baddbmm(out, w_s * gate[:, None, :], skip.flatten(2))
        return out.view(B, -1, H, W)


class UNet(nn.Module):
    """Convolutional noise-prediction UNet ``eps_theta(x_t, t)`` with ``N`` long skips.

    Args:
        in_chans: image channels.
        base_channels: width of the first level.
        channel_mults: one entry per resolution level; level ``l`` has
            ``base_channels * channel_mults[l]`` channels and runs at ``1 / 2^l`` of the input size.
        blocks_per_level: encoder blocks per level; ``N = len(channel_mults) * blocks_per_level``.
        mid_attention: self-attention in the bottleneck.
        dropout: dropout inside residual blocks.
        scaling: how long skips enter the decoder blocks; default none.
    """

    def __init__(
        self,
        in_chans: int = 3,
        base_channels: int = 64,
        channel_mults: Sequence[int] = (1, 1, 1),
        blocks_per_level: int = 2,
        mid_attention: bool = True,
        dropout: float = 0.0,
        scaling: SkipScaling | None = None,
    ):
        super().__init__()
        if not channel_mults or min(channel_mults) < 1 or blocks_per_level < 1 or base_channels < 1:
            raise ValueError("need at least one level, positive channel_mults, blocks_per_level and base_channels")
        self.in_chans, self.base_channels = in_chans, base_channels
        self.downsamplings = len(channel_mults) - 1
        time_dim = 4 * base_channels
        self.time_mlp = nn.Sequential(
            nn.Linear(base_channels, time_dim), nn.SiLU(), nn.Linear(time_dim, time_dim)
        )
        self.stem = nn.Conv2d(in_chans, base_channels, 3, padding=1)

        widths, downs, ch = [], [], base_channels
        for level, mult in enumerate(channel_mults):
            for b in range(blocks_per_level):
                widths.append(base_channels * mult)
                downs.append(level > 0 and b == 0)
        self.encoder = nn.ModuleList()
        for w, down in zip(widths, downs):
            self.encoder.append(EncoderBlock(ch, w, time_dim, down, dropout))
            ch = w

        mid = [ResBlock(ch, ch, time_dim, dropout)] + ([SelfAttention(ch)] if mid_attention else [])
        self.mid = nn.ModuleList(mid + [ResBlock(ch, ch, time_dim, dropout)])

        decoder = []  # built innermost first, stored as b_1 .. b_N
        for w, down in zip(widths[::-1], downs[::-1]):
            decoder.append(DecoderBlock(ch, w, w, time_dim, up=down, dropout=dropout))
            ch = w
        self.decoder = nn.ModuleList(decoder[::-1])
        self.out = nn.Sequential(group_norm(ch), nn.SiLU(), nn.Conv2d(ch, in_chans, 3, padding=1))

        self.scaling = scaling if scaling is not None else SkipScaling()
        self.scaling.bind(widths)

    @property
    def n_skips(self) -> int:
        """``N``, the number of long skip connections."""
        return len(self.encoder)

    @property
    def encoder_blocks(self) -> list[nn.Module]:
        """``a_1 .. a_N`` (i = 1 outermost)."""
        return list(self.encoder)

    @property
    def decoder_blocks(self) -> list[nn.Module]:
        """``b_1 .. b_N``: ``b_i`` consumes skip ``i``."""
        return list(self.decoder)

    def forward(self, x: Tensor, t: Tensor) -> Tensor:
        """Predict the noise: ``x`` (B, C, H, W), ``t`` (B,) -> (B, C, H, W)."""
        if x.dim() != 4 or x.shape[1] != self.in_chans:
            raise ValueError(f"expected input (B, {self.in_chans}, H, W), got {tuple(x.shape)}")
        if x.shape[-1] % 2**self.downsamplings or x.shape[-2] % 2**self.downsamplings:
            raise ValueError(
                f"H and W must be divisible by {2 ** self.downsamplings} for {self.downsamplings} downsamplings, "
                f"got {tuple(x.shape[-2:])}"
            )
        temb = self.time_mlp(timestep_embedding(t, self.base_channels).to(x.dtype))
        h, skips = self.stem(x), []
        for block in self.encoder:
            h = block(h, temb)
            skips.append(h)
        for layer in self.mid:
            h = layer(h, temb)
        for i in range(self.n_skips, 0, -1):
            h = self._decode(i, h, skips[i - 1], temb)
        return self.out(h)

    def _decode(self, i: int, h: Tensor, skip: Tensor, temb: Tensor) -> Tensor:
        """Decoder block ``b_i`` on the stream ``h`` and the skip ``a_i(x)``, both (B, C, H, W).

        With autograd on, LS's gate is folded into the merge (:meth:`DecoderBlock.gated_merge`),
        which spares the backward pass its full-size products. Otherwise, and for every other method,
        the scaling object scales ``h`` and the skip, so hooks on it (which read the gates a model
        applies) see ``kappa_i * a_i(x)``.
        """
        gate = self.scaling.gate(skip, i) if torch.is_grad_enabled() else None
        if gate is None:
            h, skip = self.scaling(h, skip, i)
        return self.decoder[i - 1](h, skip, temb, gate)
