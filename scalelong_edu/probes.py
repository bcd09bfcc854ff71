"""Probes: measure the quantities of the paper's theorems on a real model, one block at a time.

Every probe returns *tidy* rows, one measurement per row, with the columns of :data:`COLUMNS`::

    step  probe       block  skip  sigma  quantity     value
    120   features    a      3     NaN    norm         41.7
    120   grads       model  <NA>  NaN    grad_norm    0.52
    120   robustness  model  <NA>  0.1    loss_change  0.013

``block`` is ``"a"`` (encoder block ``a_i``), ``"b"`` (decoder block ``b_i``) or ``"model"``;
``skip`` is the long-skip index ``i`` (1 = outermost) of that block. :func:`to_frame` turns rows
into a DataFrame ready for ``seaborn.relplot(frame, x="step", y="value", hue="skip")``.

The probes, and what they measure:

* :class:`FeatureNorms` -- the norms of the block outputs ``h_i`` whose squared norm Theorem 3.1
  bounds (the curves of the paper's Fig. 1), and the effective ``kappa_i`` of every skip;
* :func:`grad_norms` -- the gradient norm of every block's parameters (Theorem 3.3);
* :func:`adam_stats` -- Adam's moments per block (the reviewer's question 2: do parameters
  oscillate less when the skips are scaled?);
* :func:`robustness` -- how much the prediction and the loss move when extra Gaussian noise is
  added to the network input (Theorem 3.4, Fig. 3c);
* :class:`BatchNorms` -- the decoder-block and output norms of every *training* batch, from the
  training forward pass itself (the oscillation across batches of the paper's Fig. 1);
* :func:`lipschitz` -- the local Lipschitz factor of every block and of the whole network, by
  power iteration on Jacobian-vector products (:func:`jacobian_norm`; Theorem 3.4's ``M_0``).

Norms measured on each training batch mix the draw of ``t`` and ``eps`` with the change of the
weights. :func:`probe_fixed_batch` measures features, loss and gradients on one fixed batch
(:func:`probe_batch`, stratified over ``t``) instead, so that a change means the weights moved.

:class:`ProbeRecorder` runs them from a training loop::

    rec = ProbeRecorder(model, optimizer=opt)
    for step, x0 in enumerate(loader):
        with rec.capture(step):        # forward hooks live only inside this block
            loss = eps_loss(model, x0, schedule)
            loss.backward()
        rec.after_backward(step)       # gradient norms
        opt.step(); opt.zero_grad()
        rec.after_step(step)           # Adam moments (and sign flips since the last call)
        rec.fixed_batch(step, batch, schedule)  # the same probes on one fixed batch
    frame = rec.to_frame()

All values are Python floats, computed in float32 from detached tensors (also under
``torch.autocast``), so no probe keeps an autograd graph alive.
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from functools import partial
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Sequence

import torch
from torch import Tensor, nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from .diffusion import Schedule, q_sample
from .train import Callback

if TYPE_CHECKING:
    import pandas as pd

COLUMNS = ("step", "probe", "block", "skip", "sigma", "quantity", "value")
"""The columns of every row, in :func:`to_frame`'s order."""

Row = dict[str, Any]


def _row(step: int | None, probe: str, block: str | None, skip: int | None, quantity: str, value: float,
         sigma: float | None = None) -> Row:
    return dict(step=step, probe=probe, block=block, skip=skip, sigma=sigma, quantity=quantity, value=float(value))


@contextmanager
def _eval_mode(model: nn.Module) -> Iterator[nn.Module]:
    """``model`` in eval mode inside the ``with`` block; every module's own mode is restored on exit."""
    modes = {m: m.training for m in model.modules()}
    model.eval()
    try:
        yield model
    finally:
        for m, mode in modes.items():
            m.training = mode


def named_blocks(model: nn.Module) -> list[tuple[str, int, nn.Module]]:
    """``("a", i, a_i)`` for i = 1 .. N, then ``("b", i, b_i)``: the blocks every probe reports on."""
    if not all(hasattr(model, name) for name in ("n_skips", "encoder_blocks", "decoder_blocks", "scaling")):
        raise TypeError(
            f"{type(model).__name__} is not a scalelong_edu model (it needs n_skips, encoder_blocks, decoder_blocks "
            "and scaling); build one with scalelong_edu.models.build_model, and unwrap DDP with ddp_model.module"
        )
    return [("a", i, m) for i, m in enumerate(model.encoder_blocks, start=1)] + [
        ("b", i, m) for i, m in enumerate(model.decoder_blocks, start=1)
    ]


