"""The `gpu` profile without a GPU: its models, every method, AMP, probes, sampling, metrics, cache.

Its dataset, CIFAR-10, needs a download, so a stand-in of the same shape (3 x 32 x 32, ten labels)
takes its place in the dataset registry; the profile keeps its models (`unet-m`, `uvit-m`), image
size and schedule; only the step counts and the batch (two images: the fixed batch then holds both
ends of the schedule, ``t = 0`` and ``T - 1``) shrink, so that everything runs on a CPU in about a
minute. What a first reader with a T4 would otherwise be the first to run, runs here.
"""

import json
from dataclasses import replace
from functools import partial

import pytest
import torch

from scalelong_edu import data
from scalelong_edu import experiments as ex
from scalelong_edu import probes as pr
from scalelong_edu.diffusion import linear_schedule
from scalelong_edu.metrics import classifier_confidence, fcd, get_feature_classifier
from scalelong_edu.models import build_model, count_parameters
from scalelong_edu.profiles import PROFILES
from scalelong_edu.scaling import METHODS
from scalelong_edu.train import TrainConfig, Trainer

GPU = PROFILES["gpu"]
SHORT = replace(GPU, steps=2, long_steps=2, warmup=1, eval_every=1, batch_size=2, n_samples=2, sample_steps=2, seeds=1)
EVERY_METHOD = ex.Experiment(
    "gpu-every-method", "the gpu profile's two backbones with every method",
    tuple(ex.RunSpec(f"{backbone} {method}", backbone=backbone, method=method)
          for backbone in ("unet", "uvit") for method in METHODS),
    end_probes=False,
)
END_PROBES = ex.Experiment(
    "gpu-end-probes", "the end-of-training probes on both gpu backbones (their code does not depend on the method)",
    tuple(ex.RunSpec(f"{backbone} ls", backbone=backbone, method="ls") for backbone in ("unet", "uvit")),
    robustness_sigmas=(0.0, 0.1),
)


@pytest.fixture
def stand_in_cifar10(monkeypatch, tmp_path):
    """Random uint8 images of CIFAR-10's shape under the name ``cifar10``, offline."""
    def load(split: str, size: int):
        gen = torch.Generator().manual_seed(0 if split == "train" else 1)
        n = 64 if split == "train" else 32
        images = torch.randint(0, 256, (n, 3, size, size), generator=gen, dtype=torch.uint8)
        return images, torch.arange(n) % 10

    info = data.DatasetInfo("cifar10", channels=3, image_size=32, offline=True, n_train=64, n_test=32,
                            description="stand-in for CIFAR-10 (random images)")
    monkeypatch.setitem(data._DATASETS, "cifar10", (info, load))
    monkeypatch.setenv("SCALELONG_RESULTS", str(tmp_path / "results"))
    for experiment in (EVERY_METHOD, END_PROBES):
        monkeypatch.setitem(ex.EXPERIMENTS, experiment.name, experiment)
    return tmp_path


def test_every_method_on_both_gpu_backbones_trains_probes_samples_and_caches(stand_in_cifar10, monkeypatch,
                                                                             untimed_estimate):
    result = ex.run_experiment(EVERY_METHOD.name, SHORT, device="cpu", progress=False)
    assert [r["label"] for r in result.runs] == [run.label for run in EVERY_METHOD.runs]
    assert {r["run"]["lr"] for r in result.runs} == {GPU.lr["unet"], GPU.lr["uvit"]}
    assert result.path.name.endswith(".json.gz")
    assert all(r["diverged_at"] is None for r in result.runs)
    parameters = {r["label"]: r["parameters"] for r in result.runs}
    assert parameters["unet none"] == 3_519_267 and parameters["uvit none"] == 11_117_664
    assert parameters["uvit ls"] == 11_126_161 and parameters["uvit ls-per-skip"] == 11_168_646
    probes = result.probes()
    for label in parameters:
        own = probes[probes.label == label]
        assert set(own.probe) == {"features", "fixed", "grads", "adam"}, label
        assert sorted(own[(own.probe == "fixed") & (own.quantity == "loss")].step) == [0, 1, 2], label
        assert result.samples(label).shape == (SHORT.n_samples, 3, 32, 32)
    assert result.spec["profile"]["unet"] == "unet-m" and result.spec["profile"]["dataset"] == "cifar10"
    assert result.spec["profile"]["steps"] == 2 and "lr" not in result.spec["profile"]

    monkeypatch.setattr(ex, "train_run", lambda *a, **k: pytest.fail("a cached result must not train again"))
    cached = ex.run_experiment(EVERY_METHOD.name, SHORT, progress=False)
    assert cached.to_json() == json.loads(json.dumps(result.to_json()))

    samples = torch.cat([result.samples(label) for label in parameters])
    classifier = get_feature_classifier("cifar10", 32, device="cpu", train_steps=5, root=stand_in_cifar10,
                                        progress=False)
    assert classifier_confidence(samples, classifier).shape == (len(samples),)
    with pytest.warns(UserWarning, match="singular"):  # 24 samples < 64 features: said, not hidden
        assert fcd(samples, "cifar10", classifier) > 0


def test_the_end_of_training_probes_run_on_both_gpu_backbones(stand_in_cifar10, monkeypatch, untimed_estimate):
    # one power iteration instead of ten: the Lipschitz probe's 13 Jacobians of the U-ViT are most of a
    # run's time on a CPU; its accuracy is tested in test_probes.py
    monkeypatch.setattr(ex, "lipschitz", partial(pr.lipschitz, iters=1))
    probes = ex.run_experiment(END_PROBES.name, SHORT, device="cpu", progress=False).probes()
    for label in ("unet ls", "uvit ls"):
        own = probes[probes.label == label]
        assert {"robustness", "lipschitz"} <= set(own.probe), label
        assert sorted(own[own.probe == "robustness"].sigma.unique()) == [0.0, 0.1], label
        assert (own[own.probe == "lipschitz"].value > 0).all(), label


@pytest.mark.parametrize("preset", [GPU.unet, GPU.uvit])
@pytest.mark.parametrize("amp", ["float16", "bfloat16"])
def test_mixed_precision_on_the_gpu_presets_runs_on_the_cpu(stand_in_cifar10, tmp_path, preset, amp):
    """The AMP path a T4 takes (float16 autocast with loss scaling), and bfloat16, exercised on the CPU;
    a checkpoint keeps the loss scaler's state, and a resumed run is the uninterrupted one. Two steps
    of two images, at 16 px (the presets' blocks are the same at any size): a CPU without
    float16/bfloat16 units emulates the low-precision products, and a step of the U-ViT at 32 px
    costs more than ten times its float32 step."""
    images = data.load_dataset("cifar10", image_size=16).tensors()[0]
    config = TrainConfig(steps=2, batch_size=2, warmup=1, amp=amp)

    def trainer():
        torch.manual_seed(0)
        return Trainer(build_model(preset, 3, 16, "ls"), images, linear_schedule(), config, device="cpu",
                       progress=False)

    full = trainer()
    full.fit(until=1, checkpoint=tmp_path / "run.pt")  # the uninterrupted run, checkpointed halfway
    full.fit()
    assert full.amp_dtype == getattr(torch, amp) and full.scaler.is_enabled() == (amp == "float16")
    assert all(torch.isfinite(torch.tensor(h["loss"])) for h in full.history)
    resumed = trainer()
    resumed.fit(checkpoint=tmp_path / "run.pt")
    assert resumed.history == full.history
    assert resumed.scaler.get_scale() == full.scaler.get_scale()
    assert count_parameters(resumed.model) > 1_000_000
