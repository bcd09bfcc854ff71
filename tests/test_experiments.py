"""Tests of scalelong_edu.experiments and the command line: caching, provenance, interruption."""

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from scalelong_edu import experiments as ex
from scalelong_edu import __main__ as cli
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


def test_an_interrupted_experiment_keeps_its_finished_runs_and_continues(tmp_results, monkeypatch, capsys):
    real_train_run, calls = ex.train_run, []

    def second_run_is_killed(run, *a, **k):
        calls.append(run.label)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real_train_run(run, *a, **k)

    monkeypatch.setattr(ex, "train_run", second_run_is_killed)
    with pytest.raises(KeyboardInterrupt):
        ex.run_experiment("quick", TINY)
    path = ex.cache_path(QUICK, TINY)
    assert not path.exists() and [f.name for f in ex.runs_dir(path).iterdir()] == ["0.json"]
    assert ex.cache_status(QUICK, TINY) == "1 of 2 runs done"

    calls.clear()
    result = ex.run_experiment("quick", TINY)
    assert calls == ["CS"] and [r["label"] for r in result.runs] == ["none", "CS"]
    assert "1 of 2 runs already done" in capsys.readouterr().out
    assert path.exists() and not ex.runs_dir(path).exists()


def test_a_damaged_partial_run_is_trained_again(tmp_results, capsys):
    path = ex.cache_path(QUICK, TINY)
    ex.runs_dir(path).mkdir()
    (ex.runs_dir(path) / "0.json").write_text('{"run": {')
    assert len(ex.run_experiment("quick", TINY).runs) == 2
    assert "ignoring the damaged partial result" in capsys.readouterr().out


@pytest.mark.parametrize("content, why", [
    ('{"spec": {', "Expecting"),
    ('{"spec":1,"provenance":2,"runs":3}', "no 'spec' object"),
    ('{"spec":{},"provenance":{},"runs":[{"label": "none"}]}', "run field 'run'"),
])
def test_a_damaged_cache_raises_with_advice(tmp_results, capsys, monkeypatch, content, why):
    path = ex.cache_path(QUICK, TINY)
    path.write_text(content)
    with pytest.raises(ex.DamagedResultError, match=f"damaged: {why}.*run quick --force"):
        ex.run_experiment("quick", TINY)
    monkeypatch.setattr(cli, "get_profile", lambda name=None: TINY)
    assert main(["list"]) == 0  # `list` reports it instead of crashing
    listed = capsys.readouterr().out
    assert f"DAMAGED (cached result {path} is damaged: {why}" in listed and "--force" in listed


def test_an_edited_cache_is_not_served(tmp_results):
    result = ex.run_experiment("quick", TINY, progress=False)
    data = json.loads(result.path.read_text())
    data["spec"]["profile"]["steps"] = 4000
    result.path.write_text(json.dumps(data))
    with pytest.raises(ex.DamagedResultError, match="does not hash to its file name"):
        ex.run_experiment("quick", TINY)
    assert ex.cache_status(QUICK, TINY).startswith("DAMAGED")
    assert len(ex.run_experiment("quick", TINY, force=True, progress=False).runs) == 2


def test_an_unwritable_results_folder_fails_before_training(tmp_path, monkeypatch):
    occupied = tmp_path / "occupied"
    occupied.write_text("a file where the results folder should be")
    monkeypatch.setenv("SCALELONG_RESULTS", str(occupied))
    monkeypatch.setattr(ex, "train_run", lambda *a, **k: pytest.fail("must fail before training"))
    with pytest.raises(PermissionError, match=f"cannot write the experiment result {occupied}"):
        ex.run_experiment("quick", TINY)


def test_a_cached_load_says_where_and_when(tmp_results, capsys):
    ex.run_experiment("quick", TINY, progress=False)
    result = ex.run_experiment("quick", TINY)
    out = capsys.readouterr().out
    assert f"loaded from the cache {result.path}, computed {result.provenance['started']} on cpu" in out


def test_divergence_is_recorded_not_hidden(monkeypatch):
    real_step = Trainer.train_step

    def nan_at_3(self):
        if self.step == 2:
            raise NonFiniteLossError("nan", self.step + 1)
        return real_step(self)

    monkeypatch.setattr(Trainer, "train_step", nan_at_3)
    record = ex.train_run(ex.RunSpec("none"), QUICK, TINY, torch.device("cpu"), progress=False)
    assert record["diverged_at"] == 3 and record["history"]["step"] == [1, 2] and "samples" not in record
    result = ex.ExperimentResult({}, {}, [record])
    with pytest.raises(ValueError, match="run 'none' diverged at step 3: it has no samples"):
        result.samples("none")


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


def test_cli_failures_print_one_line_and_exit_non_zero(capsys, monkeypatch):
    monkeypatch.setenv("SCALELONG_PROFILE", "tpu")
    assert main(["list"]) == 1
    assert capsys.readouterr().err == "error: unknown profile 'tpu'; choose one of ci, cpu, gpu (set SCALELONG_PROFILE or pass it)\n"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main(["run", "quick", "--profile", "ci", "--device", "cuda"]) == 1
    assert capsys.readouterr().err == "error: device 'cuda' is not available on this machine; use cpu (or leave it unset)\n"

    def offline(*a, **k):
        raise RuntimeError("Could not download or load dataset 'cifar10' into data (no internet?).\n  - details")

    monkeypatch.setattr(ex, "load_dataset", offline)
    assert main(["run", "quick", "--profile", "gpu", "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "dataset 'cifar10'" in err and "use --profile cpu" in err
    with pytest.raises(RuntimeError, match="cifar10"):
        main(["--traceback", "run", "quick", "--profile", "gpu", "--no-progress"])


CLI_WORKER = Path(__file__).with_name("cli_worker.py")


def test_under_torchrun_only_rank_0_reports_and_writes(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "SCALELONG_RESULTS": str(tmp_path)}
    run = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", str(CLI_WORKER)],
        capture_output=True, text=True, env=env, timeout=600,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.count("quick (tiny profile)") == 1 and run.stdout.count("run 1/2: none") == 1
    assert run.stdout.count("result:") == 1
    assert [p.name for p in tmp_path.iterdir()] == [next(tmp_path.glob("quick-tiny-*.json")).name]
