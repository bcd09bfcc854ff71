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
import shutil
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel

from . import __version__
from .diffusion import Schedule, eps_loss
from .files import atomic_write, check_free_space, check_writable
from .scaling import SkipScaling
from .workers import interrupts_deferred

CHECKPOINT_FORMAT = 2
#: settings a checkpoint may be resumed with changed, when asked (``fit(..., new_settings=True)``)
RESUMABLE_CHANGES = ("steps", "lr", "grad_clip", "warmup")
AMP_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16}
#: the fields of a checkpoint and the type each must have
CHECKPOINT_FIELDS: dict[str, type] = {
    "format": int, "version": str, "identity": dict, "spec": dict, "config": dict, "resumes": list, "step": int,
    "model": dict, "ema": dict, "optimizer": dict, "lr_schedule": dict, "scaler": dict, "data_order": dict,
    "rng": dict, "history": list,
}


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
        checkpoint: the last checkpoint this trainer wrote or resumed from (known to be finite:
            :meth:`Trainer.save` never writes non-finite state and :meth:`Trainer.load` refuses
            it), or ``None``.
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
        with interrupts_deferred():  # the first optimizer imports torch._dynamo
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

        With ``checkpoint``: check that it can be written and that its folder has room for it
        (:meth:`checkpoint_size`) before training, resume from it when the file exists, save every
        ``checkpoint_every`` steps (0 = only at the end) and at the end when it trained (a finished
        checkpoint is only read: it may be a committed file). ``new_settings=True``
        resumes it with this trainer's ``steps``, ``lr``, ``grad_clip`` and ``warmup`` where they
        differ from the checkpoint's (e.g. after a divergence); the change is printed and kept in
        :attr:`resumes` and in later checkpoints. ``until`` may not pass ``config.steps``, so every
        checkpoint's step lies within its settings.
        """
        until = self.config.steps if until is None else until
        if isinstance(until, bool) or not isinstance(until, numbers.Integral) or not 0 <= until <= self.config.steps:
            raise ValueError(f"until must be a whole number in [0, steps={self.config.steps}], got {until!r}")
        if checkpoint is not None:
            if self.rank == 0:
                check_writable(checkpoint, "the checkpoint")
                check_free_space(checkpoint, self.checkpoint_size(), "the checkpoint")
            if Path(checkpoint).exists():
                self.load(checkpoint, new_settings=new_settings)
        first, bar = self.step, None
        if self.progress and self.rank == 0 and self.step < until:
            from tqdm.auto import tqdm

            bar = tqdm(total=until, initial=self.step, desc="training", unit="step")
        try:
            while self.step < until:
                loss = self.train_step()
                if bar is not None:
                    bar.update(1)
                    if self.step % self.config.log_every == 0:
                        bar.set_postfix(loss=f"{loss:.4f}")
                if checkpoint is not None and checkpoint_every and self.step % checkpoint_every == 0:
                    self.save(checkpoint)
        finally:  # also on Ctrl-C or a divergence: the bar's last line comes before what the caller says next
            if bar is not None:
                bar.close()
        if checkpoint is not None and (self.step > first or not Path(checkpoint).exists()):
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

    def checkpoint_size(self) -> int:
        """About how many bytes :meth:`save` writes, an upper estimate for a free-space check.

        The model and its EMA copy, AdamW's two moments per parameter (``exp_avg``, ``exp_avg_sq``),
        the data order and RNG states, plus headroom: 512 bytes per tensor (file headers), 256 bytes
        per step of history and 64 KiB for the rest.
        """
        tensors = [*self.model.state_dict().values(), *self.ema.state_dict().values()]
        params = list(self.model.parameters())
        data = sum(t.numel() * t.element_size() for t in [*tensors, *params, *params])
        data += 8 * len(self.images) + self.generator.get_state().numel() + torch.get_rng_state().numel()
        return data + 512 * (len(tensors) + 3 * len(params)) + 256 * self.config.steps + 64 * 1024

    def _non_finite_state(self) -> list[str]:
        """Names of the model, EMA and optimizer tensors that hold NaN or infinity."""
        return _non_finite(_named_tensors(self.model.state_dict(), self.ema.state_dict(), self.optimizer.state))

    def save(self, path: str | Path) -> None:
        """Write a checkpoint atomically (a temporary file, then a rename); rank 0 only.

        Non-finite state is never written: it raises :class:`NonFiniteLossError` and leaves the
        previous checkpoint in place. A write that fails (a full disk) raises an OSError that names
        the file and the space it needs; the previous checkpoint stays in place, and this trainer
        keeps its state, so ``save`` can be called again.
        """
        bad = self._non_finite_state()
        if bad:
            raise self._diverged(self.step, f"{len(bad)} tensors became non-finite ({', '.join(bad[:3])}, ...)")
        if self.rank == 0:
            try:
                atomic_write(path, lambda tmp: _save_to_file(self.state_dict(), tmp))
            except OSError as e:
                raise self._write_failed(Path(path), e) from e
        if self.world > 1:
            dist.barrier()
        self.last_checkpoint = Path(path)

    def _write_failed(self, path: Path, error: OSError) -> OSError:
        kept = f"the previous checkpoint {path} is unchanged" if path.exists() else "no checkpoint was left there"
        return OSError(
            error.errno,
            f"could not write the checkpoint {path} at step {self.step} ({error.strerror or error}); it needs about "
            f"{_megabytes(self.checkpoint_size())}, {_free_space(path.parent)}; {kept}. Free some space or choose "
            "another path, then call save() again: this trainer still holds its state",
        )

    def load(self, path: str | Path, new_settings: bool = False) -> None:
        """Restore a checkpoint of this run written by :meth:`save`.

        Refuses, naming every field that differs, a checkpoint of another run: another
        architecture, skip scaling, schedule, data, ``spec`` or optimisation settings. With
        ``new_settings=True`` the settings in :data:`RESUMABLE_CHANGES` may differ; this
        trainer's values then apply from the checkpoint's step on (see :meth:`fit`).

        Refuses as well, naming the file and the field, a checkpoint that :func:`load_checkpoint`
        finds damaged, or whose tensors do not fit this trainer: model or EMA tensors of other
        shapes, Adam moments of other shapes, a data order that is not a permutation of the
        images, RNG states of another size. Nothing is restored from a refused checkpoint.
        """
        state = load_checkpoint(path)
        saved_config, config = state["config"], asdict(self.config)
        changed = {k: (saved_config.get(k), v) for k, v in config.items()
                   if k != "log_every" and saved_config.get(k) != v}
        allowed = set(RESUMABLE_CHANGES) if new_settings else set()
        saved_identity = state["identity"]
        differences = [(k, saved_identity.get(k), v) for k, v in self.identity.items() if saved_identity.get(k) != v]
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
        if state["step"] > self.config.steps:
            raise ValueError(
                f"checkpoint {path} is at step {state['step']}, past steps={self.config.steps} of this trainer: "
                f"resume it with TrainConfig(steps >= {state['step']}, ...) and new_settings=True"
            )
        self._check_fits(path, state)
        for field, part in (("lr_schedule", self.lr_schedule), ("scaler", self.scaler)):
            try:
                part.load_state_dict(state[field])
            except (KeyError, TypeError, ValueError, RuntimeError) as e:
                raise _damaged(path, field, f"does not load ({type(e).__name__}: {e})") from e
        self.model.load_state_dict(state["model"])
        self.ema.load_state_dict(state["ema"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.perm, self.pos = state["data_order"]["perm"], state["data_order"]["pos"]
        self.generator.set_state(state["rng"]["generator"])
        torch.set_rng_state(state["rng"]["torch"])
        if state["rng"]["cuda"] and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state["rng"]["cuda"])
        self.step, self.history, self.resumes = state["step"], state["history"], state["resumes"]
        self.last_checkpoint = Path(path)
        if changed:
            self._apply_new_settings(path, changed)

    def _check_fits(self, path: str | Path, state: dict[str, Any]) -> None:
        """Raise, naming the field, unless the checkpoint's tensors fit this trainer's model and data."""
        shapes = {k: v.shape for k, v in self.model.state_dict().items()}
        _check_shapes(path, "model", state["model"], shapes)
        _check_shapes(path, "ema", state["ema"], shapes)
        _check_optimizer(path, state["optimizer"], self.optimizer)
        _check_data_order(path, state["data_order"], len(self.images))
        rng = state["rng"]
        for name, now in (("generator", self.generator.get_state()), ("torch", torch.get_rng_state())):
            saved = _field(path, rng, name, torch.Tensor, prefix="rng.")
            if saved.dtype != torch.uint8 or saved.shape != now.shape:
                raise _damaged(path, f"rng.{name}", f"is a {saved.dtype} tensor of shape {tuple(saved.shape)}, "
                               f"not a torch.uint8 one of shape {tuple(now.shape)}")
        _field(path, rng, "cuda", list, prefix="rng.")

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
    """Read a checkpoint safely (``weights_only=True``) and check it is one of ours, whole and finite.

    Refuses, naming the file and the field: another format, a missing field or one of the wrong
    type (:data:`CHECKPOINT_FIELDS`), a ``step`` that is not a whole number in [0, its
    ``config.steps``], and NaN or infinite model, EMA or optimizer tensors.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint at {path}")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # truncated, corrupt or not a torch file
        raise ValueError(
            f"checkpoint {path} is corrupt or incomplete ({type(e).__name__}: {e}); delete it and rerun"
        ) from e
    if not isinstance(state, dict) or "format" not in state:
        raise ValueError(f"{path} is not a scalelong_edu checkpoint")
    if _field(path, state, "format", int) != CHECKPOINT_FORMAT:
        raise ValueError(
            f"checkpoint {path} has format {state['format']} (from version {state.get('version')}); this version "
            f"reads format {CHECKPOINT_FORMAT}: delete it and train again"
        )
    for name, kind in CHECKPOINT_FIELDS.items():
        _field(path, state, name, kind)
    steps = _field(path, state["config"], "steps", int, prefix="config.")
    if not 0 <= state["step"] <= steps:
        raise _damaged(path, "step", f"is {state['step']}, outside [0, {steps}] (its config.steps)")
    optimizer_state = _field(path, state["optimizer"], "state", dict, prefix="optimizer.")
    for i in optimizer_state:
        _field(path, optimizer_state, i, dict, prefix="optimizer.state.")
    bad = _non_finite(_named_tensors(state["model"], state["ema"], optimizer_state))
    if bad:
        more = f", as do {len(bad) - 1} more tensors" if len(bad) > 1 else ""
        raise _damaged(path, bad[0], f"holds NaN or infinite values{more}")
    return state


