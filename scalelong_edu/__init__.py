"""scalelong_edu: the helper package of the ScaleLong book.

Modules, one concept each: :mod:`~scalelong_edu.diffusion` (schedules, forward process, loss,
samplers), :mod:`~scalelong_edu.scaling` (long-skip scaling methods) and
:mod:`~scalelong_edu.models` (conv UNet and U-ViT).
"""

__version__ = "0.1.0"
