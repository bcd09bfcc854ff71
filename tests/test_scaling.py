"""Tests of scalelong_edu.scaling: what each method does to the long skips, and bad input."""

import math

import pytest
import torch
import torch.nn.functional as F

from scalelong_edu.models import UNet, UViT, count_parameters
from scalelong_edu.scaling import (
    METHODS,
    BlockOutputScaling,
    LearnableScaling,
    constant_scaling,
    cs_coefficients,
    make_scaling,
    path_factors,
)


def tiny_uvit(method="none", kappa=0.5, depth=8, **kw):
    return UViT(img_size=16, patch_size=4, in_chans=1, embed_dim=32, depth=depth, num_heads=2,
                scaling=make_scaling(method, kappa, **kw))


def tiny_unet(method="none", kappa=0.5, **kw):
    return UNet(in_chans=1, base_channels=16, channel_mults=(1, 1), blocks_per_level=2,
                scaling=make_scaling(method, kappa, **kw))


def test_cs_coefficients_follow_eq_8():
    assert cs_coefficients(0.5, 6) == [1.0, 0.5, 0.25, 0.125, 0.0625, 0.03125]
    assert cs_coefficients(0.8, 1) == [1.0]


def _skips_received(model, x, t):
    """Run the model and capture (encoder output a_i(x), skip that reached b_i) for i = 1..N.

    Both backbones call decoder block ``b_i`` with the (scaled) skip as second positional argument.
    """
    produced, received = {}, {}
    hooks = []
    for i, (a, b) in enumerate(zip(model.encoder_blocks, model.decoder_blocks), start=1):
        hooks.append(a.register_forward_hook(lambda m, inp, out, i=i: produced.__setitem__(i, out)))
        hooks.append(b.register_forward_pre_hook(lambda m, inp, i=i: received.__setitem__(i, inp[1])))
    model(x, t)
    for h in hooks:
        h.remove()
    return produced, received


@pytest.mark.parametrize("build", [tiny_uvit, tiny_unet])
def test_cs_scales_skip_i_by_kappa_to_the_i_minus_1_outermost_first(build):
    model = build("cs", 0.5)
    produced, received = _skips_received(model, torch.randn(2, 1, 16, 16), torch.tensor([3.0, 700.0]))
    n = model.n_skips
    for i in range(1, n + 1):
        torch.testing.assert_close(received[i], produced[i] * 0.5 ** (i - 1))
    assert model.scaling.coefficients[-1] == 0.5 ** (n - 1)  # innermost skip, next to the bottleneck


def test_sqrt2_cs_scales_every_skip_equally():
    model = tiny_uvit("sqrt2-cs")
    produced, received = _skips_received(model, torch.randn(2, 1, 16, 16), torch.tensor([3.0, 700.0]))
    for i in produced:
        torch.testing.assert_close(received[i], produced[i] / math.sqrt(2))


@pytest.mark.parametrize("build", [tiny_uvit, tiny_unet])
def test_cs_with_kappa_one_equals_no_scaling_bit_for_bit(build):
    x, t = torch.randn(3, 1, 16, 16), torch.tensor([1.0, 10.0, 900.0])
    torch.manual_seed(0)
    plain = build("none")
    torch.manual_seed(0)
    cs1 = build("cs", 1.0)
    assert torch.equal(plain(x, t), cs1(x, t))
    plain(x, t).square().mean().backward()
    cs1(x, t).square().mean().backward()
    for p, q in zip(plain.parameters(), cs1.parameters()):
        assert torch.equal(p.grad, q.grad)


def test_ls_parameter_counts_match_the_official_uvit_s2():
    base = dict(img_size=32, patch_size=2, in_chans=3, embed_dim=512, depth=12, num_heads=8)
    n_none = count_parameters(UViT(**base))
    shared = count_parameters(UViT(scaling=make_scaling("ls"), **base)) - n_none
    per_skip = count_parameters(UViT(scaling=make_scaling("ls-per-skip"), **base)) - n_none
    # 257 tokens, hidden 257 // 16 = 16: (257*16 + 16) + (16*257 + 257) = 8,497 per network
    assert shared == 8_497
    assert per_skip == 6 * 8_497


def test_ls_gates_channels_of_conv_skips_and_tokens_of_uvit_skips():
    unet = tiny_unet("ls-per-skip")
    assert [net.fc1.in_features for net in unet.scaling.nets] == [16, 16, 16, 16]
    uvit = tiny_uvit("ls")
    assert uvit.scaling.nets[0].fc1.in_features == uvit.num_tokens == 17
    skip = torch.randn(5, 16, 4, 4)
    gate = unet.scaling.kappa(skip, 2)
    assert gate.shape == (5, 16, 1, 1) and ((gate > 0) & (gate < 1)).all()


