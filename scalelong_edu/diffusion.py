"""Denoising diffusion: noise schedules, the forward process, the training loss and samplers.

Notation follows DDPM (Ho et al., 2020) and the ScaleLong paper, Section 2:

* forward process ``q(x_t | x_0) = N(sqrt(abar_t) x_0, (1 - abar_t) I)``, so
  ``x_t = sqrt(abar_t) x_0 + sqrt(1 - abar_t) eps`` with ``eps ~ N(0, I)``;
* the network ``eps_theta(x_t, t)`` predicts ``eps``, trained with the paper's Eq. (2),
  ``E_{t, x_0, eps} || eps - eps_theta(x_t, t) ||^2``.

Two kinds of schedule share one small interface (``sample_t``, ``alpha_bar``, ``model_time``):

* :class:`DiscreteSchedule` -- ``T`` steps, indexed ``t = 0 .. T-1`` (``linear_schedule``,
  ``cosine_schedule``);
* :class:`VPSDE` -- the continuous variance-preserving SDE of Song et al. (2021) that the
  official ScaleLong code trains with: ``t ~ U(0, 1)`` and the network sees ``999 t``.

Samplers work on a :class:`DiscreteSchedule`; ``VPSDE.discretize(T)`` gives one for a model
trained in continuous time. Every function works on any device and floating dtype: schedule
tables are kept in float64 and cast to the data's dtype and device where they are used.
"""

from __future__ import annotations

import math
from typing import Callable, Protocol

import torch
from torch import Tensor

Denoiser = Callable[[Tensor, Tensor], Tensor]
"""A network ``eps_theta(x_t, time) -> eps_hat`` with ``x_t`` of shape (B, C, H, W) and
``time`` of shape (B,) in the units the schedule's :meth:`model_time` returns."""


class Schedule(Protocol):
    """What the loss needs from a noise schedule."""

    def sample_t(self, batch: int, device: torch.device | str, generator: torch.Generator | None = None) -> Tensor:
        """Draw training times, shape (batch,)."""

    def alpha_bar(self, t: Tensor) -> Tensor:
        """``abar_t`` for times ``t`` of shape (B,); float64 (float32 on MPS), shape (B,)."""

    def model_time(self, t: Tensor) -> Tensor:
        """The time value fed to the network for times ``t`` (B,), float32."""


def _wide(x: Tensor, device: torch.device) -> Tensor:
    """``x`` on ``device`` in float64 for schedule arithmetic (float32 on MPS, which has no float64)."""
    return x.to(device=device, dtype=torch.float32 if device.type == "mps" else torch.float64)


def _broadcast(values: Tensor, like: Tensor) -> Tensor:
    """Reshape per-sample values (B,) to (B, 1, ..., 1) in ``like``'s dtype and device."""
    return values.to(device=like.device, dtype=like.dtype).view(-1, *([1] * (like.dim() - 1)))


