"""The MNIST family from IDX files: ``mnist-10k`` (the official test set, split 8,000/2,000),
full ``mnist`` and ``fashion-mnist`` (60,000 / 10,000 images)."""

from __future__ import annotations

import gzip
import struct
import zlib
from pathlib import Path

import numpy as np

from stratify.data.datasets.base import (
    Dataset,
    check_labels,
    dataset_loader,
    fixed_split,
    make_dataset,
    normalise_images,
    read_data_file,
    require_data_dir,
    require_regular_files,
)
from stratify.errors import DatasetError

MNIST_MEAN, MNIST_STD = 0.1307, 0.3081
FASHION_MEAN, FASHION_STD = 0.2860, 0.3530
#: the family of the 28×28 handwritten-digit datasets (their default learning rates)
MNIST_FAMILY = "mnist"

_IDX_STEMS = (
    "train-images-idx3-ubyte",
    "train-labels-idx1-ubyte",
    "t10k-images-idx3-ubyte",
    "t10k-labels-idx1-ubyte",
)
_IDX_FIX = "replace it with an intact copy of the official IDX file"


def read_idx(path: Path) -> np.ndarray:
    """Read a (gzipped) IDX file as used by MNIST; raises DatasetError if unreadable."""
    raw = read_data_file("mnist", path)  # a FIFO there is refused, not waited on
    try:
        if path.suffix == ".gz":
            raw = gzip.decompress(raw)
        zero, dtype_code, ndim = struct.unpack(">HBB", raw[:4])
        if zero != 0 or dtype_code != 0x08:
            raise ValueError("bad magic number")
        shape = struct.unpack(">" + "I" * ndim, raw[4 : 4 + 4 * ndim])
        data = np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim)
        if data.size != int(np.prod(shape)):
            raise ValueError(f"expected {int(np.prod(shape))} values, found {data.size}")
        return data.reshape(shape)
    # a damaged deflate stream raises zlib.error, which is no OSError
    except (OSError, EOFError, ValueError, struct.error, zlib.error) as error:
        raise DatasetError(
            f"cannot read {path}: {error}; replace it with an intact copy of the MNIST IDX file"
        ) from None


def find_idx(directory: Path, stem: str) -> Path | None:
    """``<directory>/<stem>.gz`` or ``<directory>/<stem>``, whichever exists first."""
    for candidate in (directory / f"{stem}.gz", directory / stem):
        if candidate.exists():
            return candidate
    return None


def mnist_10k_arrays(data_dir: str | None) -> tuple[np.ndarray, np.ndarray]:
    """The 10,000 official MNIST test images (uint8, 28x28) and labels from ``<data-dir>/mnist``."""
    if data_dir is None:
        raise DatasetError(
            "mnist-10k needs --data-dir DIR holding mnist/t10k-images-idx3-ubyte.gz "
            "and mnist/t10k-labels-idx1-ubyte.gz (stratify data download mnist-10k --dir DIR)"
        )
    directory = Path(data_dir) / "mnist"
    images_path = find_idx(directory, "t10k-images-idx3-ubyte")
    labels_path = find_idx(directory, "t10k-labels-idx1-ubyte")
    missing = [
        name
        for name, path in (
            ("t10k-images-idx3-ubyte.gz", images_path),
            ("t10k-labels-idx1-ubyte.gz", labels_path),
        )
        if path is None
    ]
    if missing:
        raise DatasetError(
            f"mnist-10k: missing {', '.join(missing)} in {directory}; "
            "put the official MNIST test files there (gzipped or not): "
            f"stratify data download mnist-10k --dir {data_dir}"
        )
    assert images_path is not None and labels_path is not None  # else listed in missing
    images, labels = read_idx(images_path), read_idx(labels_path)
    if images.shape != (10000, 28, 28) or labels.shape != (10000,):
        raise DatasetError(
            f"mnist-10k: {directory} holds {images.shape} images and {labels.shape} labels, "
            "expected (10000, 28, 28) and (10000,); use the official t10k files"
        )
    check_labels("mnist-10k", labels, 10, str(labels_path), _IDX_FIX)
    return images, labels


def normalise_mnist(images: np.ndarray) -> np.ndarray:
    return ((images.astype(np.float32) / 255.0 - MNIST_MEAN) / MNIST_STD)[:, None, :, :]


