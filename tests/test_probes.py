"""Tests of scalelong_edu.probes: every probe against a measurement done by hand."""

import math

import pandas as pd
import pytest
import torch

from scalelong_edu.diffusion import eps_loss, linear_schedule, q_sample
from scalelong_edu.models import build_model
from scalelong_edu.probes import (
    BatchNorms,
    fixed_batch_loss,
    ADAM_QUANTITIES,
    COLUMNS,
    FeatureNorms,
    ProbeRecorder,
    _adam_sums,
    adam_stats,
    grad_norms,
    jacobian_norm,
    lipschitz,
    named_blocks,
    probe_batch,
    probe_fixed_batch,
    robustness,
    to_frame,
)
from scalelong_edu.scaling import SkipScaling, cs_coefficients

PRESETS = ["uvit-ci", "unet-ci"]
DROPOUT = {"uvit-ci": {}, "unet-ci": {"dropout": 0.5}}  # the U-ViT has no dropout


def tiny(preset, method="none", kappa=0.5, **kw):
    torch.manual_seed(0)
    return build_model(preset, 1, 16, method, kappa, **kw)


def batch(b=3):
    g = torch.Generator().manual_seed(1)
    return torch.rand(b, 1, 16, 16, generator=g) * 2 - 1, torch.tensor([5.0, 300.0, 900.0][:b])


def pick(rows, **match):
    return [r for r in rows if all(r[k] == v for k, v in match.items())]


def value(rows, **match):
    (row,) = pick(rows, **match)
    return row["value"]


def outputs_by_hand(model, x, t):
    """Block outputs of one forward, captured with plain hooks: {("a", i): h, ("b", i): h}."""
    out, handles = {}, []
    for block, i, m in named_blocks(model):
        handles.append(m.register_forward_hook(lambda mod, inp, h, key=(block, i): out.__setitem__(key, h.detach())))
    model(x, t)
    for h in handles:
        h.remove()
    return out


def features_of_one_forward(model):
    with FeatureNorms(model) as probe, torch.no_grad():
        model(*batch())
    return probe.rows


def all_hooks(model):
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())


# ---------------------------------------------------------------- feature norms (Theorem 3.1)


@pytest.mark.parametrize("preset", PRESETS)
def test_feature_norms_equal_norms_computed_by_hand(preset):
    model = tiny(preset, "ls")
    x, t = batch()
    expected = outputs_by_hand(model, x, t)
    with FeatureNorms(model, step=7) as probe:
        model(x, t)
    rows = probe.rows
    n = model.n_skips
    for side in "ab":
        assert sorted(r["skip"] for r in pick(rows, block=side, quantity="norm")) == list(range(1, n + 1))
        assert len(pick(rows, block=side, quantity="sq_norm")) == n
    for (side, i), h in expected.items():
        per_sample = h.flatten(1).norm(dim=1)
        assert value(rows, block=side, skip=i, quantity="norm") == pytest.approx(per_sample.mean().item(), rel=1e-5)
        assert value(rows, block=side, skip=i, quantity="sq_norm") == pytest.approx(
            per_sample.square().mean().item(), rel=1e-5
        )
    # a_1's output recomputed from scratch for the U-ViT: patch embedding + time token + first block
    if preset == "uvit-ci":
        from scalelong_edu.models.embedding import timestep_embedding

        tokens = model.patch_embed(x).flatten(2).transpose(1, 2)
        h = torch.cat([timestep_embedding(t, model.embed_dim)[:, None], tokens], 1) + model.pos_embed
        a1 = model.in_blocks[0](h).detach()
        by_hand = a1.flatten(1).norm(dim=1).mean().item()
        assert value(rows, block="a", skip=1, quantity="norm") == pytest.approx(by_hand, rel=1e-5)
    assert {r["step"] for r in rows} == {7}
    assert all(type(r["value"]) is float for r in rows)


@pytest.mark.parametrize("preset", PRESETS)
def test_kappa_rows_equal_the_cs_coefficients(preset):
    model = tiny(preset, "cs", kappa=0.6)
    with FeatureNorms(model) as probe:
        model(*batch())
    kappas = sorted(pick(probe.rows, quantity="kappa"), key=lambda r: r["skip"])
    assert [r["value"] for r in kappas] == pytest.approx(cs_coefficients(0.6, model.n_skips))
    assert all(r["block"] is None for r in kappas)
    rms = sorted(pick(probe.rows, quantity="kappa_rms"), key=lambda r: r["skip"])
    assert [r["value"] for r in rms] == pytest.approx(cs_coefficients(0.6, model.n_skips))  # a constant: its rms


