"""MNIST variants for feature skew and spurious correlation: ``rotated-mnist`` (the domain
is the rotation angle) and ``colored-mnist`` (the attribute is the colour)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from stratify.data.datasets.base import Dataset, dataset_loader, fixed_split, make_dataset
from stratify.data.datasets.mnist import (
    MNIST_FAMILY,
    MNIST_MEAN,
    MNIST_STD,
    full_mnist_arrays,
    mnist_10k_arrays,
)
from stratify.errors import DatasetError
from stratify.options import DatasetOptions, dataset_option

MNIST_BASES = ("mnist-10k", "mnist")


def _mnist_base(name: str, base: str, data_dir: str | None):
    """uint8 train/test images and labels of the base dataset of a derived MNIST variant."""
    if base == "mnist-10k":
        images, labels = mnist_10k_arrays(data_dir)
        train, test = fixed_split(len(images), 2000, seed=10000)  # the same split as mnist-10k
        return images[train], labels[train], images[test], labels[test]
    if base == "mnist":
        return full_mnist_arrays("mnist", data_dir, "mnist", "MNIST")
    raise DatasetError(f"{name}: unknown base {base!r}; use base=mnist-10k or base=mnist")


ROTATION_ANGLES = (0, 15, 30, 45, 60, 75)


def rotate_images(images: np.ndarray, angles: np.ndarray) -> np.ndarray:
    """Rotate uint8 ``(N, H, W)`` images counter-clockwise by per-image ``angles`` (degrees).

    Returns float32 images in ``[0, 1]``; corners uncovered by the rotation are black,
    like the MNIST background.
    """
    import torchvision.transforms.functional as vision

    pixels = torch.from_numpy(np.array(images, dtype=np.float32)).unsqueeze(1) / 255.0
    rotated = torch.empty_like(pixels)
    for angle in np.unique(angles):
        chosen = torch.as_tensor(np.flatnonzero(angles == angle))
        rotated[chosen] = vision.rotate(
            pixels[chosen], float(angle), interpolation=vision.InterpolationMode.BILINEAR, fill=0.0
        )
    return rotated.squeeze(1).numpy()


@dataclass
class MNISTVariantOptions(DatasetOptions):
    """The option every MNIST variant takes: which MNIST it is made from."""

    base: str = dataset_option(
        "mnist-10k",
        "MNIST set the variant is made from: mnist-10k (its fixed split) or mnist.",
        choices=MNIST_BASES,
    )


@dataclass
class RotatedMNISTOptions(MNISTVariantOptions):
    angles: tuple[float, ...] = dataset_option(
        ROTATION_ANGLES, "Rotation angles in degrees, one per domain."
    )


@dataset_loader("rotated-mnist", RotatedMNISTOptions, seeded=True, family=MNIST_FAMILY)
def load_rotated_mnist(
    data_dir: str | None, device, seed: int, *, base: str, angles: tuple[float, ...]
) -> Dataset:
    """MNIST with each image rotated by one of ``angles``; the domain is the angle's index.

    Parameters
    ----------
    base : str
        ``"mnist-10k"`` (default, its fixed 8,000/2,000 split) or ``"mnist"``.
    angles : tuple of float
        Rotation angles in degrees; every train and test image gets one, uniformly at
        random with ``seed``.
    """
    angles = tuple(float(a) for a in angles)
    train_images, y_train, test_images, y_test = _mnist_base("rotated-mnist", base, data_dir)
    rng = np.random.default_rng(seed)
    d_train = rng.integers(0, len(angles), size=len(train_images))
    d_test = rng.integers(0, len(angles), size=len(test_images))
    table = np.asarray(angles)

    def prepare(images: np.ndarray, domain_ids: np.ndarray) -> np.ndarray:
        rotated = rotate_images(images, table[domain_ids])
        return ((rotated - MNIST_MEAN) / MNIST_STD)[:, None, :, :]

    return make_dataset(
        "rotated-mnist",
        prepare(train_images, d_train),
        y_train,
        prepare(test_images, d_test),
        y_test,
        10,
        device,
        d_train,
        d_test,
        base=base,
        angles=list(angles),
        domain_names=[f"{a:g} deg" for a in angles],
        num_domains=len(angles),
    )


COLOURS = ("red", "green")


def colour_for_labels(
    labels: np.ndarray, correlation: float, rng: np.random.Generator
) -> np.ndarray:
    """Colour ids (0 red, 1 green) that follow the label with probability ``correlation``.

    With probability ``correlation`` a sample's colour is its label's colour (red for
    digits 0-4, green for 5-9, the CMNIST binarisation); otherwise it is a fair coin.
    So ``P(colour = label colour) = (1 + correlation) / 2``: 0 gives no dependency,
    1 makes the colour a function of the label.
    """
    label_colour = (np.asarray(labels) >= 5).astype(np.int64)
    follows = rng.random(len(label_colour)) < correlation
    random_colour = rng.integers(0, 2, size=len(label_colour))
    return np.where(follows, label_colour, random_colour)


@dataclass
class ColoredMNISTOptions(MNISTVariantOptions):
    correlation: float = dataset_option(
        0.9,
        "How strongly colour follows the label in the training split.",
        minimum=0.0,
        maximum=1.0,
    )
    test_correlation: float = dataset_option(
        0.0,
        "How strongly colour follows the label in the test split.",
        minimum=0.0,
        maximum=1.0,
    )
    binary_labels: bool = dataset_option(
        False, "Labels become digit >= 5 (2 classes, as in CMNIST)."
    )


@dataset_loader("colored-mnist", ColoredMNISTOptions, seeded=True, family=MNIST_FAMILY)
def load_colored_mnist(
    data_dir: str | None,
    device,
    seed: int,
    *,
    base: str,
    correlation: float,
    test_correlation: float,
    binary_labels: bool,
) -> Dataset:
    """MNIST digits drawn in red or green (3 channels); the attribute is the colour.

    Parameters
    ----------
    base : str
        ``"mnist-10k"`` (default) or ``"mnist"``.
    correlation : float
        In ``[0, 1]``: how strongly colour follows the label in the training split
        (see :func:`colour_for_labels`).
    test_correlation : float
        The same for the test split; 0 (default) removes the spurious cue at test time.
    binary_labels : bool
        If true, labels become ``digit >= 5`` (2 classes, as in the CMNIST benchmark);
        by default the 10 digit classes are kept.
    """
    train_images, y_train, test_images, y_test = _mnist_base("colored-mnist", base, data_dir)
    rng = np.random.default_rng(seed)
    c_train = colour_for_labels(y_train, float(correlation), rng)
    c_test = colour_for_labels(y_test, float(test_correlation), rng)

    def paint(images: np.ndarray, colours: np.ndarray) -> np.ndarray:
        grey = images.astype(np.float32) / 255.0
        rgb = np.zeros((len(images), 3, *images.shape[1:]), dtype=np.float32)
        rgb[np.arange(len(images)), colours] = grey  # channel 0 red, channel 1 green
        return (rgb - MNIST_MEAN) / MNIST_STD

    if binary_labels:
        y_train, y_test = (y_train >= 5).astype(np.int64), (y_test >= 5).astype(np.int64)
    return make_dataset(
        "colored-mnist",
        paint(train_images, c_train),
        y_train,
        paint(test_images, c_test),
        y_test,
        2 if binary_labels else 10,
        device,
        c_train,
        c_test,
        base=base,
        correlation=float(correlation),
        test_correlation=float(test_correlation),
        domain_names=list(COLOURS),
        num_domains=2,
    )