def _parameter_groups(model: nn.Module) -> list[tuple[str, int | None, list[nn.Parameter]]]:
    """The parameters of every block ``a_i``, ``b_i``, then of the whole model (``skip=None``)."""
    groups = [(block, i, list(m.parameters())) for block, i, m in named_blocks(model)]
    return groups + [("model", None, list(model.parameters()))]


class FeatureNorms:
    """Forward hooks on every ``a_i`` and ``b_i`` that record the norm of each block's output.

    Theorem 3.1 bounds ``||h_i||^2`` of the hidden features by ``O(||x_t||^2 sum_{j >= i} kappa_j^2)``;
    the paper's Fig. 1 plots how these norms oscillate over training. For each forward pass inside
    the ``with`` block and for each block output ``h`` of shape (B, ...) (conv: (B, C, H, W),
    U-ViT: (B, L, D)) this records, averaged over the B samples:

    * ``norm`` -- the per-sample L2 norm ``||h_b||``;
    * ``sq_norm`` -- the per-sample squared norm ``||h_b||^2``, the theorem's quantity;

    and, once per forward pass, for every skip (``block=None``) the effective coefficient the
    skip-scaling object applied to that batch's encoder outputs: ``kappa``, the mean (the LS gate
    averaged over samples and channels/tokens; the constant for CS), and ``kappa_rms``, the root
    mean square, whose squares sum to the theorems' ``sum_i E[kappa_i^2]``
    (:meth:`scalelong_edu.scaling.SkipScaling.effective_kappas`).

    Hooks exist only between ``__enter__`` and ``__exit__``; rows become floats at exit.

    Args:
        model: a :mod:`scalelong_edu.models` model.
        step: the training step written into every row.
    """

    def __init__(self, model: nn.Module, step: int | None = None):
        self.blocks = named_blocks(model)
        self.model, self.step = model, step
        self.rows: list[Row] = []
        self._handles: list[torch.utils.hooks.RemovableHandle] = []
        self._pending: list[tuple[str | None, int, str, Tensor | float]] = []
        self._skips: dict[int, Tensor] = {}

    def __enter__(self) -> FeatureNorms:
        if self._handles:
            raise RuntimeError("this FeatureNorms is already recording; leave its with-block first")
        self._handles = [m.register_forward_hook(partial(self._hook, block, i)) for block, i, m in self.blocks]
        return self

    def __exit__(self, *exc) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles, self._skips = [], {}
        self.rows += [_row(self.step, "features", block, i, q, v) for block, i, q, v in self._pending]
        self._pending = []

    def _hook(self, block: str, i: int, module: nn.Module, inputs: tuple, output: Tensor) -> None:
        h = output.detach()
        norms = torch.linalg.vector_norm(h.flatten(1), dim=1, dtype=torch.float32)  # (B,)
        self._pending += [(block, i, "norm", norms.mean()), (block, i, "sq_norm", norms.square().mean())]
        if block == "a":
            self._skips[i] = h
            if len(self._skips) == self.model.n_skips:  # the encoder is done: every skip is known
                skips = [self._skips[j] for j in sorted(self._skips)]
                for quantity, statistic in (("kappa", "mean"), ("kappa_rms", "rms")):
                    kappas = self.model.scaling.effective_kappas(skips, statistic)
                    self._pending += [(None, j, quantity, k) for j, k in enumerate(kappas.tolist(), start=1)]
                self._skips = {}


def _grad_norm(params: Iterable[nn.Parameter]) -> Tensor:
    """L2 norm of all gradients together (None gradients skipped, 0 when there are none), float32."""
    norms = [torch.linalg.vector_norm(p.grad.detach(), dtype=torch.float32) for p in params if p.grad is not None]
    return torch.linalg.vector_norm(torch.stack(norms)) if norms else torch.zeros(())


