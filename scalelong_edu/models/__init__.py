"""The two backbones, both in the paper's Eq. (3) form, and named presets.

Both models take a :class:`~scalelong_edu.scaling.SkipScaling` object, expose ``n_skips`` and
their encoder/decoder blocks ``a_i``/``b_i`` in order (i = 1 outermost), and map
``(x_t (B, C, H, W), t (B,)) -> eps_hat (B, C, H, W)``.
"""

from __future__ import annotations

from torch import nn

from ..scaling import make_scaling
from .unet import UNet
from .uvit import UViT

PRESETS: dict[str, tuple[type[nn.Module], dict]] = {
    # conv UNets: constant width, so every skip has the same channel count and shared LS applies
    "unet-ci": (UNet, dict(base_channels=16, channel_mults=(1, 1), blocks_per_level=1, mid_attention=False)),
    "unet-s": (UNet, dict(base_channels=32, channel_mults=(1, 1, 1), blocks_per_level=2)),
    "unet-m": (UNet, dict(base_channels=96, channel_mults=(1, 1, 1), blocks_per_level=2)),
    # U-ViTs; "uvit-cifar" is the official CIFAR-10 U-ViT-S/2 (44M parameters)
    "uvit-ci": (UViT, dict(patch_size=4, embed_dim=64, depth=4, num_heads=2)),
    "uvit-s": (UViT, dict(patch_size=4, embed_dim=96, depth=12, num_heads=4)),
    "uvit-m": (UViT, dict(patch_size=2, embed_dim=256, depth=12, num_heads=4)),
    "uvit-cifar": (UViT, dict(patch_size=2, embed_dim=512, depth=12, num_heads=8)),
}


def build_model(
    preset: str, in_chans: int, img_size: int, method: str = "none", kappa: float = 0.5, **overrides
) -> nn.Module:
    """A model from a preset, with the named skip-scaling method.

    Args:
        preset: a key of :data:`PRESETS`.
        in_chans: image channels.
        img_size: image side (U-ViT needs it; the conv UNet checks it at the first forward).
        method, kappa: see :func:`scalelong_edu.scaling.make_scaling`.
        overrides: replace preset arguments, e.g. ``depth=20`` for a deeper U-ViT.
    """
    if preset not in PRESETS:
        raise ValueError(f"unknown model preset {preset!r}; choose one of {', '.join(PRESETS)}")
    for name, value, example in (("in_chans", in_chans, "1 for grey, 3 for colour"), ("img_size", img_size, "16")):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int (e.g. {example}), got {value!r}")
    cls, kwargs = PRESETS[preset]
    kwargs = {**kwargs, **overrides, "in_chans": in_chans, "scaling": make_scaling(method, kappa)}
    if cls is UViT:
        kwargs["img_size"] = img_size
    model = cls(**kwargs)
    if cls is UNet and img_size % 2**model.downsamplings:
        raise ValueError(
            f"img_size {img_size} must be divisible by {2**model.downsamplings} for the "
            f"{model.downsamplings} downsamplings of {preset!r}"
        )
    return model


def count_parameters(model: nn.Module) -> int:
    """Number of trainable parameters."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


__all__ = ["UNet", "UViT", "PRESETS", "build_model", "count_parameters"]
