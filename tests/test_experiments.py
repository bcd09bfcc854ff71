"""Tests of scalelong_edu.experiments and the command line: caching, provenance, interruption."""

import gzip
import itertools
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import asdict, replace
from pathlib import Path

import pytest
import torch

from scalelong_edu import experiments as ex
from scalelong_edu import __main__ as cli
from scalelong_edu.__main__ import main
from scalelong_edu.data import load_dataset
from scalelong_edu.diffusion import eps_loss, linear_schedule
from scalelong_edu.models import build_model
from scalelong_edu.probes import probe_batch
from scalelong_edu.profiles import PROFILES, get_profile
from scalelong_edu.train import NonFiniteLossError, Trainer

TINY = replace(PROFILES["ci"], steps=4, eval_every=2, batch_size=8, n_samples=4, sample_steps=2, seeds=1,
               seed_cap=None)
QUICK = ex.Experiment("quick", "two tiny runs", (ex.RunSpec("none"), ex.RunSpec("CS", method="cs")),
                      robustness_sigmas=(0.0, 0.1))
NAMES = ["uvit-gentle", "uvit-stress", "unet-gentle", "unet-stress", "main-uvit", "main-unet", "uvit-lr-sweep",
         "unet-lr-sweep", "stress-search-uvit", "breakdown-uvit", "scaling-uvit", "scaling-unet", "kappa-uvit-stress",
         "depth-uvit", "depth-unet", "kappa-grid", "block-output", "live-ddpm", "live-unet", "live-uvit", "live-ls",
         "live-depth", "depth-trained", "kappa-trained", "block-output-trained", "long-uvit", "stability-map",
         "stability-deep", "stability-confirm", "breakdown-confirm", "breakdown-scaled-confirm",
         "breakdown-sqrt2-confirm", "block-output-confirm", "unet-confirm", "unet-flips-confirm", "uvit-confirm",
         "uvit-ls-osc-confirm", "ls-confirm", "depth-confirm", "depth-osc-confirm", "depth-speed-confirm",
         "depth-unet-speed-confirm", "depth-sqrt2-speed-confirm", "depth-cs-speed-confirm", "depth-cs-speed-confirm-2",
         "unet-fcd-confirm", "uvit-fcd-confirm"]


@pytest.fixture(autouse=True)
def tmp_results(tmp_path, monkeypatch):
    monkeypatch.setenv("SCALELONG_RESULTS", str(tmp_path))
    monkeypatch.setitem(ex.EXPERIMENTS, "quick", QUICK)
    return tmp_path


def write_gzip(path, text):
    path.write_bytes(gzip.compress(text.encode()))


def read_gzip(path):
    return json.loads(gzip.decompress(path.read_bytes()))


def test_run_records_everything_and_caches(tmp_results, monkeypatch):
    result = ex.run_experiment("quick", TINY, progress=False)
    assert result.path.parent == tmp_results and result.path.exists()
    assert result.path.name.endswith(".json.gz") and read_gzip(result.path) == json.loads(json.dumps(result.to_json()))
    assert ex.load_result(result.path).to_json() == read_gzip(result.path)
    assert set(result.provenance) >= {"package_version", "torch", "device", "wall_time_s", "started"}
    assert result.spec["profile"]["steps"] == 4 and result.spec["cache_version"] == ex.CACHE_VERSION == 2
    assert result.labels == ["none", "CS"]
    hist = result.history()
    assert list(hist.columns) == ["label", "seed", "step", "loss", "grad_norm", "lr"] and len(hist) == 8
    assert set(hist.seed) == {0}
    probes = result.probes()
    assert {"label", "seed"} <= set(probes.columns) and set(probes.seed) == {0}
    feats = probes[(probes.probe == "features") & (probes.label == "CS")]
    assert sorted(feats.step.unique()) == [0, 2, 4] and set(feats.skip.dropna()) == {1, 2}
    assert set(probes.probe) == {"features", "fixed", "grads", "adam", "robustness", "lipschitz"}
    fixed = probes[probes.probe == "fixed"]
    assert sorted(fixed.step.unique()) == [0, 2, 4] and set(fixed.quantity) == {"loss", "output_sq_norm"}
    adam = probes[probes.probe == "adam"]
    assert sorted(adam.step.unique()) == [2, 4] and sorted(adam[adam.quantity == "m_sign_flip"].step.unique()) == [4]
    lip = probes[(probes.probe == "lipschitz") & (probes.label == "CS")]
    assert len(lip) == 2 * 2 + 1 and (lip.value > 0).all() and set(lip.step) == {4}
    assert result.samples("CS").shape == (4, 1, 16, 16)

    def no_training(*a, **k):
        raise AssertionError("a cached result must not train again")

    monkeypatch.setattr(ex, "train_run", no_training)
    cached = ex.run_experiment("quick", TINY)
    assert cached.to_json() == json.loads(json.dumps(result.to_json()))


def test_frechet_distance_over_training_without_end_probes(tmp_results):
    quick = replace(QUICK, name="fd", fd_points=2, end_probes=False, adam_stats=False)
    record = ex.train_run(quick.plan(TINY)[1], quick, TINY, progress=False)
    assert record["fd"]["step"] == [2, 4] and all(0 < v < float("inf") for v in record["fd"]["fcd"])
    assert {row for row in record["probes"]["probe"]} == {"features", "fixed", "grads"}
    assert len(record["samples"]) == TINY.n_samples
    again = ex.train_run(quick.plan(TINY)[1], quick, TINY, progress=False)
    assert again["fd"] == record["fd"]  # same seed, same noise: the same distances


def test_settings_added_later_enter_the_spec_only_when_set():
    assert not {"fd_points", "end_probes"} & set(QUICK.spec(TINY)["experiment"])
    with_fd = replace(QUICK, fd_points=3)
    assert with_fd.spec(TINY)["experiment"]["fd_points"] == 3
    assert ex.spec_hash(with_fd.spec(TINY)) != ex.spec_hash(QUICK.spec(TINY))
    assert replace(QUICK, end_probes=False).spec(TINY)["experiment"]["end_probes"] is False


