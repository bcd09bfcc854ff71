"""Tests for scalelong_edu.metrics: the Frechet distance, the feature classifier and its cache, FCD, Inception FID.

The classifier is trained on the offline ``digits8x8`` data set with a tiny budget, its
cache in a temporary data root. Inception FID is exercised offline: a missing library and
a failing download must both give a RuntimeError that points to ``fcd``.
"""

import math
import socket
import sys
import time
import types
import urllib.error
import urllib.request

import numpy as np
import pytest
import scipy.linalg
import torch

from scalelong_edu import __version__, metrics
from scalelong_edu.data import load_dataset
from scalelong_edu.metrics import (FeatureClassifier, classifier_confidence, fcd, frechet_distance,
                                   get_feature_classifier, inception_fid)

STEPS = 150  # training budget of the test classifier: seconds on one CPU thread


@pytest.fixture(scope="module")
def digits() -> dict[str, torch.Tensor]:
    return {split: load_dataset("digits8x8", split).tensors()[0] for split in ("train", "test")}


@pytest.fixture(scope="module")
def classifier_root(tmp_path_factory):
    return tmp_path_factory.mktemp("data")


@pytest.fixture(scope="module")
def classifier(classifier_root) -> FeatureClassifier:
    return get_feature_classifier("digits8x8", train_steps=STEPS, root=classifier_root, progress=False)


def random_spd(rng: np.random.Generator, d: int, rank: int | None = None) -> np.ndarray:
    a = rng.normal(size=(d, rank or 2 * d))
    return a @ a.T / a.shape[1]


# -----------------------------------------------------------------------------
# frechet_distance


def test_frechet_distance_is_zero_for_identical_gaussians():
    rng = np.random.default_rng(0)
    mu, sigma = rng.normal(size=20), random_spd(rng, 20)
    assert frechet_distance(mu, sigma, mu, sigma) == pytest.approx(0, abs=1e-9)
    singular = random_spd(rng, 20, rank=5)  # fewer samples than dimensions
    assert frechet_distance(mu, singular, mu, singular) == pytest.approx(0, abs=1e-6)


@pytest.mark.parametrize("m1, s1, m2, s2", [(0.0, 1.0, 0.0, 1.0), (1.0, 2.0, -0.5, 0.5), (3.0, 0.0, 0.0, 1.5)])
def test_frechet_distance_one_dimensional_closed_form(m1, s1, m2, s2):
    """N(m1, s1^2) vs N(m2, s2^2): d^2 = (m1 - m2)^2 + (s1 - s2)^2."""
    got = frechet_distance(np.array([m1]), np.array([[s1**2]]), np.array([m2]), np.array([[s2**2]]))
    assert got == pytest.approx((m1 - m2) ** 2 + (s1 - s2) ** 2, abs=1e-12)


def test_frechet_distance_diagonal_closed_form():
    """Diagonal covariances a, b: d^2 = ||mu1 - mu2||^2 + sum_i (sqrt(a_i) - sqrt(b_i))^2."""
    rng = np.random.default_rng(1)
    mu1, mu2 = rng.normal(size=8), rng.normal(size=8)
    a, b = rng.uniform(0.1, 3, size=8), rng.uniform(0.1, 3, size=8)
    expected = np.sum((mu1 - mu2) ** 2) + np.sum((np.sqrt(a) - np.sqrt(b)) ** 2)
    assert frechet_distance(mu1, np.diag(a), mu2, np.diag(b)) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("d", [2, 10, 64])
def test_frechet_distance_matches_scipy_sqrtm_and_is_symmetric(d):
    rng = np.random.default_rng(d)
    mu1, mu2 = rng.normal(size=d), rng.normal(size=d)
    s1, s2 = random_spd(rng, d), random_spd(rng, d)
    expected = np.sum((mu1 - mu2) ** 2) + np.trace(s1 + s2) - 2 * np.trace(scipy.linalg.sqrtm(s1 @ s2)).real
    got = frechet_distance(mu1, s1, mu2, s2)
    assert got == pytest.approx(expected, rel=1e-8)
    assert frechet_distance(mu2, s2, mu1, s1) == pytest.approx(got, rel=1e-10)
    as_tensors = [torch.from_numpy(x).float() for x in (mu1, s1, mu2, s2)]
    assert frechet_distance(*as_tensors) == pytest.approx(got, rel=1e-4)


