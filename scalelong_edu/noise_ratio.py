"""The noise-to-input ratio ``r = ||eps||^2 / ||x_t||^2`` behind the paper's band for ``sum_i kappa_i^2``.

The paper's Section 4.1 matches the UNet output order ``||x_t||^2 sum_i kappa_i^2`` (Theorem 3.1)
to the target ``||eps||^2`` of the loss (Eq. 2), so ``sum_i kappa_i^2 ~ ||eps||^2 / ||x_t||^2``,
and puts the sum between the *mean* of that ratio ("about 1.22") and 5, since in its Fig. 3(b)
"more than 97% of the values are smaller than 5" on CIFAR-10. With the DDPM forward process

    x_t = sqrt(abar_t) x_0 + sqrt(1 - abar_t) eps,    eps ~ N(0, I_m),

the numbers depend on choices the paper does not state; this module measures each of them:

* **which average.** Per draw ``r = ||eps||^2 / ||x_t||^2`` (:func:`noise_ratio`). Its mean over
  draws is not the ratio of means ``E||eps||^2 / E||x_t||^2`` (:func:`ratio_of_means`): per ``t``,
  ``E||eps||^2 = m`` and ``E||x_t||^2 = abar_t ||x_0||^2 + (1 - abar_t) m`` (Lemma 3.2), so with
  ``s = ||x_0||^2 / m``

      E||eps||^2 / E||x_t||^2 = 1 / (abar_t s + 1 - abar_t)              (*)

  which is also the limit of ``r`` itself as ``m -> inf`` (``||eps||^2 / m -> 1``,
  ``<x_0, eps> / m -> 0``) (:func:`predicted_ratio`). Averaging (*) over ``t`` and images gives
  the mean of the ratio; averaging its denominator first gives the ratio of means, which is
  smaller (Jensen: ``1 / D`` is convex) and depends on the data only through ``E s``.
* **the limits.** ``abar_t -> 0``: ``r -> 1``; ``abar_t -> 1``: ``r -> ||eps||^2 / ||x_0||^2 ~ 1 / s``,
  large for images with little energy (mid-grey in [-1, 1], dark in [0, 1]). ``x_0 = 0`` gives
  exactly ``1 / (1 - abar_t)``. The tail above 5 therefore needs images with ``s < 0.2`` and small
  ``t`` (``abar_t > 0.8 / (1 - s)``).
* **schedule, data range, time sampling.** Any :class:`~scalelong_edu.diffusion.DiscreteSchedule`
  (``VPSDE.discretize(T)`` for the continuous one), images in [-1, 1] or mapped to [0, 1]
  (:func:`to_unit_range`), and ``t`` uniform over ``t_min .. T`` (DDPM's 1-based ``t``; schedule
  index ``t - 1``). :func:`compare_variants` runs them all on one image set.

Sampling works on the CPU in float64: with ``m`` in the thousands a float32 sum of squares loses
digits that the tail fractions near 5 are sensitive to.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np
import torch
from torch import Tensor

from .diffusion import DiscreteSchedule
from .theory import check_number

__all__ = ["RatioDraws", "RatioSummary", "noise_ratio", "x0_sq_ratios", "to_unit_range", "sample_noise_ratios",
           "sample_ratios_from_energies", "ratio_of_means", "summarize_ratios", "image_bootstrap", "predicted_ratio",
           "predicted_ratios", "compare_variants"]

DEFAULT_QUANTILES = (0.5, 0.9, 0.97, 0.99)
"""Quantiles :func:`summarize_ratios` reports; 0.97 is the paper's "more than 97% below 5"."""


