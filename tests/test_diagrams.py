"""Tests of scalelong_edu.diagrams: the UNet diagram, skip features and tables, parameter counts."""

import matplotlib
import matplotlib.pyplot as plt
import pytest
import torch

from scalelong_edu.diagrams import (
    draw_calibration,
    draw_unet,
    init_norms,
    parameter_table,
    skip_features,
    skip_summary,
)
from scalelong_edu.models import build_model
from scalelong_edu.models.embedding import timestep_embedding
from scalelong_edu.scaling import Calibration, cs_coefficients


def _texts(ax, prefix):
    return {t.get_gid(): t.get_text() for t in ax.texts if (t.get_gid() or "").startswith(prefix)}


@pytest.mark.parametrize("n", [1, 3, 6, 10])
def test_draw_unet_labels_every_skip_with_its_kappa(n):
    kappas = cs_coefficients(0.5, n)
    ax = draw_unet(n, kappas)
    labels = _texts(ax, "kappa_")
    assert set(labels) == {f"kappa_{i}" for i in range(1, n + 1)}
    for i, k in enumerate(kappas, start=1):
        text = labels[f"kappa_{i}"]
        assert text.startswith(rf"$\kappa_{{{i}}} = ")
        assert float(text.split("=")[1].strip(" $")) == pytest.approx(k, rel=1e-3)
    assert set(_texts(ax, "a_")) == {f"a_{i}" for i in range(1, n + 1)}
    assert set(_texts(ax, "b_")) == {f"b_{i}" for i in range(1, n + 1)}
    assert rf"f_{{{n}}}" in _texts(ax, "bottleneck")["bottleneck"]


def test_outer_skip_is_on_top_and_arrows_get_thinner_with_kappa():
    ax = draw_unet(3, [1.0, 0.5, 0.25])
    labels = {t.get_gid(): t for t in ax.texts if (t.get_gid() or "").startswith("kappa_")}
    ys = [labels[f"kappa_{i}"].get_position()[1] for i in (1, 2, 3)]
    assert ys[0] > ys[1] > ys[2]  # i = 1 outermost, at the top
    skip_widths = sorted(
        (a.arrow_patch.get_linewidth() for a in ax.texts if getattr(a, "arrow_patch", None) is not None
         and a.arrow_patch.get_edgecolor()[:3] == matplotlib.colors.to_rgb("#b2182b")),
        reverse=True,
    )
    assert len(skip_widths) == 3 and skip_widths[0] > skip_widths[1] > skip_widths[2]


def test_draw_unet_symbols_strings_stream_factors_and_notes():
    fig, ax = plt.subplots()
    assert draw_unet(2, None, ax) is ax
    assert _texts(ax, "kappa_") == {"kappa_1": r"$\kappa_{1}$", "kappa_2": r"$\kappa_{2}$"}
    ax = draw_unet(2, [1.0, "learned"], stream_factors=[0.5, 0.25], encoder_notes=["8x16x16", "8x8x8"])
    assert _texts(ax, "kappa_")["kappa_2"] == "learned"
    assert _texts(ax, "stream_") == {"stream_1": r"$\eta_{1} = 0.5$", "stream_2": r"$\eta_{2} = 0.25$"}
    assert any(t.get_text() == "8x8x8" for t in ax.texts)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(n_skips=0), "n_skips must be >= 1"),
        (dict(n_skips=2.0), "whole number"),
        (dict(n_skips=3, kappas=[1.0, 0.5]), "2 values but n_skips = 3"),
        (dict(n_skips=2, kappas=[1.0, 0.0]), "kappa_2 must be a finite number > 0"),
        (dict(n_skips=2, kappas=[1.0, -0.5]), "> 0"),
        (dict(n_skips=2, kappas=0.5), "sequence of 2 values"),
        (dict(n_skips=2, stream_factors=[0.5]), "stream_factors has 1 values"),
    ],
)
def test_draw_unet_rejects_bad_input(kwargs, match):
    with pytest.raises(ValueError, match=match):
        draw_unet(**kwargs)


def test_skip_features_are_the_encoder_outputs_in_order():
    torch.manual_seed(0)
    model = build_model("unet-s", 1, 16)
    x, t = torch.randn(2, 1, 16, 16), torch.tensor([3.0, 700.0])
    feats = skip_features(model, x, t)
    assert [tuple(f.shape) for f in feats] == [(2, 32, 16, 16)] * 2 + [(2, 32, 8, 8)] * 2 + [(2, 32, 4, 4)] * 2
    # the hooks are gone afterwards
    assert all(not block._forward_hooks for block in model.encoder_blocks)
    # the first skip is a_1(stem(x)), recomputed by hand
    with torch.no_grad():
        temb = model.time_mlp(timestep_embedding(t, 32))
        assert torch.allclose(feats[0], model.encoder_blocks[0](model.stem(x), temb), atol=1e-6)
    with pytest.raises(ValueError, match="no encoder_blocks"):
        skip_features(torch.nn.Linear(2, 2), x, t)