class DiscreteSchedule:
    """A schedule of ``T`` steps given by its cumulative products ``abar_t``, t = 0 .. T-1.

    Args:
        alpha_bars: ``abar_t`` (T,), strictly decreasing in (0, 1].
        model_times: value the network sees at each step (T,); defaults to ``t`` itself.
    """

    def __init__(self, alpha_bars: Tensor, model_times: Tensor | None = None):
        alpha_bars = torch.as_tensor(alpha_bars, dtype=torch.float64).flatten()
        if alpha_bars.numel() < 2:
            raise ValueError("a schedule needs at least 2 steps")
        if not (alpha_bars > 0).all() or not (alpha_bars <= 1).all() or not (alpha_bars[1:] < alpha_bars[:-1]).all():
            raise ValueError("alpha_bars must be strictly decreasing and lie in (0, 1]")
        self.alpha_bars = alpha_bars
        self.T = alpha_bars.numel()
        self.model_times = (
            torch.arange(self.T, dtype=torch.float32)
            if model_times is None
            else torch.as_tensor(model_times, dtype=torch.float32).flatten()
        )
        if self.model_times.numel() != self.T:
            raise ValueError(f"model_times has {self.model_times.numel()} entries, expected T = {self.T}")

    @property
    def betas(self) -> Tensor:
        """Per-step variances ``beta_t = 1 - abar_t / abar_{t-1}`` (``abar_{-1} = 1``), (T,)."""
        prev = torch.cat([self.alpha_bars.new_ones(1), self.alpha_bars[:-1]])
        return 1 - self.alpha_bars / prev

    def sample_t(self, batch: int, device: torch.device | str, generator: torch.Generator | None = None) -> Tensor:
        """Uniform step indices in ``0 .. T-1``, int64 (batch,)."""
        return torch.randint(0, self.T, (batch,), device=device, generator=generator)

    def alpha_bar(self, t: Tensor) -> Tensor:
        return _wide(self.alpha_bars, t.device)[t.long()]

    def model_time(self, t: Tensor) -> Tensor:
        return self.model_times.to(t.device)[t.long()]

    def __repr__(self) -> str:
        return f"DiscreteSchedule(T={self.T}, alpha_bar[-1]={self.alpha_bars[-1].item():.3g})"


def linear_schedule(T: int = 1000, beta_start: float = 1e-4, beta_end: float = 0.02) -> DiscreteSchedule:
    """DDPM's linear schedule: ``beta_t`` evenly spaced from ``beta_start`` to ``beta_end``."""
    if T < 2:
        raise ValueError(f"T must be at least 2, got {T}")
    if not 0 < beta_start < beta_end < 1:
        raise ValueError(f"need 0 < beta_start < beta_end < 1, got {beta_start}, {beta_end}")
    betas = torch.linspace(beta_start, beta_end, T, dtype=torch.float64)
    return DiscreteSchedule(torch.cumprod(1 - betas, dim=0))


def cosine_schedule(T: int = 1000, s: float = 0.008, max_beta: float = 0.999) -> DiscreteSchedule:
    """The cosine schedule of Nichol & Dhariwal (2021): ``abar(u) ~ cos^2((u + s) / (1 + s) * pi / 2)``.

    Per-step betas are clipped at ``max_beta`` so the last step stays invertible.
    """
    if T < 2:
        raise ValueError(f"T must be at least 2, got {T}")
    u = torch.arange(T + 1, dtype=torch.float64) / T
    f = torch.cos((u + s) / (1 + s) * math.pi / 2) ** 2
    betas = (1 - f[1:] / f[:-1]).clamp(max=max_beta)
    return DiscreteSchedule(torch.cumprod(1 - betas, dim=0))


class VPSDE:
    """The variance-preserving SDE ``dx = -beta(t) x / 2 dt + sqrt(beta(t)) dw``, t in [0, 1].

    With ``beta(t) = beta_min + t (beta_max - beta_min)`` the marginal has
    ``abar(t) = exp(-beta_min t - (beta_max - beta_min) t^2 / 2)``. As in the official ScaleLong
    code, training draws ``t ~ U(0, 1)`` and the network sees ``999 t``.
    """

    def __init__(self, beta_min: float = 0.1, beta_max: float = 20.0):
        if not 0 < beta_min < beta_max:
            raise ValueError(f"need 0 < beta_min < beta_max, got {beta_min}, {beta_max}")
        self.beta_min, self.beta_max = beta_min, beta_max

    def sample_t(self, batch: int, device: torch.device | str, generator: torch.Generator | None = None) -> Tensor:
        """Uniform continuous times in [0, 1), float32 (batch,)."""
        return torch.rand(batch, device=device, generator=generator)

    def alpha_bar(self, t: Tensor) -> Tensor:
        t = _wide(t, t.device)
        return torch.exp(-self.beta_min * t - 0.5 * (self.beta_max - self.beta_min) * t**2)

    def model_time(self, t: Tensor) -> Tensor:
        return (999 * t).to(torch.float32)

    def discretize(self, T: int = 1000) -> DiscreteSchedule:
        """``T`` steps at ``t_k = (k + 1) / T``, for the DDPM/DDIM samplers."""
        t = torch.arange(1, T + 1, dtype=torch.float64) / T
        return DiscreteSchedule(self.alpha_bar(t), self.model_time(t))

    def __repr__(self) -> str:
        return f"VPSDE(beta_min={self.beta_min}, beta_max={self.beta_max})"


