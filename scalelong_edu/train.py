"""One trainer for every chapter: the eps-prediction objective (Eq. 2) with AdamW.

What it does, in order of a step: take the next global batch of a seeded epoch permutation,
draw ``t`` and ``eps`` for the whole global batch from the run's own generator (so one process
and ``torchrun`` with several see the same numbers), keep this rank's slice, compute the loss
(under autocast when ``config.amp`` asks for it), backpropagate, optionally clip, step AdamW
after a linear warm-up, update the EMA copy, and call the callbacks due at this step.

A checkpoint holds everything a run's future depends on (model, EMA, optimizer, LR schedule,
grad scaler, step, data order, RNG states, spec, package version), so ``K`` steps, a save, a
load and ``K`` more steps give bit for bit the parameters of ``2K`` uninterrupted steps. It
also records what defines the run (:func:`run_identity`: architecture, skip scaling, schedule,
data), so resuming it into a different run is refused, and it never holds non-finite values.
"""

from __future__ import annotations

import copy
import hashlib
import math
import numbers
import os
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel

from . import __version__
from .diffusion import Schedule, eps_loss
from .files import atomic_write, check_writable
from .scaling import SkipScaling

CHECKPOINT_FORMAT = 2
#: settings a checkpoint may be resumed with changed, when asked (``fit(..., new_settings=True)``)
RESUMABLE_CHANGES = ("steps", "lr", "grad_clip", "warmup")
AMP_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16}


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
        amp: mixed precision. ``True``: float16 autocast with loss scaling on CUDA, off on other
            devices. ``"float16"`` or ``"bfloat16"``: that autocast dtype on any device, the CPU
            included (float16 with loss scaling), e.g. to exercise a GPU's AMP path on a CPU.
            ``False``: full float32.
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
    amp: bool | str = True
    seed: int = 0
    log_every: int = 10

    def __post_init__(self):
        for name in ("steps", "batch_size", "warmup", "seed", "log_every"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Integral):
                raise ValueError(f"{name} must be a whole number (an int), got {value!r}")
        for name, low in (("steps", 1), ("batch_size", 1), ("log_every", 1), ("warmup", 0)):
            if getattr(self, name) < low:
                raise ValueError(f"{name} must be >= {low}, got {getattr(self, name)!r}")
        if not _finite_number(self.lr) or not self.lr > 0:
            raise ValueError(f"lr must be a finite number > 0 (e.g. 2e-4), got {self.lr!r}")
        if not _finite_number(self.ema_decay) or not 0 <= self.ema_decay < 1:
            raise ValueError(f"ema_decay must be in [0, 1) (e.g. 0.999), got {self.ema_decay!r}")
        if not _finite_number(self.weight_decay) or self.weight_decay < 0:
            raise ValueError(f"weight_decay must be a finite number >= 0, got {self.weight_decay!r}")
        if len(self.betas) != 2 or not all(_finite_number(b) and 0 <= b < 1 for b in self.betas):
            raise ValueError(f"betas must be two numbers in [0, 1) (e.g. (0.99, 0.999)), got {self.betas!r}")
        if self.grad_clip is not None and not (_finite_number(self.grad_clip) and self.grad_clip > 0):
            raise ValueError(f"grad_clip must be a number > 0 or None, got {self.grad_clip!r}")
        if not isinstance(self.amp, bool) and self.amp not in AMP_DTYPES:
            raise ValueError(f"amp must be True, False, 'float16' or 'bfloat16', got {self.amp!r}")

    def amp_dtype(self, device: torch.device) -> torch.dtype | None:
        """The autocast dtype on ``device``, or ``None`` for full precision (see ``amp``)."""
        if self.amp is True:
            return torch.float16 if device.type == "cuda" else None
        return AMP_DTYPES[self.amp] if self.amp else None


def _finite_number(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)


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
    """``preferred``, else ``$SCALELONG_DEVICE``, else the first of cuda, mps, cpu available.

    Raises a ValueError for a name torch does not know or a device this machine does not have.
    """
    name = preferred or os.environ.get("SCALELONG_DEVICE")
    if name:
        try:
            device = torch.device(name)
        except RuntimeError:
            raise ValueError(f"unknown device {name!r}; use cpu, cuda, cuda:0, ... or mps") from None
        if (device.type == "cuda" and not torch.cuda.is_available()) or (device.type == "mps" and not _mps_available()):
            raise ValueError(f"device {name!r} is not available on this machine; use cpu (or leave it unset)")
        return device
    if torch.cuda.is_available():
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
    if _mps_available():
        return torch.device("mps")
    return torch.device("cpu")


