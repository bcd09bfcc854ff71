"""U-ViT (Bao et al., 2023): a ViT with UNet-style long skips, the backbone of ScaleLong's code.

The image is cut into patches and embedded as tokens; a time token (and a class token when
``num_classes > 0``) is prepended. ``depth // 2`` in-blocks, one mid-block and ``depth // 2``
out-blocks follow, so there are ``N = depth // 2`` long skips. In the paper's Eq. (3) terms,
in-block ``i`` is the encoder block ``a_i`` and the out-block that consumes its output is the
decoder block ``b_i``; that out-block starts with ``Linear(2D -> D)`` of ``[h, kappa_i * skip]``.

For the same configuration the parameter count equals the official ``libs/uvit.py``
(checked in ``tests/test_models.py``), and the skip-scaling object adds exactly what the
official LS modules add.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..scaling import SkipScaling
from .embedding import timestep_embedding


class Attention(nn.Module):
    """Multi-head self-attention through ``F.scaled_dot_product_attention``. (B, L, D) -> (B, L, D)."""

    def __init__(self, dim: int, num_heads: int, qkv_bias: bool = False):
        super().__init__()
        if dim % num_heads:
            raise ValueError(f"embed_dim {dim} is not divisible by num_heads {num_heads}")
        self.num_heads = num_heads
        self.qkv = nn.Linear(dim, 3 * dim, bias=qkv_bias)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: Tensor) -> Tensor:
        B, L, D = x.shape
        q, k, v = self.qkv(x).view(B, L, 3, self.num_heads, D // self.num_heads).permute(2, 0, 3, 1, 4)
        out = F.scaled_dot_product_attention(q, k, v)
        return self.proj(out.transpose(1, 2).reshape(B, L, D))


class Block(nn.Module):
    """Pre-norm transformer block; out-blocks first merge the long skip with ``Linear(2D -> D)``."""

    def __init__(self, dim: int, num_heads: int, mlp_ratio: float, qkv_bias: bool, skip: bool = False):
        super().__init__()
        self.skip_linear = nn.Linear(2 * dim, dim) if skip else None
        self.norm1 = nn.LayerNorm(dim)
        self.attn = Attention(dim, num_heads, qkv_bias)
        self.norm2 = nn.LayerNorm(dim)
        hidden = int(dim * mlp_ratio)
        self.mlp = nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim))

    def forward(self, x: Tensor, skip: Tensor | None = None) -> Tensor:
        if self.skip_linear is not None:
            x = self.skip_linear(torch.cat([x, skip], dim=-1))
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class UViT(nn.Module):
    """U-ViT noise-prediction network ``eps_theta(x_t, t)``.

    Args:
        img_size: side of the square input; must be divisible by ``patch_size``.
        patch_size: side of a patch; ``L = (img_size / patch_size)^2 + extras`` tokens.
        in_chans: image channels (1 grey, 3 colour).
        embed_dim: token width ``D``.
        depth: ``depth // 2`` in-blocks and out-blocks, so ``N = depth // 2`` long skips.
        num_heads: attention heads.
        mlp_ratio: MLP hidden width over ``D``.
        qkv_bias: bias in the query/key/value projection.
        mlp_time_embed: pass the time embedding through ``Linear-SiLU-Linear``.
        num_classes: > 0 adds a class token (class-conditional model).
        conv: end with a 3x3 convolution, as the official model does.
        scaling: how long skips enter the out-blocks (:mod:`scalelong_edu.scaling`); default none.
    """

    def __init__(
        self,
        img_size: int = 32,
        patch_size: int = 2,
        in_chans: int = 3,
        embed_dim: int = 512,
        depth: int = 12,
        num_heads: int = 8,
        mlp_ratio: float = 4.0,
        qkv_bias: bool = False,
        mlp_time_embed: bool = False,
        num_classes: int = 0,
        conv: bool = True,
        scaling: SkipScaling | None = None,
    ):
        super().__init__()
        if img_size % patch_size:
            raise ValueError(f"img_size {img_size} must be divisible by patch_size {patch_size}")
        if depth < 2:
            raise ValueError(f"depth must be >= 2 to have a long skip, got {depth}")
        self.img_size, self.patch_size, self.in_chans, self.embed_dim = img_size, patch_size, in_chans, embed_dim
        self.num_classes = num_classes
        self.extras = 2 if num_classes > 0 else 1
        self.num_tokens = self.extras + (img_size // patch_size) ** 2
        n = depth // 2

        self.patch_embed = nn.Conv2d(in_chans, embed_dim, patch_size, stride=patch_size)
        self.time_embed = (
            nn.Sequential(nn.Linear(embed_dim, 4 * embed_dim), nn.SiLU(), nn.Linear(4 * embed_dim, embed_dim))
            if mlp_time_embed
            else nn.Identity()
        )
        self.label_emb = nn.Embedding(num_classes, embed_dim) if num_classes > 0 else None
        self.pos_embed = nn.Parameter(torch.zeros(1, self.num_tokens, embed_dim))
        self.in_blocks = nn.ModuleList(Block(embed_dim, num_heads, mlp_ratio, qkv_bias) for _ in range(n))
        self.mid_block = Block(embed_dim, num_heads, mlp_ratio, qkv_bias)
        self.out_blocks = nn.ModuleList(Block(embed_dim, num_heads, mlp_ratio, qkv_bias, skip=True) for _ in range(n))
        self.norm = nn.LayerNorm(embed_dim)
        self.decoder_pred = nn.Linear(embed_dim, patch_size**2 * in_chans)
        self.final_layer = nn.Conv2d(in_chans, in_chans, 3, padding=1) if conv else nn.Identity()

        nn.init.trunc_normal_(self.pos_embed, std=0.02)
        self.apply(_init_linear)
        self.scaling = scaling if scaling is not None else SkipScaling()
        self.scaling.bind([self.num_tokens] * n)  # after init: LS keeps PyTorch's default init

    @property
    def n_skips(self) -> int:
        """``N``, the number of long skip connections."""
        return len(self.in_blocks)

    @property
    def encoder_blocks(self) -> list[nn.Module]:
        """``a_1 .. a_N`` (i = 1 outermost): the in-blocks whose outputs are the skips."""
        return list(self.in_blocks)

    @property
    def decoder_blocks(self) -> list[nn.Module]:
        """``b_1 .. b_N``: ``b_i`` is the out-block that consumes skip ``i``."""
        return list(self.out_blocks)[::-1]

    def forward(self, x: Tensor, t: Tensor, y: Tensor | None = None) -> Tensor:
        """Predict the noise: ``x`` (B, C, H, W), ``t`` (B,) [, class ``y`` (B,)] -> (B, C, H, W)."""
        if x.shape[1:] != (self.in_chans, self.img_size, self.img_size):
            raise ValueError(
                f"expected input (B, {self.in_chans}, {self.img_size}, {self.img_size}), got {tuple(x.shape)}"
            )
        if (y is None) != (self.label_emb is None):
            raise ValueError("pass class labels y exactly when the model has num_classes > 0")
        tokens = self.patch_embed(x).flatten(2).transpose(1, 2)
        extra = [self.time_embed(timestep_embedding(t, self.embed_dim).to(tokens.dtype))]
        if y is not None:
            extra.append(self.label_emb(y))
        h = torch.cat([e.unsqueeze(1) for e in extra[::-1]] + [tokens], dim=1) + self.pos_embed

        skips = []
        for block in self.in_blocks:
            h = block(h)
            skips.append(h)
        h = self.mid_block(h)
        for i, block in zip(range(self.n_skips, 0, -1), self.out_blocks):
            h, skip = self.scaling(h, skips[i - 1], i)
            h = block(h, skip)

        h = self.decoder_pred(self.norm(h))[:, self.extras :]
        return self.final_layer(self._unpatchify(h))

    def _unpatchify(self, h: Tensor) -> Tensor:
        """(B, L, p*p*C) patch tokens -> (B, C, H, W); token features are ordered (p1, p2, C)."""
        B, p, C, g = h.shape[0], self.patch_size, self.in_chans, self.img_size // self.patch_size
        return h.reshape(B, g, g, p, p, C).permute(0, 5, 1, 3, 2, 4).reshape(B, C, g * p, g * p)


def _init_linear(m: nn.Module) -> None:
    if isinstance(m, nn.Linear):
        nn.init.trunc_normal_(m.weight, std=0.02)
        if m.bias is not None:
            nn.init.zeros_(m.bias)