def grad_norms(model: nn.Module, step: int | None = None) -> list[Row]:
    """Gradient norm of the parameters of every block ``a_i``, ``b_i`` and of the whole model.

    Theorem 3.3 bounds the gradient of the i-th block's parameters by
    ``O(loss * ||x_t||^2 sum_{j >= i} kappa_j^2)`` (per sample; this measures the batch gradient).
    Call it after ``loss.backward()`` and before ``optimizer.zero_grad()``; with a ``GradScaler``
    call it after ``scaler.unscale_(optimizer)``, or the norms carry the loss scale.

    Returns:
        Rows with ``probe="grads"``, ``quantity="grad_norm"``: 2N block rows and one ``block="model"``
        row (the value ``clip_grad_norm_`` would see).
    """
    groups = _parameter_groups(model)
    if all(p.grad is None for p in groups[-1][2]):
        raise RuntimeError("the model has no gradients: call grad_norms after loss.backward() and before zero_grad()")
    return [_row(step, "grads", block, i, "grad_norm", _grad_norm(params).item()) for block, i, params in groups]


def _adam_sums(state: dict, group: dict, previous: Tensor | None) -> Tensor:
    """Sums over one parameter's elements: ``|m|``, ``v``, Adam's step ``|m_hat| / (sqrt(v_hat) + eps)``,
    ``log v``, ``(log v)^2`` and the sign flips of ``m`` since ``previous`` (its sign bits), (6,)."""
    m, v = state["exp_avg"], state["exp_avg_sq"]
    beta1, beta2 = (float(b) for b in group["betas"])
    t = float(state["step"])
    v_used = state["max_exp_avg_sq"] if group["amsgrad"] else v
    update = (m.abs() / (1 - beta1**t)) / (v_used.sqrt() / math.sqrt(1 - beta2**t) + float(group["eps"]))
    log_v = v.double().clamp_min(1e-30).log()  # float64: the variance below is a difference of sums
    flips = (m.signbit() != previous).sum() if previous is not None else m.new_zeros((), dtype=torch.long)
    sums = [m.abs().sum(), v.sum(), update.sum(), log_v.sum(), log_v.square().sum(), flips]
    return torch.stack([x.double() for x in sums])


ADAM_QUANTITIES = ("exp_avg_abs", "exp_avg_sq", "update_size", "log_v_std", "m_sign_flip")
"""What :func:`adam_stats` records per block, in order."""


def adam_stats(
    optimizer: torch.optim.Optimizer, model: nn.Module, step: int | None = None, signs: dict | None = None
) -> list[Row]:
    """Adam's moment statistics per block ``a_i``, ``b_i`` and for the whole model.

    The reviewer asks (question 2) for direct evidence that parameters oscillate less with scaled
    skips, by comparing Adam's ``m`` and ``v``: a gradient that keeps flipping sign leaves ``|m|``
    small next to ``sqrt(v)``. Over all elements of a block's parameters:

    * ``exp_avg_abs`` -- mean ``|m|`` (first moment, as stored);
    * ``exp_avg_sq`` -- mean ``v`` (second moment, as stored);
    * ``update_size`` -- mean ``|m_hat| / (sqrt(v_hat) + eps)`` with Adam's bias corrections
      ``m_hat = m / (1 - beta1^t)``, ``v_hat = v / (1 - beta2^t)`` (``max v`` under amsgrad): the
      size of the step Adam takes per element, in units of the learning rate (weight decay aside).
      Near 1 means consistent gradients; near 0 means they cancel out;
    * ``log_v_std`` -- the standard deviation of ``ln v`` over the elements: the spread of the
      second moments (1 means a typical factor of e between elements);
    * ``m_sign_flip`` -- with ``signs``: the fraction of elements whose ``m`` changed sign since
      the previous call with the same dict (not recorded at the first call). A parameter that oscillates
      flips its momentum often.

    Parameters without optimizer state (before the first ``optimizer.step()``, or never given a
    gradient) are left out; a block none of whose parameters has state gives no rows.

    Args:
        optimizer: a ``torch.optim.Adam`` or ``AdamW`` holding the model's parameters.
        signs: a dict kept between calls (``{}`` at first), updated in place with the sign bits
            of every ``m``; without it ``m_sign_flip`` is not recorded.
    """
    if not isinstance(optimizer, (torch.optim.Adam, torch.optim.AdamW)):
        raise TypeError(f"adam_stats needs torch.optim.Adam or AdamW, got {type(optimizer).__name__}")
    settings = {p: group for group in optimizer.param_groups for p in group["params"]}
    groups = _parameter_groups(model)
    if not any(p in settings for p in groups[-1][2]):
        raise ValueError("the optimizer holds none of the model's parameters; pass the one that trains this model")
    rows = []
    for block, i, params in groups:
        held = [p for p in params if "exp_avg" in optimizer.state.get(p, {})]
        if not held:
            continue
        previous = {p: signs.get(p) if signs is not None else None for p in held}
        sums = torch.stack([_adam_sums(optimizer.state[p], settings[p], previous[p]) for p in held]).sum(0).tolist()
        count = sum(p.numel() for p in held)
        abs_m, v, update, log_v, log_v2, flips = (total / count for total in sums)
        values = [abs_m, v, update, math.sqrt(max(log_v2 - log_v * log_v, 0.0))]
        if signs is not None and all(previous[p] is not None for p in held):
            values.append(flips)
        rows += [_row(step, "adam", block, i, q, value) for q, value in zip(ADAM_QUANTITIES, values)]
    if signs is not None:
        signs.update({p: optimizer.state[p]["exp_avg"].signbit() for p in groups[-1][2] if p in optimizer.state})
    return rows