def test_the_cache_key_covers_the_full_spec():
    base = ex.cache_path(QUICK, TINY)
    assert base.name.startswith("quick-ci-") and base.name.endswith(".json.gz")
    assert ex.runs_dir(base).name == base.name.removesuffix(".json.gz") + ".runs"
    assert ex.cache_path(QUICK, replace(TINY, steps=5)) != base
    assert ex.cache_path(replace(QUICK, runs=(ex.RunSpec("none", lr=1e-3), QUICK.runs[1])), TINY) != base
    assert ex.cache_path(replace(QUICK, runs=(ex.RunSpec("none", lr_scale=2), QUICK.runs[1])), TINY) != base
    assert ex.cache_path(replace(QUICK, seeds=2), TINY) != base
    assert ex.cache_path(QUICK, replace(TINY, seeds=2)) != base
    assert ex.cache_path(replace(QUICK, step_fraction=0.5), TINY) != base
    assert ex.cache_path(QUICK, replace(TINY, lr={**TINY.lr, "uvit": 1e-3})) != base
    assert ex.cache_path(QUICK, TINY) == base


def test_the_cache_key_ignores_what_the_runs_do_not_use():
    base = ex.cache_path(QUICK, TINY)  # every run gentle, U-ViT
    assert ex.cache_path(QUICK, replace(TINY, stress_lr={"uvit": 1.0, "unet": 1.0})) == base
    assert ex.cache_path(QUICK, replace(TINY, lr={**TINY.lr, "unet": 1.0})) == base
    assert ex.cache_path(replace(QUICK, seeds=1), replace(TINY, seeds=3)) == base  # the experiment's seeds win
    assert ex.cache_path(replace(QUICK, step_fraction=0.9), TINY) == base  # round(4 * 0.9) = 4 steps all the same
    stress = replace(QUICK, runs=tuple(replace(r, regime="stress") for r in QUICK.runs))
    assert ex.cache_path(stress, replace(TINY, stress_lr={"uvit": 1.0, "unet": 1.0})) != ex.cache_path(stress, TINY)
    spec = QUICK.spec(TINY)
    assert not {"lr", "stress_lr", "seeds"} & set(spec["profile"])
    assert [r["lr"] for r in spec["runs"]] == [TINY.lr["uvit"]] * 2


def test_plan_runs_every_run_once_per_seed_with_its_learning_rate():
    runs = (ex.RunSpec("gentle"), ex.RunSpec("stress", backbone="unet", regime="stress"),
            ex.RunSpec("x4", lr_scale=4), ex.RunSpec("fixed", lr=1e-3, lr_scale=4, regime="stress"))
    experiment = ex.Experiment("plan", "", runs)
    plan = experiment.plan(replace(TINY, seeds=2))
    assert [(r.label, r.seed) for r in plan] == [(r.label, s) for s in (0, 1) for r in runs]  # seed-major
    lr, stress = TINY.lr["uvit"], TINY.stress_lr["unet"]
    assert [r.lr for r in plan[:4]] == pytest.approx([lr, stress, 4 * lr, 1e-3])  # explicit lr: no lr_scale
    assert [r.lr for r in plan[:4]] == [r.lr for r in plan[4:]]
    assert plan[2].lr == pytest.approx(4 * TINY.learning_rate("uvit"))
    assert plan[1].lr == TINY.learning_rate("unet", "stress")
    assert [(r.lr, r.seed) for r in runs] == [(None, 0)] * 3 + [(1e-3, 0)]  # the experiment's runs are left alone
    assert len(replace(experiment, seeds=3).plan(TINY)) == 12 and len(experiment.plan(TINY)) == 4
    assert len(experiment.plan(PROFILES["cpu"])) == 4 * PROFILES["cpu"].seeds
    with pytest.raises(ValueError, match="unknown regime 'wild'"):
        ex.Experiment("bad", "", (ex.RunSpec("x", regime="wild"),)).plan(TINY)


def test_steps_are_a_fraction_of_the_profile_steps():
    ci = PROFILES["ci"]  # 30 steps
    assert ex.Experiment("e", "", ()).steps(ci) == 30
    assert ex.Experiment("e", "", (), step_fraction=1 / 3).steps(ci) == 10
    assert ex.Experiment("e", "", (), step_fraction=1e-6).steps(ci) == 1
    assert ex.get_experiment("uvit-lr-sweep").steps(PROFILES["cpu"]) == 400
    assert ex.get_experiment("uvit-lr-sweep").spec(ci)["profile"]["steps"] == 10


def test_profile_learning_rates():
    for profile in PROFILES.values():
        for backbone in ("uvit", "unet"):
            assert profile.learning_rate(backbone) == profile.lr[backbone] == profile.learning_rate(backbone, "gentle")
            assert profile.learning_rate(backbone, "stress") == profile.stress_lr[backbone]
            assert profile.learning_rate(backbone, "stress") > profile.learning_rate(backbone) > 0
        assert profile.seeds >= 2  # intervals over seeds need two
    ci = replace(PROFILES["ci"], lr={"uvit": 1.0, "unet": 2.0}, stress_lr={"uvit": 3.0, "unet": 4.0})
    assert [ci.learning_rate(b, r) for r in ("gentle", "stress") for b in ("uvit", "unet")] == [1.0, 2.0, 3.0, 4.0]
    with pytest.raises(ValueError, match="unknown regime 'calm'; choose gentle or stress"):
        PROFILES["ci"].learning_rate("uvit", "calm")
    with pytest.raises(ValueError, match="unknown backbone 'dit'; choose one of unet, uvit"):
        PROFILES["ci"].learning_rate("dit", "stress")


def test_train_run_needs_a_planned_run():
    with pytest.raises(ValueError, match="run.lr is None.*experiment.plan"):
        ex.train_run(ex.RunSpec("none"), QUICK, TINY, torch.device("cpu"), progress=False)