@dataclass(frozen=True)
class RatioDraws:
    """Monte-Carlo draws of ``(image, t, eps)``, one entry per draw, all (n,).

    Attributes:
        t: DDPM time in ``1 .. T`` (schedule index ``t - 1``), int64.
        image_index: which image of the set, int64.
        eps_sq: ``||eps||^2 / m``, float64.
        xt_sq: ``||x_t||^2 / m``, float64.
    """

    t: Tensor
    image_index: Tensor
    eps_sq: Tensor
    xt_sq: Tensor

    @property
    def ratio(self) -> Tensor:
        """``r = ||eps||^2 / ||x_t||^2`` per draw (n,), float64."""
        return self.eps_sq / self.xt_sq


@dataclass(frozen=True)
class RatioSummary:
    """What Fig. 3(b) shows of a sample of ratios: its centre, quantiles and the share below a threshold."""

    n: int
    mean: float
    median: float
    quantiles: dict[float, float]
    threshold: float
    frac_below: float

    def as_row(self) -> dict[str, float]:
        """A flat dict for a table: ``mean``, ``median``, ``q97`` ..., ``frac_below``."""
        row: dict[str, float] = {"n": self.n, "mean": self.mean, "median": self.median}
        row.update({f"q{100 * q:g}": v for q, v in self.quantiles.items()})
        row["frac_below"] = self.frac_below
        return row


# -- checks -------------------------------------------------------------------------------------------
def _check_images(images: Tensor) -> Tensor:
    """``images`` (N, ...) as a float64 CPU tensor, or a ValueError."""
    if not isinstance(images, Tensor):
        raise ValueError(f"images must be a tensor (N, C, H, W), got {type(images).__name__}")
    if images.dim() < 2 or images.shape[0] < 1 or images[0].numel() < 1:
        raise ValueError(f"images must have shape (N, ...) with N >= 1 and at least one pixel, "
                         f"got {tuple(images.shape)}")
    if not (images.is_floating_point() and torch.isfinite(images).all()):
        raise ValueError("images must be finite floating-point values")
    return images.detach().to(device="cpu", dtype=torch.float64)


def _check_int(value: int, name: str, low: int, high: float = math.inf) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or not low <= value <= high:
        bound = f"{low} .. {high}" if math.isfinite(high) else f">= {low}"
        raise ValueError(f"{name} must be a whole number {bound}, got {value!r}")
    return int(value)


def _check_schedule(schedule: DiscreteSchedule) -> DiscreteSchedule:
    if not isinstance(schedule, DiscreteSchedule):
        raise ValueError(f"schedule must be a DiscreteSchedule (use VPSDE.discretize(T) for the SDE), "
                         f"got {type(schedule).__name__}")
    return schedule


# -- the ratio ----------------------------------------------------------------------------------------
def _sq_norms(x0: Tensor, alpha_bar: Tensor, noise: Tensor) -> tuple[Tensor, Tensor]:
    """``(||eps||^2 / m, ||x_t||^2 / m)`` per sample, float64 (B,); inputs already float64 and checked."""
    a = alpha_bar.view(-1, *([1] * (x0.dim() - 1)))
    x_t = a.sqrt() * x0 + (1 - a).sqrt() * noise
    return noise.square().flatten(1).mean(1), x_t.square().flatten(1).mean(1)


def noise_ratio(x0: Tensor, alpha_bar: Tensor, noise: Tensor) -> Tensor:
    """``r = ||eps||^2 / ||x_t||^2`` with ``x_t = sqrt(abar) x_0 + sqrt(1 - abar) eps``, per sample.

    Args:
        x0: clean images (B, ...).
        alpha_bar: ``abar_t`` per sample (B,), in [0, 1].
        noise: ``eps`` (same shape as ``x0``).

    Returns:
        float64 (B,). ``x_0 = 0`` gives ``1 / (1 - abar)``; ``abar = 0`` gives 1; ``abar = 1`` gives
        ``||eps||^2 / ||x_0||^2`` (inf where ``x_0 = 0``).
    """
    x0 = _check_images(x0)
    alpha_bar = torch.as_tensor(alpha_bar, dtype=torch.float64).cpu()
    if alpha_bar.shape != (x0.shape[0],):
        raise ValueError(f"alpha_bar must have shape ({x0.shape[0]},) to match the batch, got {tuple(alpha_bar.shape)}")
    if not ((alpha_bar >= 0) & (alpha_bar <= 1)).all():
        raise ValueError("alpha_bar must lie in [0, 1]")
    if not isinstance(noise, Tensor) or noise.shape != x0.shape:
        raise ValueError(f"noise must be a tensor of x0's shape {tuple(x0.shape)}, got "
                         f"{tuple(noise.shape) if isinstance(noise, Tensor) else type(noise).__name__}")
    if not (noise.is_floating_point() and torch.isfinite(noise).all()):
        raise ValueError("noise must be finite floating-point values (eps ~ N(0, I)), got NaN, inf or integers")
    eps_sq, xt_sq = _sq_norms(x0, alpha_bar, noise.detach().to(device="cpu", dtype=torch.float64))
    return eps_sq / xt_sq