@torch.no_grad()
def robustness(
    model: nn.Module,
    x0: Tensor,
    t: Tensor,
    schedule: Schedule,
    sigmas: Sequence[float],
    seed: int = 0,
    step: int | None = None,
) -> list[Row]:
    """How much extra input noise moves the prediction and the loss (Theorem 3.4, Fig. 3c).

    Draws ``eps`` and one direction ``z ~ N(0, I)`` from a generator seeded with ``seed``, forms
    ``x_t = q_sample(x0, t, schedule, eps)`` and, for every ``sigma`` in ``sigmas``, feeds
    ``x_t + sigma * z`` (the same ``z`` for every sigma, so curves over sigma are smooth). With
    ``out(x) = eps_theta(x, t)`` and per-sample values averaged over the batch, it records:

    * ``output_change`` -- ``||out(x_t + sigma z) - out(x_t)||``, the left side of Theorem 3.4;
    * ``output_change_rel`` -- the same divided by ``||out(x_t)||``;
    * ``loss`` -- Eq. (2) on the perturbed input, the target still the original ``eps``;
    * ``loss_change`` -- ``loss`` minus the loss on the clean input.

    Runs in eval mode under ``torch.no_grad`` and restores every module's mode afterwards.

    Args:
        x0: clean images (B, C, H, W).
        t: times (B,) in the schedule's units (step indices for a ``DiscreteSchedule``).
        sigmas: the standard deviations ``sigma_delta`` of the extra noise, each >= 0.
        seed: seeds ``eps`` and ``z``; the same seed gives the same rows.

    Returns:
        Four rows per sigma, ``probe="robustness"``, ``block="model"``, ``sigma`` set.
    """
    sigmas = [float(s) for s in sigmas]
    if not sigmas or not all(math.isfinite(s) and s >= 0 for s in sigmas):
        raise ValueError(f"sigmas must be a non-empty list of finite numbers >= 0, got {sigmas}")
    generator = torch.Generator(device=x0.device).manual_seed(seed)
    eps, z = (torch.randn(x0.shape, generator=generator, device=x0.device, dtype=x0.dtype) for _ in range(2))
    x_t = q_sample(x0, t, schedule, eps)
    time = schedule.model_time(t)

    with _eval_mode(model):
        clean = model(x_t, time).float()
        clean_loss = (clean - eps.float()).square().flatten(1).mean(1)
        clean_norm = torch.linalg.vector_norm(clean.flatten(1), dim=1)
        rows = []
        for sigma in sigmas:
            out = model(x_t + sigma * z, time).float()
            change = torch.linalg.vector_norm((out - clean).flatten(1), dim=1)
            loss = (out - eps.float()).square().flatten(1).mean(1)
            values = torch.stack([change, change / clean_norm, loss, loss - clean_loss]).mean(1).tolist()
            rows += [
                _row(step, "robustness", "model", None, quantity, value, sigma)
                for quantity, value in zip(("output_change", "output_change_rel", "loss", "loss_change"), values)
            ]
    return rows


