"""Sample quality: Frechet distances between real and generated images.

A Frechet distance compares two image sets through a feature extractor ``phi``: fit a
Gaussian to the features of each set (mean ``mu``, covariance ``S``) and measure

    d^2 = ||mu_1 - mu_2||^2 + Tr(S_1 + S_2 - 2 (S_1 S_2)^(1/2))

(:func:`frechet_distance`). Lower is better; 0 means the two feature distributions agree in
mean and covariance. Two choices of ``phi``:

* :func:`fcd` -- the **Frechet Classifier Distance**, the book's default. ``phi`` is the
  64-d penultimate layer of a small CNN trained here on the dataset's own training split
  (:func:`get_feature_classifier`; about a minute on a CPU, then cached). It works with
  no internet, on the small grey-scale datasets the book trains on (MNIST at 32 px,
  scikit-learn digits at 16 px), and its features are ones that separate *these* images.
* :func:`inception_fid` -- the usual **FID** (Heusel et al., 2017): ``phi`` is the 2048-d
  pool layer of an Inception-v3 trained on ImageNet, through ``torchmetrics`` (optional
  extra). Its weights must be downloaded once; without internet it raises a
  ``RuntimeError`` that points here.

Why FCD is the offline default, and what its numbers mean: Inception-v3 needs a download
the book cannot assume, and was trained on colour photographs at 299 px, so on 32 px
digits its features say little. FCD numbers are **not comparable to published FIDs**,
nor across classifiers: the scale depends on the feature network, its training run, the
image size and the number of samples (the estimate is biased upwards for small sample
sets, strongly so when there are fewer samples than feature dimensions). Compare FCD
values only within one experiment: same dataset, image size, classifier and sample count.
The paper's FID tables (CIFAR-10, CelebA, ImageNet) can be approached only with
:func:`inception_fid` on those datasets with tens of thousands of samples.
"""

from __future__ import annotations

import math
import socket
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from tqdm.auto import tqdm

from . import __version__
from .data import data_root, dataset_info, load_dataset
from .files import atomic_write, check_writable

FEATURE_DIM = 64  # width of the classifier's feature layer: the dimension of the FCD Gaussians
TRAIN_STEPS = 1500  # default training budget of the feature classifier (batches of TRAIN_BATCH)
TRAIN_BATCH = 64
TRAIN_LR = 2e-3  # Adam, cosine-decayed to 0 over the run
SEED = 0  # seeds the classifier's initialisation and batch order
RANGE_TOLERANCE = 0.1  # images may stray this far outside [-1, 1] (e.g. unclamped samples)
DOWNLOAD_TIMEOUT_S = 5.0  # socket timeout while Inception weights download: no internet fails fast

ArrayLike = np.ndarray | Tensor


# -----------------------------------------------------------------------------
# the Frechet distance between two Gaussians


def _as_float64(x: ArrayLike) -> np.ndarray:
    if isinstance(x, Tensor):
        x = x.detach().cpu().double().numpy()
    return np.asarray(x, dtype=np.float64)


def _psd_sqrt(sigma: np.ndarray, name: str) -> np.ndarray:
    """Symmetric square root ``V diag(sqrt(l)) V^T`` of a symmetric PSD matrix with eigenpairs ``(l, V)``.

    Eigenvalues that round-off pushed slightly below 0 are set to 0; clearly negative ones
    (below ``-1e-6`` times the largest magnitude) mean ``sigma`` is no covariance: ValueError.
    """
    eigvals, eigvecs = np.linalg.eigh(sigma)
    if eigvals.min() < -1e-6 * max(np.abs(eigvals).max(), np.finfo(np.float64).tiny):
        raise ValueError(f"{name} is not positive semi-definite (smallest eigenvalue {eigvals.min():.3g})")
    return (eigvecs * np.sqrt(eigvals.clip(min=0))) @ eigvecs.T


