"""CIFAR-10 / CIFAR-100 through torchvision (python pickles, md5-checked by torchvision)."""

from __future__ import annotations

import pickle

import numpy as np

from stratify.data.datasets.base import (
    Dataset,
    dataset_loader,
    make_dataset,
    normalise_images,
    require_data_dir,
    require_regular_files,
)
from stratify.errors import DatasetError

CIFAR10_MEAN, CIFAR10_STD = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)
CIFAR100_MEAN, CIFAR100_STD = (0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)


def _load_cifar(
    name: str,
    data_dir: str | None,
    device,
    torchvision_class: str,
    folder: str,
    files: str,
    num_classes: int,
    mean,
    std,
) -> Dataset:
    expected = f"{folder}/ ({files}), the extracted python version of the archive"
    directory = require_data_dir(name, data_dir, expected)
    require_regular_files(name, directory / folder)
    import torchvision.datasets

    reader = getattr(torchvision.datasets, torchvision_class)
    try:
        train = reader(str(directory), train=True, download=False)
        test = reader(str(directory), train=False, download=False)
    except RuntimeError:
        raise DatasetError(
            f"{name}: missing or corrupt files in {directory / folder}; expected {files} "
            "(extract the official python-version archive into --data-dir, or run "
            f"stratify data download {name} --dir {directory})"
        ) from None
    except (OSError, EOFError, ValueError, KeyError, pickle.UnpicklingError) as error:
        raise DatasetError(
            f"{name}: cannot read {directory / folder} ({error}); replace it with the official "
            "python-version archive, extracted"
        ) from None
    return make_dataset(
        name,
        normalise_images(np.asarray(train.data), mean, std),
        np.asarray(train.targets),
        normalise_images(np.asarray(test.data), mean, std),
        np.asarray(test.targets),
        num_classes,
        device,
        class_names=list(train.classes),
    )


@dataset_loader("cifar10")
def load_cifar10(data_dir: str | None, device, seed: int) -> Dataset:
    """CIFAR-10 (50,000 / 10,000 colour 32x32 images) from ``<data-dir>/cifar-10-batches-py/``."""
    return _load_cifar(
        "cifar10",
        data_dir,
        device,
        "CIFAR10",
        "cifar-10-batches-py",
        "data_batch_1..data_batch_5, test_batch, batches.meta",
        10,
        CIFAR10_MEAN,
        CIFAR10_STD,
    )


@dataset_loader("cifar100")
def load_cifar100(data_dir: str | None, device, seed: int) -> Dataset:
    """CIFAR-100 (fine labels) from ``<data-dir>/cifar-100-python/``."""
    return _load_cifar(
        "cifar100",
        data_dir,
        device,
        "CIFAR100",
        "cifar-100-python",
        "train, test, meta",
        100,
        CIFAR100_MEAN,
        CIFAR100_STD,
    )