def _damaged(path: str | Path, field: str, problem: str) -> ValueError:
    return ValueError(f"checkpoint {path}: field {field!r} {problem}; delete it and train again")


def _field(path: str | Path, parent: dict, name: Any, kind: type, prefix: str = "") -> Any:
    """``parent[name]``, raising (naming ``prefix + name``) when it is missing or not a ``kind``."""
    if name not in parent:
        raise _damaged(path, f"{prefix}{name}", "is missing")
    value = parent[name]
    if isinstance(value, bool) or not isinstance(value, kind):
        problem = f"is {_short_repr(value)} of type {type(value).__name__}, not {kind.__name__}"
        raise _damaged(path, f"{prefix}{name}", problem)
    return value


def _short_repr(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _named_tensors(model: dict, ema: dict, optimizer_state: dict) -> Iterable[tuple[str, Any]]:
    """``(field, value)`` of the model, EMA and optimizer state, named as in a checkpoint."""
    yield from ((f"model.{k}", v) for k, v in model.items())
    yield from ((f"ema.{k}", v) for k, v in ema.items())
    for i, moments in optimizer_state.items():
        yield from ((f"optimizer.state.{i}.{k}", v) for k, v in moments.items())


def _non_finite(named: Iterable[tuple[str, Any]]) -> list[str]:
    """The names of the floating-point tensors among ``named`` that hold NaN or infinity."""
    return [name for name, v in named if torch.is_tensor(v) and v.is_floating_point() and not v.isfinite().all()]


def _check_shapes(path: str | Path, field: str, saved: dict, shapes: dict[str, torch.Size]) -> None:
    """Raise unless ``saved`` holds exactly the tensors named in ``shapes``, of those shapes."""
    for name, shape in shapes.items():
        value = _field(path, saved, name, torch.Tensor, prefix=f"{field}.")
        if value.shape != shape:
            raise _damaged(path, f"{field}.{name}", f"has shape {tuple(value.shape)}; this model's is {tuple(shape)}")
    extra = [name for name in saved if name not in shapes]
    if extra:
        raise _damaged(path, f"{field}.{extra[0]}", "is not a tensor of this model")


def _check_optimizer(path: str | Path, saved: dict, optimizer: torch.optim.Optimizer) -> None:
    """Raise unless ``saved`` has this optimizer's parameter groups and moments of its parameters' shapes."""
    groups = _field(path, saved, "param_groups", list, prefix="optimizer.")
    sizes = [len(g["params"]) for g in optimizer.param_groups]
    saved_sizes = [len(g["params"]) if isinstance(g, dict) and isinstance(g.get("params"), list) else None
                   for g in groups]
    if saved_sizes != sizes:
        raise _damaged(path, "optimizer.param_groups", f"does not hold groups of {sizes} parameters")
    params = [p for g in optimizer.param_groups for p in g["params"]]
    for i, moments in saved["state"].items():
        if not isinstance(i, int) or not 0 <= i < len(params):
            raise _damaged(path, f"optimizer.state.{i}", f"names no parameter (there are {len(params)})")
        for name in ("exp_avg", "exp_avg_sq"):
            value = _field(path, moments, name, torch.Tensor, prefix=f"optimizer.state.{i}.")
            if value.shape != params[i].shape:
                raise _damaged(path, f"optimizer.state.{i}.{name}",
                               f"has shape {tuple(value.shape)}; its parameter's is {tuple(params[i].shape)}")


def _check_data_order(path: str | Path, saved: dict, n_images: int) -> None:
    """Raise unless ``saved`` is an epoch permutation of the ``n_images`` (or none yet) and a position in it."""
    perm = _field(path, saved, "perm", torch.Tensor, prefix="data_order.")
    empty = perm.shape == (0,)
    if not empty and not (perm.dtype == torch.long and torch.equal(perm.sort().values, torch.arange(n_images))):
        raise _damaged(path, "data_order.perm", f"is not a permutation of the {n_images} training images")
    pos = _field(path, saved, "pos", int, prefix="data_order.")
    if not 0 <= pos <= len(perm):
        raise _damaged(path, "data_order.pos", f"is {pos}, outside [0, {len(perm)}] (the length of data_order.perm)")


def _save_to_file(state: dict[str, Any], path: Path) -> None:
    """``torch.save`` into ``path``; a failed write raises its own OSError (e.g. ENOSPC on a full disk).

    Given a file name, torch reports a failed write as "[enforce fail at inline_container.cc]
    unexpected pos"; written through a Python file, the OSError is kept and raised instead.
    """
    with open(path, "wb") as file:
        writer = _KeepWriteError(file)
        try:
            torch.save(state, writer)
        except RuntimeError:
            if writer.error is None:
                raise
            raise writer.error from None


class _KeepWriteError:
    """A file for ``torch.save`` that remembers the OSError its last failed write raised."""

    def __init__(self, file):
        self.file, self.error = file, None

    def write(self, data: bytes) -> int:
        try:
            return self.file.write(data)
        except OSError as e:
            self.error = e
            raise

    def flush(self) -> None:
        self.file.flush()


def _free_space(folder: Path) -> str:
    return f"{folder} has {_megabytes(shutil.disk_usage(folder).free)} free"


def _megabytes(n: int) -> str:
    return f"{n / 1e6:.1f} MB"