def q_sample(x0: Tensor, t: Tensor, schedule: Schedule, noise: Tensor | None = None) -> Tensor:
    """Draw ``x_t ~ q(x_t | x_0)`` in closed form: ``sqrt(abar_t) x_0 + sqrt(1 - abar_t) eps``.

    Args:
        x0: clean data (B, ...).
        t: times (B,) in the schedule's units.
        noise: ``eps`` (same shape as ``x0``); drawn with ``randn_like`` when omitted.
    """
    if t.shape != (x0.shape[0],):
        raise ValueError(f"t must have shape ({x0.shape[0]},) to match the batch, got {tuple(t.shape)}")
    noise = torch.randn_like(x0) if noise is None else noise
    if noise.shape != x0.shape:
        raise ValueError(f"noise shape {tuple(noise.shape)} differs from x0 shape {tuple(x0.shape)}")
    abar = _broadcast(schedule.alpha_bar(t), x0)
    return abar.sqrt() * x0 + (1 - abar).sqrt() * noise


def eps_loss(
    model: Denoiser,
    x0: Tensor,
    schedule: Schedule,
    generator: torch.Generator | None = None,
    reduce: bool = True,
    t: Tensor | None = None,
    noise: Tensor | None = None,
) -> Tensor:
    """The paper's Eq. (2): ``|| eps - eps_theta(x_t, t) ||^2`` averaged over pixels.

    Draws ``t`` from the schedule and ``eps ~ N(0, I)`` (from ``generator`` when given, so a
    seeded run repeats) unless they are passed in, forms ``x_t`` with :func:`q_sample` and
    compares the prediction.

    Returns:
        The mean over the batch (scalar), or per-sample losses (B,) when ``reduce=False``.
    """
    if t is None:
        t = schedule.sample_t(x0.shape[0], x0.device, generator)
    if noise is None:
        noise = torch.randn(x0.shape, device=x0.device, dtype=x0.dtype, generator=generator)
    x_t = q_sample(x0, t, schedule, noise)
    pred = model(x_t, schedule.model_time(t))
    if pred.shape != noise.shape:
        raise ValueError(f"the model returned shape {tuple(pred.shape)}, expected {tuple(noise.shape)}")
    per_sample = (pred.float() - noise.float()).pow(2).flatten(1).mean(1)
    return per_sample.mean() if reduce else per_sample


def _check_sampling_args(schedule: DiscreteSchedule, shape: tuple[int, ...]) -> None:
    if not isinstance(schedule, DiscreteSchedule):
        raise TypeError(
            f"samplers need a DiscreteSchedule, got {type(schedule).__name__}; "
            "for a VPSDE pass vpsde.discretize(1000)"
        )
    if len(shape) < 2:
        raise ValueError(f"shape must be (B, C, ...), got {shape}")


def _predict_x0(x_t: Tensor, eps: Tensor, abar: Tensor, clip: bool) -> Tensor:
    x0 = (x_t - (1 - abar).sqrt() * eps) / abar.sqrt()
    return x0.clamp(-1, 1) if clip else x0


