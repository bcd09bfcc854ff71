"""One trainer for every chapter: the eps-prediction objective (Eq. 2) with AdamW.

What it does, in order of a step: take the next global batch of a seeded epoch permutation,
draw ``t`` and ``eps`` for the whole global batch from the run's own generator (so one process
and ``torchrun`` with several see the same numbers), keep this rank's slice, compute the loss
(under fp16 autocast on CUDA), backpropagate, optionally clip, step AdamW after a linear
warm-up, update the EMA copy, and call the callbacks due at this step.

A checkpoint holds everything a run's future depends on (model, EMA, optimizer, LR schedule,
grad scaler, step, data order, RNG states, spec, package version), so ``K`` steps, a save, a
load and ``K`` more steps give bit for bit the parameters of ``2K`` uninterrupted steps.
"""

from __future__ import annotations

import copy
import math
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel

from . import __version__
from .diffusion import Schedule, eps_loss
from .files import atomic_write

CHECKPOINT_FORMAT = 1


@dataclass(frozen=True)
class TrainConfig:
    """Optimisation settings. Defaults follow the official ScaleLong CIFAR-10 run, scaled down.

    Attributes:
        steps: total optimisation steps.
        batch_size: global batch (split evenly over ``torchrun`` processes).
        lr, weight_decay, betas: AdamW (official: 2e-4, 0.03, (0.99, 0.999)).
        warmup: steps of linear learning-rate warm-up, then constant (as the official code).
        ema_decay: decay of the parameter EMA used for sampling.
        grad_clip: clip the global gradient norm to this value; ``None`` = no clipping.
        amp: fp16 mixed precision with loss scaling on CUDA (ignored elsewhere).
        seed: seeds initialisation-independent randomness: data order, ``t``, ``eps``.
        log_every: steps between progress-bar updates.
    """

    steps: int
    batch_size: int
    lr: float = 2e-4
    weight_decay: float = 0.03
    betas: tuple[float, float] = (0.99, 0.999)
    warmup: int = 100
    ema_decay: float = 0.999
    grad_clip: float | None = None
    amp: bool = True
    seed: int = 0
    log_every: int = 10

    def __post_init__(self):
        if self.steps < 1 or self.batch_size < 1:
            raise ValueError(f"steps and batch_size must be >= 1, got {self.steps}, {self.batch_size}")
        if not self.lr > 0 or not 0 <= self.ema_decay < 1 or self.warmup < 0:
            raise ValueError("need lr > 0, 0 <= ema_decay < 1 and warmup >= 0")
        if self.grad_clip is not None and not self.grad_clip > 0:
            raise ValueError(f"grad_clip must be > 0 or None, got {self.grad_clip}")


class Callback:
    """Hooks into a step; each runs only at steps divisible by ``every`` (steps count from 1)."""

    every: int = 1

    def on_step_start(self, trainer: Trainer, step: int) -> None: ...

    def on_backward_end(self, trainer: Trainer, step: int) -> None: ...

    def on_step_end(self, trainer: Trainer, step: int) -> None: ...

    def on_fit_end(self, trainer: Trainer) -> None:
        """Called once when :meth:`Trainer.fit` finishes, whatever ``every`` is."""


class Every(Callback):
    """Call ``fn(trainer, step)`` after every ``every``-th step."""

    def __init__(self, every: int, fn: Callable[[Trainer, int], None]):
        self.every, self.fn = every, fn

    def on_step_end(self, trainer: Trainer, step: int) -> None:
        self.fn(trainer, step)


def pick_device(preferred: str | None = None) -> torch.device:
    """``preferred``, else ``$SCALELONG_DEVICE``, else the first of cuda, mps, cpu available."""
    name = preferred or os.environ.get("SCALELONG_DEVICE")
    if name:
        return torch.device(name)
    if torch.cuda.is_available():
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
    if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


def init_distributed() -> tuple[int, int]:
    """Join the process group ``torchrun`` set up (NCCL on CUDA, gloo on CPU); ``(rank, world)``."""
    world = int(os.environ.get("WORLD_SIZE", 1))
    if world > 1 and not dist.is_initialized():
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    return (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)


class NonFiniteLossError(FloatingPointError):
    """Raised when the loss becomes NaN or infinite."""