def probe_batch(images: Tensor, n: int, schedule: Schedule, seed: int = 0) -> tuple[Tensor, Tensor, Tensor]:
    """A fixed evaluation batch ``(x0, t, eps)``, stratified over time.

    Probing every run on the same batch makes a change in a probed norm mean a change in the
    weights, not a fresh draw of ``t`` and ``eps``. ``x0`` are the first ``n`` of ``images``
    (use held-out images), ``t`` spreads evenly over the schedule's ``T`` steps (one stratum
    per sample, ``linspace(0, T - 1, n)`` rounded) and ``eps`` comes from a generator seeded
    with ``seed``.

    Returns:
        ``x0`` (n, C, H, W), ``t`` (n,) long, ``eps`` (n, C, H, W), on ``images``' device.
    """
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= len(images):
        raise ValueError(f"n must be an int in [1, {len(images)}] (the images available), got {n!r}")
    x0 = images[:n]
    t = torch.linspace(0, schedule.T - 1, n, device=x0.device).round().long()
    generator = torch.Generator(device=x0.device).manual_seed(seed)
    eps = torch.randn(x0.shape, generator=generator, device=x0.device, dtype=x0.dtype)
    return x0, t, eps


def probe_fixed_batch(
    model: nn.Module, batch: tuple[Tensor, Tensor, Tensor], schedule: Schedule, step: int | None = None
) -> list[Row]:
    """Feature norms, kappas, the loss and block gradient norms of ``model`` on one fixed batch.

    One forward and backward pass of Eq. (2) on ``batch`` (:func:`probe_batch`) in eval mode:
    the rows of :class:`FeatureNorms`, ``probe="fixed"`` rows of the ``loss`` and of the output's
    ``output_sq_norm`` (per-sample ``||f(x_t)||^2``, batch mean: the network output that Sec. 4.1
    matches against ``||eps||^2``), and the rows of :func:`grad_norms` for the gradient of that loss.
    Gradients are cleared afterwards (set to ``None``), so call it after ``optimizer.step()``, never
    between backward and step.
    """
    x0, t, eps = batch
    with _eval_mode(model):
        with FeatureNorms(model, step) as features:
            pred = model(q_sample(x0, t, schedule, eps), schedule.model_time(t))
        loss = (pred.float() - eps.float()).square().mean()
        model.zero_grad(set_to_none=True)
        loss.backward()
        out_sq = pred.detach().float().flatten(1).square().sum(1).mean().item()
        rows = [*features.rows, _row(step, "fixed", "model", None, "loss", loss.item()),
                _row(step, "fixed", "model", None, "output_sq_norm", out_sq), *grad_norms(model, step)]
        model.zero_grad(set_to_none=True)
    return rows


@torch.no_grad()
def fixed_batch_loss(model: nn.Module, batch: tuple[Tensor, Tensor, Tensor], schedule: Schedule,
                     step: int | None = None, probe: str = "fixed_ema") -> Row:
    """The loss of Eq. (2) of ``model`` on the fixed batch (forward only, eval mode) as one row
    (``probe``, ``block="model"``, ``quantity="loss"``): for the EMA model, which the trainer never
    runs forward, so that its curve is as free of batch noise as the training model's."""
    x0, t, eps = batch
    with _eval_mode(model):
        pred = model(q_sample(x0, t, schedule, eps), schedule.model_time(t))
    return _row(step, probe, "model", None, "loss", (pred.float() - eps.float()).square().mean().item())


def jacobian_norm(f: Callable[[Tensor], Tensor], x: Tensor, iters: int = 10, seed: int = 0) -> Tensor:
    """Per-sample spectral norm of the Jacobian of ``f`` at ``x``, by power iteration on ``J^T J``.

    ``f`` must treat the samples of the batch independently (true of the book's models and
    blocks in eval mode), so its batch Jacobian is block-diagonal and each sample's block is
    iterated on its own: ``v <- J^T J v / ||J^T J v||`` (Jacobian-vector products by double
    backward), then ``||J v||``. The estimate approaches the largest singular value from below.

    Returns:
        (B,) float32: the local Lipschitz factor of ``f`` at each sample.
    """
    if isinstance(iters, bool) or not isinstance(iters, int) or iters < 1:
        raise ValueError(f"iters must be an int >= 1, got {iters!r}")
    generator = torch.Generator(device=x.device).manual_seed(seed)
    x = x.detach().float()

    def per_sample_unit(v: Tensor) -> Tensor:
        return v / torch.linalg.vector_norm(v.flatten(1), dim=1).clamp_min(1e-30).view(-1, *[1] * (v.dim() - 1))

    v = per_sample_unit(torch.randn(x.shape, generator=generator, device=x.device))
    with sdpa_kernel(SDPBackend.MATH):  # the fused attention kernels have no double backward
        for _ in range(iters):
            jv = torch.autograd.functional.jvp(f, x, v)[1]
            v = per_sample_unit(torch.autograd.functional.vjp(f, x, jv)[1])
        jv = torch.autograd.functional.jvp(f, x, v)[1]
    return torch.linalg.vector_norm(jv.flatten(1), dim=1).detach()


