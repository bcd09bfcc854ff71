"""Tests of scalelong_edu.models: the official U-ViT's parameter counts, shapes, gradients."""

from functools import partial

import pytest
import torch

from scalelong_edu.diffusion import eps_loss, linear_schedule
from scalelong_edu.models import PRESETS, UNet, UViT, build_model, count_parameters
from scalelong_edu.models.unet import DecoderBlock
from scalelong_edu.scaling import METHODS, make_scaling

# Parameter counts of the official U-ViT (sail-sg/ScaleLong, libs/uvit.py), read by instantiating
# it with scalelong = 0 / 3 / 4 (none / LS shared / LS per skip) at each configuration.
OFFICIAL_UVIT_COUNTS = [
    (dict(img_size=32, patch_size=2, in_chans=3, embed_dim=512, depth=12, num_heads=8), (44_255_328, 44_263_825, 44_306_310)),
    (dict(img_size=64, patch_size=4, in_chans=3, embed_dim=512, depth=12, num_heads=8), (44_292_228, 44_300_725, 44_343_210)),
    (
        dict(img_size=64, patch_size=4, in_chans=3, embed_dim=768, depth=16, num_heads=12, mlp_time_embed=True, num_classes=1000),
        (135_662_724, 135_671_254, 135_730_964),
    ),
    (dict(img_size=32, patch_size=4, in_chans=1, embed_dim=128, depth=12, num_heads=4), (2_782_746, 2_783_335, 2_786_280)),
    (dict(img_size=16, patch_size=2, in_chans=1, embed_dim=64, depth=4, num_heads=2, qkv_bias=True), (271_310, 271_899, 272_488)),
]


@pytest.mark.parametrize("config, counts", OFFICIAL_UVIT_COUNTS)
def test_uvit_parameter_count_equals_the_official_model(config, counts):
    with torch.device("meta"):  # counts only: no memory for the 135M model
        got = tuple(count_parameters(UViT(scaling=make_scaling(m), **config)) for m in ("none", "ls", "ls-per-skip"))
    assert got == counts


@pytest.mark.parametrize("chans", [1, 3])
@pytest.mark.parametrize("size", [16, 32])
@pytest.mark.parametrize("preset", ["unet-ci", "unet-s", "uvit-ci", "uvit-s"])
def test_output_shape_equals_input_shape(preset, chans, size):
    model = build_model(preset, chans, size)
    x = torch.randn(2, chans, size, size)
    assert model(x, torch.tensor([0.0, 999.0])).shape == x.shape


def test_n_skips_follows_the_configuration():
    assert UNet(base_channels=16, channel_mults=(1, 1, 1, 1), blocks_per_level=3).n_skips == 12
    assert UViT(img_size=16, patch_size=4, embed_dim=32, depth=20, num_heads=2).n_skips == 10
    for model in (build_model("unet-s", 1, 32), build_model("uvit-s", 1, 32)):
        assert len(model.encoder_blocks) == len(model.decoder_blocks) == model.n_skips == 6


def test_unet_skips_mirror_resolutions():
    model = UNet(in_chans=1, base_channels=16, channel_mults=(1, 2, 2), blocks_per_level=2,
                 scaling=make_scaling("ls-per-skip"))
    shapes = {}
    for i, a in enumerate(model.encoder_blocks, start=1):
        a.register_forward_hook(lambda m, inp, out, i=i: shapes.__setitem__(i, tuple(out.shape[1:])))
    model(torch.randn(1, 1, 16, 16), torch.tensor([5.0]))
    assert shapes == {1: (16, 16, 16), 2: (16, 16, 16), 3: (32, 8, 8), 4: (32, 8, 8), 5: (32, 4, 4), 6: (32, 4, 4)}
    assert model.scaling.widths == (16, 16, 32, 32, 32, 32)