def test_every_seed_is_a_run_of_its_own(tmp_results):
    result = ex.run_experiment("quick", replace(TINY, seeds=2), progress=False)
    assert [(r["label"], r["run"]["seed"]) for r in result.runs] == [("none", 0), ("CS", 0), ("none", 1), ("CS", 1)]
    assert result.labels == ["none", "CS"]
    hist = result.history()
    assert len(hist) == 16 and hist.groupby(["label", "seed"]).size().to_dict() == {
        ("CS", 0): 4, ("CS", 1): 4, ("none", 0): 4, ("none", 1): 4}
    assert not hist[hist.seed == 0].loss.reset_index(drop=True).equals(hist[hist.seed == 1].loss.reset_index(drop=True))
    probes = result.probes()
    assert set(zip(probes.label, probes.seed)) == {("none", 0), ("CS", 0), ("none", 1), ("CS", 1)}
    assert not torch.equal(result.samples("CS", seed=0), result.samples("CS", seed=1))
    assert torch.equal(result.samples("CS"), result.samples("CS", seed=0))
    with pytest.raises(KeyError, match="no run labelled 'CS' with seed 2; labels: \\['none', 'CS'\\]"):
        result.samples("CS", seed=2)


def test_probes_run_on_a_fixed_held_out_batch_from_step_0(tmp_results, monkeypatch):
    batches = []

    def spy(*args, **kwargs):
        batches.append(probe_batch(*args, **kwargs))
        return batches[-1]

    monkeypatch.setattr(ex, "probe_batch", spy)
    slow_fast = ex.Experiment("slow-fast", "one model, two learning rates",
                              (ex.RunSpec("slow", lr=1e-4), ex.RunSpec("fast", lr=1e-2)), robustness_sigmas=(0.0,))
    monkeypatch.setitem(ex.EXPERIMENTS, "slow-fast", slow_fast)
    result = ex.run_experiment("slow-fast", TINY, progress=False)
    assert len(batches) == 2 and all(torch.equal(a, b) for a, b in zip(*batches))  # the same batch for every run
    probes = result.probes().query("probe in ('features', 'fixed', 'grads')")
    slow, fast = (probes[probes.label == label].drop(columns="label").reset_index(drop=True)
                  for label in ("slow", "fast"))
    at_0 = slow.step == 0
    assert at_0.sum() > 0 and slow[at_0].equals(fast[fast.step == 0])  # the same model before training
    assert not (slow[slow.step == 4].value.to_numpy() == fast[fast.step == 4].value.to_numpy()).all()

    # the step-0 loss is that of the untrained model on the test split's first batch, not a training batch
    test = load_dataset(TINY.dataset, "test", image_size=TINY.image_size).tensors()[0]
    x0, t, eps = probe_batch(test, TINY.batch_size, linear_schedule())
    assert torch.equal(batches[0][0], x0)
    torch.manual_seed(0)
    model = build_model(TINY.uvit, 1, TINY.image_size).eval()
    with torch.no_grad():
        loss = eps_loss(model, x0, linear_schedule(), t=t, noise=eps).item()
    (fixed_0,) = slow.query("probe == 'fixed' and quantity == 'loss' and step == 0").value
    assert fixed_0 == pytest.approx(loss, rel=1e-5)


def test_a_diverging_run_is_a_result(tmp_results, monkeypatch):
    wild = ex.Experiment("wild", "a learning rate far too high", (ex.RunSpec("none"), ex.RunSpec("wild", lr=1e3)),
                         robustness_sigmas=(0.0,))
    monkeypatch.setitem(ex.EXPERIMENTS, "wild", wild)
    result = ex.run_experiment("wild", TINY, progress=False)
    none, diverged = result.runs
    assert none["diverged_at"] is None and diverged["diverged_at"] == 2 and "samples" not in diverged
    assert diverged["history"]["step"] == [1]
    loaded = ex.load_result(result.path)  # written and loadable
    assert loaded.runs[1]["diverged_at"] == 2 and loaded.labels == ["none", "wild"]
    probes = loaded.probes()
    assert set(probes[probes.label == "wild"].probe) == {"features", "fixed", "grads"}  # step 0 only: no end probes
    assert set(probes[probes.label == "wild"].step) == {0}
    with pytest.raises(ValueError, match="run 'wild' \\(seed 0\\) diverged at step 2: it has no samples"):
        loaded.samples("wild")
    assert loaded.samples("none").shape == (4, 1, 16, 16)


def test_an_interrupted_experiment_keeps_its_finished_runs_and_continues(tmp_results, monkeypatch, capsys):
    real_train_run, calls = ex.train_run, []
    two_seeds = replace(TINY, steps=2, seeds=2)

    def third_run_is_killed(run, *a, **k):
        calls.append((run.label, run.seed))
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real_train_run(run, *a, **k)

    monkeypatch.setattr(ex, "train_run", third_run_is_killed)
    with pytest.raises(KeyboardInterrupt):
        ex.run_experiment("quick", two_seeds)
    path = ex.cache_path(QUICK, two_seeds)
    assert not path.exists() and sorted(f.name for f in ex.runs_dir(path).iterdir()) == ["0.json", "1.json"]
    assert ex.cache_status(QUICK, two_seeds) == "2 of 4 runs done"  # seed 0 of every method first

    calls.clear()
    result = ex.run_experiment("quick", two_seeds)
    assert calls == [("none", 1), ("CS", 1)] and [r["label"] for r in result.runs] == ["none", "CS"] * 2
    out = capsys.readouterr().out
    assert "2 of 4 runs already done" in out and f"run 4/4: CS, seed 1, lr {TINY.lr['uvit']:g}" in out
    assert path.exists() and not ex.runs_dir(path).exists()


