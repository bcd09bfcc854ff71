"""scalelong_edu: the helper package of the ScaleLong book.

Modules, one concept each: ``diffusion`` (schedules, forward process, loss, samplers),
``scaling`` (long-skip scaling methods), ``models`` (conv UNet and U-ViT), ``data`` (datasets),
``profiles`` (ci/cpu/gpu sizes), ``train`` (the trainer), ``probes`` (measurements of the
theorems' quantities), ``experiments`` (cached named runs), ``metrics`` (sample quality),
``plotting``/``widgets``/``diagrams`` (figures) and ``book``/``notebooks`` (chapter machinery).
"""

__version__ = "0.1.0"