@pytest.mark.parametrize("preset", ["unet-ci", "unet-s", "unet-m", "uvit-ci"])
def test_the_output_depends_on_the_time(preset):
    """Normalisation must not erase the time embedding (instance norm after a per-channel bias would)."""
    torch.manual_seed(0)
    model = build_model(preset, 1, 16)
    for module in model.modules():  # undo the zero init of the residual branches' last layers
        if isinstance(module, (torch.nn.Conv2d, torch.nn.Linear)):
            torch.nn.init.normal_(module.weight, std=0.1)
    x = torch.randn(2, 1, 16, 16)
    with torch.no_grad():
        change = (model(x, torch.full((2,), 10.0)) - model(x, torch.full((2,), 900.0))).abs().max()
    assert change > 1e-2


def test_kappa_survives_the_normalisation_of_a_conv_decoder_block():
    """The 1x1 merge mixes stream and skip before GroupNorm, so kappa_i changes the residual branch."""
    torch.manual_seed(0)
    block = build_model("unet-s", 1, 16).decoder_blocks[0]
    h, skip = torch.randn(2, 32, 16, 16), torch.randn(2, 32, 16, 16) * 3
    normed = [block.res.norm1(block.merge(torch.cat([h, k * skip], 1))) for k in (1.0, 0.25)]
    assert ((normed[0] - normed[1]).norm() / normed[0].norm()).item() > 0.1


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("preset", ["unet-ci", "uvit-ci"])
def test_backward_through_model_and_loss_gives_finite_gradients(preset, method):
    torch.manual_seed(0)
    model = build_model(preset, 3, 16, method, kappa=0.7)
    loss = eps_loss(model, torch.rand(4, 3, 16, 16) * 2 - 1, linear_schedule())
    loss.backward()
    grads = [p.grad for p in model.parameters()]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
    if method.startswith("ls"):
        assert all(p.grad.abs().sum() > 0 for p in model.scaling.parameters())


def test_presets_build_and_report_counts():
    for name in PRESETS:
        with torch.device("meta"):
            assert count_parameters(build_model(name, 3, 32)) > 10_000


def test_bad_model_input_raises():
    with pytest.raises(ValueError, match="unknown model preset"):
        build_model("resnet", 3, 32)
    with pytest.raises(ValueError, match="divisible by patch_size"):
        UViT(img_size=30, patch_size=4)
    with pytest.raises(ValueError, match=r"expected input \(B, 3, 16, 16\)"):
        build_model("uvit-ci", 3, 16)(torch.randn(1, 1, 16, 16), torch.zeros(1))
    with pytest.raises(ValueError, match="divisible by 4"):
        build_model("unet-s", 1, 32)(torch.randn(1, 1, 18, 18), torch.zeros(1))
    with pytest.raises(ValueError, match="t must have shape"):
        build_model("unet-ci", 1, 16)(torch.randn(2, 1, 16, 16), torch.zeros(2, 1))
    with pytest.raises(ValueError, match="in_chans must be a positive int.*got 0"):
        build_model("uvit-ci", 0, 16)
    with pytest.raises(ValueError, match="img_size must be a positive int.*got -4"):
        build_model("uvit-ci", 1, -4)
    with pytest.raises(ValueError, match="img_size must be a positive int.*got 16.0"):
        build_model("unet-ci", 1, 16.0)
    with pytest.raises(ValueError, match="img_size 18 must be divisible by 4"):
        build_model("unet-s", 1, 18)


def _unet_gating_every_skip(model, x, t):
    """The reference for the folded LS merge: the same model with no gate to fold, so every skip is
    scaled by the scaling object's forward (``gate * skip``), concatenated and merged by the 1x1 conv."""
    model.scaling.gate = lambda skip, i: None  # an instance attribute shadows the method
    try:
        return model(x, t)
    finally:
        del model.scaling.gate


def _output_and_grads(forward, model, x, t):
    """``forward(x, t)`` and the gradient of every parameter of ``model`` (by name) for a squared loss."""
    model.zero_grad(set_to_none=True)
    out = forward(x, t)
    out.square().mean().backward()
    return out.detach(), {name: p.grad.clone() for name, p in model.named_parameters()}