def test_frechet_distance_is_non_negative_for_close_and_singular_gaussians():
    rng = np.random.default_rng(2)
    for _ in range(20):
        d = int(rng.integers(1, 30))
        s1 = random_spd(rng, d, rank=int(rng.integers(1, d + 1)))
        s2 = s1 + 1e-12 * random_spd(rng, d)
        mu = rng.normal(size=d)
        assert frechet_distance(mu, s1, mu + 1e-9, s2) >= 0


def test_frechet_distance_rejects_bad_shapes_and_matrices():
    mu, eye = np.zeros(3), np.eye(3)
    with pytest.raises(ValueError, match="vectors of one length"):
        frechet_distance(mu, eye, np.zeros(4), np.eye(4))
    with pytest.raises(ValueError, match="vectors of one length"):
        frechet_distance(eye, eye, eye, eye)
    with pytest.raises(ValueError, match=r"sigma2 must have shape \(3, 3\)"):
        frechet_distance(mu, eye, mu, np.eye(4))
    with pytest.raises(ValueError, match="not symmetric"):
        frechet_distance(mu, np.triu(np.ones((3, 3))), mu, eye)
    with pytest.raises(ValueError, match="not positive semi-definite"):
        frechet_distance(mu, eye, mu, -eye)
    with pytest.raises(ValueError, match="NaN"):
        frechet_distance(np.array([0.0, np.nan, 0.0]), eye, mu, eye)


# -----------------------------------------------------------------------------
# the feature classifier and its cache


def test_classifier_trains_to_useful_accuracy_on_a_tiny_budget(classifier, digits):
    assert (classifier.dataset, classifier.channels, classifier.image_size) == ("digits8x8", 1, 16)
    assert classifier.accuracy > 0.85  # 10 classes: chance is 0.1
    labels = load_dataset("digits8x8", "test").tensors()[1]
    with torch.no_grad():
        assert metrics._accuracy(classifier, digits["test"], labels) == classifier.accuracy
        features = classifier.features(digits["test"][:7])
        assert features.shape == (7, metrics.FEATURE_DIM)
        assert classifier(digits["test"][:7]).shape == (7, 10)


def test_classifier_cache_is_written_and_reloaded_without_training(classifier, classifier_root, digits, monkeypatch):
    path = classifier_root / "classifiers" / "digits8x8-16.pt"
    saved = torch.load(path, weights_only=True)
    assert {k: saved[k] for k in ("dataset", "image_size", "train_steps", "version")} == {
        "dataset": "digits8x8",
        "image_size": 16,
        "train_steps": STEPS,
        "version": __version__,
    }
    assert saved["accuracy"] == classifier.accuracy
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temporary file left behind

    def no_training(*args, **kwargs):
        raise AssertionError("a valid cache must be loaded, not retrained")

    monkeypatch.setattr(metrics, "_train_classifier", no_training)
    reloaded = get_feature_classifier("digits8x8", train_steps=STEPS, root=classifier_root)
    assert reloaded.accuracy == classifier.accuracy
    with torch.no_grad():
        torch.testing.assert_close(reloaded.features(digits["test"]), classifier.features(digits["test"]))


def test_cache_goes_under_the_data_root(tmp_path, monkeypatch):
    monkeypatch.setenv("SCALELONG_DATA", str(tmp_path))
    get_feature_classifier("digits8x8", image_size=12, train_steps=5, progress=False)
    assert (tmp_path / "classifiers" / "digits8x8-12.pt").is_file()