def test_workers_train_runs_in_parallel_processes_with_the_results_of_one_thread(tmp_results, monkeypatch, capsys):
    two_seeds = replace(TINY, steps=2, seeds=2)
    path = ex.cache_path(QUICK, two_seeds)
    ex.runs_dir(path).mkdir()  # seed 0 already done: the workers train only seed 1's two runs
    for i, run in enumerate(QUICK.plan(two_seeds)[:2]):
        record = ex.train_run(run, QUICK, two_seeds, progress=False)
        (ex.runs_dir(path) / f"{i}.json").write_text(json.dumps({"run": asdict(run), "record": record}))
    parallel = ex.run_experiment("quick", two_seeds, workers=2)
    assert "training 2 runs, 2 at a time" in capsys.readouterr().out
    assert [(r["label"], r["run"]["seed"]) for r in parallel.runs] == [("none", 0), ("CS", 0), ("none", 1), ("CS", 1)]
    assert parallel.provenance["workers"] == 2 and not ex.runs_dir(path).exists()

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        serial = ex.run_experiment("quick", two_seeds, force=True, progress=False)
    finally:
        torch.set_num_threads(threads)
    for a, b in zip(parallel.runs, serial.runs):
        assert a["history"] == b["history"] and a["samples"] == b["samples"]


def test_workers_are_refused_where_they_cannot_work(tmp_results, monkeypatch):
    for workers in (0, 1.5, True):
        with pytest.raises(ValueError, match="workers must be a positive int"):
            ex.run_experiment("quick", TINY, workers=workers)
    monkeypatch.setattr(ex, "pick_device", lambda device: torch.device("mps"))
    with pytest.raises(ValueError, match="on the CPU or one CUDA GPU, not under torchrun or on 'mps'"):
        ex.run_experiment("quick", TINY, workers=2)


def keep(path, i, record, run, key=None, profile=TINY):
    """Write ``record`` as partial run ``i`` of the quick experiment (a file of today's format)."""
    ex.runs_dir(path).mkdir(exist_ok=True)
    ex.keep_run(ex.partial_path(path, i), key or QUICK.run_key(run, profile), run, record)


def test_finished_runs_ignore_a_partial_file_of_another_run(tmp_results):
    plan = QUICK.plan(TINY)
    path = ex.cache_path(QUICK, TINY)
    record = ex.train_run(plan[0], QUICK, TINY, progress=False)
    for i in (0, 1):
        keep(path, i, record, plan[0])
    done, damaged = ex.finished_runs(QUICK, TINY)
    assert list(done) == [0] and len(damaged) == 1 and "1.json" in damaged[0] and "belongs to another run" in damaged[0]


def test_a_partial_run_is_checked_against_the_run_it_stands_for(tmp_results):
    """Issue 19, case 6: a partial of another profile, one whose record is another seed's, one
    with no history or probes, and a folder in a partial's place are all refused, saying why."""
    plan, path = QUICK.plan(TINY), ex.cache_path(QUICK, TINY)
    record = ex.train_run(plan[0], QUICK, TINY, progress=False)
    keep(path, 0, record, plan[0], key=QUICK.run_key(plan[0], replace(TINY, steps=10)))  # another profile's
    old_format = {"run": asdict(plan[1]), "record": {**record, "run": asdict(plan[1]), "history": {}}}
    ex.partial_path(path, 1).write_text(json.dumps(old_format))  # no key, and an empty history
    done, damaged = ex.finished_runs(QUICK, TINY)
    assert done == {} and "its key differs" in damaged[0] and "history has 0 steps; the spec trains 4" in damaged[1]

    two_seeds = replace(TINY, seeds=2)
    plan2, path2 = QUICK.plan(two_seeds), ex.cache_path(QUICK, two_seeds)
    other_seed = {"run": asdict(plan2[2]), "record": {**record, "run": asdict(plan2[0])}}
    ex.runs_dir(path2).mkdir()
    ex.partial_path(path2, 2).write_text(json.dumps(other_seed))
    ex.partial_path(path2, 3).mkdir()
    done, damaged = ex.finished_runs(QUICK, two_seeds)
    assert done == {} and "another run than the spec's: seed 0 (not 1)" in damaged[0]
    assert "3.json (it is a folder, not a partial-run file: remove it)" in damaged[1]
    with pytest.raises(IsADirectoryError, match="3.json is a folder where a partial-run file belongs: remove it"):
        ex.run_experiment("quick", two_seeds, progress=False)
    good = ex.train_run(plan[0], QUICK, TINY, progress=False)
    keep(path, 0, good, plan[0])
    assert list(ex.finished_runs(QUICK, TINY)[0]) == [0]
    assert json.loads(ex.partial_path(path, 0).read_text())["key"] == QUICK.run_key(plan[0], TINY)


def test_runs_of_a_result_file_are_the_runs_of_its_spec(tmp_results):
    """Issue 19, case 7: every seed set to 0, a run dropped, another experiment's runs: refused."""
    result = ex.run_experiment("quick", replace(TINY, seeds=2), progress=False)
    data = read_gzip(result.path)
    edits = {
        "another run than the spec's: seed 0 (not 1)": lambda d: [r["run"].update(seed=0) for r in d["runs"]],
        "it holds 3 runs; its spec has 4": lambda d: d["runs"].pop(),
        "another run than the spec's: label": lambda d: [r["run"].update(label="other") for r in d["runs"]],
    }
    for why, edit in edits.items():
        edited = json.loads(json.dumps(data))
        edit(edited)
        write_gzip(result.path, json.dumps(edited))
        with pytest.raises(ex.DamagedResultError, match=f"damaged: (run [0-9]: )?(it holds )?{re.escape(why)}.*--force"):
            ex.load_result(result.path)


def test_every_committed_result_passes_the_load_checks():
    """The stricter checks keep every cached result of the book usable."""
    folder = Path(__file__).parents[1] / "data" / "results"
    for path in sorted(folder.glob(f"*{ex.SUFFIX}")):
        assert ex.load_result(path).runs