def test_skip_summary_of_a_uvit():
    model = build_model("uvit-ci", 1, 16, "cs", 0.5)
    table = skip_summary(model, torch.randn(2, 1, 16, 16), torch.tensor([1.0, 2.0]))
    assert list(table.index) == [1, 2]
    assert list(table["a_i(x) shape"]) == ["17 × 64", "17 × 64"]  # 16 patches + time token, width 64
    assert list(table["gated width"]) == [17, 17]
    assert list(table["mean kappa_i"]) == pytest.approx([1.0, 0.5])


def test_parameter_table_of_the_official_cifar_uvit():
    table = parameter_table(["uvit-cifar"], 3, 32, ["none", "cs", "ls", "ls-per-skip"])
    assert table["uvit-cifar"].to_dict() == {
        "none": 44_255_328, "cs": 44_255_328, "ls": 44_263_825, "ls-per-skip": 44_306_310,
    }


def test_parameter_table_columns_per_preset():
    table = parameter_table(["unet-ci", "uvit-ci"], 1, 16, ["none", "ls"])
    assert list(table.columns) == ["unet-ci", "uvit-ci"] and list(table.index) == ["none", "ls"]
    hidden = max(16 // 16, Calibration.MIN_HIDDEN)
    assert table.loc["ls", "unet-ci"] - table.loc["none", "unet-ci"] == 16 * hidden + hidden + hidden * 16 + 16
    assert parameter_table("uvit-ci", 1, 16, ["none"]).shape == (1, 1)


def test_init_norms_compares_norms_at_initialisation_with_the_sum_of_kappa_squared():
    torch.manual_seed(0)
    x, t = torch.randn(4, 1, 16, 16), torch.tensor([10.0, 200.0, 500.0, 900.0])
    methods = ["none", "cs", "block-output", "ls"]
    table = init_norms("uvit-ci", x, t, methods, kappa=0.5, seed=3)
    assert list(table.index) == methods
    assert list(table.columns) == ["sum_kappa2", "tail_kappa2_mean", "output_sq", "hidden_sq_mean", "hidden_sq_1",
                                   "hidden_sq_2"]
    assert table.equals(init_norms("uvit-ci", x, t, methods, kappa=0.5, seed=3))  # seeded
    assert list(table["sum_kappa2"][:3]) == pytest.approx([2.0, 1.25, 1.25])  # block-output: its paths
    # mean over i of sum_{j >= i} kappa_j^2: none (2 + 1) / 2, CS (1.25 + 0.25) / 2
    assert list(table["tail_kappa2_mean"][:2]) == pytest.approx([1.5, 0.75])

    torch.manual_seed(3)  # the same initialisation, measured by hand
    model = build_model("uvit-ci", 1, 16, "ls").eval()
    seen = {}
    model.decoder_blocks[0].register_forward_hook(lambda m, inp, out: seen.__setitem__("h_1", out))
    model.scaling.register_forward_hook(lambda m, inp, out: seen.__setitem__(inp[2], out[1] / inp[1]))
    with torch.no_grad():
        out = model(x, t)
    x_sq = x.flatten(1).square().sum(1).mean()
    ls = table.loc["ls"]
    assert ls["sum_kappa2"] == pytest.approx(sum(seen[i].square().mean().item() for i in (1, 2)), rel=1e-5)
    assert ls["output_sq"] == pytest.approx((out.flatten(1).square().sum(1).mean() / x_sq).item(), rel=1e-5)
    assert ls["hidden_sq_1"] == pytest.approx((seen["h_1"].flatten(1).square().sum(1).mean() / x_sq).item(), rel=1e-5)
    assert table.loc["cs", "hidden_sq_mean"] < table.loc["none", "hidden_sq_mean"]
    with pytest.raises(ValueError, match="B, C, H, W"):
        init_norms("uvit-ci", x[0], t)


def test_draw_calibration_shows_every_stage_with_its_shape():
    ax = draw_calibration(17, 96, 4, gated="tokens", pooled="dim")
    texts = {t.get_gid(): t.get_text() for t in ax.texts if t.get_gid()}
    assert sorted(texts) == [f"stage_{k}" for k in range(7)]
    assert "(B, 17 tokens, 96 dim)" in texts["stage_0"] and "(B, 17)" in texts["stage_1"]
    assert "Linear 17→4" in texts["stage_2"] and "Linear 4→17" in texts["stage_3"]
    assert "(B, 17, 1)" in texts["stage_4"] and "(B, 17, 96)" in texts["stage_5"]
    for bad in (dict(width=0, length=4, hidden=2), dict(width=4, length=4, hidden=1.5)):
        with pytest.raises(ValueError, match="positive integer"):
            draw_calibration(**bad)
