"""The quantities of the paper's theorems as functions.

* Lemma 3.2: the exact expectation of ``||x_t||^2 / m`` (:func:`expected_xt_sq_ratio`);
* Theorems 3.1 and 3.3: ``sum_i kappa_i^2``, the factor they put on ``||x_t||^2`` in the bounds
  on hidden-feature and gradient norms, and its tail sums ``S_i = sum_{j >= i} kappa_j^2``
  (:func:`tail_sums`); the closed form under CS and the range of the CS base ``kappa`` that
  keeps the sum inside the band the paper's Section 4.1 derives;
* Theorem 3.4: the robustness factor ``sum_i kappa_i M_0^i`` (:func:`robustness_factor`).
"""

from __future__ import annotations

import math
import numbers
from typing import Sequence

import numpy as np
from torch import Tensor

from .scaling import check_kappa, check_n_skips

SUM_KAPPA2_BAND = (1.22, 5.0)
"""The band for ``sum_i kappa_i^2`` derived in the paper's Section 4.1: from the mean of
``||eps||^2 / ||x_t||^2`` (about 1.22) up to a rough upper bound of 5."""

PAPER_KAPPA_RANGE = (0.5, 0.95)
"""The range of the CS base ``kappa`` the paper estimates from that band."""

__all__ = ["SUM_KAPPA2_BAND", "PAPER_KAPPA_RANGE", "check_n_skips", "check_band", "check_number", "sum_kappa_squared",
           "cs_sum_kappa_squared", "cs_kappa_range", "expected_xt_sq_ratio", "tail_sums", "robustness_factor"]


def _scalar(value: object) -> float | None:
    """``value`` as a float when it is one real number (a Python or numpy scalar, a 0-d array or
    tensor; a bool is not a number here), else ``None``."""
    if isinstance(value, (np.ndarray, Tensor)) and value.ndim == 0:
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return None
    return float(value)


def check_number(value: object, name: str, minimum: float = -math.inf, *, above: bool = False,
                 hint: str = "") -> float:
    """``value`` as a float if it is one finite real number (a Python or numpy scalar, or a 0-d array
    or tensor) of at least ``minimum`` (above it with ``above=True``), else a ValueError naming ``name``
    (``hint`` says what the number is)."""
    number = _scalar(value)
    if number is None or not math.isfinite(number) or number < minimum or (above and number == minimum):
        bound = f" {'>' if above else '>='} {minimum:g}" if math.isfinite(minimum) else ""
        raise ValueError(f"{name} must be a finite number{bound}{hint}, got {value!r}")
    return number


def sum_kappa_squared(kappas: Sequence[float] | Tensor) -> float:
    """``sum_i kappa_i^2``, the factor the paper's Theorems 3.1 and 3.3 put on ``||x_t||^2``.

    Pass the effective ``kappa_i``, the total factor on the path through skip ``i``
    (:func:`scalelong_edu.scaling.path_factors`): for ``block-output`` that is ``eta ** (i - 1)``,
    not the 1 on the skip itself. For LS pass the RMS gates
    (``measured_kappas(model, x, t, statistic="rms")``), so the sum is ``sum_i E[kappa_i^2]``.
    """
    if isinstance(kappas, (str, bytes)):
        raise ValueError(f"kappas must be a sequence of numbers, got {kappas!r}")
    try:
        values = [float(k) for k in (kappas.flatten().tolist() if isinstance(kappas, Tensor) else kappas)]
    except (TypeError, ValueError):
        raise ValueError(f"kappas must be a sequence of numbers, got {kappas!r}") from None
    if not values:
        raise ValueError("kappas is empty: give one coefficient per long skip")
    if not all(math.isfinite(v) for v in values):
        raise ValueError(f"kappas must be finite, got {values}")
    return float(sum(v * v for v in values))


def _floats(kappas: Sequence[float] | Tensor) -> list[float]:
    sum_kappa_squared(kappas)  # the same checks and messages
    return [float(k) for k in (kappas.flatten().tolist() if isinstance(kappas, Tensor) else kappas)]


def tail_sums(kappas: Sequence[float] | Tensor) -> list[float]:
    """``S_i = sum_{j >= i} kappa_j^2`` for i = 1 .. N: the factor Theorems 3.1 and 3.3 put on
    ``||x_t||^2`` in the bounds for skip ``i`` (``S_1`` is :func:`sum_kappa_squared`)."""
    squares = [k * k for k in _floats(kappas)]
    return [math.fsum(squares[i:]) for i in range(len(squares))]


def robustness_factor(kappas: Sequence[float] | Tensor, m0: float) -> float:
    """``sum_{i=1}^N kappa_i M_0^i``, the factor Theorem 3.4 puts on the perturbation size.

    ``M_0`` bounds how much one block can stretch its input (its Lipschitz constant); the path
    through skip ``i`` passes ``i`` of them each way, hence the power. Standard UNet
    (``kappa_i = 1``) gives ``sum_i M_0^i``, of order ``N M_0^N`` when ``M_0 >= 1``.
    """
    m0 = check_number(m0, "m0", 0, above=True, hint=" (a Lipschitz factor)")
    return math.fsum(k * m0**i for i, k in enumerate(_floats(kappas), start=1))


