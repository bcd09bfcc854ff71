"""What training costs, said before it is spent: FLOP counts, the T4 budget of every chapter's live
section, the refusal beyond a budget, a checkpoint loaded instead of training."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from scalelong_edu import cost, gpu_scale
from scalelong_edu import experiments as ex
from scalelong_edu.diffusion import eps_loss, linear_schedule
from scalelong_edu.models import build_model
from scalelong_edu.profiles import PROFILES

TINY = replace(PROFILES["ci"], steps=4, eval_every=2, batch_size=8, n_samples=4, sample_steps=2, seeds=1,
               seed_cap=None)
QUICK = ex.Experiment("quick", "two tiny runs", (ex.RunSpec("none"), ex.RunSpec("CS", method="cs")),
                      robustness_sigmas=(0.0, 0.1))


@pytest.fixture(autouse=True)
def tmp_results(results_here, monkeypatch):
    monkeypatch.setitem(ex.EXPERIMENTS, "quick", QUICK)
    return results_here


@pytest.mark.parametrize("preset", ["unet-ci", "uvit-ci"])
def test_the_meta_device_count_is_the_count_of_a_real_step(preset):
    torch.manual_seed(0)
    model = build_model(preset, 1, 16)
    x0 = torch.zeros(2, 1, 16, 16)
    with FlopCounterMode(display=False) as counter:
        eps_loss(model, x0, linear_schedule()).backward()
    counted = cost.model_cost(model, preset, 1, 16, batch_size=2)
    # the U-ViT's attention is counted on meta (the math path) and not on the CPU's fused kernel
    assert counted.step >= counter.get_total_flops() > 0.8 * counted.step
    assert 0 < 2 * counted.forward < counted.step
    assert cost.model_cost(model, preset, 1, 16, batch_size=8).step == 4 * counted.step
    assert all(p.device.type == "cpu" for p in model.parameters())  # counted on a copy


def test_every_chapter_s_live_section_fits_its_t4_budget():
    """Each "at GPU scale" section, cold (nothing cached), within 25 minutes of a T4 by its FLOPs."""
    minutes = {}
    for chapter, name in gpu_scale.SECTIONS.items():
        experiment = ex.get_experiment(name)
        work = ex.work(experiment, PROFILES["gpu"])
        assert work.dataset == "cifar10" and len(work.runs) == len(experiment.plan(PROFILES["gpu"]))
        minutes[chapter] = cost.t4_minutes(work)
    assert set(minutes) == set(range(1, 9))
    assert all(2 < m <= cost.BUDGET_MINUTES for m in minutes.values()), minutes


def test_work_counts_the_evaluations():
    plain = ex.work(QUICK, TINY)
    sampled = ex.work(replace(QUICK, fd_points=3, fd_samples=16), TINY)
    run = sampled.runs[0]
    assert run.image_forwards - plain.runs[0].image_forwards == 3 * 16 * TINY.sample_steps
    assert run.probe_steps == TINY.steps // TINY.eval_every + 1
    assert sampled.flops > plain.flops > len(plain.runs) * TINY.steps * run.model.step
    assert str(plain) == "2 runs x 4 steps of uvit-ci (269k parameters) on digits8x8 at 16 px, batch 8"


def test_training_says_its_cost_first_and_refuses_beyond_the_budget(tmp_results, capsys):
    with pytest.raises(cost.BudgetExceeded) as refused:
        ex.run_experiment("quick", TINY, budget=1e-9)
    message = str(refused.value)
    assert "2 runs x 4 steps of uvit-ci" in message and "SCALELONG_TRAIN=all" in message
    assert "python -m scalelong_edu run quick --profile ci" in message
    assert not [p for p in tmp_results.rglob("*.json*") if not p.name.startswith(".")]  # nothing trained, nothing kept
    ex.run_experiment("quick", TINY, budget=math.inf)
    out = capsys.readouterr().out
    assert out.index("to train: 2 runs x 4 steps") < out.index("run 1/2")
    assert "s a training step, measured here" in out


def test_the_budget_is_lifted_only_by_the_reader(monkeypatch):
    assert cost.default_budget() == cost.BUDGET_MINUTES
    monkeypatch.setenv("SCALELONG_TRAIN", "all")
    assert cost.default_budget() is None
    monkeypatch.setenv("SCALELONG_TRAIN", "yes")
    with pytest.raises(ValueError, match="SCALELONG_TRAIN='yes' is not understood: set it to 'all'"):
        cost.default_budget()


def test_an_estimate_needs_one_timing_per_run():
    work = ex.work(QUICK, TINY)
    with pytest.raises(ValueError, match="one step time per run is needed: 2 runs, 1 timings"):
        cost.estimate(work, [0.1], torch.device("cpu"))
    assert cost.estimate(work, [0.1, 0.1], torch.device("cpu")).minutes > 2 * 4 * 0.1 / 60


def test_a_trained_model_is_loaded_from_its_checkpoint_and_an_untrained_one_says_its_cost(tmp_path, capsys):
    from scalelong_edu.train import TrainConfig, Trainer

    images = torch.rand(16, 1, 16, 16) * 2 - 1
    config = TrainConfig(steps=3, batch_size=4, warmup=1)

    def trainer():
        torch.manual_seed(0)
        return Trainer(build_model("unet-ci", 1, 16), images, linear_schedule(), config, device="cpu", progress=False)

    path = tmp_path / "unet.pt"
    refused = r"1 run x 3 steps of unet-ci \(\d+k parameters\) on digits at 16 px, batch 4: about \d+ s on cpu"
    with pytest.raises(cost.BudgetExceeded, match=refused):
        cost.fit_or_load(trainer(), path, "unet-ci", "digits", budget=1e-9)
    assert not path.exists()
    trained = cost.fit_or_load(trainer(), path, "unet-ci", "digits")
    assert "to train: 1 run x 3 steps" in capsys.readouterr().out and trained.step == 3
    written = path.stat().st_mtime_ns
    loaded = cost.fit_or_load(trainer(), path, "unet-ci", "digits", budget=1e-9)  # nothing left to train
    assert capsys.readouterr().out == "loaded the trained model from unet.pt (step 3 of 3)\n"
    assert loaded.history == trained.history and path.stat().st_mtime_ns == written  # read, not rewritten


def test_a_step_is_timed_within_its_time_limit(monkeypatch):
    from scalelong_edu.train import TrainConfig, Trainer

    calls = []
    step = Trainer.train_step
    monkeypatch.setattr(Trainer, "train_step", lambda self: (calls.append(1), step(self))[1])
    model, config = build_model("unet-ci", 1, 16), TrainConfig(steps=1, batch_size=2, warmup=1)
    seconds = cost.seconds_per_step(model, config, 1, 16, torch.device("cpu"), steps=5, max_seconds=0.0)
    assert len(calls) == 2 and seconds > 0  # the warm-up and one timed step, not five
    calls.clear()
    cost.seconds_per_step(model, config, 1, 16, torch.device("cpu"), steps=3)
    assert len(calls) == 4