@dataset_loader("mnist-10k", family=MNIST_FAMILY)
def load_mnist_10k(data_dir: str | None, device, seed: int) -> Dataset:
    """The official MNIST test set split deterministically into 8,000 train / 2,000 test."""
    images, labels = mnist_10k_arrays(data_dir)
    train, test = fixed_split(len(images), 2000, seed=10000)
    x = normalise_mnist(images)
    return make_dataset("mnist-10k", x[train], labels[train], x[test], labels[test], 10, device)


def full_mnist_arrays(name: str, data_dir: str | None, folder: str, torchvision_class: str):
    """Train/test uint8 images and labels of MNIST or Fashion-MNIST.

    Reads the four IDX files from ``<data-dir>/<folder>/`` (gzipped or not) when all are
    there, otherwise the torchvision layout ``<data-dir>/<torchvision_class>/raw/``.
    """
    expected = (
        f"{folder}/{{train,t10k}}-{{images-idx3,labels-idx1}}-ubyte[.gz] "
        f"or torchvision's {torchvision_class}/raw/ layout"
    )
    directory = require_data_dir(name, data_dir, expected)
    found = [find_idx(directory / folder, stem) for stem in _IDX_STEMS]
    present = [path for path in found if path is not None]
    if len(present) == len(found):
        train_images, train_labels, test_images, test_labels = (read_idx(p) for p in present)
        label_sources = (str(found[1]), str(found[3]))
    else:
        import torchvision.datasets

        require_regular_files(name, directory / torchvision_class)
        reader = getattr(torchvision.datasets, torchvision_class)
        try:
            train = reader(str(directory), train=True, download=False)
            test = reader(str(directory), train=False, download=False)
        except RuntimeError:
            missing = [stem for stem, path in zip(_IDX_STEMS, found) if path is None]
            raise DatasetError(
                f"{name}: missing {', '.join(missing)} in {directory / folder} and no "
                f"torchvision layout {directory / torchvision_class / 'raw'}; put the four "
                f"official IDX files (gzipped or not) in {directory / folder}: "
                f"stratify data download {name} --dir {directory}"
            ) from None
        except (AssertionError, ValueError, TypeError, OSError) as error:
            raise DatasetError(
                f"{name}: cannot read {directory / torchvision_class / 'raw'} ({error}); "
                "replace the files with intact copies"
            ) from None
        train_images, train_labels = train.data.numpy(), train.targets.numpy()
        test_images, test_labels = test.data.numpy(), test.targets.numpy()
        raw = directory / torchvision_class / "raw"
        label_sources = (str(raw / _IDX_STEMS[1]), str(raw / _IDX_STEMS[3]))
    for images, labels in ((train_images, train_labels), (test_images, test_labels)):
        if images.ndim != 3 or images.shape[1:] != (28, 28) or len(images) != len(labels):
            raise DatasetError(
                f"{name}: found {images.shape} images with {labels.shape} labels in {directory}, "
                "expected (N, 28, 28) images and N labels; use the official IDX files"
            )
    check_labels(name, train_labels, 10, label_sources[0], _IDX_FIX)
    check_labels(name, test_labels, 10, label_sources[1], _IDX_FIX)
    return train_images, train_labels, test_images, test_labels


@dataset_loader("mnist", family=MNIST_FAMILY)
def load_mnist(data_dir: str | None, device, seed: int) -> Dataset:
    """Full MNIST (60,000 train / 10,000 test) from ``<data-dir>/mnist/`` or ``MNIST/raw/``."""
    train_images, train_labels, test_images, test_labels = full_mnist_arrays(
        "mnist", data_dir, "mnist", "MNIST"
    )
    return make_dataset(
        "mnist",
        normalise_mnist(train_images),
        train_labels,
        normalise_mnist(test_images),
        test_labels,
        10,
        device,
    )


@dataset_loader("fashion-mnist")
def load_fashion_mnist(data_dir: str | None, device, seed: int) -> Dataset:
    """Fashion-MNIST from ``<data-dir>/fashion-mnist/`` or torchvision's ``FashionMNIST/raw/``."""
    train_images, train_labels, test_images, test_labels = full_mnist_arrays(
        "fashion-mnist", data_dir, "fashion-mnist", "FashionMNIST"
    )

    def normalise(images: np.ndarray) -> np.ndarray:
        return normalise_images(images[..., None], FASHION_MEAN, FASHION_STD)

    return make_dataset(
        "fashion-mnist",
        normalise(train_images),
        train_labels,
        normalise(test_images),
        test_labels,
        10,
        device,
    )