def frechet_distance(mu1: ArrayLike, sigma1: ArrayLike, mu2: ArrayLike, sigma2: ArrayLike) -> float:
    """Squared Frechet (2-Wasserstein) distance between N(mu1, sigma1) and N(mu2, sigma2).

        d^2 = ||mu1 - mu2||^2 + Tr(S1) + Tr(S2) - 2 Tr((S1 S2)^(1/2))

    ``S1 S2`` is not symmetric, but it has the same eigenvalues as the symmetric PSD matrix
    ``M = S1^(1/2) S2 S1^(1/2)``, so ``Tr((S1 S2)^(1/2)) = sum_i sqrt(lambda_i(M))``. Computed
    that way in float64 with symmetric eigendecompositions, which stays real and stable for
    singular covariances (fewer samples than dimensions), where a general ``sqrtm`` can return
    complex values. FID papers report this squared distance itself (no square root is taken).

    Args:
        mu1, mu2: means, shape (d,); NumPy arrays or tensors.
        sigma1, sigma2: covariances, shape (d, d), symmetric positive semi-definite.

    Returns:
        d^2 >= 0 as a float (round-off below 0 is clipped to 0).

    Raises:
        ValueError: shapes that do not match (d,), (d, d); non-finite values; a covariance that
            is not symmetric or not positive semi-definite.
    """
    mu1, sigma1, mu2, sigma2 = (_as_float64(x) for x in (mu1, sigma1, mu2, sigma2))
    if mu1.ndim != 1 or mu1.shape != mu2.shape:
        raise ValueError(f"mu1 and mu2 must be vectors of one length d, got shapes {mu1.shape} and {mu2.shape}")
    d = mu1.shape[0]
    for name, sigma in (("sigma1", sigma1), ("sigma2", sigma2)):
        if sigma.shape != (d, d):
            raise ValueError(f"{name} must have shape ({d}, {d}) to match the means, got {sigma.shape}")
    for name, x in (("mu1", mu1), ("sigma1", sigma1), ("mu2", mu2), ("sigma2", sigma2)):
        if not np.isfinite(x).all():
            raise ValueError(f"{name} contains NaN or infinite values")
    for name, sigma in (("sigma1", sigma1), ("sigma2", sigma2)):
        if not np.allclose(sigma, sigma.T, rtol=1e-5, atol=1e-8 * max(np.abs(sigma).max(), 1.0)):
            raise ValueError(f"{name} is not symmetric, so it is not a covariance matrix")

    root1 = _psd_sqrt((sigma1 + sigma1.T) / 2, "sigma1")
    _psd_sqrt((sigma2 + sigma2.T) / 2, "sigma2")  # validates sigma2 like sigma1
    middle = root1 @ sigma2 @ root1
    trace_sqrt = np.sqrt(np.linalg.eigvalsh((middle + middle.T) / 2).clip(min=0)).sum()
    value = np.sum((mu1 - mu2) ** 2) + np.trace(sigma1) + np.trace(sigma2) - 2 * trace_sqrt
    return float(max(value, 0.0))


# -----------------------------------------------------------------------------
# the feature classifier


class FeatureClassifier(nn.Module):
    """A compact CNN whose penultimate layer gives the features of the Frechet Classifier Distance.

    Three 3x3 conv blocks (16, 32, 64 channels, ReLU, 2x2 max-pool each), an adaptive
    average pool to 2 x 2, a linear feature layer of ``feature_dim`` units with ReLU, and a
    linear head over ``num_classes``: about 40 k parameters.

    Args:
        channels, image_size: the input images (B, channels, image_size, image_size).
        num_classes: number of labels of the dataset.
        feature_dim: width of the feature layer.
        dataset: name of the dataset it was trained on (for messages and the cache).
        accuracy: test-split accuracy in [0, 1] measured after training; NaN if untrained.
    """

    def __init__(
        self,
        channels: int,
        image_size: int,
        num_classes: int,
        feature_dim: int = FEATURE_DIM,
        dataset: str = "",
        accuracy: float = math.nan,
    ):
        super().__init__()
        self.channels, self.image_size = channels, image_size
        self.num_classes, self.feature_dim = num_classes, feature_dim
        self.dataset, self.accuracy = dataset, accuracy
        blocks = []
        for c_in, c_out in ((channels, 16), (16, 32), (32, 64)):
            blocks += [nn.Conv2d(c_in, c_out, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2, ceil_mode=True)]
        self.body = nn.Sequential(
            *blocks, nn.AdaptiveAvgPool2d(2), nn.Flatten(), nn.Linear(64 * 4, feature_dim), nn.ReLU()
        )
        self.head = nn.Linear(feature_dim, num_classes)

    def features(self, x: Tensor) -> Tensor:
        """Penultimate-layer features, (B, C, H, W) images in [-1, 1] -> (B, feature_dim)."""
        expected = (self.channels, self.image_size, self.image_size)
        if x.ndim != 4 or tuple(x.shape[1:]) != expected:
            raise ValueError(
                f"The classifier for {self.dataset!r} takes images (B, {', '.join(map(str, expected))}), "
                f"got {tuple(x.shape)}"
            )
        return self.body(x)

    def forward(self, x: Tensor) -> Tensor:
        """Class logits, (B, C, H, W) -> (B, num_classes)."""
        return self.head(self.features(x))

    def extra_repr(self) -> str:
        return f"dataset={self.dataset!r}, image_size={self.image_size}, test accuracy={self.accuracy:.4f}"