def test_corrupt_cache_is_retrained_with_a_warning(tmp_path, digits):
    first = get_feature_classifier("digits8x8", train_steps=20, root=tmp_path, progress=False)
    path = tmp_path / "classifiers" / "digits8x8-16.pt"
    path.write_bytes(path.read_bytes()[:1000])  # a truncated download or an interrupted copy
    with pytest.warns(UserWarning, match="corrupt"):
        second = get_feature_classifier("digits8x8", train_steps=20, root=tmp_path, progress=False)
    with torch.no_grad():  # the retrained classifier is the same: training is seeded
        torch.testing.assert_close(second.features(digits["test"]), first.features(digits["test"]))
    torch.load(path, weights_only=True)  # and the cache is whole again


def test_mismatching_cache_is_retrained_with_a_warning(tmp_path):
    get_feature_classifier("digits8x8", train_steps=10, root=tmp_path, progress=False)
    with pytest.warns(UserWarning, match="train_steps: cached 10, wanted 12"):
        get_feature_classifier("digits8x8", train_steps=12, root=tmp_path, progress=False)
    path = tmp_path / "classifiers" / "digits8x8-16.pt"
    saved = torch.load(path, weights_only=True)
    torch.save({**saved, "version": "0.0.0"}, path)
    with pytest.warns(UserWarning, match="version: cached '0.0.0'"):
        get_feature_classifier("digits8x8", train_steps=12, root=tmp_path, progress=False)


def test_feature_classifier_rejects_images_of_the_wrong_shape(classifier):
    with pytest.raises(ValueError, match=r"takes images \(B, 1, 16, 16\), got \(2, 1, 32, 32\)"):
        classifier.features(torch.zeros(2, 1, 32, 32))
    with pytest.raises(ValueError, match="takes images"):
        classifier.features(torch.zeros(1, 16, 16))


def test_get_feature_classifier_rejects_bad_arguments(tmp_path):
    with pytest.raises(ValueError, match="Unknown dataset 'mnist5'.*mnist5k"):
        get_feature_classifier("mnist5", root=tmp_path)
    with pytest.raises(ValueError, match="no class labels.*inception_fid"):
        get_feature_classifier("celeba64", root=tmp_path)
    with pytest.raises(ValueError, match="train_steps must be a positive int"):
        get_feature_classifier("digits8x8", train_steps=0, root=tmp_path)
    with pytest.raises(ValueError, match="image_size must be a positive int"):
        get_feature_classifier("digits8x8", image_size=0, root=tmp_path)


# -----------------------------------------------------------------------------
# fcd


def test_classifier_confidence_is_high_on_real_digits_and_low_on_noise(classifier, digits):
    real = classifier_confidence(digits["test"], classifier)
    noise = classifier_confidence(torch.rand(200, 1, 16, 16, generator=torch.Generator().manual_seed(0)) * 2 - 1,
                                  classifier)
    assert real.shape == (len(digits["test"]),) and ((real > 0.1) & (real <= 1)).all()
    assert (real > 0.9).float().mean() > 0.7 > (noise > 0.9).float().mean()
    with pytest.raises(ValueError, match="must be scaled to \\[-1, 1\\]"):
        classifier_confidence(digits["test"] * 255, classifier)


def test_fcd_of_real_images_is_far_below_noise_and_blank_images(classifier, digits):
    real = fcd(digits["test"], digits["train"], classifier=classifier)
    generator = torch.Generator().manual_seed(0)
    noise = fcd(torch.rand(500, 1, 16, 16, generator=generator) * 2 - 1, digits["train"], classifier=classifier)
    blank = fcd(torch.full((500, 1, 16, 16), -1.0), digits["train"], classifier=classifier)
    assert 0 < real < noise / 10 and real < blank / 10
    assert fcd(digits["train"], digits["train"], classifier=classifier) == pytest.approx(0, abs=1e-4)


def test_fcd_sees_missing_classes(classifier, digits):
    """A 'generator' that drops half the digits is far off: features of a trained classifier separate classes.

    With the same network untrained (random weights) this ratio is about 4; trained, about 15.
    """
    labels = load_dataset("digits8x8", "train").tensors()[1]
    real = fcd(digits["test"], digits["train"], classifier=classifier)
    half = fcd(digits["train"][labels < 5], digits["test"], classifier=classifier)
    assert half > 8 * real