class Trainer:
    """Train a noise-prediction network ``model(x_t, time)`` on images in [-1, 1].

    Args:
        model: the network (e.g. from :func:`scalelong_edu.models.build_model`).
        images: the training set (N, C, H, W) in [-1, 1], kept on the CPU.
        schedule: the noise schedule (:mod:`scalelong_edu.diffusion`).
        config: optimisation settings.
        device: default from :func:`pick_device`.
        callbacks: probes, sample grids, ... (:class:`Callback`).
        spec: a JSON-like description of the run, stored in checkpoints and checked on load.
        progress: show a ``tqdm`` bar with the loss.
    """

    def __init__(
        self,
        model: nn.Module,
        images: Tensor,
        schedule: Schedule,
        config: TrainConfig,
        device: torch.device | str | None = None,
        callbacks: Sequence[Callback] = (),
        spec: dict[str, Any] | None = None,
        progress: bool = True,
    ):
        if images.dim() != 4 or images.shape[0] < 1:
            raise ValueError(f"images must be (N, C, H, W), got {tuple(images.shape)}")
        self.rank, self.world = init_distributed()
        if config.batch_size % self.world:
            raise ValueError(f"batch_size {config.batch_size} must be divisible by the {self.world} processes")
        self.device = torch.device(device) if device is not None else pick_device()
        self.images, self.schedule, self.config = images.cpu(), schedule, config
        self.callbacks, self.spec, self.progress = list(callbacks), spec or {}, progress

        self.model = model.to(self.device)
        self.ema = copy.deepcopy(self.model).eval().requires_grad_(False)
        self.net = DistributedDataParallel(self.model) if self.world > 1 else self.model
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(), lr=config.lr, betas=config.betas, weight_decay=config.weight_decay
        )
        warmup = max(config.warmup, 1)
        self.lr_schedule = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda s: min(1.0, (s + 1) / warmup))
        self.amp = config.amp and self.device.type == "cuda"
        self.scaler = torch.amp.GradScaler("cuda", enabled=self.amp)

        self.generator = torch.Generator().manual_seed(config.seed)
        self.step = 0
        self.perm, self.pos = torch.empty(0, dtype=torch.long), 0
        self.history: list[dict[str, float]] = []

    # -- one step ----------------------------------------------------------------------------
    def _next_batch(self) -> tuple[Tensor, Tensor, Tensor]:
        """This rank's slice of the next global batch, with its ``t`` and ``eps``."""
        B = self.config.batch_size
        if self.pos + B > len(self.perm):
            self.perm, self.pos = torch.randperm(len(self.images), generator=self.generator), 0
            if B > len(self.perm):
                raise ValueError(f"batch_size {B} exceeds the {len(self.perm)} training images")
        idx = self.perm[self.pos : self.pos + B]
        self.pos += B
        t = self.schedule.sample_t(B, "cpu", self.generator)
        noise = torch.randn((B, *self.images.shape[1:]), generator=self.generator)
        local = slice(self.rank * B // self.world, (self.rank + 1) * B // self.world)
        to = lambda x: x[local].to(self.device, non_blocking=True)  # noqa: E731
        return to(self.images[idx]), to(t), to(noise)

    def _due(self, step: int) -> list[Callback]:
        return [cb for cb in self.callbacks if step % cb.every == 0]

    def train_step(self) -> float:
        """One optimisation step; returns the (global-batch mean) loss."""
        step = self.step + 1
        due = self._due(step)
        for cb in due:
            cb.on_step_start(self, step)
        x0, t, noise = self._next_batch()
        self.model.train()
        with torch.autocast("cuda", dtype=torch.float16, enabled=self.amp):
            loss = eps_loss(self.net, x0, self.schedule, t=t, noise=noise)
        self.optimizer.zero_grad(set_to_none=True)
        self.scaler.scale(loss).backward()
        value = self._global_mean(loss.detach())
        if not math.isfinite(value):
            raise NonFiniteLossError(
                f"the loss became {value} at step {step}; try a lower learning rate (now {self.config.lr:g}), "
                "gradient clipping (grad_clip=1.0), a longer warm-up or a smaller kappa, then restart or resume "
                "from the last checkpoint"
            )
        self.scaler.unscale_(self.optimizer)
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.config.grad_clip or math.inf)
        for cb in due:
            cb.on_backward_end(self, step)
        lr = self.optimizer.param_groups[0]["lr"]
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.lr_schedule.step()
        self._update_ema()
        self.step = step
        self.history.append({"step": step, "loss": value, "grad_norm": float(grad_norm), "lr": lr})
        for cb in due:
            cb.on_step_end(self, step)
        return value

    def _global_mean(self, value: Tensor) -> float:
        if self.world > 1:
            dist.all_reduce(value)
            value = value / self.world
        return value.item()

    @torch.no_grad()
    def _update_ema(self) -> None:
        decay = self.config.ema_decay
        for e, p in zip(self.ema.parameters(), self.model.parameters()):
            e.lerp_(p.detach(), 1 - decay)
        for e, b in zip(self.ema.buffers(), self.model.buffers()):
            e.copy_(b)

    def fit(self, until: int | None = None, checkpoint: str | Path | None = None, checkpoint_every: int = 0) -> list[dict]:
        """Train until ``until`` steps are done (default ``config.steps``) and return the history.

        With ``checkpoint``: resume from it when the file exists, save every ``checkpoint_every``
        steps (0 = only at the end) and at the end.
        """
        until = self.config.steps if until is None else until
        if checkpoint is not None and Path(checkpoint).exists():
            self.load(checkpoint)
        bar = None
        if self.progress and self.rank == 0 and self.step < until:
            from tqdm.auto import tqdm

            bar = tqdm(total=until, initial=self.step, desc="training", unit="step")
        while self.step < until:
            loss = self.train_step()
            if bar is not None:
                bar.update(1)
                if self.step % self.config.log_every == 0:
                    bar.set_postfix(loss=f"{loss:.4f}")
            if checkpoint is not None and checkpoint_every and self.step % checkpoint_every == 0:
                self.save(checkpoint)
        if bar is not None:
            bar.close()
        if checkpoint is not None:
            self.save(checkpoint)
        for cb in self.callbacks:
            cb.on_fit_end(self)
        return self.history

    # -- checkpoints -------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue the run exactly."""
        return {
            "format": CHECKPOINT_FORMAT,
            "version": __version__,
            "spec": self.spec,
            "config": asdict(self.config),
            "step": self.step,
            "model": self.model.state_dict(),
            "ema": self.ema.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "lr_schedule": self.lr_schedule.state_dict(),
            "scaler": self.scaler.state_dict(),
            "data_order": {"perm": self.perm, "pos": self.pos},
            "rng": {
                "generator": self.generator.get_state(),
                "torch": torch.get_rng_state(),
                "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
            },
            "history": self.history,
        }

    def save(self, path: str | Path) -> None:
        """Write a checkpoint atomically (a temporary file, then a rename); rank 0 only."""
        if self.rank == 0:
            atomic_write(path, lambda tmp: torch.save(self.state_dict(), tmp))
        if self.world > 1:
            dist.barrier()

    def load(self, path: str | Path) -> None:
        """Restore a checkpoint written by :meth:`save` for the same spec and config."""
        state = load_checkpoint(path)
        if state["spec"] != self.spec or state["config"] != asdict(self.config):
            raise ValueError(
                f"checkpoint {path} belongs to a different run (its spec/config differ from this trainer's); "
                "use another checkpoint path or delete it to start over"
            )
        self.model.load_state_dict(state["model"])
        self.ema.load_state_dict(state["ema"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.lr_schedule.load_state_dict(state["lr_schedule"])
        self.scaler.load_state_dict(state["scaler"])
        self.perm, self.pos = state["data_order"]["perm"], state["data_order"]["pos"]
        self.generator.set_state(state["rng"]["generator"])
        torch.set_rng_state(state["rng"]["torch"])
        if state["rng"]["cuda"] and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state["rng"]["cuda"])
        self.step, self.history = state["step"], state["history"]


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    """Read a checkpoint safely (``weights_only=True``) and check it is one of ours."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint at {path}")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # truncated, corrupt or not a torch file
        raise ValueError(f"checkpoint {path} is corrupt or incomplete ({type(e).__name__}: {e}); delete it and rerun") from e
    if not isinstance(state, dict) or state.get("format") != CHECKPOINT_FORMAT:
        raise ValueError(f"{path} is not a scalelong_edu checkpoint of format {CHECKPOINT_FORMAT}")
    return state