def _default_device() -> torch.device:
    if torch.cuda.is_available():
        return torch.device("cuda")
    if torch.backends.mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


def _accuracy(model: FeatureClassifier, images: Tensor, labels: Tensor, batch_size: int = 500) -> float:
    """Share of ``images`` (N, C, H, W) that ``model`` labels correctly."""
    device = next(model.parameters()).device
    correct = 0
    with torch.inference_mode():
        for x, y in zip(images.split(batch_size), labels.split(batch_size), strict=True):
            correct += (model(x.to(device)).argmax(1).cpu() == y).sum().item()
    return correct / len(labels)


def _train_classifier(
    dataset: str, image_size: int, num_classes: int, train_steps: int, root: Path, device: torch.device, progress: bool
) -> FeatureClassifier:
    """Train a :class:`FeatureClassifier` on the train split, then measure its test accuracy.

    Adam with a cosine-decayed learning rate, cross-entropy, random batches of ``TRAIN_BATCH``
    drawn with seed ``SEED`` (the initialisation too), without touching the global RNG.
    """
    images, labels = load_dataset(dataset, "train", image_size=image_size, root=root).tensors()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEED)
        model = FeatureClassifier(images.shape[1], image_size, num_classes, dataset=dataset)
    model.to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=TRAIN_LR)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=train_steps)
    generator = torch.Generator().manual_seed(SEED)
    for _ in tqdm(range(train_steps), desc=f"feature classifier for {dataset}", disable=not progress, leave=False):
        index = torch.randint(len(labels), (TRAIN_BATCH,), generator=generator)
        loss = F.cross_entropy(model(images[index].to(device)), labels[index].to(device))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        schedule.step()
    model.eval()
    test_images, test_labels = load_dataset(dataset, "test", image_size=image_size, root=root).tensors()
    model.accuracy = _accuracy(model, test_images, test_labels)
    return model


def _load_cached(path: Path, expected: dict, device: torch.device) -> FeatureClassifier | None:
    """The classifier cached at ``path`` if it is readable and matches ``expected``; else warn and return None."""
    try:
        saved = torch.load(path, map_location="cpu", weights_only=True)
        mismatched = {k: (saved[k], v) for k, v in expected.items() if saved[k] != v}
        if not mismatched:
            model = FeatureClassifier(
                expected["channels"],
                expected["image_size"],
                expected["num_classes"],
                expected["feature_dim"],
                dataset=expected["dataset"],
                accuracy=float(saved["accuracy"]),
            )
            model.load_state_dict(saved["state_dict"])
            return model.to(device).eval()
    except Exception as err:  # any unreadable file (truncated, not a checkpoint, wrong tensors) is retrained
        warnings.warn(
            f"Feature-classifier cache {path} is corrupt ({type(err).__name__}: {err}); retraining it.", stacklevel=3
        )
        return None
    details = ", ".join(f"{k}: cached {old!r}, wanted {new!r}" for k, (old, new) in mismatched.items())
    warnings.warn(
        f"Feature-classifier cache {path} does not match this request ({details}); retraining it.", stacklevel=3
    )
    return None