def test_fcd_with_a_dataset_name_uses_its_test_split(classifier, digits):
    assert fcd(digits["train"], "digits8x8", classifier=classifier) == pytest.approx(
        fcd(digits["train"], digits["test"], classifier=classifier), rel=1e-9
    )


def test_fcd_without_classifier_gets_the_datasets_own(classifier, digits, monkeypatch):
    calls = []

    def fake_get(dataset, image_size=None):
        calls.append((dataset, image_size))
        return classifier

    monkeypatch.setattr(metrics, "get_feature_classifier", fake_get)
    assert fcd(digits["train"], "digits8x8") == fcd(digits["train"], "digits8x8", classifier=classifier)
    assert calls == [("digits8x8", 16)]
    with pytest.raises(ValueError, match="pass the feature network too"):
        fcd(digits["train"], digits["test"])


def test_fcd_rejects_bad_images_with_clear_errors(classifier, digits):
    real = digits["test"]
    with pytest.raises(ValueError, match=r"samples must have shape \(N, 1, 16, 16\).*digits8x8"):
        fcd(-torch.ones(10, 1, 32, 32), real, classifier=classifier)
    with pytest.raises(ValueError, match=r"reference must have shape"):
        fcd(real, -torch.ones(10, 3, 16, 16), classifier=classifier)
    with pytest.raises(ValueError, match=r"images \(N, C, H, W\)"):
        fcd(-torch.ones(10, 16, 16), real, classifier=classifier)
    with pytest.raises(ValueError, match=r"x / 127.5 - 1"):
        fcd(torch.zeros(10, 1, 16, 16, dtype=torch.uint8), real, classifier=classifier)
    with pytest.raises(ValueError, match=r"scaled to \[-1, 1\].*span \[0, 255\].*x / 127.5 - 1"):
        fcd(torch.linspace(0, 255, 10 * 16 * 16).reshape(10, 1, 16, 16), real, classifier=classifier)
    with pytest.raises(ValueError, match="at least 2 images"):
        fcd(real[:1], real, classifier=classifier)
    with pytest.raises(ValueError, match="NaN"):
        fcd(torch.full((10, 1, 16, 16), math.nan), real, classifier=classifier)
    with pytest.raises(TypeError, match="torch.Tensor"):
        fcd(real.numpy(), real, classifier=classifier)


def test_fcd_warns_about_few_samples_and_unshifted_images(classifier, digits):
    with pytest.warns(UserWarning, match="fewer than the 64 feature dimensions"):
        fcd(digits["test"][:20], digits["train"], classifier=classifier)
    with pytest.warns(UserWarning, match="no negative values"):
        fcd((digits["test"] + 1) / 2, digits["train"], classifier=classifier)


# -----------------------------------------------------------------------------
# inception_fid


def fake_torchmetrics(monkeypatch, metric_class: type) -> None:
    """Make ``from torchmetrics.image.fid import FrechetInceptionDistance`` return ``metric_class``."""
    fid = types.ModuleType("torchmetrics.image.fid")
    fid.FrechetInceptionDistance = metric_class
    for name, module in [
        ("torchmetrics", types.ModuleType("torchmetrics")),
        ("torchmetrics.image", types.ModuleType("torchmetrics.image")),
        ("torchmetrics.image.fid", fid),
    ]:
        monkeypatch.setitem(sys.modules, name, module)


def test_inception_fid_without_torchmetrics_points_to_fcd(monkeypatch, digits):
    monkeypatch.setitem(sys.modules, "torchmetrics", None)  # makes the import fail, installed or not
    monkeypatch.setitem(sys.modules, "torchmetrics.image.fid", None)
    with pytest.raises(RuntimeError, match=r"scalelong-edu\[fid\].*fcd\(") as info:
        inception_fid(digits["test"], digits["train"])
    assert isinstance(info.value.__cause__, ImportError)