def _mps_available() -> bool:
    return getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available()


def init_distributed() -> tuple[int, int]:
    """Join the process group ``torchrun`` set up (NCCL on CUDA, gloo on CPU); ``(rank, world)``."""
    world = int(os.environ.get("WORLD_SIZE", 1))
    if world > 1 and not dist.is_initialized():
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    return (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)


class NonFiniteLossError(FloatingPointError):
    """The loss or the gradient became NaN or infinite; the weights were not updated with it.

    Attributes:
        step: the step that failed.
        checkpoint: the last checkpoint this trainer wrote or resumed from (finite by
            construction: :meth:`Trainer.save` never writes non-finite state), or ``None``.
    """

    def __init__(self, message: str, step: int, checkpoint: Path | None = None):
        super().__init__(message)
        self.step, self.checkpoint = step, checkpoint


def check_images(images: Tensor) -> None:
    """Raise unless ``images`` is a float (N, C, H, W) tensor with values in [-1, 1]."""
    if images.dim() != 4 or images.shape[0] < 1:
        raise ValueError(f"images must be (N, C, H, W), got {tuple(images.shape)}")
    if not images.is_floating_point():
        raise ValueError(
            f"images are {images.dtype}, but the trainer expects floats in [-1, 1]: convert 0..255 pixels with "
            "images.float() / 127.5 - 1 (load_dataset(...).tensors() already gives that)"
        )
    low, high = images.min().item(), images.max().item()
    if not (-1 - 1e-3 <= low and high <= 1 + 1e-3):
        raise ValueError(
            f"images range over [{low:.4g}, {high:.4g}], but the trainer expects [-1, 1]: "
            "map 0..255 with x / 127.5 - 1 and 0..1 with 2 * x - 1"
        )


def run_identity(model: nn.Module, images: Tensor, schedule: Schedule) -> dict[str, str]:
    """What defines a run besides its optimisation settings, as readable strings.

    ``architecture`` (class, parameter count and a hash of every tensor's name and shape),
    ``skip scaling`` (method and its constants, e.g. ``method='cs', n_skips=6, kappa=0.5``),
    ``schedule`` (its repr and a hash of its ``alpha_bars``) and ``data`` (shape, dtype and a
    SHA-256 of the training images). Checkpoints store it; resuming compares it field by field.
    """
    shapes = [(name, tuple(t.shape)) for name, t in model.state_dict().items()]
    scaling = next((m for m in model.modules() if isinstance(m, SkipScaling)), None)
    schedule_text = repr(schedule)
    if isinstance(getattr(schedule, "alpha_bars", None), Tensor):
        schedule_text += f", alpha_bars sha256 {_sha(schedule.alpha_bars)}"
    n, c, h, w = images.shape
    return {
        "architecture": f"{type(model).__name__}, {sum(p.numel() for p in model.parameters()):,} parameters, "
        f"shapes sha256 {hashlib.sha256(repr(shapes).encode()).hexdigest()[:12]}",
        "skip scaling": scaling.extra_repr() if scaling is not None else "no SkipScaling module",
        "schedule": schedule_text,
        "data": f"{n} images {c}x{h}x{w} {str(images.dtype).removeprefix('torch.')}, sha256 {_sha(images)}",
    }


def _sha(tensor: Tensor) -> str:
    raw = tensor.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy()
    return hashlib.sha256(raw).hexdigest()[:12]