def get_feature_classifier(
    dataset: str,
    image_size: int | None = None,
    device: torch.device | str | None = None,
    train_steps: int = TRAIN_STEPS,
    root: str | Path | None = None,
    progress: bool = True,
) -> FeatureClassifier:
    """The feature classifier of a dataset: loaded from the cache, or trained and cached.

    The cache file is ``<root>/classifiers/<dataset>-<image_size>.pt`` (``root`` defaults to
    :func:`~scalelong_edu.data.data_root`) and holds the weights, the test accuracy and what
    identifies the run (dataset, image size, architecture, ``train_steps``, seed, package
    version). It is written atomically and read with ``torch.load(weights_only=True)``; a
    corrupt file, or one made for other settings, is retrained with a warning.

    At the default budget, ``mnist5k`` trains in under a minute on one CPU core and reaches
    about 97% test accuracy (``.accuracy``); ``digits8x8`` takes about 15 s for 98%.

    Args:
        dataset: a labelled dataset name of :func:`~scalelong_edu.data.list_datasets`.
        image_size: image side; ``None`` uses the dataset's default.
        device: where the classifier runs; ``None`` picks cuda, then mps, then cpu.
        train_steps: number of training batches, if it must be trained.
        root: data folder, for the dataset (online ones) and the cache.
        progress: show a progress bar while training.

    Returns:
        A :class:`FeatureClassifier` in eval mode on ``device``.

    Raises:
        ValueError: unknown or unlabelled dataset, ``image_size`` or ``train_steps`` not a positive int.
    """
    info = dataset_info(dataset)
    if info.num_classes < 2:
        raise ValueError(
            f"Dataset {dataset!r} has no class labels, so no feature classifier can be trained on it; "
            "use inception_fid for it instead."
        )
    for name, value in (("image_size", image_size), ("train_steps", train_steps)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    image_size = image_size or info.image_size
    device = torch.device(device) if device is not None else _default_device()
    root = Path(root) if root is not None else data_root()
    path = root / "classifiers" / f"{dataset}-{image_size}.pt"
    expected = {
        "dataset": dataset,
        "image_size": image_size,
        "channels": info.channels,
        "num_classes": info.num_classes,
        "feature_dim": FEATURE_DIM,
        "train_steps": train_steps,
        "seed": SEED,
        "version": __version__,
    }
    if path.exists():
        model = _load_cached(path, expected, device)
        if model is not None:
            return model
    check_writable(path, "the feature classifier")  # before training it, not after
    model = _train_classifier(dataset, image_size, info.num_classes, train_steps, root, device, progress)
    state_dict = {k: v.cpu() for k, v in model.state_dict().items()}
    record = {**expected, "state_dict": state_dict, "accuracy": model.accuracy}
    atomic_write(path, lambda tmp: torch.save(record, tmp))
    return model


# -----------------------------------------------------------------------------
# Frechet Classifier Distance


def _check_images(images: Tensor, name: str) -> None:
    """Raise an error that says what to do unless ``images`` are (N >= 2, C, H, W) floats in [-1, 1].

    Values in [-1.1, 1.1] pass (unclamped samples overshoot a little); all values >= 0 give a
    warning, as that is what images left in [0, 1] look like.
    """
    if not isinstance(images, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of images (N, C, H, W), got {type(images).__name__}")
    if images.ndim != 4:
        raise ValueError(f"{name} must be images (N, C, H, W), got shape {tuple(images.shape)}")
    if not images.is_floating_point():
        raise ValueError(
            f"{name} must be floats in [-1, 1], got {images.dtype}; convert uint8 images with x / 127.5 - 1"
        )
    if len(images) < 2:
        raise ValueError(f"{name} must hold at least 2 images to estimate a covariance, got {len(images)}")
    if not torch.isfinite(images).all():
        raise ValueError(f"{name} contains NaN or infinite values")
    low, high = images.min().item(), images.max().item()
    if low < -1 - RANGE_TOLERANCE or high > 1 + RANGE_TOLERANCE:
        raise ValueError(
            f"{name} must be scaled to [-1, 1], but its values span [{low:.3g}, {high:.3g}]; "
            "map [0, 1] images with 2 x - 1 and [0, 255] ones with x / 127.5 - 1, and clamp generated samples"
        )
    if low >= 0:
        warnings.warn(
            f"{name} has no negative values; images in [0, 1] must be mapped to [-1, 1] with 2 x - 1.", stacklevel=3
        )


def _check_shape(images: Tensor, name: str, shape: tuple[int, ...], hint: str) -> None:
    if tuple(images.shape[1:]) != shape:
        raise ValueError(f"{name} must have shape (N, {', '.join(map(str, shape))}), got {tuple(images.shape)}; {hint}")


def _gaussian_fit(features: Tensor) -> tuple[np.ndarray, np.ndarray]:
    """Mean (F,) and unbiased covariance (F, F), in float64, of features (N, F)."""
    x = features.double().cpu().numpy()
    return x.mean(axis=0), np.cov(x, rowvar=False)


def _classifier_features(classifier: FeatureClassifier, images: Tensor, batch_size: int) -> Tensor:
    """Features (N, F) of images (N, C, H, W), computed in batches on the classifier's device."""
    device = next(classifier.parameters()).device
    with torch.inference_mode():
        return torch.cat([classifier.features(batch.to(device)).cpu() for batch in images.split(batch_size)])


def classifier_confidence(images: Tensor, classifier: FeatureClassifier, batch_size: int = 500) -> Tensor:
    """The classifier's probability for its top class, per image: (N, C, H, W) in [-1, 1] -> (N,).

    A plain, per-image measure of "is this a recognisable digit": near 1 when the dataset's
    classifier (:func:`get_feature_classifier`) is sure which class an image shows, near
    ``1 / num_classes`` for noise. Compare samples with real held-out images, whose
    confidence is the ceiling for this classifier.
    """
    _check_images(images, "images")
    device = next(classifier.parameters()).device
    with torch.inference_mode():
        return torch.cat([classifier(x.to(device)).softmax(1).amax(1).cpu() for x in images.split(batch_size)])


def fcd(
    samples: Tensor,
    reference: Tensor | str,
    classifier: FeatureClassifier | None = None,
    batch_size: int = 500,
) -> float:
    """Frechet Classifier Distance between ``samples`` and ``reference`` images.

    Both sets go through the classifier's feature layer ``phi`` (:meth:`FeatureClassifier.features`);
    with ``(mu, S)`` the mean and covariance of each set's features,
    ``FCD = frechet_distance(mu_samples, S_samples, mu_reference, S_reference)``.
    Comparable only within one dataset, image size, classifier and sample count (see the module
    docstring). Below ``feature_dim`` (64) images a set's covariance is singular and the value
    is biased upwards: a warning says so.

    Args:
        samples: images (N, C, H, W) in [-1, 1], e.g. generated ones.
        reference: real images (M, C, H, W) in [-1, 1], or a dataset name, which means the
            test split of that dataset at the samples' image size.
        classifier: the feature network; ``None`` takes :func:`get_feature_classifier` of the
            reference dataset at the samples' image size (so it needs a dataset name).
        batch_size: images per forward pass.

    Returns:
        The FCD, a float >= 0.

    Raises:
        ValueError: images of the wrong shape, dtype or range, fewer than 2 images, or
            ``classifier=None`` with reference images instead of a dataset name.
    """
    _check_images(samples, "samples")
    if classifier is None:
        if not isinstance(reference, str):
            raise ValueError(
                "With reference images, pass the feature network too: "
                "fcd(samples, reference, classifier=get_feature_classifier(dataset_name))"
            )
        classifier = get_feature_classifier(reference, image_size=samples.shape[-1])
    if isinstance(reference, str):
        reference = load_dataset(reference, "test", image_size=classifier.image_size).tensors()[0]
    else:
        _check_images(reference, "reference")
    shape = (classifier.channels, classifier.image_size, classifier.image_size)
    hint = f"the classifier was trained on {classifier.dataset!r} at {classifier.image_size} px"
    for name, images in (("samples", samples), ("reference", reference)):
        _check_shape(images, name, shape, hint)
        if len(images) < classifier.feature_dim:
            warnings.warn(
                f"{name} holds {len(images)} images, fewer than the {classifier.feature_dim} feature dimensions: "
                "its covariance is singular and the FCD is biased upwards; use more images.",
                stacklevel=2,
            )
    stats = [_gaussian_fit(_classifier_features(classifier, x, batch_size)) for x in (samples, reference)]
    return frechet_distance(*stats[0], *stats[1])


# -----------------------------------------------------------------------------
# Inception FID (needs the optional torchmetrics and a one-time weight download)


@contextmanager
def _socket_timeout(seconds: float) -> Iterator[None]:
    """Set the process-wide default socket timeout for the block, then restore it."""
    previous = socket.getdefaulttimeout()
    socket.setdefaulttimeout(seconds)
    try:
        yield
    finally:
        socket.setdefaulttimeout(previous)


def _to_rgb_uint8(images: Tensor) -> Tensor:
    """[-1, 1] floats (N, C, H, W) -> uint8 (N, 3, H, W) in 0..255, grey channels repeated, as Inception takes."""
    images = ((images.clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8)
    return images.expand(-1, 3, -1, -1) if images.shape[1] == 1 else images


def inception_fid(
    samples: Tensor,
    reference: Tensor | str,
    batch_size: int = 64,
    device: torch.device | str | None = None,
) -> float:
    """Frechet Inception Distance (FID) through ``torchmetrics``: the metric of published tables.

    Features are the 2048-d pool layer of the Inception-v3 used by the reference FID code,
    computed on images quantised to uint8, grey ones repeated to 3 channels and resized by
    the network to 299 px; then ``frechet_distance`` of the two feature Gaussians. A CPU
    manages only a few images a second; use a GPU. Published FIDs use 50,000 samples; fewer
    give larger values.

    Needs ``pip install "scalelong-edu[fid]"`` (torchmetrics, torch-fidelity) and, once, the
    Inception weights (about 100 MB, downloaded into ``torch.hub.get_dir()/checkpoints``).

    Args:
        samples: images (N, C, H, W) in [-1, 1], C = 1 or 3.
        reference: real images of the same shape, or a dataset name (its test split at the
            samples' image size).
        batch_size: images per forward pass.
        device: where Inception runs; ``None`` picks cuda if available, else cpu.

    Returns:
        The FID, a float >= 0.

    Raises:
        ValueError: bad images (see :func:`fcd`).
        RuntimeError: torchmetrics is not installed, or the weights could not be downloaded
            (no internet): the message points to :func:`fcd`, which works offline.
    """
    _check_images(samples, "samples")
    if samples.shape[1] not in (1, 3):
        raise ValueError(f"Inception takes grey or RGB images, but samples have {samples.shape[1]} channels")
    if isinstance(reference, str):
        reference = load_dataset(reference, "test", image_size=samples.shape[-1]).tensors()[0]
    else:
        _check_images(reference, "reference")
    _check_shape(reference, "reference", tuple(samples.shape[1:]), "it must match the samples")

    offline = "Use fcd(samples, dataset_name) instead: the Frechet Classifier Distance works offline."
    try:
        from torchmetrics.image.fid import FrechetInceptionDistance

        with _socket_timeout(DOWNLOAD_TIMEOUT_S):
            metric = FrechetInceptionDistance(feature=2048, normalize=False)
    except ImportError as err:  # torchmetrics, or the torch-fidelity it builds Inception from, is missing
        raise RuntimeError(
            f'Inception FID needs torchmetrics and torch-fidelity: pip install "scalelong-edu[fid]" ({err}). {offline}'
        ) from err
    except Exception as err:  # a failed download surfaces as URLError, timeout, HTTP or torch.load errors
        raise RuntimeError(
            f"Could not load the Inception-v3 weights for FID (no internet? {type(err).__name__}: {err}). "
            f"Connect once to download them, or copy the weights file into {torch.hub.get_dir()}/checkpoints. "
            f"{offline}"
        ) from err
    metric = metric.to(device if device is not None else "cuda" if torch.cuda.is_available() else "cpu")
    with torch.no_grad():
        for real, images in ((False, samples), (True, reference)):
            for batch in images.split(batch_size):
                metric.update(_to_rgb_uint8(batch).to(metric.device), real=real)
        return float(metric.compute())