@pytest.mark.parametrize("shape", [(3, 16, 4, 5), (3, 17, 32)])  # conv skip (B, C, H, W), U-ViT skip (B, L, D)
def test_calibration_gate_is_eq_9_on_the_global_average(shape):
    """sigmoid(W2 relu(W1 GAP(x))) with GAP the mean over every axis after the gated one, in value and
    gradient; kappa is the same gate shaped to broadcast, and only LS has a gate to fold."""
    scaling = LearnableScaling(per_skip=True)
    scaling.bind([shape[1]] * 2)
    net = scaling.nets[1]
    x = torch.randn(shape, dtype=torch.float64, requires_grad=True)
    net.double()
    gate = scaling.gate(x, 2)
    reference = torch.sigmoid(net.fc2(F.relu(net.fc1(x.flatten(2).mean(-1)))))
    assert gate.shape == shape[:2]
    assert torch.allclose(gate, reference, rtol=1e-5, atol=1e-6)
    assert torch.equal(scaling.kappa(x, 2), gate.view(*shape[:2], *[1] * (len(shape) - 2)))
    weights = torch.randn(shape[:2], dtype=torch.float64)
    (got,) = torch.autograd.grad((gate * weights).sum(), x)
    (want,) = torch.autograd.grad((reference * weights).sum(), x)
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-6)
    for method in ("none", "cs", "block-output"):
        assert constant_scaling(method, 0.5, 2).gate(x, 1) is None


@pytest.mark.parametrize("method", METHODS)
def test_effective_kappas_are_the_path_factors(method):
    model = tiny_uvit(method, 0.5)
    produced, _ = _skips_received(model, torch.randn(2, 1, 16, 16), torch.tensor([3.0, 700.0]))
    kappas = model.scaling.effective_kappas([produced[i] for i in range(1, model.n_skips + 1)])
    assert kappas.shape == (4,) and kappas.dtype == torch.float64
    if method in ("ls", "ls-per-skip"):  # PyTorch's default init: gates sit near sigmoid(small) ~ 0.5
        assert ((kappas > 0.3) & (kappas < 0.7)).all()
    else:  # block-output: skips unscaled, but skip i's path rides the stream through i - 1 merges
        assert kappas.tolist() == pytest.approx(path_factors(method, 0.5, 4)[:4])
        assert kappas.tolist() == pytest.approx({"none": [1.0] * 4, "sqrt2-cs": [2**-0.5] * 4}.get(
            method, [1, 0.5, 0.25, 0.125]))


def _linear_standin_output(scaling, n, skip_delta=None, bottleneck_delta=0.0):
    """Eq. (3) with identity blocks, a_i(x) = x, b_i(u) = u and f_N(u) = u, merged the way both
    backbones call the scaling object. ``skip_delta = (k, d)`` perturbs only skip k's copy of a_k(x)."""
    x = torch.ones(1, 1, 1, dtype=torch.float64)
    skips = [x.clone() for _ in range(n)]
    if skip_delta is not None:
        k, d = skip_delta
        skips[k - 1] = skips[k - 1] + d
    h = x + bottleneck_delta
    for i in range(n, 0, -1):
        h, skip = scaling(h, skips[i - 1], i)
        h = h + skip
    return h.item()


@pytest.mark.parametrize("method, kappa", [("none", 0.5), ("sqrt2-cs", 0.5), ("cs", 0.5), ("cs", 0.8),
                                           ("block-output", 0.5), ("block-output", 0.8)])
@pytest.mark.parametrize("n", [1, 2, 6])
def test_path_factors_match_perturbing_each_path_of_a_linear_model(method, kappa, n):
    """Perturb one path's input by d: the output moves by (its total factor) * d, path by path."""
    scaling = make_scaling(method, kappa)
    scaling.bind([1] * n)
    base, d = _linear_standin_output(scaling, n), 0.125
    measured = [(_linear_standin_output(scaling, n, skip_delta=(k, d)) - base) / d for k in range(1, n + 1)]
    measured.append((_linear_standin_output(scaling, n, bottleneck_delta=d) - base) / d)
    assert measured == pytest.approx(path_factors(method, kappa, n), rel=1e-12)


def test_block_output_paths_equal_cs_on_the_skips_and_eta_to_the_n_on_the_bottleneck():
    # not the compounding eta ** (k (k - 1) / 2) of a factor eta ** i at merge i
    assert path_factors("block-output", 0.5, 6) == pytest.approx([1, 0.5, 0.25, 0.125, 0.0625, 0.03125, 0.5**6])
    assert path_factors("cs", 0.5, 6) == pytest.approx(cs_coefficients(0.5, 6) + [1.0])
    assert path_factors("sqrt2-cs", 0.5, 2) == pytest.approx([2**-0.5, 2**-0.5, 1.0])
    assert path_factors("none", 0.9, 3) == [1.0] * 4
    with pytest.raises(ValueError, match="learns kappa_i.*measured_kappas"):
        path_factors("ls", 0.5, 6)
    with pytest.raises(ValueError, match="n_skips must be >= 1"):
        constant_scaling("cs", 0.5, 0)