def x0_sq_ratios(images: Tensor) -> Tensor:
    """``s = ||x_0||^2 / m`` per image (N,), float64: the data term of Lemma 3.2 and of (*)."""
    return _check_images(images).flatten(1).square().mean(1)


def to_unit_range(images: Tensor) -> Tensor:
    """Map images from [-1, 1] to [0, 1] (``(x + 1) / 2``), same shape and dtype.

    ``s`` changes with the range: a mid-grey image has ``s ~ 0`` in [-1, 1] but ``~ 0.25`` in
    [0, 1]; a black background has ``s = 1`` in [-1, 1] but 0 in [0, 1].
    """
    _check_images(images)
    if images.min() < -1 or images.max() > 1:
        raise ValueError(f"images must lie in [-1, 1], got [{images.min().item():.3g}, {images.max().item():.3g}]")
    return (images + 1) / 2


def sample_noise_ratios(images: Tensor, schedule: DiscreteSchedule, draws: int = 1, t_min: int = 1,
                        generator: torch.Generator | None = None, chunk_size: int = 1024) -> RatioDraws:
    """Draw ``(t, eps)`` for every image ``draws`` times, as in training, and record both norms.

    ``t`` is uniform over ``t_min .. T`` (``t_min = 1``: every step, as DDPM trains; a larger
    ``t_min`` drops the least noisy steps, where the tail lives) and ``eps ~ N(0, I)``, both from
    ``generator``, so the same generator state gives the same draws. Draw ``k`` of image ``i`` is
    entry ``k * N + i``.

    Args:
        images: (N, ...) clean images in the range the model sees.
        schedule: a discrete schedule of ``T`` steps.
        draws: draws per image (>= 1).
        t_min: smallest DDPM time, 1 .. T.
        generator: a CPU generator; ``None`` uses the global one.
        chunk_size: draws per batch of noise (bounds memory). The noise stream is cut at chunk
            boundaries, so reproduce a run with the same ``chunk_size`` too.

    Returns:
        :class:`RatioDraws` with ``N * draws`` entries.
    """
    x0 = _check_images(images)
    schedule = _check_schedule(schedule)
    draws = _check_int(draws, "draws", 1)
    t_min = _check_int(t_min, "t_min", 1, schedule.T)
    chunk_size = _check_int(chunk_size, "chunk_size", 1)
    n_images, n = x0.shape[0], x0.shape[0] * draws
    index = torch.arange(n) % n_images
    t = torch.randint(t_min, schedule.T + 1, (n,), generator=generator)
    alpha_bar = schedule.alpha_bars.to(torch.float64)[t - 1]
    eps_sq, xt_sq = torch.empty(n, dtype=torch.float64), torch.empty(n, dtype=torch.float64)
    for start in range(0, n, chunk_size):
        stop = min(start + chunk_size, n)
        batch = x0[index[start:stop]]
        noise = torch.randn(batch.shape, dtype=torch.float64, generator=generator)
        eps_sq[start:stop], xt_sq[start:stop] = _sq_norms(batch, alpha_bar[start:stop], noise)
    return RatioDraws(t=t, image_index=index, eps_sq=eps_sq, xt_sq=xt_sq)


