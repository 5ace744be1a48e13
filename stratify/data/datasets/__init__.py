"""Datasets, loaded once into tensors on the chosen device.

Every loader returns a :class:`Dataset`; ``load_dataset(name, ...)`` dispatches on the
registry ``DATASETS``. Nothing is downloaded: loaders read local files and raise
:class:`~stratify.errors.DatasetError` naming the files and layout they expect
(:mod:`stratify.data.sources` lists them and downloads those that can be fetched:
``stratify data list``, ``stratify data download``).

Names, the files each reads under ``--data-dir``, and its domains (if any):

- ``digits``: none (scikit-learn's bundled digits); ``synthetic``: none (generated).
- ``mnist-10k``: ``mnist/t10k-{images-idx3,labels-idx1}-ubyte[.gz]``.
- ``mnist`` / ``fashion-mnist``: the four IDX files in ``mnist/`` / ``fashion-mnist/``,
  or torchvision's ``MNIST/raw/`` / ``FashionMNIST/raw/``.
- ``cifar10`` / ``cifar100``: ``cifar-10-batches-py/`` / ``cifar-100-python/`` (fine labels).
- ``covtype``: ``covertype/`` (the cache of scikit-learn's ``fetch_covtype``), 7 classes.
- ``covtype-binary``: ``covtype/covtype.libsvm.binary[.scale][.bz2]`` (LIBSVM), 2 classes:
  the COVTYPE of NIID-Bench and of the Stratify paper.
- ``tiny-imagenet``: ``tiny-imagenet-200/{train,val}/...``.
- ``pacs``: ``pacs/<domain>/<class>/*.jpg|png``; domains = 4 styles.
- ``digits-dg``: ``digits-dg/<domain>/{train,val}/<class>/*.png``; domains = 4 sources.
- ``rotated-mnist`` / ``colored-mnist``: the files of ``mnist-10k`` (or ``base="mnist"``);
  domains = rotation angle / colour.

Images are normalised float32 ``(N, C, H, W)``; covtype is standardised ``(N, 54)``.
Fixed train/test splits never depend on ``seed``; the derived datasets draw their
angles and colours with it. Labels are checked to lie in ``[0, num_classes)``.

Each loader declares its options as a :class:`~stratify.options.DatasetOptions` dataclass
(:func:`dataset_options` lists them); an undeclared key, a value of the wrong type or out
of range is refused before any file is read.

Modules: :mod:`.base` (the :class:`Dataset`, options, shared helpers), :mod:`.builtin`
(digits, synthetic), :mod:`.mnist`, :mod:`.cifar`, :mod:`.tabular` (covtype),
:mod:`.folders` (tiny-imagenet, pacs, digits-dg) and :mod:`.derived` (rotated-mnist,
colored-mnist).
"""

from __future__ import annotations

import dataclasses

import torch

from stratify.data.datasets.base import Dataset, DatasetLoader, check_labels
from stratify.data.datasets.builtin import load_digits, load_synthetic
from stratify.data.datasets.cifar import (
    CIFAR10_MEAN,
    CIFAR10_STD,
    CIFAR100_MEAN,
    CIFAR100_STD,
    load_cifar10,
    load_cifar100,
)
from stratify.data.datasets.derived import (
    COLOURS,
    MNIST_BASES,
    ROTATION_ANGLES,
    colour_for_labels,
    load_colored_mnist,
    load_rotated_mnist,
    rotate_images,
)
from stratify.data.datasets.folders import (
    DIGITS_DG_DOMAINS,
    HALF,
    HALF_STD,
    IMAGE_SUFFIXES,
    IMAGENET_MEAN,
    IMAGENET_STD,
    PACS_DOMAINS,
    load_digits_dg,
    load_pacs,
    load_tiny_imagenet,
)
from stratify.data.datasets.mnist import (
    FASHION_MEAN,
    FASHION_STD,
    MNIST_MEAN,
    MNIST_STD,
    load_fashion_mnist,
    load_mnist,
    load_mnist_10k,
    mnist_10k_arrays,
    normalise_mnist,
    read_idx,
)
from stratify.data.datasets.tabular import load_covtype, load_covtype_binary
from stratify.errors import DatasetError