def test_kappa_rows_are_the_mean_ls_gate_of_the_batch():
    model = tiny("uvit-ci", "ls")
    x, t = batch()
    skips = outputs_by_hand(model, x, t)
    with FeatureNorms(model) as probe:
        model(x, t)
    for i in range(1, model.n_skips + 1):
        gates = model.scaling.nets[0](skips[("a", i)])
        gate = gates.mean().item()
        assert value(probe.rows, quantity="kappa", skip=i) == pytest.approx(gate, rel=1e-6)
        assert 0 < gate < 1
        rms = gates.double().square().mean().sqrt().item()  # sqrt(E[kappa^2]) >= E[kappa]
        assert value(probe.rows, quantity="kappa_rms", skip=i) == pytest.approx(rms, rel=1e-6) and rms > gate


@pytest.mark.parametrize("preset", PRESETS)
def test_feature_norms_under_autocast(preset):
    model = tiny(preset)
    x, t = batch()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        expected = outputs_by_hand(model, x, t)
        with FeatureNorms(model) as probe:
            out = model(x, t)
    assert out.dtype == torch.bfloat16  # the hooks saw low-precision features
    for (side, i), h in expected.items():
        got = value(probe.rows, block=side, skip=i, quantity="norm")
        assert type(got) is float and got == pytest.approx(h.float().flatten(1).norm(dim=1).mean().item(), rel=1e-3)


def test_hooks_exist_only_inside_capture_and_keep_no_graph():
    model = tiny("uvit-ci")
    x, t = batch()
    assert all_hooks(model) == 0
    rec = ProbeRecorder(model)
    model(x, t)  # outside capture: nothing recorded, no hooks
    assert rec.rows == [] and all_hooks(model) == 0
    with rec.capture(step=0):
        assert all_hooks(model) == 2 * model.n_skips
        loss = model(x, t).square().mean()
        loss.backward()
    assert all_hooks(model) == 0
    assert len(rec.rows) == 4 * model.n_skips + 2 * model.n_skips  # norm, sq_norm per block; kappa, kappa_rms per skip
    assert all(type(r["value"]) is float for r in rec.rows)
    n = len(rec.rows)
    model(x, t)
    assert len(rec.rows) == n
    with pytest.raises(RuntimeError, match="boom"), rec.capture(step=1):
        raise RuntimeError("boom")
    assert all_hooks(model) == 0  # removed even when the step fails


def test_feature_norms_cannot_be_entered_twice():
    probe = FeatureNorms(tiny("uvit-ci"))
    with probe, pytest.raises(RuntimeError, match="already recording"):
        probe.__enter__()


def test_probes_reject_models_without_blocks():
    with pytest.raises(TypeError, match="not a scalelong_edu model"):
        ProbeRecorder(torch.nn.Linear(2, 2))


# ---------------------------------------------------------------- gradient norms (Theorem 3.3)


@pytest.mark.parametrize("preset", PRESETS)
def test_grad_norms_equal_norms_computed_by_hand(preset):
    model = tiny(preset, "ls")
    loss = eps_loss(model, batch()[0], linear_schedule(), generator=torch.Generator().manual_seed(0))
    loss.backward()
    rows = grad_norms(model, step=3)
    assert len(rows) == 2 * model.n_skips + 1
    for side, blocks in (("a", model.encoder_blocks), ("b", model.decoder_blocks)):
        for i, block in enumerate(blocks, start=1):
            by_hand = torch.linalg.vector_norm(torch.cat([p.grad.flatten() for p in block.parameters()]))
            assert value(rows, block=side, skip=i) == pytest.approx(by_hand.item(), rel=1e-5)
            assert by_hand > 0
    total = torch.linalg.vector_norm(torch.cat([p.grad.flatten() for p in model.parameters()]))
    assert value(rows, block="model") == pytest.approx(total.item(), rel=1e-5)
    assert pick(rows, block="model")[0]["skip"] is None


def test_grad_norms_before_backward_raise():
    with pytest.raises(RuntimeError, match="after loss.backward"):
        grad_norms(tiny("unet-ci"))


# ---------------------------------------------------------------- Adam moments (reviewer, question 2)


