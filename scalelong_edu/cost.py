"""What training will cost, said before it is spent.

Before a cell trains, it says what it will train (runs x steps, model, dataset) and how long that
should take on this device, and it refuses to start more than :data:`BUDGET_MINUTES` on its own:
the book's text rests on committed results, so long training is always the reader's choice
(``SCALELONG_TRAIN=all``, :func:`default_budget`).

Two estimates of the same work (:class:`Work`, counted from the experiment's spec):

* :func:`t4_minutes` -- arithmetic: floating-point operations (PyTorch's ``FlopCounterMode``, a
  multiply-add = 2 FLOPs) over :data:`T4_TFLOPS`, the effective rate of a Colab T4 (65 TFLOP/s
  peak in fp16 on tensor cores; small-batch training under autocast reaches about a quarter).
  It needs no GPU, so the tests check every chapter's live work against the budget with it.
* :func:`estimate` -- on the device at hand: a few real training steps of each model are timed
  (:func:`seconds_per_step`), and the evaluations are added in proportion to their FLOPs.

FLOPs are counted on the ``meta`` device at batch 2 and scaled to the real batch: every layer of these models costs the
same per image. Evaluation counts the probes (one training step's worth each), the DDIM samples
of the Frechet distances and of the end grid (a forward pass per image and step), and the end
probes (robustness: a forward per noise level; Lipschitz: about ten power iterations of a
forward and a backward pass). The estimate ignores data loading and Python overhead.
"""

from __future__ import annotations

import copy
import functools
import os
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Sequence

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from .diffusion import eps_loss, linear_schedule
from .models import count_parameters
from .train import TrainConfig, Trainer, load_checkpoint

T4_TFLOPS = 16.0
"""Effective TFLOP/s of a Colab T4 training these models under float16 autocast."""
BUDGET_MINUTES = 25.0
"""The most minutes of training a notebook cell starts without the reader asking for more."""
TRAIN_VAR = "SCALELONG_TRAIN"
"""``SCALELONG_TRAIN=all``: train every experiment of a chapter (at the ``gpu`` profile on a GPU),
with no budget. Unset: the text comes from the committed results, and live training stays within
:data:`BUDGET_MINUTES`."""
LIPSCHITZ_PASSES = 30
"""Forward-pass equivalents of the end-of-run Lipschitz probe (10 power iterations, each a
Jacobian-vector and a vector-Jacobian product, over all blocks)."""


def train_everything() -> bool:
    """Whether the reader asked for every experiment to be trained (``SCALELONG_TRAIN=all``)."""
    value = os.environ.get(TRAIN_VAR, "")
    if value not in ("", "all"):
        raise ValueError(f"{TRAIN_VAR}={value!r} is not understood: set it to 'all' (train every experiment, "
                         "no budget) or leave it unset")
    return value == "all"


def default_budget() -> float | None:
    """:data:`BUDGET_MINUTES`, or ``None`` (no limit) when the reader set ``SCALELONG_TRAIN=all``."""
    return None if train_everything() else BUDGET_MINUTES


@dataclass(frozen=True)
class ModelCost:
    """FLOPs of one model at one batch size.

    Attributes:
        name: what the reader is told, e.g. ``"uvit-m (11.1M parameters)"``.
        step: one training step (forward, loss, backward) at the global batch.
        forward: one forward pass of one image.
    """

    name: str
    step: float
    forward: float


def model_cost(model: nn.Module, name: str, channels: int, image_size: int, batch_size: int) -> ModelCost:
    """Count :class:`ModelCost` for ``model`` on images of ``channels x image_size x image_size``.
    The count runs on PyTorch's ``meta`` device (a copy is moved there): shapes only, no arithmetic,
    so it takes about a second whatever the model's size."""
    if any(p.device.type != "meta" for p in model.parameters()):
        model = copy.deepcopy(model).to("meta")
    x0 = torch.zeros(2, channels, image_size, image_size, device="meta")
    schedule = linear_schedule()
    with FlopCounterMode(display=False) as counter:
        eps_loss(model, x0, schedule).backward()
    step = counter.get_total_flops() / 2 * batch_size
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        eps_loss(model, x0, schedule)
    n = count_parameters(model)
    size = f"{n / 1e6:.1f}M" if n >= 1e6 else f"{n / 1e3:.0f}k"
    return ModelCost(f"{name} ({size} parameters)", step, counter.get_total_flops() / 2)


@dataclass(frozen=True)
class RunWork:
    """One run's work: ``steps`` training steps and the evaluations, in steps and image-forwards."""

    model: ModelCost
    steps: int
    probe_steps: int
    image_forwards: int

    @property
    def flops(self) -> float:
        return (self.steps + self.probe_steps) * self.model.step + self.image_forwards * self.model.forward


@dataclass(frozen=True)
class Work:
    """What a cell will train: runs (each with its model), on a dataset."""

    runs: tuple[RunWork, ...]
    dataset: str
    image_size: int
    batch_size: int

    @property
    def flops(self) -> float:
        return sum(run.flops for run in self.runs)

    def __str__(self) -> str:
        models = ", ".join(dict.fromkeys(run.model.name for run in self.runs))
        steps = sorted({run.steps for run in self.runs})
        steps_text = f"{steps[0]:,}" if len(steps) == 1 else f"{steps[0]:,}-{steps[-1]:,}"
        runs = len(self.runs)
        return (f"{runs} run{'s' * (runs != 1)} x {steps_text} steps of {models} on {self.dataset} at "
                f"{self.image_size} px, batch {self.batch_size}")