__all__ = [
    "CIFAR10_MEAN",
    "CIFAR10_STD",
    "CIFAR100_MEAN",
    "CIFAR100_STD",
    "COLOURS",
    "DATASETS",
    "DIGITS_DG_DOMAINS",
    "FASHION_MEAN",
    "FASHION_STD",
    "HALF",
    "HALF_STD",
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "IMAGE_SUFFIXES",
    "MNIST_BASES",
    "MNIST_MEAN",
    "MNIST_STD",
    "PACS_DOMAINS",
    "ROTATION_ANGLES",
    "Dataset",
    "DatasetLoader",
    "check_labels",
    "colour_for_labels",
    "dataset_options",
    "dataset_family",
    "dataset_uses_seed",
    "load_cifar10",
    "load_cifar100",
    "load_colored_mnist",
    "load_covtype",
    "load_covtype_binary",
    "load_dataset",
    "load_digits",
    "load_digits_dg",
    "load_fashion_mnist",
    "load_mnist",
    "load_mnist_10k",
    "load_pacs",
    "load_rotated_mnist",
    "load_synthetic",
    "load_tiny_imagenet",
    "mnist_10k_arrays",
    "normalise_mnist",
    "read_idx",
    "rotate_images",
]

DATASETS: dict[str, DatasetLoader] = {
    "digits": load_digits,
    "synthetic": load_synthetic,
    "mnist-10k": load_mnist_10k,
    "mnist": load_mnist,
    "fashion-mnist": load_fashion_mnist,
    "cifar10": load_cifar10,
    "cifar100": load_cifar100,
    "covtype": load_covtype,
    "covtype-binary": load_covtype_binary,
    "tiny-imagenet": load_tiny_imagenet,
    "pacs": load_pacs,
    "digits-dg": load_digits_dg,
    "rotated-mnist": load_rotated_mnist,
    "colored-mnist": load_colored_mnist,
}


def _loader(name: str) -> DatasetLoader:
    if name not in DATASETS:
        raise DatasetError(f"unknown dataset {name!r}; choose one of {', '.join(sorted(DATASETS))}")
    return DATASETS[name]


def dataset_options(name: str) -> dict[str, dataclasses.Field]:
    """The options dataset ``name`` declares, in declaration order (empty if none).

    Each is a field of the loader's :class:`~stratify.options.DatasetOptions` made with
    :func:`~stratify.options.dataset_option`: its ``default``, and in its ``metadata`` the
    ``help``, the ``choices`` and the ``check`` (a :class:`~stratify.validation.Typed`,
    whose ``describe()`` says what values are valid), e.g. for listing them in a CLI.

    Raises
    ------
    DatasetError
        Unknown name.
    """
    return dict(_loader(name).options)


def dataset_family(name: str) -> str:
    """The family whose default learning rates dataset ``name`` shares
    (:attr:`~stratify.data.datasets.base.DatasetLoader.family`); a name that is not
    registered (a caller's own dataset) is its own family.

    Parameters
    ----------
    name : str
        A dataset name.
    """
    return DATASETS[name].family if name in DATASETS else name


def dataset_uses_seed(name: str) -> bool:
    """Whether dataset ``name``'s data depends on the ``seed`` it is loaded with.

    Raises
    ------
    DatasetError
        Unknown name.
    """
    return _loader(name).seeded


def load_dataset(
    name: str,
    data_dir: str | None = None,
    device: torch.device | str = "cpu",
    seed: int = 0,
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
        Seed for generated data (``synthetic``) and for the angles/colours of
        ``rotated-mnist``/``colored-mnist``; fixed train/test splits do not depend on it.
    **options
        Loader-specific options, typed or as text (``"0.5"``, ``"true"``, ``"0,45"``):
        ``n_train``, ``n_test``, ``num_features``, ``num_classes`` (synthetic);
        ``image_size`` (tiny-imagenet, pacs, digits-dg); ``test_domain`` (pacs,
        digits-dg: leave that domain out for testing); ``base`` (``"mnist-10k"`` or
        ``"mnist"``), ``angles`` (rotated-mnist); ``base``, ``correlation``,
        ``test_correlation``, ``binary_labels`` (colored-mnist). See
        :func:`dataset_options`.

    Returns
    -------
    Dataset
        Tensors on ``device``; ``domains_train``/``domains_test`` for multi-domain data,
        with ``meta["num_domains"]`` and ``meta["domain_names"]``.

    Raises
    ------
    DatasetError
        Unknown name; an option the loader does not declare, of the wrong type or out of
        range; missing or unreadable files; labels outside ``[0, num_classes)``.
    """
    return _loader(name)(data_dir=data_dir, device=device, seed=seed, **options)