def adam_by_hand(opt, params):
    """mean |m|, mean v, mean |m_hat| / (sqrt(v_hat) + eps) over params, written out from Adam's update."""
    (group,) = opt.param_groups
    b1, b2 = group["betas"]
    m = torch.cat([opt.state[p]["exp_avg"].flatten() for p in params])
    v = torch.cat([opt.state[p]["exp_avg_sq"].flatten() for p in params])
    t = opt.state[params[0]]["step"].item()
    update = (m / (1 - b1**t)).abs() / ((v / (1 - b2**t)).sqrt() + group["eps"])
    return m.abs().mean().item(), v.mean().item(), update.mean().item()


@pytest.mark.parametrize("optim", [torch.optim.Adam, torch.optim.AdamW])
@pytest.mark.parametrize("preset", PRESETS)
def test_adam_stats_match_a_hand_computation_after_two_steps(preset, optim):
    model = tiny(preset)
    opt = optim(model.parameters(), lr=1e-3, eps=1e-6)
    assert adam_stats(opt, model) == []  # no state yet: no rows, no crash
    x0 = batch()[0]
    for _ in range(2):
        eps_loss(model, x0, linear_schedule()).backward()
        opt.step()
        opt.zero_grad()
    rows = adam_stats(opt, model, step=2)
    for side, blocks in (("a", model.encoder_blocks), ("b", model.decoder_blocks), ("model", [model])):
        for i, block in enumerate(blocks, start=1):
            skip = None if side == "model" else i
            params = [p for p in block.parameters() if p in opt.state]
            expected = adam_by_hand(opt, params)
            got = [value(rows, block=side, skip=skip, quantity=q) for q in ("exp_avg_abs", "exp_avg_sq", "update_size")]
            assert got == pytest.approx(expected, rel=1e-5)
    # after the first step Adam's update is exactly the gradient's sign: |m_hat| / sqrt(v_hat) = 1
    assert 0 < value(rows, block="model", quantity="update_size") <= 1


def test_adam_stats_after_one_step_see_sign_updates():
    model = tiny("uvit-ci")
    opt = torch.optim.Adam(model.parameters(), eps=1e-30)
    for p in model.parameters():
        p.grad = torch.full_like(p, 0.5)
    opt.step()
    assert value(adam_stats(opt, model), block="model", quantity="update_size") == pytest.approx(1.0)


def test_adam_sums_stay_on_the_parameters_device():
    """On a GPU the first call (no previous signs) once stacked a CPU zero with CUDA sums and crashed
    every run; the meta device stands in for a GPU here."""
    m = torch.ones(3, device="meta")
    state = {"exp_avg": m, "exp_avg_sq": m, "step": torch.tensor(1.0)}
    group = {"betas": (0.9, 0.999), "amsgrad": False, "eps": 1e-8}
    assert _adam_sums(state, group, previous=None).device == m.device


def test_adam_stats_skip_parameters_without_state():
    model = tiny("uvit-ci")
    opt = torch.optim.Adam(model.parameters())
    model.encoder_blocks[0].requires_grad_(False)  # a_1 never gets a gradient, so never gets state
    eps_loss(model, batch()[0], linear_schedule()).backward()
    opt.step()
    rows = adam_stats(opt, model)
    assert pick(rows, block="a", skip=1) == []
    assert [r["quantity"] for r in pick(rows, block="a", skip=2)] == list(ADAM_QUANTITIES[:4])


def test_adam_stats_reject_other_optimizers():
    model = tiny("unet-ci")
    with pytest.raises(TypeError, match="Adam or AdamW"):
        adam_stats(torch.optim.SGD(model.parameters(), lr=0.1), model)
    with pytest.raises(ValueError, match="none of the model's parameters"):
        adam_stats(torch.optim.Adam(torch.nn.Linear(2, 2).parameters()), model)
    with pytest.raises(ValueError, match="needs the optimizer"):
        ProbeRecorder(model).after_step(0)


def set_grads(model, value):
    for p in model.parameters():
        p.grad = torch.full_like(p, value)


