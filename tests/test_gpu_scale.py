"""A chapter's "at GPU scale" section: without a GPU it says what it would train; at the ci size it
runs end to end; its figure stands beside the committed result's."""

from __future__ import annotations

from dataclasses import replace
from functools import partial

import matplotlib.pyplot as plt
import pytest
import torch

from scalelong_edu import experiments as ex
from scalelong_edu import gpu_scale
from scalelong_edu import probes as pr
from scalelong_edu.profiles import PROFILES

TINY = replace(PROFILES["ci"], steps=4, eval_every=2, batch_size=8, n_samples=4, sample_steps=2, seeds=2,
               seed_cap=None)
QUICK = ex.Experiment("quick", "two tiny runs, the Frechet distance twice",
                      (ex.RunSpec("none"), ex.RunSpec("CS (kappa=0.5)", method="cs")), fd_points=2, fd_samples=8,
                      robustness_sigmas=(0.0, 0.1))


@pytest.fixture(autouse=True)
def tmp_results(results_here, monkeypatch):
    monkeypatch.setitem(ex.EXPERIMENTS, "quick", QUICK)
    return results_here


def test_a_section_without_a_gpu_says_what_it_would_train(monkeypatch, capsys):
    monkeypatch.setattr(gpu_scale, "live_profile", lambda: PROFILES["gpu"])
    monkeypatch.setattr(gpu_scale, "pick_device", lambda: torch.device("cpu"))
    monkeypatch.setattr(gpu_scale, "run_experiment", lambda *a, **k: pytest.fail("nothing may train without a GPU"))
    assert gpu_scale.section(3) is None
    out = capsys.readouterr().out
    assert "[live-uvit] no GPU found, so nothing is trained. At GPU scale this section trains 4 runs x 1,750 " in out
    assert "steps of uvit-m" in out and "min on a Colab T4 (by its FLOPs). On Colab: Runtime >" in out
    with pytest.raises(ValueError, match="no chapter 9 has an 'at GPU scale' section"):
        gpu_scale.section(9)


def test_every_section_runs_end_to_end_at_the_ci_size(monkeypatch, untimed_estimate):
    """What a GPU reader's section does, at the ci profile on the CPU: trains, measures, caches;
    chapter 7 trains only its LS runs (its unscaled runs are chapter 3's). The estimate it announces
    is tested in test_cost.py, the Lipschitz probe's accuracy (here one power iteration, not ten) in
    test_probes.py."""
    monkeypatch.setenv("SCALELONG_PROFILE", "ci")
    monkeypatch.setattr(ex, "lipschitz", partial(pr.lipschitz, iters=1))
    trained = []
    real = ex.train_run
    monkeypatch.setattr(ex, "train_run", lambda run, *a, **k: trained.append(run.label) or real(run, *a, **k))
    for chapter in sorted(gpu_scale.SECTIONS):
        result = gpu_scale.section(chapter, progress=False)
        assert result.spec["profile"]["name"] == "ci" and result.path.exists()
        assert all(r["diverged_at"] is None and r["samples"] for r in result.runs)
    assert trained.count("LS") == 2 and trained.count("none") == 1 + 2 + 2  # ddpm, unet, uvit; not ls


def test_curves_over_training_for_every_quantity_and_the_figure_beside():
    result = ex.run_experiment("quick", TINY, progress=False)
    for quantity in gpu_scale.QUANTITIES:
        frame = gpu_scale.over_training(result, quantity)
        assert list(frame.columns) == ["label", "method", "seed", "step", "value"], quantity
        assert set(frame.method) == {"none", "cs"} and set(frame.seed) == {0, 1} and (frame.value > 0).all()
    loss = gpu_scale.over_training(result, "loss")
    # a running mean over a twentieth of the run: none for a run of 4 steps
    merged = loss.merge(result.history(), on=["label", "seed", "step"])
    assert len(merged) == len(loss) and list(merged.value) == pytest.approx(list(merged.loss))
    assert list(dict.fromkeys(loss.label)) == ["none", "CS (kappa=0.5)"]  # the result's order
    assert sorted(gpu_scale.over_training(result, "fcd").step.unique()) == [2, 4]
    with pytest.raises(ValueError, match="unknown quantity 'norm'; choose one of loss, grad_norm"):
        gpu_scale.over_training(result, "norm")

    fig = gpu_scale.curves_beside(3, "feature_norm", result, None)
    drawn, missing = fig.axes
    assert drawn.get_title() == "cpu profile (committed)" and len(drawn.lines) == 2 * 2 + 2  # seeds + medians
    assert not missing.axison and "needs a GPU" in missing.texts[0].get_text()
    assert [t.get_text() for t in drawn.get_legend().get_texts()] == ["none", "CS (κ = 0.5)"]
    plt.close(fig)
    fig = gpu_scale.curves_beside(7, "loss", result, result)
    assert all(len(ax.lines) == 2 + 1 for ax in fig.axes)
    plt.close(fig)
    fig = gpu_scale.robustness_beside(3, result, None)
    assert [line.get_label() for line in fig.axes[0].lines] == ["none", "CS (kappa=0.5)"]
    assert list(fig.axes[0].lines[0].get_xdata()) == [0.0, 0.1]
    plt.close(fig)
    assert gpu_scale.samples(None, "none") is None
    assert gpu_scale.samples(result, "none").shape == (4, 1, 16, 16)