def sample_ratios_from_energies(x0_sq_ratio: Tensor | Sequence[float], m: int, schedule: DiscreteSchedule,
                                draws: int = 1, t_min: int = 1, seed: int = 0) -> RatioDraws:
    """:func:`sample_noise_ratios` for images known only by their energies ``s = ||x_0||^2 / m``,
    in the same distribution, exactly.

    ``eps ~ N(0, I_m)`` is isotropic, so only two numbers of it enter the ratio: its component
    ``z = <eps, x_0> / ||x_0||`` along the image, ``N(0, 1)``, and ``q``, the squared norm of the rest,
    ``chi^2_{m-1}`` and independent of ``z``. Then ``||eps||^2 = z^2 + q`` and

        ||x_t||^2 = abar ||x_0||^2 + 2 sqrt(abar (1 - abar)) ||x_0|| z + (1 - abar) (z^2 + q),

    so a data set's ratios follow from its per-image ``s`` and ``m`` (e.g. CIFAR-10's, from
    :func:`scalelong_edu.data.cifar10_test_energies`). ``t`` is uniform over ``t_min .. T``; the
    draws come from NumPy's generator seeded with ``seed`` (draw ``k`` of image ``i`` is entry
    ``k * N + i``), not from torch's, so they do not reproduce :func:`sample_noise_ratios` draw for draw.

    Args:
        x0_sq_ratio: ``s`` per image (N,), finite and >= 0.
        m: pixels per image (``C * H * W``), >= 2.
    """
    s = torch.as_tensor(x0_sq_ratio, dtype=torch.float64).reshape(-1)
    if s.numel() == 0 or not (torch.isfinite(s) & (s >= 0)).all():
        raise ValueError("x0_sq_ratio must be a non-empty sequence of finite energies >= 0")
    m = _check_int(m, "m", 2)
    schedule = _check_schedule(schedule)
    draws = _check_int(draws, "draws", 1)
    t_min = _check_int(t_min, "t_min", 1, schedule.T)
    rng = np.random.default_rng(seed)
    n = s.numel() * draws
    index = torch.arange(n) % s.numel()
    t = torch.from_numpy(rng.integers(t_min, schedule.T + 1, n))
    a = schedule.alpha_bars.to(torch.float64)[t - 1]
    z, q = torch.from_numpy(rng.standard_normal(n)), torch.from_numpy(rng.chisquare(m - 1, n))
    energy = s[index] * m
    eps_sq = z.square() + q
    xt_sq = a * energy + 2 * (a * (1 - a) * energy).sqrt() * z + (1 - a) * eps_sq
    return RatioDraws(t=t, image_index=index, eps_sq=eps_sq / m, xt_sq=xt_sq / m)


def ratio_of_means(draws: RatioDraws) -> float:
    """``E||eps||^2 / E||x_t||^2`` over the draws: the other "mean" of the ratio, ``<=`` its mean when the
    large-``m`` limit (*) holds (the harmonic-type average weights the noisy, ``r ~ 1`` steps more)."""
    return float(draws.eps_sq.sum() / draws.xt_sq.sum())