class Trainer:
    """Train a noise-prediction network ``model(x_t, time)`` on images in [-1, 1].

    Args:
        model: the network (e.g. from :func:`scalelong_edu.models.build_model`).
        images: the training set (N, C, H, W), float in [-1, 1], kept on the CPU.
        schedule: the noise schedule (:mod:`scalelong_edu.diffusion`).
        config: optimisation settings.
        device: default from :func:`pick_device`.
        callbacks: probes, sample grids, ... (:class:`Callback`).
        spec: a JSON-like description of the run, stored in checkpoints and checked on load
            (the model, scaling, schedule and data are checked whatever it says).
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
        check_images(images)
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
        self.lr_schedule = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda s: self._warmup_factor(s))
        self.amp_dtype = config.amp_dtype(self.device)
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=self.amp_dtype == torch.float16)

        self.generator = torch.Generator().manual_seed(config.seed)
        self.step = 0
        self.perm, self.pos = torch.empty(0, dtype=torch.long), 0
        self.history: list[dict[str, float]] = []
        self.resumes: list[dict[str, Any]] = []  # settings changed on resuming, with the step
        self.last_checkpoint: Path | None = None
        self._identity: dict[str, str] | None = None

    def _warmup_factor(self, s: int) -> float:
        """Linear warm-up to the peak learning rate over ``config.warmup`` steps, then constant."""
        return min(1.0, (s + 1) / max(self.config.warmup, 1))

    @property
    def identity(self) -> dict[str, str]:
        """:func:`run_identity` of this trainer's model, images and schedule (computed once)."""
        if self._identity is None:
            self._identity = run_identity(self.model, self.images, self.schedule)
        return self._identity

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
        """One optimisation step; returns the (global-batch mean) loss.

        Raises :class:`NonFiniteLossError` before the optimizer step when the loss or (without
        float16 loss scaling, whose scaler skips such steps itself) the gradient norm is not finite.
        """
        step = self.step + 1
        due = self._due(step)
        for cb in due:
            cb.on_step_start(self, step)
        x0, t, noise = self._next_batch()
        self.model.train()
        with torch.autocast(self.device.type, dtype=self.amp_dtype, enabled=self.amp_dtype is not None):
            loss = eps_loss(self.net, x0, self.schedule, t=t, noise=noise)
        self.optimizer.zero_grad(set_to_none=True)
        self.scaler.scale(loss).backward()
        value = self._global_mean(loss.detach())
        if not math.isfinite(value):
            raise self._diverged(step, f"the loss became {value}")
        self.scaler.unscale_(self.optimizer)
        grad_norm = float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.config.grad_clip or math.inf))
        if not self.scaler.is_enabled() and not math.isfinite(grad_norm):
            raise self._diverged(step, f"the gradient norm became {grad_norm}")
        for cb in due:
            cb.on_backward_end(self, step)
        lr = self.optimizer.param_groups[0]["lr"]
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.lr_schedule.step()
        self._update_ema()
        self.step = step
        self.history.append({"step": step, "loss": value, "grad_norm": grad_norm, "lr": lr})
        for cb in due:
            cb.on_step_end(self, step)
        return value

    def _diverged(self, step: int, what: str) -> NonFiniteLossError:
        c = self.config
        safer = f"TrainConfig(..., lr={c.lr / 10:g}, grad_clip=1.0, warmup={max(2 * c.warmup, 100)})"
        if self.last_checkpoint is not None:
            advice = (
                f"The last checkpoint, {self.last_checkpoint}, holds finite weights: resume from it with safer "
                f"settings, e.g. {safer} and fit(checkpoint={str(self.last_checkpoint)!r}, new_settings=True)."
            )
            advice += " If it diverges again, its weights are already damaged: start over."
        else:
            advice = f"No checkpoint was saved: start again with safer settings, e.g. {safer}."
        return NonFiniteLossError(
            f"{what} at step {step} (learning rate {c.lr:g}); the weights were not updated with it. {advice} "
            "A smaller kappa can also help.",
            step,
            self.last_checkpoint,
        )

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

    def fit(
        self,
        until: int | None = None,
        checkpoint: str | Path | None = None,
        checkpoint_every: int = 0,
        new_settings: bool = False,
    ) -> list[dict]:
        """Train until ``until`` steps are done (default ``config.steps``) and return the history.

        With ``checkpoint``: check that it can be written before training, resume from it when
        the file exists, save every ``checkpoint_every`` steps (0 = only at the end) and at the
        end. ``new_settings=True`` resumes it with this trainer's ``steps``, ``lr``,
        ``grad_clip`` and ``warmup`` where they differ from the checkpoint's (e.g. after a
        divergence); the change is printed and kept in :attr:`resumes` and in later checkpoints.
        """
        until = self.config.steps if until is None else until
        if checkpoint is not None:
            if self.rank == 0:
                check_writable(checkpoint, "the checkpoint")
            if Path(checkpoint).exists():
                self.load(checkpoint, new_settings=new_settings)
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
        """Everything needed to continue the run exactly, and what identifies it."""
        return {
            "format": CHECKPOINT_FORMAT,
            "version": __version__,
            "identity": self.identity,
            "spec": self.spec,
            "config": asdict(self.config),
            "resumes": self.resumes,
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

    def _non_finite_state(self) -> list[str]:
        """Names of the model, EMA and optimizer tensors that hold NaN or infinity."""
        named = [(f"model.{k}", v) for k, v in self.model.state_dict().items()]
        named += [(f"ema.{k}", v) for k, v in self.ema.state_dict().items()]
        named += [(f"optimizer.{i}.{k}", v) for i, s in self.optimizer.state.items() for k, v in s.items()]
        return [name for name, v in named if torch.is_tensor(v) and v.is_floating_point() and not v.isfinite().all()]

    def save(self, path: str | Path) -> None:
        """Write a checkpoint atomically (a temporary file, then a rename); rank 0 only.

        Non-finite state is never written: it raises :class:`NonFiniteLossError` and leaves the
        previous checkpoint in place.
        """
        bad = self._non_finite_state()
        if bad:
            raise self._diverged(self.step, f"{len(bad)} tensors became non-finite ({', '.join(bad[:3])}, ...)")
        if self.rank == 0:
            atomic_write(path, lambda tmp: torch.save(self.state_dict(), tmp))
        if self.world > 1:
            dist.barrier()
        self.last_checkpoint = Path(path)

    def load(self, path: str | Path, new_settings: bool = False) -> None:
        """Restore a checkpoint of this run written by :meth:`save`.

        Refuses, naming every field that differs, a checkpoint of another run: another
        architecture, skip scaling, schedule, data, ``spec`` or optimisation settings. With
        ``new_settings=True`` the settings in :data:`RESUMABLE_CHANGES` may differ; this
        trainer's values then apply from the checkpoint's step on (see :meth:`fit`).
        """
        state = load_checkpoint(path)
        saved_config, config = state["config"], asdict(self.config)
        changed = {k: (saved_config.get(k), v) for k, v in config.items() if k != "log_every" and saved_config.get(k) != v}
        allowed = set(RESUMABLE_CHANGES) if new_settings else set()
        differences = [(k, state["identity"].get(k), v) for k, v in self.identity.items() if state["identity"].get(k) != v]
        differences += [("spec", state["spec"], self.spec)] if state["spec"] != self.spec else []
        differences += [(k, old, new) for k, (old, new) in changed.items() if k not in allowed]
        if differences:
            lines = "\n".join(f"  {k}: {old!r} (checkpoint) vs {new!r} (this trainer)" for k, old, new in differences)
            hint = ""
            if any(k in RESUMABLE_CHANGES for k, _, _ in differences) and not new_settings:
                hint = f" To resume it with changed {', '.join(RESUMABLE_CHANGES)}, pass new_settings=True."
            raise ValueError(
                f"checkpoint {path} belongs to a different run:\n{lines}\n"
                f"Use another checkpoint path, or delete it to start over.{hint}"
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
        self.step, self.history, self.resumes = state["step"], state["history"], state["resumes"]
        self.last_checkpoint = Path(path)
        if changed:
            self._apply_new_settings(path, changed)

    def _apply_new_settings(self, path: str | Path, changed: dict[str, tuple[Any, Any]]) -> None:
        """Give the restored optimizer and LR schedule this trainer's peak learning rate; log it."""
        self.lr_schedule.base_lrs = [self.config.lr for _ in self.optimizer.param_groups]
        for group in self.optimizer.param_groups:
            group["initial_lr"] = self.config.lr
            group["lr"] = self.config.lr * self._warmup_factor(self.lr_schedule.last_epoch)
        self.resumes.append({"step": self.step, "changed": {k: list(v) for k, v in changed.items()}})
        if self.rank == 0:
            text = ", ".join(f"{k} {old!r} -> {new!r}" for k, (old, new) in changed.items())
            print(f"resuming {path} at step {self.step} with new settings: {text}", file=sys.stderr, flush=True)


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    """Read a checkpoint safely (``weights_only=True``) and check it is one of ours."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint at {path}")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # truncated, corrupt or not a torch file
        raise ValueError(f"checkpoint {path} is corrupt or incomplete ({type(e).__name__}: {e}); delete it and rerun") from e
    if not isinstance(state, dict) or "format" not in state:
        raise ValueError(f"{path} is not a scalelong_edu checkpoint")
    if state["format"] != CHECKPOINT_FORMAT:
        raise ValueError(
            f"checkpoint {path} has format {state['format']} (from version {state.get('version')}); this version "
            f"reads format {CHECKPOINT_FORMAT}: delete it and train again"
        )
    return state