def lipschitz(model: nn.Module, x_t: Tensor, time: Tensor, iters: int = 10, seed: int = 0,
              step: int | None = None) -> list[Row]:
    """Local Lipschitz factors of every block and of the whole network (Theorem 3.4's ``M_0``).

    For each block ``a_i``, ``b_i`` the spectral norm of the Jacobian of its output with respect
    to its main input (the stream; the skip and time embedding held fixed), at the inputs it
    receives when the model runs on ``(x_t, time)``; and, as ``block="model"``, that of
    ``x_t -> eps_theta(x_t, time)``, the factor by which a small input perturbation can grow.
    By :func:`jacobian_norm`, in eval mode, averaged over the batch.

    Returns:
        Rows ``probe="lipschitz"``, ``quantity="jacobian_norm"``: 2N block rows and one model row.
    """
    inputs: dict[tuple[str, int], tuple[tuple, dict]] = {}

    def keep(key, module, args, kwargs):
        inputs[key] = (tuple(a.detach() if isinstance(a, Tensor) else a for a in args), kwargs)

    blocks = named_blocks(model)
    with _eval_mode(model):
        handles = [m.register_forward_pre_hook(partial(keep, (b, i)), with_kwargs=True) for b, i, m in blocks]
        try:
            with torch.no_grad():
                model(x_t, time)
        finally:
            for handle in handles:
                handle.remove()
        rows = []
        for block, i, module in blocks:
            args, kwargs = inputs[(block, i)]
            norms = jacobian_norm(lambda z: module(z, *args[1:], **kwargs), args[0], iters, seed)
            rows.append(_row(step, "lipschitz", block, i, "jacobian_norm", norms.mean().item()))
        norms = jacobian_norm(lambda z: model(z, time), x_t, iters, seed)
        rows.append(_row(step, "lipschitz", "model", None, "jacobian_norm", norms.mean().item()))
    return rows


BATCH_QUANTITIES = ("mean", "min", "max", "log_step")
"""What :class:`BatchNorms` keeps of each window of training steps, per block."""