@torch.no_grad()
def ddpm_sample(
    model: Denoiser,
    schedule: DiscreteSchedule,
    shape: tuple[int, ...],
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    generator: torch.Generator | None = None,
    clip: bool = True,
    progress: bool = False,
) -> Tensor:
    """DDPM ancestral sampling (Ho et al., 2020, Algorithm 2), all ``T`` steps.

    Each step predicts ``x_0`` from ``eps_theta`` (clipped to [-1, 1] when ``clip``) and draws
    ``x_{t-1}`` from the Gaussian posterior ``q(x_{t-1} | x_t, x_0)``, whose variance is
    ``beta_t (1 - abar_{t-1}) / (1 - abar_t)``.

    Returns:
        Samples of ``shape`` (B, C, H, W).
    """
    _check_sampling_args(schedule, shape)
    abars = schedule.alpha_bars.to(device=device, dtype=dtype)
    betas = schedule.betas.to(device=device, dtype=dtype)
    times = schedule.model_times.to(device)
    x = torch.randn(shape, device=device, dtype=dtype, generator=generator)
    steps = range(schedule.T - 1, -1, -1)
    for t in _maybe_tqdm(steps, progress, "DDPM"):
        eps = model(x, times[t].expand(shape[0]))
        abar, beta = abars[t], betas[t]
        abar_prev = abars[t - 1] if t > 0 else abars.new_tensor(1.0)
        x0 = _predict_x0(x, eps, abar, clip)
        mean = (abar_prev.sqrt() * beta * x0 + (1 - beta).sqrt() * (1 - abar_prev) * x) / (1 - abar)
        if t > 0:
            var = beta * (1 - abar_prev) / (1 - abar)
            x = mean + var.sqrt() * torch.randn(shape, device=device, dtype=dtype, generator=generator)
        else:
            x = mean
    return x


@torch.no_grad()
def ddim_sample(
    model: Denoiser,
    schedule: DiscreteSchedule,
    shape: tuple[int, ...],
    steps: int = 50,
    eta: float = 0.0,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    generator: torch.Generator | None = None,
    clip: bool = True,
    progress: bool = False,
) -> Tensor:
    """DDIM sampling (Song, Meng & Ermon, 2021, Eq. 12) on ``steps`` evenly spaced steps.

    ``eta = 0`` is the deterministic DDIM sampler; ``eta = 1`` matches DDPM's posterior noise.

    Returns:
        Samples of ``shape`` (B, C, H, W).
    """
    _check_sampling_args(schedule, shape)
    if not 1 <= steps <= schedule.T:
        raise ValueError(f"steps must be in 1 .. {schedule.T}, got {steps}")
    if eta < 0:
        raise ValueError(f"eta must be >= 0, got {eta}")
    abars = schedule.alpha_bars.to(device=device, dtype=dtype)
    times = schedule.model_times.to(device)
    seq = torch.linspace(0, schedule.T - 1, steps, dtype=torch.float64).round().long().tolist()
    x = torch.randn(shape, device=device, dtype=dtype, generator=generator)
    for k in _maybe_tqdm(range(len(seq) - 1, -1, -1), progress, "DDIM"):
        t = seq[k]
        abar = abars[t]
        abar_prev = abars[seq[k - 1]] if k > 0 else abars.new_tensor(1.0)
        eps = model(x, times[t].expand(shape[0]))
        x0 = _predict_x0(x, eps, abar, clip)
        if clip:  # keep eps consistent with the clipped x0
            eps = (x - abar.sqrt() * x0) / (1 - abar).sqrt()
        sigma = eta * ((1 - abar_prev) / (1 - abar) * (1 - abar / abar_prev)).sqrt()
        x = abar_prev.sqrt() * x0 + (1 - abar_prev - sigma**2).clamp(min=0).sqrt() * eps
        if eta > 0 and k > 0:
            x = x + sigma * torch.randn(shape, device=device, dtype=dtype, generator=generator)
    return x


def _maybe_tqdm(iterable, progress: bool, desc: str):
    if not progress:
        return iterable
    from tqdm.auto import tqdm

    return tqdm(iterable, desc=desc, leave=False)