def test_block_output_scaling_scales_the_stream_by_eta_at_every_merge():
    scaling = BlockOutputScaling(0.5)
    scaling.bind([8, 8, 8])
    h, skip = torch.ones(2, 8, 4), torch.ones(2, 8, 4)
    for i in (1, 2, 3):
        h2, skip2 = scaling(h, skip, i)
        assert torch.equal(skip2, skip) and torch.equal(h2, h * 0.5)
    assert [scaling.outward_factor(i) for i in range(4)] == [1.0, 0.5, 0.25, 0.125]


@pytest.mark.parametrize("build", [tiny_uvit, tiny_unet])
def test_block_output_in_a_model_scales_each_deeper_output_once(build):
    """In the real backbones the stream entering b_i is eta times what the deeper block produced."""
    model = build("block-output", 0.5)
    n, blocks = model.n_skips, model.decoder_blocks
    feeds = {i: blocks[i] for i in range(1, n)}  # b_{i+1} feeds merge i; the bottleneck feeds merge N
    feeds[n] = model.mid_block if isinstance(model, UViT) else model.mid[-1]
    produced, entering, hooks = {}, {}, []
    for i in range(1, n + 1):
        hooks.append(feeds[i].register_forward_hook(lambda m, inp, out, i=i: produced.__setitem__(i, out)))
        hooks.append(blocks[i - 1].register_forward_pre_hook(lambda m, inp, i=i: entering.__setitem__(i, inp[0])))
    model(torch.randn(2, 1, 16, 16), torch.tensor([3.0, 700.0]))
    for hook in hooks:
        hook.remove()
    assert sorted(entering) == list(range(1, n + 1))
    for i in entering:
        torch.testing.assert_close(entering[i], 0.5 * produced[i])


def test_rms_statistic_averages_squared_gates_not_the_squared_mean():
    scaling = LearnableScaling(per_skip=True)
    scaling.bind([2])
    net = scaling.nets[0]
    with torch.no_grad():  # gates 0.1 and 0.9 whatever the input: mean 0.5, mean square 0.41
        net.fc2.weight.zero_()
        net.fc2.bias.copy_(torch.tensor([math.log(0.1 / 0.9), math.log(0.9 / 0.1)]))
    skip = torch.randn(3, 2, 5)
    assert scaling.effective_kappas([skip]).item() == pytest.approx(0.5, rel=1e-6)
    assert scaling.effective_kappas([skip], "rms").item() ** 2 == pytest.approx(0.41, rel=1e-6)
    with pytest.raises(ValueError, match="'mean' or 'rms'"):
        scaling.effective_kappas([skip], "median")


@pytest.mark.parametrize("bad", [0, -0.5, float("nan"), float("inf"), "half", None])
@pytest.mark.parametrize("method", ["cs", "block-output"])
def test_bad_kappa_raises_a_clear_error(method, bad):
    with pytest.raises(ValueError, match="finite number > 0|must be a number"):
        make_scaling(method, bad)


def test_bad_method_and_options_raise():
    with pytest.raises(ValueError, match="unknown skip-scaling method 'CS'.*none, sqrt2-cs, cs"):
        make_scaling("CS")
    with pytest.raises(TypeError, match="no options"):
        make_scaling("cs", 0.5, reduction=4)


def test_per_skip_module_count_must_match_n():
    with pytest.raises(ValueError, match="n_skips=6 but the model has N = 4"):
        tiny_uvit("ls-per-skip", n_skips=6)
    assert tiny_uvit("ls-per-skip", n_skips=4).scaling.n_skips == 4


def test_shared_ls_needs_equal_widths_and_one_model():
    with pytest.raises(ValueError, match="same width.*ls-per-skip"):
        UNet(in_chans=1, base_channels=16, channel_mults=(1, 2), blocks_per_level=1, scaling=make_scaling("ls"))
    scaling = LearnableScaling()
    UViT(img_size=16, patch_size=4, in_chans=1, embed_dim=32, depth=4, num_heads=2, scaling=scaling)
    with pytest.raises(RuntimeError, match="one per model"):
        UViT(img_size=16, patch_size=4, in_chans=1, embed_dim=32, depth=4, num_heads=2, scaling=scaling)


def test_unbound_scaling_and_bad_index_raise():
    s = make_scaling("cs")
    with pytest.raises(RuntimeError, match="not bound"):
        s(torch.ones(1), torch.ones(1), 1)
    s.bind([4, 4])
    with pytest.raises(IndexError, match="1 .. 2"):
        s(torch.ones(1), torch.ones(1), 3)