def test_inception_fid_fails_fast_when_the_weights_cannot_be_downloaded(monkeypatch, digits):
    """The download runs under a short socket timeout; a non-routable address cannot make it hang."""
    seen_timeouts = []

    class Downloading:
        def __init__(self, **kwargs):
            seen_timeouts.append(socket.getdefaulttimeout())
            urllib.request.urlopen("http://10.255.255.1/weights-inception.pth")

    fake_torchmetrics(monkeypatch, Downloading)
    monkeypatch.setattr(metrics, "DOWNLOAD_TIMEOUT_S", 1.0)
    before, start = socket.getdefaulttimeout(), time.monotonic()
    with pytest.raises(RuntimeError, match=r"Inception-v3 weights.*fcd\("):
        inception_fid(digits["test"], digits["train"])
    assert time.monotonic() - start < 15
    assert seen_timeouts == [1.0] and socket.getdefaulttimeout() == before


def test_inception_fid_through_the_real_library_offline(monkeypatch, digits):
    """With torchmetrics installed, a failing download inside it still becomes the RuntimeError."""
    pytest.importorskip("torchmetrics")
    inception = pytest.importorskip("torch_fidelity.feature_extractor_inceptionv3")

    def offline(*args, **kwargs):
        raise urllib.error.URLError("no internet (simulated)")

    monkeypatch.setattr(inception, "load_state_dict_from_url", offline)
    with pytest.raises(RuntimeError, match=r"Inception-v3 weights.*fcd\("):
        inception_fid(digits["test"], digits["train"])


def test_inception_fid_feeds_uint8_rgb_samples_and_reference(monkeypatch):
    updates = []

    class Recording:
        def __init__(self, feature, normalize):
            assert (feature, normalize) == (2048, False)
            self.device = torch.device("cpu")

        def to(self, device):
            return self

        def update(self, images, real):
            updates.append((images, real))

        def compute(self):
            return torch.tensor(12.5, dtype=torch.float64)

    fake_torchmetrics(monkeypatch, Recording)
    samples = torch.linspace(-1, 1, 5 * 8 * 8).reshape(5, 1, 8, 8)
    reference = torch.full((3, 1, 8, 8), -1.0)
    assert inception_fid(samples, reference, batch_size=2, device="cpu") == 12.5
    assert [(tuple(x.shape), real) for x, real in updates] == [
        ((2, 3, 8, 8), False),
        ((2, 3, 8, 8), False),
        ((1, 3, 8, 8), False),
        ((2, 3, 8, 8), True),
        ((1, 3, 8, 8), True),
    ]
    fake = torch.cat([x for x, real in updates if not real])
    assert fake.dtype == torch.uint8 and (fake[:, 0] == fake[:, 2]).all()
    assert fake.min() == 0 and fake.max() == 255


def test_inception_fid_rejects_bad_images_before_loading_anything(monkeypatch):
    monkeypatch.setitem(sys.modules, "torchmetrics", None)
    with pytest.raises(ValueError, match="grey or RGB"):
        inception_fid(-torch.ones(4, 2, 8, 8), -torch.ones(4, 2, 8, 8))
    with pytest.raises(ValueError, match=r"reference must have shape \(N, 1, 8, 8\)"):
        inception_fid(-torch.ones(4, 1, 8, 8), -torch.ones(4, 1, 16, 16))
    with pytest.raises(ValueError, match="scaled to"):
        inception_fid(-torch.ones(4, 1, 8, 8), torch.full((4, 1, 8, 8), 255.0))


def test_an_unwritable_classifier_folder_fails_before_training(tmp_path, monkeypatch):
    """Issue 19, case 3: the classifier's cache folder is checked before the classifier trains."""
    (tmp_path / "classifiers").write_text("a file where the folder belongs")
    monkeypatch.setattr(metrics, "_train_classifier", lambda *a, **k: pytest.fail("must fail before training"))
    with pytest.raises(PermissionError, match=f"cannot write the feature classifier {tmp_path}/classifiers/"):
        metrics.get_feature_classifier("digits8x8", root=tmp_path, progress=False)