def summarize_ratios(ratios: Tensor | Sequence[float], threshold: float = 5.0,
                     quantiles: Sequence[float] = DEFAULT_QUANTILES) -> RatioSummary:
    """Mean, median, quantiles and the fraction strictly below ``threshold`` of a sample of ratios.

    ``inf`` (an all-zero image at ``abar = 1``) is allowed and counts as above any threshold; NaN is not.
    A quantile that falls between two values of which the upper is ``inf`` is ``inf`` (linear
    interpolation would give NaN), and one that falls on a value is that value.
    """
    values = np.asarray(ratios.detach().cpu() if isinstance(ratios, Tensor) else ratios, dtype=np.float64).ravel()
    if values.size == 0:
        raise ValueError("ratios is empty")
    if np.isnan(values).any() or (values < 0).any():
        raise ValueError("ratios must be >= 0 and not NaN")
    threshold = check_number(threshold, "threshold")
    qs = [float(q) for q in quantiles]
    if not all(0 <= q <= 1 for q in qs):
        raise ValueError(f"quantiles must lie in [0, 1], got {qs}")
    with np.errstate(invalid="ignore"):  # quantiles that interpolate towards an inf ratio
        quantile_values = {q: _quantile(values, q) for q in qs}
        median = float(np.median(values))
    return RatioSummary(
        n=int(values.size),
        mean=float(values.mean()),
        median=median,
        quantiles=quantile_values,
        threshold=threshold,
        frac_below=float((values < threshold).mean()),
    )


def image_bootstrap(draws: RatioDraws, threshold: float = 5.0, n_boot: int = 2000,
                    seed: int = 0) -> dict[str, tuple[float, float]]:
    """95% percentile intervals of the mean of the ratio, of :func:`ratio_of_means` and of the share
    of ratios below ``threshold``, resampling the *images* with replacement (``n_boot`` times, NumPy
    seeded with ``seed``): a data set's statistics carry the sampling error of its images, which more draws per
    image do not shrink. Every image must have the same number of draws (as the samplers give).

    Returns:
        ``{"mean": (lo, hi), "ratio_of_means": (lo, hi), "frac_below": (lo, hi)}``.
    """
    index = draws.image_index.numpy()
    n_images = int(index.max()) + 1
    counts = np.bincount(index, minlength=n_images)
    if (counts != counts[0]).any():
        raise ValueError("every image needs the same number of draws")
    per_image = [np.bincount(index, weights=w, minlength=n_images)
                 for w in (draws.ratio.numpy(), draws.eps_sq.numpy(), draws.xt_sq.numpy(),
                           (draws.ratio < threshold).double().numpy())]
    weights = np.random.default_rng(seed).multinomial(n_images, np.full(n_images, 1 / n_images), size=n_boot)
    ratio, eps, xt, below = (weights @ v for v in per_image)
    n_draws = weights.sum(1) * counts[0]
    stats = {"mean": ratio / n_draws, "ratio_of_means": eps / xt, "frac_below": below / n_draws}
    return {k: (float(np.quantile(v, 0.025)), float(np.quantile(v, 0.975))) for k, v in stats.items()}


def _quantile(values: np.ndarray, q: float) -> float:
    """``np.quantile`` (linear interpolation) of NaN-free ``values``. It is NaN only when the upper
    neighbour of ``q`` is ``inf`` (``inf - inf`` or ``0 * inf``); the quantile is then that upper
    neighbour: ``inf``, or the value ``q`` falls on exactly."""
    value = float(np.quantile(values, q))
    return float(np.quantile(values, q, method="higher")) if math.isnan(value) else value


# -- the large-m prediction ---------------------------------------------------------------------------
def predicted_ratio(alpha_bar: Tensor | float, x0_sq_ratio: Tensor | float) -> Tensor:
    """(*): ``E||eps||^2 / E||x_t||^2 = 1 / (abar s + 1 - abar)`` at fixed ``t`` and image, float64.

    The exact ratio of expectations at one ``t`` (``1 / expected_xt_sq_ratio``), and the limit of
    ``r`` itself as ``m -> inf``. Broadcasts: ``alpha_bar`` (T,) against ``x0_sq_ratio`` (N, 1) gives (N, T).
    """
    a = torch.as_tensor(alpha_bar, dtype=torch.float64)
    s = torch.as_tensor(x0_sq_ratio, dtype=torch.float64)
    if not ((a >= 0) & (a <= 1)).all():
        raise ValueError("alpha_bar must lie in [0, 1]")
    if not (torch.isfinite(s) & (s >= 0)).all():
        raise ValueError("x0_sq_ratio must be finite and >= 0")
    return 1 / (a * s + (1 - a))