def test_outputs_are_checked_before_training(tmp_path, monkeypatch):
    """Issue 19, cases 2, 3 and 14: a full disk, a runs folder that cannot be created and a folder
    where the result belongs all fail before any training, naming the path."""
    monkeypatch.setattr(ex, "train_run", lambda *a, **k: pytest.fail("must fail before training"))
    monkeypatch.setenv("SCALELONG_RESULTS", str(tmp_path))
    path = ex.cache_path(QUICK, TINY)
    with monkeypatch.context() as m:
        m.setattr("shutil.disk_usage", lambda folder: FULL)
        with pytest.raises(OSError, match=re.escape(f"not enough space for the 2 runs of quick left to train in "
                                                    f"{tmp_path}: about 0.1 MB needed, 0.0 MB free")):
            ex.run_experiment("quick", TINY)
    loop = ex.runs_dir(path)
    loop.symlink_to(loop)  # a symlink loop where the runs folder belongs
    with pytest.raises(PermissionError, match=f"cannot write the partial-run files {loop}"):
        ex.run_experiment("quick", TINY)
    loop.unlink()
    path.mkdir()
    with pytest.raises(IsADirectoryError, match=f"{path} is a folder where the result of quick belongs: move"):
        ex.run_experiment("quick", TINY)
    assert "BLOCKED" in ex.cache_status(QUICK, TINY)


FULL = shutil._ntuple_diskusage(10**9, 10**9 - 1000, 1000)


def test_a_damaged_partial_run_is_trained_again(tmp_results, capsys):
    path = ex.cache_path(QUICK, TINY)
    ex.runs_dir(path).mkdir()
    (ex.runs_dir(path) / "0.json").write_text('{"run": {')
    assert len(ex.run_experiment("quick", TINY).runs) == 2
    assert "ignoring the damaged partial result" in capsys.readouterr().out


GOOD = gzip.compress(b'{"spec": {}, "provenance": {}, "runs": []}' * 20, mtime=0)


