"""Profiles: one switch that sizes every experiment in the book.

* ``ci``  -- tiny: the whole notebook suite runs under nbval on a 2-core CPU in minutes;
* ``cpu`` -- the default without a GPU: real but small runs, a chapter's live runs in <= 10 min
  (measured on 2 cores: a 1,200-step run takes about 1.3 min for ``unet-s`` and 1.8 min for
  ``uvit-s``, so an experiment of four runs fits);
* ``gpu`` -- the default with a GPU: CIFAR-10 with an 11M-parameter U-ViT (patch 2, N = 6),
  a chapter's four runs in about 25 minutes on a Colab T4 by ``benchmarks/t4_estimate.py``.
  The paper's U-ViT-S/2 (preset ``uvit-cifar``) costs 4x the FLOPs of ``uvit-m`` a step: too
  slow for a T4 chapter, there for readers with a bigger GPU.

The book's text rests on the committed ``cpu`` results on every device, so the profile comes from
``SCALELONG_PROFILE`` when set, else ``gpu`` if CUDA is available *and* the reader asked for every
experiment to be trained (``SCALELONG_TRAIN=all``, :mod:`scalelong_edu.cost`), else ``cpu``. What a
GPU trains by default is each chapter's "at GPU scale" section, at :func:`live_profile`.
Experiments ask their profile for sizes; notebooks never branch on it.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass

import torch

from .cost import train_everything

ENV_VAR = "SCALELONG_PROFILE"


@dataclass(frozen=True)
class Profile:
    """The sizes an experiment runs at.

    Attributes:
        name: ``ci``, ``cpu`` or ``gpu``.
        dataset, image_size: see :func:`scalelong_edu.data.load_dataset`.
        unet, uvit: model presets (:data:`scalelong_edu.models.PRESETS`).
        batch_size: global batch.
        lr: the *gentle* peak learning rate of each backbone (``"unet"``, ``"uvit"``): the one at
            which it trains well in ``steps`` steps.
        stress_lr: the *stress* learning rate of each backbone: high enough that the unscaled
            baseline is pushed hard (chosen by the ``uvit-lr-sweep`` and ``unet-lr-sweep`` experiments,
            see chapter 3).
        seeds: seeds per method in every comparison between methods (intervals need >= 2).
        steps: optimisation steps of one training run of an experiment.
        long_steps: steps of the one long run that shows what training achieves (chapter 1's
            UNet): on ``cpu``, long enough that most samples are recognisable digits.
        warmup: learning-rate warm-up steps.
        eval_every: steps between probe/metric evaluations.
        ema_decay: decay of the EMA model that samples are drawn from.
        n_samples: images drawn for sample grids and sample-quality metrics.
        sample_steps: DDIM steps when sampling.
        seed_cap: the most seeds any experiment runs at this profile (``None``: no cap), so that
            the ``ci`` profile runs the many-seed comparisons at its own size.
        breakdown_loss: a run whose final training loss reaches this broke down
            (:func:`scalelong_edu.evidence.run_table`). Predicting zero noise scores 1; the
            ``cpu`` and ``gpu`` runs are trained, so half of that is already a failure, while the
            ``ci`` profile's 30 steps leave every run near 0.8 and only a worse-than-zero one counts.
    """

    name: str
    dataset: str
    image_size: int
    unet: str
    uvit: str
    batch_size: int
    lr: dict[str, float]
    stress_lr: dict[str, float]
    seeds: int
    steps: int
    long_steps: int
    warmup: int
    eval_every: int
    ema_decay: float
    n_samples: int
    sample_steps: int
    seed_cap: int | None = None
    breakdown_loss: float = 0.5

    def as_dict(self) -> dict:
        return asdict(self)

    def learning_rate(self, backbone: str, regime: str = "gentle") -> float:
        """The peak learning rate of ``backbone`` (``"unet"`` or ``"uvit"``) in ``regime``."""
        rates = {"gentle": self.lr, "stress": self.stress_lr}
        if regime not in rates:
            raise ValueError(f"unknown regime {regime!r}; choose gentle or stress")
        if backbone not in rates[regime]:
            raise ValueError(f"unknown backbone {backbone!r}; choose one of {', '.join(rates[regime])}")
        return rates[regime][backbone]


PROFILES: dict[str, Profile] = {
    p.name: p
    for p in (
        Profile("ci", "digits8x8", 16, "unet-ci", "uvit-ci", batch_size=16, lr={"unet": 2e-4, "uvit": 2e-3},
                stress_lr={"unet": 3.2e-3, "uvit": 1.6e-2}, seeds=2, steps=30, long_steps=30, warmup=5,
                eval_every=10, ema_decay=0.9, n_samples=16, sample_steps=5, seed_cap=2, breakdown_loss=1.0),
        Profile("cpu", "mnist5k", 16, "unet-s", "uvit-s", batch_size=64, lr={"unet": 2e-4, "uvit": 2e-3},
                stress_lr={"unet": 3.2e-3, "uvit": 1.6e-2}, seeds=3, steps=1200, long_steps=6000, warmup=100,
                eval_every=25, ema_decay=0.995, n_samples=64, sample_steps=50),
        Profile("gpu", "cifar10", 32, "unet-m", "uvit-m", batch_size=128, lr={"unet": 2e-4, "uvit": 2e-4},
                stress_lr={"unet": 3.2e-3, "uvit": 1.6e-3}, seeds=3, steps=2500, long_steps=10000, warmup=250,
                eval_every=100, ema_decay=0.999, n_samples=256, sample_steps=100),
    )
}


def get_profile(name: str | None = None) -> Profile:
    """The named profile, else ``$SCALELONG_PROFILE``, else ``gpu`` with CUDA when
    ``SCALELONG_TRAIN=all``, else ``cpu`` (the committed results)."""
    name = name or os.environ.get(ENV_VAR) or ("gpu" if torch.cuda.is_available() and train_everything() else "cpu")
    if name not in PROFILES:
        raise ValueError(f"unknown profile {name!r}; choose one of {', '.join(PROFILES)} (set {ENV_VAR} or pass it)")
    return PROFILES[name]


def live_profile() -> Profile:
    """The profile of a chapter's "at GPU scale" section: ``gpu``, or ``ci`` when the book runs at
    ``ci`` (the tests run every section end to end at that size)."""
    return PROFILES["ci"] if get_profile().name == "ci" else PROFILES["gpu"]