def t4_minutes(work: Work, tflops: float = T4_TFLOPS) -> float:
    """Minutes ``work`` takes on a Colab T4 by its FLOPs at ``tflops`` effective TFLOP/s."""
    return work.flops / (tflops * 1e12) / 60


def seconds_per_step(model: nn.Module, config: TrainConfig, channels: int, image_size: int,
                     device: torch.device, steps: int = 3, max_seconds: float = 10.0) -> float:
    """Seconds of one training step of a copy of ``model`` under ``config`` (batch, AMP) on
    ``device``, on random images: the mean of ``steps`` steps after one warm-up step, or of as many
    as fit in ``max_seconds`` (at least one), so that a model too large for the device is not timed
    for minutes."""
    images = torch.rand(2 * config.batch_size, channels, image_size, image_size) * 2 - 1
    trainer = Trainer(copy.deepcopy(model), images, linear_schedule(), replace(config, steps=steps + 1),
                      device=device, progress=False)
    trainer.train_step()
    _synchronize(trainer.device)
    start, timed = time.perf_counter(), 0
    while timed < steps and (timed == 0 or time.perf_counter() - start < max_seconds):
        trainer.train_step()
        _synchronize(trainer.device)
        timed += 1
    return (time.perf_counter() - start) / timed


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@dataclass(frozen=True)
class Estimate:
    """How long ``work`` should take on ``device``, and how that was found."""

    work: Work
    minutes: float
    device: str
    basis: str

    def __str__(self) -> str:
        return f"{self.work}: about {_duration(self.minutes)} on {self.device} ({self.basis})"


def _duration(minutes: float) -> str:
    if minutes < 1:
        return f"{minutes * 60:.0f} s"
    return f"{minutes:.1f} min" if minutes < 90 else f"{minutes / 60:.1f} h"


def estimate(work: Work, timings: Sequence[float], device: torch.device) -> Estimate:
    """Minutes of ``work`` on ``device`` from ``timings``, the measured seconds of one training step
    of each run's model (in run order): each run's evaluations are added in proportion to their
    FLOPs."""
    if len(timings) != len(work.runs):
        raise ValueError(f"one step time per run is needed: {len(work.runs)} runs, {len(timings)} timings")
    seconds = sum(t * run.flops / run.model.step for t, run in zip(timings, work.runs))
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else device.type
    low, high = f"{min(timings):.3g}", f"{max(timings):.3g}"
    steps = low if low == high else f"{low}-{high}"
    return Estimate(work, seconds / 60, name, f"{steps} s a training step, measured here; evaluations added by their "
                    "FLOPs")


class BudgetExceeded(RuntimeError):
    """A cell was about to start more training than its budget allows without the reader asking."""


def check_budget(estimate: Estimate, budget: float | None, command: str) -> None:
    """Raise :class:`BudgetExceeded` when ``estimate`` is over ``budget`` minutes (``None``: no limit),
    saying how to train anyway (``command``: the shell command that trains it)."""
    if budget is not None and estimate.minutes > budget:
        raise BudgetExceeded(
            f"{estimate}: more than the {budget:g} minutes a cell starts on its own. The book's text does not "
            f"need this training (it rests on the committed results). To train it anyway, set {TRAIN_VAR}=all "
            f"(in the shell, or os.environ[{TRAIN_VAR!r}] = 'all' before the first cell) or run `{command}`.")


def announce(plan: Estimate, budget: float | None, command: str, say: Callable[[str], None] | None = None) -> None:
    """Say (default: print) what is about to be trained and how long it should take (``plan``), then
    :func:`check_budget` it against ``budget`` (``None``: :func:`default_budget`)."""
    (say or functools.partial(print, flush=True))(f"to train: {plan}")
    check_budget(plan, default_budget() if budget is None else budget, command)


def fit_or_load(trainer: Trainer, checkpoint: str | Path, model: str, dataset: str, budget: float | None = None,
                checkpoint_every: int = 500) -> Trainer:
    """``trainer`` trained to ``config.steps``: loaded from ``checkpoint`` when that holds the finished
    run (:meth:`~scalelong_edu.train.Trainer.fit` checks that it is this run), else trained into it
    (resuming what it holds) after saying what that costs here and checking it against ``budget``
    (:func:`announce`). ``model`` and ``dataset`` name what is trained, for the message."""
    config, images = trainer.config, trainer.images
    done = load_checkpoint(checkpoint)["step"] if Path(checkpoint).exists() else 0
    if done < config.steps:
        size = images.shape[-1]
        work = Work((RunWork(model_cost(trainer.model, model, images.shape[1], size, config.batch_size),
                             config.steps - done, 0, 0),), dataset, size, config.batch_size)
        seconds = seconds_per_step(trainer.model, config, images.shape[1], size, trainer.device)
        announce(estimate(work, [seconds], trainer.device), budget, "make execute")
    trainer.fit(checkpoint=checkpoint, checkpoint_every=checkpoint_every)
    if done >= config.steps:
        print(f"loaded the trained model from {Path(checkpoint).name} (step {trainer.step:,} of {config.steps:,})")
    return trainer