def predicted_ratios(x0_sq_ratio: Tensor | Sequence[float] | float, schedule: DiscreteSchedule,
                     t_min: int = 1) -> Tensor:
    """(*) on the whole grid of images x steps ``t_min .. T``, flattened (N * (T - t_min + 1),).

    Every entry has the same weight, so :func:`summarize_ratios` of the result is the exact
    expectation, over uniform ``t`` and images, of the large-``m`` ratio: no Monte-Carlo noise. It
    needs only the per-image ``s`` (:func:`x0_sq_ratios`), so it also predicts a data set from
    its pixel statistics alone.
    """
    schedule = _check_schedule(schedule)
    t_min = _check_int(t_min, "t_min", 1, schedule.T)
    s = torch.as_tensor(x0_sq_ratio, dtype=torch.float64).reshape(-1, 1)
    if s.numel() == 0:
        raise ValueError("x0_sq_ratio is empty")
    return predicted_ratio(schedule.alpha_bars[t_min - 1:], s).flatten()


# -- the variants -------------------------------------------------------------------------------------
def compare_variants(images: Tensor, schedules: Mapping[str, DiscreteSchedule],
                     ranges: Sequence[str] = ("[-1,1]", "[0,1]"), t_mins: Sequence[int] = (1,),
                     draws: int = 1, seed: int = 0, threshold: float = 5.0) -> list[dict[str, float | str]]:
    """One row per (schedule, data range, ``t_min``): the Monte-Carlo summary of ``r`` and both averages.

    Each row holds ``schedule``, ``range``, ``t_min``, the :meth:`RatioSummary.as_row` fields of the
    sampled ratios, ``ratio_of_means`` of the same draws, and the large-``m`` predictions
    ``pred_mean`` (mean of (*)), ``pred_ratio_of_means`` (``1 / mean(abar s + 1 - abar)``) and
    ``pred_frac_below``. Every row draws from a fresh ``torch.Generator`` seeded with ``seed``.

    Args:
        images: (N, ...) in [-1, 1], as :func:`scalelong_edu.data.load_dataset` returns them.
        schedules: name -> schedule.
        ranges: any of ``"[-1,1]"`` (as given) and ``"[0,1]"`` (:func:`to_unit_range`).
    """
    unknown = [r for r in ranges if r not in ("[-1,1]", "[0,1]")]
    if unknown or not ranges:
        raise ValueError(f"ranges must be a non-empty choice of '[-1,1]' and '[0,1]', got {list(ranges)}")
    if not schedules:
        raise ValueError("schedules is empty")
    if isinstance(t_mins, (str, bytes)) or np.ndim(t_mins) != 1 or len(t_mins) == 0:
        raise ValueError(f"t_mins must be a non-empty sequence of smallest DDPM times (e.g. (1,)), got {t_mins!r}")
    rows: list[dict[str, float | str]] = []
    for data_range in ranges:
        x0 = _check_images(images) if data_range == "[-1,1]" else to_unit_range(_check_images(images))
        s = x0_sq_ratios(x0)
        for name, schedule in schedules.items():
            for t_min in t_mins:
                sampled = sample_noise_ratios(x0, schedule, draws, t_min, torch.Generator().manual_seed(seed))
                predicted = predicted_ratios(s, schedule, t_min)
                abar_mean = float(schedule.alpha_bars[t_min - 1:].mean())
                row: dict[str, float | str] = {"schedule": name, "range": data_range, "t_min": t_min}
                row.update(summarize_ratios(sampled.ratio, threshold).as_row())
                row["ratio_of_means"] = ratio_of_means(sampled)
                row["pred_mean"] = float(predicted.mean())
                row["pred_ratio_of_means"] = 1 / (abar_mean * float(s.mean()) + 1 - abar_mean)
                row["pred_frac_below"] = float((predicted < threshold).double().mean())
                rows.append(row)
    return rows