class BatchNorms(Callback):
    """The norms of every training batch's decoder-block outputs ``h_i = b_i(...)`` and of the
    network output, recorded from the training forward pass itself (a :class:`scalelong_edu.train.Callback`).

    The fixed-batch probes show how the weights move; these show what the optimiser sees, step by
    step: the norm of each batch's features mixes the weights' change with the draw of ``x_0``,
    ``t`` and ``eps`` (the "oscillation across batches" of the paper's Fig. 1 and of the review).
    Forward hooks live only during the step's forward pass; each step costs one vector norm per
    block. To stay compact, the per-step norms (per-sample L2 norm, averaged over the batch) are
    summarised over windows of ``window`` steps by :meth:`summary` (rows with ``probe="batch"``):
    for each window (``step`` = its last step) and each block (``block="b"``, ``skip=i``; the
    network output: ``block="output"``), the ``mean``, ``min`` and ``max`` of the norm and
    ``log_step``, the mean ``|log n_{k+1} - log n_k|`` between consecutive steps of the window.

    Args:
        model: a :mod:`scalelong_edu.models` model (unwrapped from DDP), the trainer's.
        window: steps per summary window (e.g. the profile's ``eval_every``).
    """

    every = 1

    def __init__(self, model: nn.Module, window: int):
        if isinstance(window, bool) or not isinstance(window, int) or window < 2:
            raise ValueError(f"window must be an int >= 2 (steps per summary), got {window!r}")
        self.blocks = [(block, i, m) for block, i, m in named_blocks(model) if block == "b"]
        self.blocks.append(("output", None, model))
        self.window = window
        self.norms: dict[int, list[float]] = {}  # step -> one norm per block, in self.blocks' order
        self._handles: list[torch.utils.hooks.RemovableHandle] = []
        self._pending: dict[int, Tensor] = {}

    def _hook(self, k: int, module: nn.Module, inputs: tuple, output: Tensor) -> None:
        self._pending[k] = torch.linalg.vector_norm(output.detach().flatten(1), dim=1, dtype=torch.float32).mean()

    def on_step_start(self, trainer, step: int) -> None:
        self._handles = [m.register_forward_hook(partial(self._hook, k)) for k, (_, _, m) in enumerate(self.blocks)]

    def on_backward_end(self, trainer, step: int) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []
        if len(self._pending) == len(self.blocks):
            self.norms[step] = torch.stack([self._pending[k] for k in range(len(self.blocks))]).tolist()
        self._pending = {}

    def summary(self) -> list[Row]:
        """The windows' rows (see the class) of every step recorded so far."""
        steps = sorted(self.norms)
        if not steps:
            return []
        series = torch.tensor([self.norms[s] for s in steps], dtype=torch.float64)  # (steps, blocks)
        windows = torch.tensor([(s - 1) // self.window for s in steps])
        rows = []
        for w in windows.unique().tolist():
            mine = series[windows == w]
            end = steps[int((windows == w).nonzero().max())]
            logs = mine.clamp_min(1e-30).log()
            log_step = logs.diff(dim=0).abs().mean(0) if len(mine) > 1 else torch.full((mine.shape[1],), math.nan)
            stats = {"mean": mine.mean(0), "min": mine.amin(0), "max": mine.amax(0), "log_step": log_step}
            for k, (block, i, _) in enumerate(self.blocks):
                rows += [_row(end, "batch", block, i, q, stats[q][k].item()) for q in BATCH_QUANTITIES]
        return rows


def to_frame(rows: Iterable[Row]) -> pd.DataFrame:
    """Rows as a DataFrame with the columns :data:`COLUMNS`.

    Dtypes: ``step`` and ``skip`` nullable integers (``Int64``; ``<NA>`` where a row has none),
    ``sigma`` and ``value`` float64 (``sigma`` NaN outside the robustness probe), the rest strings.
    """
    import pandas as pd

    frame = pd.DataFrame(list(rows), columns=list(COLUMNS))
    return frame.astype({"step": "Int64", "skip": "Int64", "sigma": "float64", "value": "float64"})


class ProbeRecorder:
    """Collects the rows of every probe for one model over a training run.

    Args:
        model: a :mod:`scalelong_edu.models` model (unwrapped from DDP).
        optimizer: its Adam/AdamW optimizer; needed only by :meth:`after_step`.

    Attributes:
        rows: every row recorded so far, in order.
    """

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer | None = None):
        named_blocks(model)  # fail now, not at the first step, if the model has no a_i/b_i
        self.model, self.optimizer = model, optimizer
        self.rows: list[Row] = []
        self._signs: dict = {}

    @contextmanager
    def capture(self, step: int) -> Iterator[FeatureNorms]:
        """Record feature norms and kappas of the forward passes inside the ``with`` block.

        The hooks are added on entry and removed on exit, so steps outside ``capture`` run the
        plain model at no cost.
        """
        with FeatureNorms(self.model, step) as probe:
            yield probe
        self.rows += probe.rows

    def after_backward(self, step: int) -> None:
        """Record :func:`grad_norms`; call between ``loss.backward()`` and ``optimizer.zero_grad()``."""
        self.rows += grad_norms(self.model, step)

    def after_step(self, step: int) -> None:
        """Record :func:`adam_stats` (with sign flips since the previous call); call after
        ``optimizer.step()``."""
        if self.optimizer is None:
            raise ValueError("after_step needs the optimizer: create the recorder with ProbeRecorder(model, opt)")
        self.rows += adam_stats(self.optimizer, self.model, step, signs=self._signs)

    def fixed_batch(self, step: int, batch: tuple[Tensor, Tensor, Tensor], schedule: Schedule) -> None:
        """Record :func:`probe_fixed_batch`; call after ``optimizer.step()``."""
        self.rows += probe_fixed_batch(self.model, batch, schedule, step)

    def robustness(
        self, step: int, x0: Tensor, t: Tensor, schedule: Schedule, sigmas: Sequence[float], seed: int = 0
    ) -> None:
        """Record :func:`robustness` on a fixed batch, e.g. every few hundred steps."""
        self.rows += robustness(self.model, x0, t, schedule, sigmas, seed=seed, step=step)

    def to_frame(self) -> pd.DataFrame:
        """:func:`to_frame` of all rows recorded so far."""
        return to_frame(self.rows)