@pytest.mark.parametrize("content, why", [
    (gzip.compress(b'{"spec": {', mtime=0), "Expecting"),
    (gzip.compress(b'{"spec":1,"provenance":2,"runs":3}', mtime=0), "no 'spec' object"),
    (gzip.compress(b'{"spec":{},"provenance":{},"runs":[{"label": "none"}]}', mtime=0),
     "its stored spec does not hash"),
    (GOOD[: len(GOOD) // 2], "Compressed file ended"),  # truncated, as by a full disk
    (GOOD[:-8] + b"\0" * 8, "CRC check failed"),
    (b'{"spec": {}, "provenance": {}, "runs": []}', "Not a gzipped file"),  # a result of cache version 1
], ids=["cut json", "no spec", "spec hash", "truncated", "crc", "version 1"])  # ids xdist's workers agree on
def test_a_damaged_cache_raises_with_advice(tmp_results, capsys, monkeypatch, content, why):
    path = ex.cache_path(QUICK, TINY)
    path.write_bytes(content)
    with pytest.raises(ex.DamagedResultError, match=f"damaged: {why}.*run quick --force"):
        ex.run_experiment("quick", TINY)
    monkeypatch.setattr(cli, "get_profile", lambda name=None: TINY)
    assert main(["list"]) == 0  # `list` reports it instead of crashing
    listed = capsys.readouterr().out
    assert f"DAMAGED (cached result {path} is damaged: {why}" in listed and "--force" in listed


def test_a_corrupt_gzip_stream_is_a_damaged_cache(tmp_results):
    """Not truncated but garbled: gzip raises zlib.error, neither an OSError nor an EOFError."""
    path = ex.cache_path(QUICK, TINY)
    path.write_bytes(GOOD[:15] + b"\xff" * 10 + GOOD[25:])
    with pytest.raises(ex.DamagedResultError, match="damaged: .*run quick --force"):
        ex.load_result(path)


def test_an_edited_cache_is_not_served(tmp_results):
    result = ex.run_experiment("quick", TINY, progress=False)
    data = read_gzip(result.path)
    data["spec"]["profile"]["steps"] = 4000
    write_gzip(result.path, json.dumps(data))
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
    assert f"loaded from the cache: {result.path.name}\n  computed {result.provenance['started']} on cpu" in out


def test_divergence_is_recorded_not_hidden(monkeypatch):
    real_step = Trainer.train_step

    def nan_at_3(self):
        if self.step == 2:
            raise NonFiniteLossError("nan", self.step + 1)
        return real_step(self)

    monkeypatch.setattr(Trainer, "train_step", nan_at_3)
    record = ex.train_run(QUICK.plan(TINY)[0], QUICK, TINY, torch.device("cpu"), progress=False)
    assert record["diverged_at"] == 3 and record["history"]["step"] == [1, 2] and "samples" not in record
    assert set(record["probes"]["step"]) == {0, 2}  # the fixed-batch probes up to the divergence
    result = ex.ExperimentResult({}, {}, [record])
    with pytest.raises(ValueError, match="run 'none' \\(seed 0\\) diverged at step 3: it has no samples"):
        result.samples("none")


def test_the_named_experiments():
    assert [name for name in ex.EXPERIMENTS if name != "quick"] == NAMES
    for backbone in ("uvit", "unet"):
        for regime in ("gentle", "stress"):
            e = ex.get_experiment(f"{backbone}-{regime}")
            assert [(r.label, r.method) for r in e.runs] == [(m[0], m[1]) for m in ex.METHODS]
            assert ("CS (kappa=0.5)", 0.5) in {(r.label, r.kappa) for r in e.runs}
            assert {"none", "sqrt2-cs", "cs", "ls"} <= {r.method for r in e.runs}
            assert {(r.backbone, r.regime) for r in e.runs} == {(backbone, regime)} and e.seeds is None
        sweep = ex.get_experiment(f"{backbone}-lr-sweep")
        assert sweep.seeds == 1 and sweep.step_fraction == pytest.approx(1 / 3)
        assert [r.lr_scale for r in sweep.runs] == [1, 1, 4, 4, 8, 8, 16, 16]
        assert {r.method for r in sweep.runs} == {"none", "cs"} and {r.backbone for r in sweep.runs} == {backbone}
    cpu = PROFILES["cpu"]
    assert [r.lr for r in ex.get_experiment("uvit-lr-sweep").plan(cpu)][::2] == pytest.approx(
        [k * cpu.lr["uvit"] for k in (1, 4, 8, 16)])
    assert {r.lr for r in ex.get_experiment("unet-stress").plan(cpu)} == {cpu.stress_lr["unet"]}
    assert len(ex.get_experiment("uvit-gentle").plan(cpu)) == len(ex.METHODS) * cpu.seeds
    for backbone in ("uvit", "unet"):
        e = ex.get_experiment(f"scaling-{backbone}")
        assert [(r.label, r.method, r.kappa) for r in e.runs] == list(ex.SCALING_METHODS)
        assert {(r.backbone, r.regime) for r in e.runs} == {(backbone, "gentle")} and e.fd_points > 0
    assert [r.kappa for r in ex.get_experiment("scaling-unet").runs if r.method == "cs"] == [0.3, 0.5, 0.7, 0.9]
    stress = ex.get_experiment("kappa-uvit-stress")
    assert {(r.backbone, r.regime, r.method) for r in stress.runs} == {("uvit", "stress", "cs")}


def test_every_named_experiment_builds_its_models_at_every_profile():
    models = set()  # ~1,100 runs share ~200 models (seeds, learning rates): each is built once
    for e in ex.EXPERIMENTS.values():
        for profile in PROFILES.values():
            for run in e.plan(profile):
                assert run.lr > 0
                preset = profile.uvit if run.backbone == "uvit" else profile.unet
                models.add((preset, profile.image_size, run.method, run.kappa, run.model_overrides))
    for preset, image_size, method, kappa, overrides in models:
        with torch.device("meta"):
            model = ex.build_model(preset, 1, image_size, method, kappa, **dict(overrides))
        assert model.n_skips >= 1, (preset, method, kappa, overrides)


def test_unknown_names_raise():
    with pytest.raises(ValueError, match="unknown experiment 'nope'.*uvit-gentle, uvit-stress"):
        ex.run_experiment("nope")
    with pytest.raises(ValueError, match="unknown profile 'tpu'"):
        get_profile("tpu")


def test_profile_comes_from_the_environment(monkeypatch):
    monkeypatch.setenv("SCALELONG_PROFILE", "ci")
    assert get_profile().name == "ci"
    monkeypatch.delenv("SCALELONG_PROFILE")
    monkeypatch.delenv("SCALELONG_TRAIN", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert get_profile().name == "cpu"  # the text rests on the committed cpu results, GPU or not
    monkeypatch.setenv("SCALELONG_TRAIN", "all")
    assert get_profile().name == "gpu"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert get_profile().name == "cpu"


def test_cli(capsys, monkeypatch):
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "python -m scalelong_edu run" in capsys.readouterr().out
    main(["list", "--profile", "ci"])
    listed = capsys.readouterr().out
    assert all(name in listed for name in NAMES)
    monkeypatch.setattr(ex, "get_profile", lambda name=None: TINY)
    main(["run", "quick", "--no-progress"])
    out = capsys.readouterr().out
    assert "quick (ci profile)" in out and "CS" in out and "result:" in out
    monkeypatch.setitem(ex.EXPERIMENTS, "again", replace(QUICK, name="again"))
    main(["run", "quick", "again", "--no-progress"])  # one after the other, the first from the cache
    out = capsys.readouterr().out
    assert out.index("quick (ci profile)") < out.index("again (ci profile)") and out.count("result:") == 2
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
    monkeypatch.setattr(ex, "estimate_here", lambda *a: pytest.fail("the dataset fails before any step is timed"))
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
    assert run.stdout.count("quick (tiny profile)") == 1 and run.stdout.count("run 1/2: none, seed 0") == 1
    assert run.stdout.count("result:") == 1
    path, lock = sorted(tmp_path.iterdir(), key=lambda p: p.name.startswith("."))
    assert path.name.startswith("quick-tiny-") and path.name.endswith(".json.gz") and lock.name == f".{path.name}.lock"
    assert len(ex.load_result(path, "quick").runs) == 2


def test_the_help_names_only_existing_experiments(capsys):
    import re

    with pytest.raises(SystemExit):
        main(["--help"])
    named = re.findall(r"scalelong_edu run (\S+)", capsys.readouterr().out)
    assert named and all(name in ex.EXPERIMENTS for name in named)


def test_fig1_recordings_dense_early_probes_batch_norms_ema_loss_and_fd_samples(tmp_results, monkeypatch):
    seen = []
    monkeypatch.setattr(ex, "fcd", lambda samples, reference, classifier: seen.append(len(samples)) or 1.0)
    monkeypatch.setattr(ex, "get_feature_classifier", lambda *a, **k: None)
    fig1 = replace(QUICK, name="fig1", fd_points=2, fd_samples=6, early_probes=(1, 2), batch_norms=True,
                   ema_loss=True, end_probes=False)
    monkeypatch.setitem(ex.EXPERIMENTS, "fig1", fig1)
    result = ex.run_experiment("fig1", TINY, progress=False)
    probes = result.probes()
    fixed = probes[(probes.probe == "fixed") & (probes.quantity == "loss") & (probes.label == "CS")]
    assert sorted(fixed.step) == [0, 1, 2, 4]  # every step up to 2, then every eval_every = 2
    assert sorted(probes[(probes.probe == "adam") & (probes.label == "CS")].step.unique()) == [2, 4]
    ema = probes[(probes.probe == "fixed_ema") & (probes.label == "CS")]
    assert sorted(ema.step) == [0, 2, 4] and (ema.value > 0).all()
    batch = probes[(probes.probe == "batch") & (probes.label == "CS")]
    assert sorted(batch.step.unique()) == [2, 4] and set(batch.block) == {"b", "output"}
    assert seen == [6] * 4  # two runs, two evaluations, fd_samples each
    spec = fig1.spec(TINY)["experiment"]
    assert spec["early_probes"] == (1, 2) and spec["batch_norms"] and spec["fd_samples"] == 6
    assert "batch_norms" not in QUICK.spec(TINY)["experiment"]  # defaults stay out: old hashes hold


def test_the_runs_that_chapter_8s_trained_experiments_share_are_one_run_each():
    cpu = get_profile("cpu")
    keys = {name: {ex.get_experiment(name).run_key(run, cpu): run for run in ex.get_experiment(name).plan(cpu)}
            for name in ("depth-trained", "kappa-trained", "block-output-trained")}
    shared = keys["depth-trained"].keys() & keys["kappa-trained"].keys()
    assert len(shared) == 2 * 6  # none and CS 0.5 at N = 8, six seeds
    assert {(keys["depth-trained"][k].method, keys["depth-trained"][k].kappa) for k in shared} == {("none", 1.0),
                                                                                                    ("cs", 0.5)}
    assert not keys["block-output-trained"].keys() & (keys["depth-trained"].keys() | keys["kappa-trained"].keys())
    long = ex.get_experiment("long-uvit")
    assert long.steps(cpu) == cpu.long_steps and len(long.plan(cpu)) == 2 * 6
    deep, grid = (ex.get_experiment(name) for name in ("stability-deep", "stability-map"))
    deep_keys = {deep.run_key(run, cpu): run.seed for run in deep.plan(cpu)}
    reused = deep_keys.keys() & {grid.run_key(run, cpu) for run in grid.plan(cpu)}
    assert len(deep_keys) == 4 * ex.BREAKDOWN_SEEDS and sorted(deep_keys[k] for k in reused) == [0] * 4 + [1] * 4
    for name, declared in ex.CONFIRMATIONS.items():
        confirm, pilot_of = ex.get_experiment(name), ex.get_experiment(declared.pilot)
        pilot_keys = {pilot_of.run_key(run, cpu) for run in pilot_of.plan(cpu)}
        assert max(run.seed for run in pilot_of.plan(cpu)) < declared.first  # fresh seeds follow the pilot's
        fresh = range(declared.first, declared.first + declared.fresh)
        pilot = [(run.method, run.seed) for run in confirm.plan(cpu) if confirm.run_key(run, cpu) in pilot_keys]
        arms = {run.method for run in confirm.runs}
        assert {(run.method, run.seed) for run in confirm.plan(cpu) if run.seed in fresh} == {
            (m, s) for m in arms for s in fresh}
        if declared.cautious is None:  # paired endpoints: measured apart, fresh seeds only
            assert not pilot and {run.seed for run in confirm.plan(cpu)} == set(fresh)
        else:  # breakdown rates: measured as the pilot, whose runs it reuses
            assert sorted(pilot) == sorted((m, s) for m in arms for s in range(declared.first))
    fresh_cells = {name: {(run.method, run.seed) for run in ex.get_experiment(name).plan(cpu)
                          if declared.first <= run.seed < declared.first + declared.fresh}
                   for name, declared in ex.CONFIRMATIONS.items()}
    for a, b in itertools.combinations(ex.CONFIRMATIONS, 2):  # a treatment's fresh seeds are tested once
        if ex.CONFIRMATIONS[a].pilot == ex.CONFIRMATIONS[b].pilot:
            assert {method for method, _ in fresh_cells[a] & fresh_cells[b]} <= {"none"}, (a, b)
    search = ex.get_experiment("stress-search-uvit")
    assert [r.lr_scale for r in search.plan(cpu)[:5]] == list(ex.STRESS_SEARCH) and len(search.plan(cpu)) == 25
    assert {r.method for r in search.runs} == {"none"}


def test_the_ci_profile_caps_the_seeds_of_the_main_comparisons():
    main = ex.get_experiment("main-uvit")
    assert len(main.plan(get_profile("cpu"))) == 16 * 4 and len(main.plan(get_profile("ci"))) == 2 * 4
    assert len(ex.get_experiment("main-unet").plan(get_profile("cpu"))) == 12 * 4
    assert "seed_cap" not in main.spec(get_profile("ci"))["profile"]


def test_runs_of_two_methods_with_one_seed_share_initial_weights_and_batches(tmp_results, monkeypatch,
                                                                            untimed_estimate):
    """The premise of every paired test in the book: same seed, same start, same data."""
    built, batches = [], []
    build = ex.build_model

    def recording_build(*args, **kwargs):
        model = build(*args, **kwargs)
        built.append({k: v.clone() for k, v in model.state_dict().items()})
        return model

    next_batch = Trainer._next_batch

    def recording_batch(self):
        batch = next_batch(self)
        batches.append((self.spec["run"]["label"], [x.clone() for x in batch]))
        return batch

    monkeypatch.setattr(ex, "build_model", recording_build)
    monkeypatch.setattr(Trainer, "_next_batch", recording_batch)
    pair = ex.Experiment("pair", "none vs LS", (ex.RunSpec("none"), ex.RunSpec("LS", method="ls")), end_probes=False)
    monkeypatch.setitem(ex.EXPERIMENTS, "pair", pair)
    result = ex.run_experiment("pair", TINY, progress=False)
    none, ls = built
    assert set(none) < set(ls)  # LS adds its calibration networks, created after the backbone ...
    assert all(torch.equal(none[k], ls[k]) for k in none)  # ... so the backbone starts from the same weights
    first, second = ([b for label, b in batches if label == name] for name in ("none", "LS"))
    assert len(first) == TINY.steps and all(torch.equal(x, y) for a, b in zip(first, second) for x, y in zip(a, b))
    probes = result.probes().query("probe == 'features' and block == 'a' and step == 0")
    assert probes[probes.label == "none"].value.tolist() == probes[probes.label == "LS"].value.tolist()


def test_a_failed_write_names_its_file_and_keeps_the_previous_partial(tmp_results, monkeypatch):
    """Issue 19, case 2: a full disk while a run is kept: the error names the file, the old stays."""
    plan, path = QUICK.plan(TINY), ex.cache_path(QUICK, TINY)
    record = ex.train_run(plan[0], QUICK, TINY, progress=False)
    keep(path, 0, record, plan[0])
    before = ex.partial_path(path, 0).read_text()

    def full(self, text):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Path, "write_text", full)
    with pytest.raises(OSError, match=re.escape(f"[Errno 28] No space left on device: '{ex.partial_path(path, 0)}'")):
        keep(path, 0, record, plan[0])
    monkeypatch.undo()
    assert ex.partial_path(path, 0).read_text() == before and len(list(ex.runs_dir(path).iterdir())) == 1


def test_finished_so_far_reads_the_runs_kept_without_training(tmp_results, monkeypatch):
    two_seeds = replace(TINY, seeds=2)
    with pytest.raises(FileNotFoundError, match="no run of quick has finished .* `python -m scalelong_edu run quick"):
        ex.finished_so_far("quick", two_seeds)
    plan, path = QUICK.plan(two_seeds), ex.cache_path(QUICK, two_seeds)
    keep(path, 1, ex.train_run(plan[1], QUICK, two_seeds, progress=False), plan[1], profile=two_seeds)
    monkeypatch.setattr(ex, "train_run", lambda *a, **k: pytest.fail("must not train"))
    partial = ex.finished_so_far("quick", two_seeds)
    assert [r["label"] for r in partial.runs] == ["CS"] and partial.describe().startswith("partial (1 of 4 runs")
    monkeypatch.undo()
    monkeypatch.setenv("SCALELONG_RESULTS", str(tmp_results))
    monkeypatch.setitem(ex.EXPERIMENTS, "quick", QUICK)
    complete = ex.run_experiment("quick", two_seeds, progress=False)
    assert ex.finished_so_far("quick", two_seeds).to_json() == json.loads(json.dumps(complete.to_json()))


def test_a_run_trained_for_any_experiment_is_reused_not_retrained(tmp_results, monkeypatch, capsys):
    """Issue 21, item 1: adding seeds trains only the new seeds; a run of another experiment with
    the same settings and measurements (another label) is reused; another measurement is not."""
    first = ex.run_experiment("quick", TINY, progress=False)
    more = replace(QUICK, name="quick2", description="more seeds", seeds=2,
                   runs=(ex.RunSpec("no scaling"), ex.RunSpec("CS", method="cs")))
    monkeypatch.setitem(ex.EXPERIMENTS, "quick2", more)
    real, calls = ex.train_run, []

    def counted(run, *a, **k):
        calls.append((run.label, run.seed))
        return real(run, *a, **k)

    monkeypatch.setattr(ex, "train_run", counted)
    second = ex.run_experiment("quick2", TINY)
    assert calls == [("no scaling", 1), ("CS", 1)]
    assert "run 1/4 (no scaling, seed 0) is already trained: reused from quick-ci-" in capsys.readouterr().out
    assert second.runs[0]["history"] == first.runs[0]["history"] and second.runs[0]["label"] == "no scaling"
    assert ex.load_result(second.path).runs[0]["run"]["label"] == "no scaling"
    other = replace(QUICK, name="quick3", description="other measurements", robustness_sigmas=(0.0,))
    monkeypatch.setitem(ex.EXPERIMENTS, "quick3", other)
    calls.clear()
    ex.run_experiment("quick3", TINY, progress=False)
    assert calls == [("none", 0), ("CS", 0)]


def test_a_second_process_waits_for_the_first_and_loads_what_it_cached(tmp_results, monkeypatch, capsys):
    """Two notebooks (or test workers) that need the same uncached result: one trains, the other
    waits on the result's lock, then loads the cache instead of training the same runs again."""
    import threading
    import time

    from scalelong_edu.files import exclusive

    path = ex.cache_path(QUICK, TINY)
    ex.run_experiment("quick", TINY, progress=False)
    aside = path.rename(path.with_name("aside"))
    monkeypatch.setattr(ex, "train_run", lambda *a, **k: pytest.fail("the waiting process trained"))
    loaded = []
    second = threading.Thread(target=lambda: loaded.append(ex.run_experiment("quick", TINY)))
    with exclusive(path, "the experiment result"):  # the first process, still training
        second.start()
        out, deadline = "", time.monotonic() + 60
        while "waiting for it" not in out and time.monotonic() < deadline:
            time.sleep(0.05)
            out += capsys.readouterr().out
        assert f"[quick] another process is computing {path.name}: waiting for it" in out
        aside.rename(path)  # ... which caches its result and lets go
    second.join(60)
    assert "[quick] loaded from the cache" in capsys.readouterr().out and loaded[0].path == path


def test_the_stress_comparison_runs_where_the_declared_rule_puts_it_and_reuses_the_searchs_runs(monkeypatch):
    from scalelong_edu.evidence import breakdown_scale

    monkeypatch.delenv("SCALELONG_RESULTS")  # the committed results
    cpu = PROFILES["cpu"]
    search = ex.finished_so_far("stress-search-uvit", cpu)
    assert "partial" not in search.provenance, "the rule is applied to the finished search only"
    assert breakdown_scale(search) == ex.STRESS_SCALE
    searching, comparing = ex.EXPERIMENTS["stress-search-uvit"], ex.EXPERIMENTS["breakdown-uvit"]
    searched = {searching.run_key(r, cpu) for r in searching.plan(cpu) if r.lr_scale == ex.STRESS_SCALE}
    unscaled = {comparing.run_key(r, cpu) for r in comparing.plan(cpu) if r.method == "none"}
    assert len(searched) == searching.seeds
    assert searched < unscaled and len(unscaled) == ex.BREAKDOWN_SEEDS
