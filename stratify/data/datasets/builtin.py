"""Datasets that need no files: scikit-learn's bundled ``digits`` and generated ``synthetic``
clusters."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from stratify.data.datasets.base import Dataset, dataset_loader, fixed_split, make_dataset
from stratify.options import DatasetOptions, dataset_option
from stratify.validation import check_fits_in_memory


@dataset_loader("digits")
def load_digits(data_dir: str | None, device, seed: int) -> Dataset:
    """scikit-learn's bundled 8x8 handwritten digits (1,797 images): the embedded default."""
    from sklearn.datasets import load_digits as sk_load_digits

    bunch = sk_load_digits()
    images = (bunch.images.astype(np.float32) / 16.0 - 0.5) / 0.5
    images = images[:, None, :, :]
    train, test = fixed_split(len(images), 360, seed=1797)
    return make_dataset(
        "digits",
        images[train],
        bunch.target[train],
        images[test],
        bunch.target[test],
        10,
        device,
    )


@dataclass
class SyntheticOptions(DatasetOptions):
    n_train: int = dataset_option(2000, "Training samples.", minimum=1)
    n_test: int = dataset_option(500, "Test samples.", minimum=1)
    num_features: int = dataset_option(32, "Dimensions of each sample.", minimum=1)
    num_classes: int = dataset_option(10, "Number of classes (Gaussian clusters).", minimum=1)


@dataset_loader("synthetic", SyntheticOptions, seeded=True)
def load_synthetic(
    data_dir: str | None,
    device,
    seed: int,
    *,
    n_train: int,
    n_test: int,
    num_features: int,
    num_classes: int,
) -> Dataset:
    """Gaussian class clusters in ``num_features`` dimensions, any size, seeded."""
    # float64 noise beside its float32 copy for the larger draw, float32 for the other
    largest, other = max(n_train, n_test), min(n_train, n_test)
    check_fits_in_memory(
        (12 * largest + 4 * other + 8 * num_classes) * num_features,
        f"synthetic: {n_train:,} + {n_test:,} samples of {num_features:,} features",
        "use smaller -o n_train, n_test or num_features",
    )
    rng = np.random.default_rng(seed)
    centers = rng.normal(0.0, 1.0, size=(num_classes, num_features)).astype(np.float32)

    def draw(n: int):
        labels = rng.integers(0, num_classes, size=n)
        points = centers[labels] + rng.normal(0.0, 1.0, size=(n, num_features)).astype(np.float32)
        return points, labels

    x_train, y_train = draw(n_train)
    x_test, y_test = draw(n_test)
    return make_dataset("synthetic", x_train, y_train, x_test, y_test, num_classes, device)