def test_log_v_std_is_the_spread_of_log_v_by_hand():
    model = tiny("unet-ci")
    opt = torch.optim.Adam(model.parameters())
    set_grads(model, 1.0)
    opt.step()
    a1 = list(model.encoder_blocks[0].parameters())
    g = torch.Generator().manual_seed(0)
    for p in model.parameters():  # v = exp(normal): ln v has a known spread within every block
        opt.state[p]["exp_avg_sq"] = (torch.randn(p.shape, generator=g) * 1.5 - 2).exp()
    opt.state[a1[0]]["exp_avg_sq"] = torch.tensor([1.0, math.e**2]).repeat(a1[0].numel() // 2).view(a1[0].shape)
    rows = adam_stats(opt, model)
    for side, blocks in (("a", model.encoder_blocks), ("b", model.decoder_blocks), ("model", [model])):
        for i, block in enumerate(blocks, start=1):
            log_v = torch.cat([opt.state[p]["exp_avg_sq"].double().log().flatten() for p in block.parameters()])
            got = value(rows, block=side, skip=None if side == "model" else i, quantity="log_v_std")
            assert got == pytest.approx(log_v.std(correction=0).item(), rel=1e-4)
    # a single parameter holding v in {1, e^2}, half each: ln v in {0, 2}, standard deviation exactly 1
    only = torch.optim.Adam(a1[:1])
    only.state[a1[0]] = opt.state[a1[0]]
    assert value(adam_stats(only, model), block="a", skip=1, quantity="log_v_std") == pytest.approx(1.0, rel=1e-6)


def test_log_v_std_of_a_constant_v_is_zero():
    """E[(ln v)^2] - E[ln v]^2 cancels badly for small v unless summed in float64."""
    model = tiny("uvit-ci")
    opt = torch.optim.Adam(model.parameters())
    set_grads(model, 1e-4)  # v = (1 - beta2) g^2 = 1e-11 everywhere, a typical size late in training
    opt.step()
    assert value(adam_stats(opt, model), block="model", quantity="log_v_std") == pytest.approx(0.0, abs=1e-3)


def test_m_sign_flip_counts_elements_whose_momentum_changed_sign():
    model = tiny("uvit-ci")
    opt = torch.optim.Adam(model.parameters())
    signs = {}
    set_grads(model, 1.0)
    opt.step()  # m = 0.1 > 0 everywhere
    first = adam_stats(opt, model, step=1, signs=signs)
    assert pick(first, quantity="m_sign_flip") == []  # nothing to compare with at the first call
    assert set(signs) == set(model.parameters()) and all(s.dtype == torch.bool for s in signs.values())
    opt.step()  # the same gradient: m = 0.19, no sign changed
    same = adam_stats(opt, model, step=2, signs=signs)
    assert {r["value"] for r in pick(same, quantity="m_sign_flip")} == {0.0}
    assert len(pick(same, quantity="m_sign_flip")) == 2 * model.n_skips + 1
    assert [r["quantity"] for r in pick(same, block="model")] == list(ADAM_QUANTITIES)
    set_grads(model, -10.0)
    opt.step()  # m = 0.9 * 0.19 - 1 < 0: every element flipped
    flipped = adam_stats(opt, model, step=3, signs=signs)
    assert {r["value"] for r in pick(flipped, quantity="m_sign_flip")} == {1.0}
    assert pick(adam_stats(opt, model, step=3), quantity="m_sign_flip") == []  # without signs: not recorded


def test_m_sign_flip_is_the_fraction_of_flipped_elements():
    model = tiny("unet-ci")
    opt = torch.optim.Adam(model.parameters())
    set_grads(model, 1.0)
    opt.step()
    signs = {}
    adam_stats(opt, model, signs=signs)
    a1 = list(model.encoder_blocks[0].parameters())
    flip = a1[0]  # flip the momentum of one parameter of a_1 by hand
    opt.state[flip]["exp_avg"].neg_()
    rows = adam_stats(opt, model, signs=signs)
    count = sum(p.numel() for p in a1)
    assert value(rows, block="a", skip=1, quantity="m_sign_flip") == pytest.approx(flip.numel() / count)
    total = sum(p.numel() for p in model.parameters())
    assert value(rows, block="model", quantity="m_sign_flip") == pytest.approx(flip.numel() / total)
    assert value(rows, block="b", skip=1, quantity="m_sign_flip") == 0.0
    assert value(adam_stats(opt, model, signs=signs), block="model", quantity="m_sign_flip") == 0.0  # signs updated


# ---------------------------------------------------------------- robustness (Theorem 3.4, Fig. 3c)


@pytest.mark.parametrize("preset", PRESETS)
def test_robustness_zero_sigma_gives_zero_change_and_change_grows_with_sigma(preset):
    model = tiny(preset)
    x0 = batch()[0]
    t = torch.tensor([10, 500, 900])
    sigmas = [0.0, 0.01, 0.1, 1.0]
    rows = robustness(model, x0, t, linear_schedule(), sigmas, seed=3, step=5)
    assert len(rows) == 4 * len(sigmas)
    for q in ("output_change", "output_change_rel", "loss_change"):
        assert value(rows, sigma=0.0, quantity=q) == 0.0
    changes = [value(rows, sigma=s, quantity="output_change") for s in sigmas]
    assert changes == sorted(changes) and changes[1] > 0
    assert value(rows, sigma=1.0, quantity="loss_change") != 0  # its sign is the model's business
    assert {r["block"] for r in rows} == {"model"} and {r["step"] for r in rows} == {5}


def test_robustness_matches_a_hand_computation():
    model = tiny("uvit-ci").eval()
    x0, schedule, t = batch()[0], linear_schedule(), torch.tensor([10, 500, 900])
    rows = robustness(model, x0, t, schedule, [0.3], seed=11)
    g = torch.Generator().manual_seed(11)
    eps, z = torch.randn(x0.shape, generator=g), torch.randn(x0.shape, generator=g)
    x_t, time = q_sample(x0, t, schedule, eps), schedule.model_time(t)
    with torch.no_grad():
        clean, noisy = model(x_t, time), model(x_t + 0.3 * z, time)
    change = (noisy - clean).flatten(1).norm(dim=1)
    loss, clean_loss = [(o - eps).square().flatten(1).mean(1) for o in (noisy, clean)]
    assert value(rows, quantity="output_change") == pytest.approx(change.mean().item(), rel=1e-5)
    rel = (change / clean.flatten(1).norm(dim=1)).mean().item()
    assert value(rows, quantity="output_change_rel") == pytest.approx(rel, rel=1e-5)
    assert value(rows, quantity="loss") == pytest.approx(loss.mean().item(), rel=1e-5)
    assert value(rows, quantity="loss_change") == pytest.approx((loss - clean_loss).mean().item(), rel=1e-4, abs=1e-7)


def test_robustness_is_deterministic_and_restores_modes():
    model = tiny("unet-ci", dropout=0.5)  # dropout: eval mode matters
    model.train()
    model.out.eval()  # a mixed state must come back as it was
    x0, t = batch()[0], torch.tensor([10, 500, 900])
    modes = {name: m.training for name, m in model.named_modules()}
    first = robustness(model, x0, t, linear_schedule(), [0.0, 0.5], seed=1)
    assert {name: m.training for name, m in model.named_modules()} == modes
    assert robustness(model, x0, t, linear_schedule(), [0.0, 0.5], seed=1) == first
    assert robustness(model, x0, t, linear_schedule(), [0.0, 0.5], seed=2) != first
    assert torch.is_grad_enabled()


def test_robustness_rejects_bad_sigmas():
    model = tiny("uvit-ci")
    x0, t = batch()[0], torch.tensor([1, 2, 3])
    for sigmas in ([], [-0.1], [math.nan]):
        with pytest.raises(ValueError, match="sigmas must be"):
            robustness(model, x0, t, linear_schedule(), sigmas)


# ---------------------------------------------------------------- recorder and tidy frames


def test_recorder_runs_a_training_loop_and_builds_a_tidy_frame():
    model = tiny("unet-ci", "ls")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    rec = ProbeRecorder(model, optimizer=opt)
    x0, schedule = batch()[0], linear_schedule()
    for step in range(3):
        with rec.capture(step):
            loss = eps_loss(model, x0, schedule)
            loss.backward()
        rec.after_backward(step)
        opt.step()
        opt.zero_grad()
        rec.after_step(step)
    rec.robustness(2, x0, torch.tensor([1, 2, 3]), schedule, [0.0, 0.1])
    rec.fixed_batch(3, probe_batch(x0, 3, schedule), schedule)
    frame = rec.to_frame()
    n = model.n_skips
    assert list(frame.columns) == list(COLUMNS)
    features = len(features_of_one_forward(model))
    per_step = features + (2 * n + 1) + 4 * (2 * n + 1)  # features + grads + adam (no sign flips at the first)
    assert len(frame) == 3 * per_step + 2 * (2 * n + 1) + 8 + (features + 2 + 2 * n + 1)  # + flips, fixed batch
    flips = frame.query("quantity == 'm_sign_flip'")
    assert sorted(flips["step"].unique()) == [1, 2]  # the recorder keeps the signs between steps
    assert set(frame.query("step == 3")["probe"]) == {"features", "fixed", "grads"}
    assert str(frame["step"].dtype) == "Int64" and str(frame["skip"].dtype) == "Int64"
    assert frame["value"].dtype == "float64" and frame["sigma"].dtype == "float64"
    for col in ("probe", "quantity"):
        assert pd.api.types.is_string_dtype(frame[col])
    assert set(frame["probe"]) == {"features", "grads", "adam", "robustness", "fixed"}
    assert frame.loc[frame["block"] == "model", "skip"].isna().all()
    assert frame.loc[frame["probe"] == "robustness", "sigma"].notna().all()
    assert frame.loc[frame["probe"] != "robustness", "sigma"].isna().all()
    assert frame["value"].notna().all()
    norms = frame.query("probe == 'features' and quantity == 'norm' and block == 'b'")
    assert sorted(norms["skip"].unique()) == list(range(1, n + 1))
    assert len(norms) == 4 * n  # three training steps and the fixed batch


def test_to_frame_of_no_rows_has_the_columns():
    frame = to_frame([])
    assert list(frame.columns) == list(COLUMNS) and len(frame) == 0
    assert frame["value"].dtype == "float64"


# ---------------------------------------------------------------- the fixed probe batch


def test_probe_batch_is_fixed_and_stratified_over_t():
    images, schedule = torch.rand(10, 1, 16, 16), linear_schedule()
    x0, t, eps = probe_batch(images, 4, schedule, seed=3)
    assert torch.equal(x0, images[:4]) and eps.shape == x0.shape and eps.dtype == x0.dtype
    assert t.dtype == torch.long and t.tolist() == [0, 333, 666, 999]  # linspace(0, T - 1, 4)
    assert probe_batch(images, 10, schedule)[1].tolist() == [0, 111, 222, 333, 444, 555, 666, 777, 888, 999]
    assert probe_batch(images, 5, schedule)[1].tolist() == [0, 250, 500, 749, 999]  # rounded, not truncated
    assert probe_batch(images, 1, schedule)[1].tolist() == [0]
    assert torch.equal(probe_batch(images, 4, schedule, seed=3)[2], eps)
    assert not torch.equal(probe_batch(images, 4, schedule, seed=4)[2], eps)
    assert eps.std().item() == pytest.approx(1, abs=0.2)
    for n in (0, 11, 2.0, True, None):
        with pytest.raises(ValueError, match="n must be an int in \\[1, 10\\]"):
            probe_batch(images, n, schedule)


@pytest.mark.parametrize("preset", PRESETS)
def test_probe_fixed_batch_measures_the_loss_features_and_gradients_of_that_batch(preset):
    model = tiny(preset, "ls", **DROPOUT[preset])  # dropout: the probe must run in eval mode
    model.train()
    model.encoder_blocks[0].eval()  # a mixed state comes back as it was
    modes = {name: m.training for name, m in model.named_modules()}
    schedule = linear_schedule()
    batch_ = probe_batch(batch(3)[0], 3, schedule, seed=5)
    rows = probe_fixed_batch(model, batch_, schedule, step=4)
    assert {name: m.training for name, m in model.named_modules()} == modes
    assert all(p.grad is None for p in model.parameters())
    assert probe_fixed_batch(model, batch_, schedule, step=4) == rows  # fixed: the same rows again

    x0, t, eps = batch_
    model.eval()  # by hand: the same loss and gradients, in eval mode
    expected = outputs_by_hand(model, q_sample(x0, t, schedule, eps), schedule.model_time(t))
    loss = eps_loss(model, x0, schedule, t=t, noise=eps)
    loss.backward()
    n = model.n_skips
    assert value(rows, probe="fixed", quantity="loss") == pytest.approx(loss.item(), rel=1e-5)
    with torch.no_grad():
        out = model(q_sample(x0, t, schedule, eps), schedule.model_time(t))
    assert value(rows, probe="fixed", quantity="output_sq_norm") == pytest.approx(
        out.flatten(1).square().sum(1).mean().item(), rel=1e-5)
    assert {r["block"] for r in pick(rows, probe="fixed")} == {"model"}
    for (side, i), h in expected.items():
        assert value(rows, block=side, skip=i, quantity="norm") == pytest.approx(
            h.flatten(1).norm(dim=1).mean().item(), rel=1e-5)
        assert len(pick(rows, block=side, skip=i, quantity="sq_norm")) == 1
    assert len(pick(rows, quantity="kappa")) == n
    by_hand = grad_norms(model, step=4)
    assert [r["value"] for r in pick(rows, probe="grads")] == pytest.approx([r["value"] for r in by_hand], rel=1e-5)
    assert len(rows) == len(features_of_one_forward(model)) + 2 + 2 * n + 1 and {r["step"] for r in rows} == {4}
    assert all_hooks(model) == 0


def test_probe_fixed_batch_clears_gradients_and_changes_no_weights():
    model = tiny("uvit-ci")
    schedule = linear_schedule()
    x0, t, eps = probe_batch(batch(3)[0], 3, schedule)
    weights = [p.detach().clone() for p in model.parameters()]
    set_grads(model, 1.0)  # stale gradients neither leak into the probe nor survive it
    rows = probe_fixed_batch(model, (x0, t, eps), schedule)
    assert all(p.grad is None for p in model.parameters())
    assert all(torch.equal(w, p) for w, p in zip(weights, model.parameters()))
    eps_loss(model, x0, schedule, t=t, noise=eps).backward()
    assert value(rows, probe="grads", block="model") == pytest.approx(value(grad_norms(model), block="model"), rel=1e-5)


# ---------------------------------------------------------------- Jacobian norms and Lipschitz factors


def test_jacobian_norm_of_a_linear_map_is_its_largest_singular_value():
    diag = torch.diag(torch.tensor([0.5, 3.0, 1.0, 2.0]))
    x = torch.randn(3, 4, generator=torch.Generator().manual_seed(0))
    assert jacobian_norm(lambda z: z @ diag.T, x).tolist() == pytest.approx([3.0] * 3, rel=1e-3)
    A = torch.randn(6, 5, generator=torch.Generator().manual_seed(1))  # sigma_1 / sigma_2 = 1.14: slow to converge
    got = jacobian_norm(lambda z: z @ A.T, torch.randn(3, 5, generator=torch.Generator().manual_seed(2)), iters=100)
    assert got.shape == (3,) and got.dtype == torch.float32
    assert got.tolist() == pytest.approx([torch.linalg.matrix_norm(A, 2).item()] * 3, rel=1e-3)
    assert (got <= torch.linalg.matrix_norm(A, 2) * (1 + 1e-5)).all()  # power iteration: from below


def test_jacobian_norm_is_per_sample_on_images():
    scale = torch.tensor([1.0, 2.0, 5.0]).view(3, 1, 1, 1)
    A = torch.randn(8, 8, generator=torch.Generator().manual_seed(2))
    x = torch.randn(3, 1, 8, 8, generator=torch.Generator().manual_seed(3))

    def f(z):  # each sample's image times A, row by row, times its own scale: ||J_b|| = scale_b ||A||
        return scale * (z @ A.T)

    expected = (scale.flatten() * torch.linalg.matrix_norm(A, 2)).tolist()
    assert jacobian_norm(f, x, iters=100).tolist() == pytest.approx(expected, rel=1e-3)
    assert torch.equal(jacobian_norm(f, x, iters=3, seed=1), jacobian_norm(f, x, iters=3, seed=1))
    assert jacobian_norm(lambda z: z.sin(), torch.zeros(2, 3)).tolist() == pytest.approx([1.0, 1.0])  # nonlinear


def test_jacobian_norm_rejects_bad_iters():
    for iters in (0, -1, 2.5, True, None):
        with pytest.raises(ValueError, match="iters must be an int >= 1"):
            jacobian_norm(lambda z: z, torch.ones(1, 2), iters=iters)


class LinearNet(torch.nn.Module):
    """``x -> b_1(a_1(x), skip=a_1(x))`` with ``a_1(x) = A x`` and ``b_1(h, skip) = B h + C skip``."""

    def __init__(self, A, B, C):
        super().__init__()
        self.a = torch.nn.Linear(A.shape[1], A.shape[0], bias=False)
        self.a.weight.data = A
        self.b = Merge(B, C)
        self.n_skips, self.encoder_blocks, self.decoder_blocks = 1, [self.a], [self.b]
        self.scaling = SkipScaling()

    def forward(self, x, t):
        h = self.a(x)
        return self.b(h, h)


class Merge(torch.nn.Module):
    def __init__(self, B, C):
        super().__init__()
        self.B, self.C = torch.nn.Parameter(B), torch.nn.Parameter(C)

    def forward(self, h, skip):
        return h @ self.B.T + skip @ self.C.T


def test_lipschitz_of_linear_blocks_are_their_matrix_norms():
    g = torch.Generator().manual_seed(0)
    A, B, C = (torch.randn(4, 4, generator=g) for _ in range(3))
    model = LinearNet(A, B, C)
    rows = lipschitz(model, torch.randn(2, 4, generator=g), torch.zeros(2), iters=200, step=9)
    norm = lambda M: torch.linalg.matrix_norm(M, 2).item()  # noqa: E731
    assert value(rows, block="a", skip=1) == pytest.approx(norm(A), rel=1e-3)
    assert value(rows, block="b", skip=1) == pytest.approx(norm(B), rel=1e-3)  # the skip is held fixed
    assert value(rows, block="model") == pytest.approx(norm((B + C) @ A), rel=1e-3)  # the skip moves with x
    assert {(r["probe"], r["quantity"], r["step"]) for r in rows} == {("lipschitz", "jacobian_norm", 9)}


@pytest.mark.parametrize("preset", PRESETS)
def test_lipschitz_gives_one_positive_row_per_block_and_the_model(preset):
    model = tiny(preset, "ls", **DROPOUT[preset])
    model.train()
    x, t = batch(2)
    rows = lipschitz(model, x, t[:2], iters=2, step=1)
    n = model.n_skips
    assert [(r["block"], r["skip"]) for r in rows] == [*(("a", i) for i in range(1, n + 1)),
                                                       *(("b", i) for i in range(1, n + 1)), ("model", None)]
    assert all(r["value"] > 0 and math.isfinite(r["value"]) for r in rows)
    assert all(m.training for m in model.modules()) and all_hooks(model) == 0
    assert all(p.grad is None for p in model.parameters())
    assert lipschitz(model, x, t[:2], iters=2, step=1) == rows  # eval mode: dropout off, deterministic


def test_fixed_batch_loss_is_the_eval_mode_loss_of_that_batch():
    model = tiny("uvit-ci", "cs", **DROPOUT["uvit-ci"]).train()
    schedule = linear_schedule()
    x0, t, eps = probe_batch(batch(3)[0], 3, schedule, seed=2)
    row = fixed_batch_loss(model, (x0, t, eps), schedule, step=7)
    assert model.training and all(p.grad is None for p in model.parameters())
    model.eval()
    with torch.no_grad():
        expected = eps_loss(model, x0, schedule, t=t, noise=eps).item()
    assert row["value"] == pytest.approx(expected, rel=1e-5)
    assert (row["step"], row["probe"], row["block"], row["quantity"]) == (7, "fixed_ema", "model", "loss")


@pytest.mark.parametrize("preset", PRESETS)
def test_batch_norms_are_the_training_forward_norms_summarised_per_window(preset):
    from scalelong_edu.train import TrainConfig, Trainer

    torch.manual_seed(0)
    images = torch.rand(32, 1, 16, 16) * 2 - 1
    model = tiny(preset)
    trainer = Trainer(model, images, linear_schedule(), TrainConfig(steps=5, batch_size=4, seed=0), progress=False)
    probe = BatchNorms(trainer.model, window=2)
    seen = []  # the same norms by hand, from hooks of our own on the outermost decoder block and the model
    hooks = [m.register_forward_hook(lambda m, i, o, k=k: seen.append((k, o.detach().flatten(1).norm(dim=1).mean())))
             for k, m in (("b1", trainer.model.decoder_blocks[0]), ("out", trainer.model))]
    trainer.callbacks.append(probe)
    trainer.fit()
    for h in hooks:
        h.remove()
    assert sorted(probe.norms) == [1, 2, 3, 4, 5] and all(len(v) == model.n_skips + 1 for v in probe.norms.values())
    b1 = [v.item() for k, v in seen if k == "b1"]
    out = [v.item() for k, v in seen if k == "out"]
    assert [probe.norms[s][0] for s in range(1, 6)] == pytest.approx(b1, rel=1e-5)
    assert [probe.norms[s][-1] for s in range(1, 6)] == pytest.approx(out, rel=1e-5)
    assert all_hooks(trainer.model) == 0  # the probe's hooks are gone after each step
    rows = probe.summary()
    assert sorted({r["step"] for r in rows}) == [2, 4, 5]  # windows (1, 2), (3, 4), (5)
    assert value(rows, block="b", skip=1, step=4, quantity="mean") == pytest.approx((b1[2] + b1[3]) / 2, rel=1e-5)
    assert value(rows, block="b", skip=1, step=4, quantity="max") == pytest.approx(max(b1[2:4]), rel=1e-5)
    assert value(rows, block="output", step=2, quantity="log_step") == pytest.approx(
        abs(math.log(out[1] / out[0])), rel=1e-5)
    assert math.isnan(value(rows, block="output", step=5, quantity="log_step"))  # one step: no change to measure
    with pytest.raises(ValueError, match="window"):
        BatchNorms(model, window=1)