def test_gated_merge_equals_gating_then_concatenating():
    """W_h h + (W_s diag(g)) skip == merge(cat[h, g * skip]) in value and in every gradient; channel
    counts all differ, so a gate on the wrong axis or a wrong split of the weight cannot pass."""
    torch.manual_seed(0)
    block = DecoderBlock(in_ch=8, skip_ch=5, out_ch=6, time_dim=16, up=False, dropout=0.0).double()
    h = torch.randn(3, 8, 4, 6, dtype=torch.float64, requires_grad=True)
    skip = torch.randn(3, 5, 4, 6, dtype=torch.float64, requires_grad=True)
    gate = torch.rand(3, 5, dtype=torch.float64, requires_grad=True)
    inputs = [h, skip, gate, block.merge.weight, block.merge.bias]
    folded = block.gated_merge(h, skip, gate)
    reference = block.merge(torch.cat([h, gate[:, :, None, None] * skip], dim=1))
    assert folded.shape == reference.shape == (3, 6, 4, 6)
    assert torch.allclose(folded, reference, rtol=1e-5, atol=1e-6)
    weights = torch.randn_like(reference)
    grads = torch.autograd.grad((folded * weights).sum(), inputs)
    expected = torch.autograd.grad((reference * weights).sum(), inputs)
    for got, want in zip(grads, expected):
        assert torch.allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("method", ["ls", "ls-per-skip"])
@pytest.mark.parametrize("preset", ["unet-ci", "unet-s"])
def test_ls_unet_with_folded_gates_matches_gating_the_skips(preset, method):
    """In training the UNet folds the LS gates into its merges (the scaling object's forward is not
    called); output and every gradient, the calibration networks' included, match the reference."""
    torch.manual_seed(0)
    model = build_model(preset, 3, 16, method)
    x, t = torch.randn(4, 3, 16, 16), torch.tensor([5.0, 300.0, 700.0, 999.0])
    calls = []
    handle = model.scaling.register_forward_hook(lambda m, inp, out: calls.append(inp[2]))
    out, grads = _output_and_grads(model, model, x, t)
    assert calls == []  # folded
    ref_out, ref_grads = _output_and_grads(partial(_unet_gating_every_skip, model), model, x, t)
    handle.remove()
    assert calls == list(range(model.n_skips, 0, -1))
    assert torch.allclose(out, ref_out, rtol=1e-5, atol=1e-6)
    for name, got in grads.items():
        assert torch.allclose(got, ref_grads[name], rtol=1e-5, atol=1e-6), name
    assert all(grads[name].abs().sum() > 0 for name in grads if name.startswith("scaling."))


def test_unet_gates_the_skip_through_the_scaling_object_without_autograd():
    """Without autograd nothing is folded: hooks on the scaling object see every gated skip."""
    torch.manual_seed(0)
    model = build_model("unet-ci", 1, 16, "ls-per-skip")
    x, t = torch.randn(2, 1, 16, 16), torch.tensor([3.0, 800.0])
    seen = {}
    model.scaling.register_forward_hook(lambda m, inp, out: seen.__setitem__(inp[2], out[1] / inp[1]))
    with torch.no_grad():
        plain = model(x, t)
    assert sorted(seen) == [1, 2]
    assert torch.allclose(plain, model(x, t).detach(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("method", ["none", "sqrt2-cs", "cs", "block-output"])
def test_constant_methods_merge_exactly_as_before(method):
    """Only LS gates are folded: constant methods scale and concatenate as the reference does, bit for bit."""
    torch.manual_seed(0)
    model = build_model("unet-s", 3, 16, method, kappa=0.7)
    x, t = torch.randn(4, 3, 16, 16), torch.tensor([5.0, 300.0, 700.0, 999.0])
    out, grads = _output_and_grads(model, model, x, t)
    ref_out, ref_grads = _output_and_grads(partial(_unet_gating_every_skip, model), model, x, t)
    assert torch.equal(out, ref_out)
    assert all(torch.equal(got, ref_grads[name]) for name, got in grads.items())
