"""The sinusoidal time embedding both backbones feed their time input through."""

from __future__ import annotations

import math

import torch
from torch import Tensor


def timestep_embedding(t: Tensor, dim: int, max_period: float = 10_000.0) -> Tensor:
    """Transformer-style sinusoidal features of a (possibly fractional) time.

    Feature ``k < dim/2`` is ``cos(t w_k)`` and feature ``dim/2 + k`` is ``sin(t w_k)`` with
    frequencies ``w_k = max_period ** (-k / (dim/2))``; an odd ``dim`` is padded with a zero.

    Args:
        t: times (B,), e.g. DDPM step indices or ``999 t`` for the VP-SDE.
        dim: embedding size.

    Returns:
        (B, dim) float32.
    """
    if t.dim() != 1:
        raise ValueError(f"t must have shape (B,), got {tuple(t.shape)}")
    half = dim // 2
    freqs = torch.exp(-math.log(max_period) * torch.arange(half, device=t.device, dtype=torch.float32) / half)
    angles = t.float()[:, None] * freqs[None]
    emb = torch.cat([torch.cos(angles), torch.sin(angles)], dim=-1)
    return torch.nn.functional.pad(emb, (0, dim % 2))
