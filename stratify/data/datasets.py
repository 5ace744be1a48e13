"""Datasets, loaded once into tensors on the chosen device.

Every loader returns a :class:`Dataset`; ``load_dataset(name, ...)`` dispatches on the
registry ``DATASETS``. Nothing is downloaded: loaders read local files and raise
:class:`~stratify.errors.DatasetError` naming the files and layout they expect.
"""

from __future__ import annotations

import gzip
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from stratify.errors import DatasetError


@dataclass
class Dataset:
    """A train/test split held as tensors on one device.

    Parameters
    ----------
    name : str
        Registry name, e.g. ``"mnist-10k"``.
    x_train, x_test : torch.Tensor
        Float32 inputs, ``(N, C, H, W)`` for images or ``(N, F)`` for tabular data.
    y_train, y_test : torch.Tensor
        Int64 class labels in ``[0, num_classes)``.
    num_classes : int
        Number of classes.
    domains_train, domains_test : numpy.ndarray or None
        Per-sample domain or attribute id (int64), where the dataset has one.
    """

    name: str
    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    num_classes: int
    domains_train: np.ndarray | None = None
    domains_test: np.ndarray | None = None
    meta: dict = field(default_factory=dict)

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(self.x_train.shape[1:])

    @property
    def train_labels(self) -> np.ndarray:
        """Training labels as a numpy array (for partitioning and planning)."""
        return self.y_train.cpu().numpy()

    def to(self, device: torch.device | str) -> Dataset:
        for attribute in ("x_train", "y_train", "x_test", "y_test"):
            setattr(self, attribute, getattr(self, attribute).to(device))
        return self


def _tensors(x: np.ndarray, y: np.ndarray, device: torch.device | str):
    return (
        torch.as_tensor(np.ascontiguousarray(x), dtype=torch.float32, device=device),
        torch.as_tensor(np.asarray(y), dtype=torch.int64, device=device),
    )


def _split(n: int, n_test: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    order = np.random.default_rng(seed).permutation(n)
    return np.sort(order[n_test:]), np.sort(order[:n_test])


def load_digits(data_dir: str | None = None, device="cpu", seed: int = 0, **_) -> Dataset:
    """scikit-learn's bundled 8x8 handwritten digits (1,797 images): the embedded default."""
    from sklearn.datasets import load_digits as sk_load_digits

    bunch = sk_load_digits()
    images = (bunch.images.astype(np.float32) / 16.0 - 0.5) / 0.5
    images = images[:, None, :, :]
    train, test = _split(len(images), 360, seed=1797)
    x_train, y_train = _tensors(images[train], bunch.target[train], device)
    x_test, y_test = _tensors(images[test], bunch.target[test], device)
    return Dataset("digits", x_train, y_train, x_test, y_test, 10)


def load_synthetic(
    data_dir: str | None = None,
    device="cpu",
    seed: int = 0,
    n_train: int = 2000,
    n_test: int = 500,
    num_features: int = 32,
    num_classes: int = 10,
    **_,
) -> Dataset:
    """Gaussian class clusters in ``num_features`` dimensions, any size, seeded."""
    rng = np.random.default_rng(seed)
    centers = rng.normal(0.0, 1.0, size=(num_classes, num_features)).astype(np.float32)

    def draw(n: int):
        labels = rng.integers(0, num_classes, size=n)
        points = centers[labels] + rng.normal(0.0, 1.0, size=(n, num_features)).astype(np.float32)
        return points, labels

    x_train, y_train = _tensors(*draw(n_train), device)
    x_test, y_test = _tensors(*draw(n_test), device)
    return Dataset("synthetic", x_train, y_train, x_test, y_test, num_classes)


MNIST_MEAN, MNIST_STD = 0.1307, 0.3081


def read_idx(path: Path) -> np.ndarray:
    """Read a (gzipped) IDX file as used by MNIST; raises DatasetError if unreadable."""
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as handle:
            raw = handle.read()
        zero, dtype_code, ndim = struct.unpack(">HBB", raw[:4])
        if zero != 0 or dtype_code != 0x08:
            raise ValueError("bad magic number")
        shape = struct.unpack(">" + "I" * ndim, raw[4 : 4 + 4 * ndim])
        data = np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim)
        if data.size != int(np.prod(shape)):
            raise ValueError(f"expected {int(np.prod(shape))} values, found {data.size}")
        return data.reshape(shape)
    except (OSError, EOFError, ValueError, struct.error) as error:
        raise DatasetError(
            f"cannot read {path}: {error}; replace it with an intact copy of the MNIST IDX file"
        ) from None


def _find(directory: Path, stem: str) -> Path | None:
    for candidate in (directory / f"{stem}.gz", directory / stem):
        if candidate.exists():
            return candidate
    return None


def mnist_10k_arrays(data_dir: str | None) -> tuple[np.ndarray, np.ndarray]:
    """The 10,000 official MNIST test images (uint8, 28x28) and labels from ``<data-dir>/mnist``."""
    if data_dir is None:
        raise DatasetError(
            "mnist-10k needs --data-dir DIR holding mnist/t10k-images-idx3-ubyte.gz "
            "and mnist/t10k-labels-idx1-ubyte.gz"
        )
    directory = Path(data_dir) / "mnist"
    images_path = _find(directory, "t10k-images-idx3-ubyte")
    labels_path = _find(directory, "t10k-labels-idx1-ubyte")
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
            "put the official MNIST test files there (gzipped or not)"
        )
    images, labels = read_idx(images_path), read_idx(labels_path)
    if images.shape != (10000, 28, 28) or labels.shape != (10000,):
        raise DatasetError(
            f"mnist-10k: {directory} holds {images.shape} images and {labels.shape} labels, "
            "expected (10000, 28, 28) and (10000,); use the official t10k files"
        )
    return images, labels


def normalise_mnist(images: np.ndarray) -> np.ndarray:
    return ((images.astype(np.float32) / 255.0 - MNIST_MEAN) / MNIST_STD)[:, None, :, :]


def load_mnist_10k(data_dir: str | None = None, device="cpu", seed: int = 0, **_) -> Dataset:
    """The official MNIST test set split deterministically into 8,000 train / 2,000 test."""
    images, labels = mnist_10k_arrays(data_dir)
    train, test = _split(len(images), 2000, seed=10000)
    x = normalise_mnist(images)
    x_train, y_train = _tensors(x[train], labels[train], device)
    x_test, y_test = _tensors(x[test], labels[test], device)
    return Dataset("mnist-10k", x_train, y_train, x_test, y_test, 10)


DATASETS: dict[str, Callable[..., Dataset]] = {
    "digits": load_digits,
    "synthetic": load_synthetic,
    "mnist-10k": load_mnist_10k,
}


def load_dataset(
    name: str, data_dir: str | None = None, device: torch.device | str = "cpu", seed: int = 0,
    **options,
) -> Dataset:
    """Load dataset ``name`` onto ``device``.

    Parameters
    ----------
    name : str
        One of ``DATASETS``.
    data_dir : str, optional
        Folder holding the dataset's files (not needed for ``digits`` and ``synthetic``).
    device : torch.device or str
        Where the tensors live.
    seed : int
        Seed for generated data (``synthetic``); fixed splits do not depend on it.
    **options
        Loader-specific options (e.g. ``n_train`` for ``synthetic``).
    """
    if name not in DATASETS:
        raise DatasetError(f"unknown dataset {name!r}; choose one of {', '.join(sorted(DATASETS))}")
    return DATASETS[name](data_dir=data_dir, device=device, seed=seed, **options)