def _check_alpha_bar(alpha_bar: float | Tensor | np.ndarray) -> float | Tensor | np.ndarray:
    """``alpha_bar`` (a float for one number, else the tensor or array itself), or a ValueError
    unless every value is a real number in [0, 1]."""
    number = _scalar(alpha_bar) if not isinstance(alpha_bar, Tensor) else None
    if number is not None:
        values, out = np.asarray([number]), number
    elif isinstance(alpha_bar, Tensor):
        values, out = alpha_bar.detach().cpu(), alpha_bar
        values = (values.double() if values.dtype.is_floating_point else values).numpy()
    elif isinstance(alpha_bar, np.ndarray):
        values, out = alpha_bar, alpha_bar
    else:
        values = out = None
    if values is None or values.dtype.kind not in "fiu":
        raise ValueError(f"alpha_bar must be a number, tensor or array of abar_t in [0, 1], got {alpha_bar!r}")
    bad = values[~((values >= 0) & (values <= 1))]
    if bad.size:
        raise ValueError(f"alpha_bar must lie in [0, 1] (abar_t of a noise schedule), got {float(bad.flat[0]):.6g}")
    return out


def expected_xt_sq_ratio(alpha_bar: float | Tensor, x0_sq_ratio: float) -> float | Tensor:
    """``E ||x_t||^2 / m = abar_t E||x_0||^2 / m + (1 - abar_t)`` (Lemma 3.2's quantity, exactly).

    With ``x_t = sqrt(abar_t) x_0 + sqrt(1 - abar_t) eps`` and ``eps ~ N(0, I)`` independent of
    ``x_0``, the cross term has mean zero and ``E||eps||^2 = m``. ``x0_sq_ratio`` is the data's
    ``E ||x_0||^2 / m`` (1/3 for uniform pixels in [-1, 1]; larger for mostly-black digits).
    ``alpha_bar`` is one number in [0, 1] (Python or numpy) or a tensor or array of them, which
    the result then broadcasts over.
    """
    x0_sq_ratio = check_number(x0_sq_ratio, "x0_sq_ratio", 0)
    alpha_bar = _check_alpha_bar(alpha_bar)
    return alpha_bar * x0_sq_ratio + (1 - alpha_bar)


def cs_sum_kappa_squared(kappa: float, n_skips: int) -> float:
    """Closed form of ``sum_i kappa_i^2`` under CS: ``(1 - kappa^(2N)) / (1 - kappa^2)``, N at kappa = 1."""
    kappa, n = check_kappa(kappa), check_n_skips(n_skips)
    q = kappa * kappa
    if abs(q - 1.0) < 1e-12:
        return float(n)
    return float((1.0 - q**n) / (1.0 - q))


def _cs_sum_direct(kappa: float, n: int) -> float:
    try:
        return math.fsum(kappa ** (2 * j) for j in range(n))
    except OverflowError:
        return math.inf


def cs_kappa_range(n_skips: int, lo: float = SUM_KAPPA2_BAND[0], hi: float = SUM_KAPPA2_BAND[1],
                   tol: float = 1e-12) -> tuple[float, float]:
    """The CS bases ``kappa`` for which ``lo <= sum_i kappa_i^2 <= hi`` with ``N`` skips.

    Under CS the sum ``1 + kappa^2 + ... + kappa^(2N-2)`` grows strictly with ``kappa`` from 1
    (``kappa -> 0``), so the answer is an interval ``[kappa_lo, kappa_hi]``; both ends are found by
    bisection to ``tol``. When ``lo <= 1`` every small ``kappa`` meets the lower end and
    ``kappa_lo`` is 0.

    Raises:
        ValueError: ``N < 1``, a band that is not ``0 <= lo < hi`` finite, ``hi <= 1`` (no ``kappa``
            reaches it: ``kappa_1 = 1`` alone gives 1), or ``N = 1`` with ``lo > 1`` (the sum is then
            always 1).
    """
    n = check_n_skips(n_skips)
    lo, hi = check_band((lo, hi))
    if not tol > 0:
        raise ValueError(f"tol must be > 0, got {tol}")
    if hi <= 1.0:
        raise ValueError(f"hi must exceed 1: under CS kappa_1 = 1, so the sum is at least 1 (got hi={hi})")
    if n == 1:
        if lo > 1.0:
            raise ValueError(f"with N = 1 the sum is always kappa_1^2 = 1, below lo={lo}; no kappa works")
        return 0.0, math.inf

    def solve(target: float) -> float:
        a, b = 0.0, 1.0
        while _cs_sum_direct(b, n) < target:
            a, b = b, 2 * b
        while b - a > tol * max(1.0, b):
            mid = 0.5 * (a + b)
            if _cs_sum_direct(mid, n) < target:
                a = mid
            else:
                b = mid
        return 0.5 * (a + b)

    return (0.0 if lo <= 1.0 else solve(lo)), solve(hi)


def check_band(band: Sequence[float]) -> tuple[float, float]:
    """``(lo, hi)`` as floats, or a ValueError unless ``0 <= lo < hi`` are finite."""
    try:
        lo, hi = (float(v) for v in band)
    except (TypeError, ValueError):
        raise ValueError(f"band must be two numbers (lo, hi), got {band!r}") from None
    if not (math.isfinite(lo) and math.isfinite(hi) and 0 <= lo < hi):
        raise ValueError(f"band must satisfy 0 <= lo < hi (finite), got ({lo}, {hi})")
    return lo, hi
