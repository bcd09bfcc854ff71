"""Tests of scalelong_edu.experiments and the command line: caching, provenance, interruption."""

import json
from dataclasses import replace

import pytest
import torch

from scalelong_edu import experiments as ex
from scalelong_edu.__main__ import main
from scalelong_edu.profiles import PROFILES, get_profile
from scalelong_edu.train import NonFiniteLossError, Trainer

TINY = replace(PROFILES["ci"], steps=4, eval_every=2, batch_size=8, n_samples=4, sample_steps=2)
QUICK = ex.Experiment("quick", "two tiny runs", (ex.RunSpec("none"), ex.RunSpec("CS", method="cs")),
                      robustness_sigmas=(0.0, 0.1))


@pytest.fixture(autouse=True)
def tmp_results(tmp_path, monkeypatch):
    monkeypatch.setenv("SCALELONG_RESULTS", str(tmp_path))
    monkeypatch.setitem(ex.EXPERIMENTS, "quick", QUICK)
    return tmp_path


def test_run_records_everything_and_caches(tmp_results, monkeypatch):
    result = ex.run_experiment("quick", TINY, progress=False)
    assert result.path.parent == tmp_results and result.path.exists()
    assert set(result.provenance) >= {"package_version", "torch", "device", "wall_time_s", "started"}
    assert result.spec["profile"]["steps"] == 4
    hist = result.history()
    assert list(hist.columns) == ["label", "step", "loss", "grad_norm", "lr"] and len(hist) == 8
    probes = result.probes()
    feats = probes[(probes.probe == "features") & (probes.label == "CS")]
    assert sorted(feats.step.unique()) == [2, 4] and set(feats.skip.dropna()) == {1, 2}
    assert set(probes.probe) >= {"features", "grads", "adam", "robustness"}
    assert result.samples("CS").shape == (4, 1, 16, 16)

    def no_training(*a, **k):
        raise AssertionError("a cached result must not train again")

    monkeypatch.setattr(ex, "train_run", no_training)
    cached = ex.run_experiment("quick", TINY)
    assert cached.to_json() == json.loads(json.dumps(result.to_json()))


def test_the_cache_key_covers_the_full_spec():
    base = ex.cache_path(QUICK, TINY)
    assert base.name.startswith("quick-ci-")
    assert ex.cache_path(QUICK, replace(TINY, steps=5)) != base
    assert ex.cache_path(replace(QUICK, runs=(ex.RunSpec("none", lr=1e-3),)), TINY) != base
    assert ex.cache_path(QUICK, TINY) == base


def test_an_interrupted_run_leaves_no_cache(tmp_results, monkeypatch):
    calls = []

    def second_run_fails(run, *a, **k):
        calls.append(run)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return {"label": run.label}

    monkeypatch.setattr(ex, "train_run", second_run_fails)
    with pytest.raises(KeyboardInterrupt):
        ex.run_experiment("quick", TINY)
    assert list(tmp_results.iterdir()) == []


def test_a_damaged_cache_raises_with_advice(tmp_results):
    path = ex.cache_path(QUICK, TINY)
    path.write_text('{"spec": {')
    with pytest.raises(ValueError, match="damaged.*delete it"):
        ex.run_experiment("quick", TINY)


def test_divergence_is_recorded_not_hidden(monkeypatch):
    real_step = Trainer.train_step

    def nan_at_3(self):
        if self.step == 2:
            raise NonFiniteLossError("nan")
        return real_step(self)

    monkeypatch.setattr(Trainer, "train_step", nan_at_3)
    record = ex.train_run(ex.RunSpec("none"), QUICK, TINY, torch.device("cpu"), progress=False)
    assert record["diverged_at"] == 3 and record["history"]["step"] == [1, 2] and "samples" not in record


def test_every_named_experiment_builds_its_models_at_every_profile():
    for e in ex.EXPERIMENTS.values():
        for profile in PROFILES.values():
            for run in e.runs:
                preset = profile.uvit if run.backbone == "uvit" else profile.unet
                with torch.device("meta"):
                    model = ex.build_model(preset, 1, profile.image_size, run.method, run.kappa,
                                           **dict(run.model_overrides))
                assert model.n_skips >= 1


def test_unknown_names_raise():
    with pytest.raises(ValueError, match="unknown experiment 'nope'.*uvit-methods"):
        ex.run_experiment("nope")
    with pytest.raises(ValueError, match="unknown profile 'tpu'"):
        get_profile("tpu")


def test_profile_comes_from_the_environment(monkeypatch):
    monkeypatch.setenv("SCALELONG_PROFILE", "ci")
    assert get_profile().name == "ci"
    monkeypatch.delenv("SCALELONG_PROFILE")
    assert get_profile().name == ("gpu" if torch.cuda.is_available() else "cpu")


def test_cli(capsys, monkeypatch):
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "python -m scalelong_edu run uvit-methods --profile cpu" in capsys.readouterr().out
    main(["list", "--profile", "ci"])
    assert "uvit-methods" in capsys.readouterr().out
    monkeypatch.setattr(ex, "get_profile", lambda name=None: TINY)
    main(["run", "quick", "--no-progress"])
    out = capsys.readouterr().out
    assert "quick (ci profile)" in out and "CS" in out and "result:" in out
    with pytest.raises(SystemExit):
        main(["run", "nope"])
