"""What every loader shares: the :class:`Dataset` tensors, split and tensor helpers, and the
declared, checked loader options.

A loader declares its options as a :class:`~stratify.options.DatasetOptions` dataclass of
:func:`~stratify.options.dataset_option` fields, the option machinery of the methods and
of ``TrainConfig``, and names it in :func:`dataset_loader`; every call, through
:func:`~stratify.data.datasets.load_dataset` or directly, converts and checks them before
any file is read, so a misspelt key, a wrong type or an out-of-range value is one
:class:`~stratify.errors.DatasetError` line naming the option, the value and what is valid.
"""

from __future__ import annotations

import dataclasses
import functools
import stat
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from stratify.errors import ConfigError, CorruptRunError, DatasetError
from stratify.files import file_kind, read_file
from stratify.options import DatasetOptions, check_value


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


# --------------------------------------------------------------------------------------
# Loader options: a DatasetOptions dataclass of stratify.options fields per loader.


def check_options(
    dataset: str, declared: Mapping[str, dataclasses.Field], given: Mapping[str, Any]
) -> dict[str, Any]:
    """Every declared option's value: the given ones converted and checked, defaults else.

    Parameters
    ----------
    dataset : str
        The dataset's name, for the messages.
    declared : mapping of str to dataclasses.Field
        The loader's option fields (:func:`~stratify.data.datasets.dataset_options`).
    given : mapping of str to object
        The user's values, typed or as text (``"0.5"``, ``"true"``, ``"0,45"``); ``None``
        means "not given".

    Raises
    ------
    DatasetError
        A key that is not declared (naming the valid ones), or a bad value, in one line
        starting with the dataset's name.
    """
    unknown = [key for key in given if key not in declared]
    if unknown:
        keys = ", ".join(repr(key) for key in unknown)
        noun = "option" if len(unknown) == 1 else "options"
        valid = (
            f"valid options: {', '.join(sorted(declared))}"
            if declared
            else f"{dataset} takes no options"
        )
        raise DatasetError(f"{dataset} has no {noun} {keys}; {valid}")
    values = {name: field.default for name, field in declared.items()}
    for key, value in given.items():
        if value is None:
            continue
        try:
            values[key] = check_value(declared[key], value, key)
        except ConfigError as error:
            raise DatasetError(f"{dataset}: {error}") from None
    return values


class DatasetLoader:
    """A loader with its declared options; calling it checks the options, then loads.

    Made by :func:`dataset_loader`. ``loader(data_dir, device, seed, **options)`` calls the
    wrapped function with every declared option, given or default.

    Attributes
    ----------
    name : str
        Registry name of the dataset, used in error messages.
    options_class : type of DatasetOptions
        The dataclass declaring the options.
    options : dict of str to dataclasses.Field
        Its option fields, in declaration order.
    seeded : bool
        Whether the data drawn depends on ``seed`` (generated data, random angles or
        colours); a fixed split does not, so one load serves every seed.
    family : str
        The datasets whose images are alike enough to share a method's default learning
        rate (``mnist`` for mnist-10k, mnist, rotated-mnist and colored-mnist); the
        dataset's own name when it has no relatives (docs/architecture.md, "Default
        learning rates").
    """

    def __init__(
        self,
        name: str,
        options: type[DatasetOptions],
        load: Callable[..., Dataset],
        seeded: bool = False,
        family: str | None = None,
    ) -> None:
        self.name = name
        self.family = family or name
        self.options_class = options
        self.options = {field.name: field for field in options.option_fields()}
        self.load = load
        self.seeded = seeded
        functools.update_wrapper(self, load)

    def __call__(
        self,
        data_dir: str | None = None,
        device: torch.device | str = "cpu",
        seed: int = 0,
        **options: Any,
    ) -> Dataset:
        values = check_options(self.name, self.options, options)
        return self.load(data_dir, device, seed, **values)


def dataset_loader(
    name: str,
    options: type[DatasetOptions] = DatasetOptions,
    *,
    seeded: bool = False,
    family: str | None = None,
) -> Callable[[Callable[..., Dataset]], DatasetLoader]:
    """Decorate ``load(data_dir, device, seed, **options)`` as the loader of ``name``.

    ``options`` is the :class:`~stratify.options.DatasetOptions` dataclass declaring the
    loader's options (fields made with :func:`~stratify.options.dataset_option`). The
    function receives every one by keyword, already converted and range-checked, so it
    declares them without defaults: the defaults live in ``options``. ``seeded``
    declares that what it draws depends on ``seed``; ``family`` names the datasets it
    shares default learning rates with (:class:`DatasetLoader`).
    """

    def decorate(load: Callable[..., Dataset]) -> DatasetLoader:
        return DatasetLoader(name, options, load, seeded=seeded, family=family)

    return decorate


# --------------------------------------------------------------------------------------
# Tensors, splits and shared checks.


def _writable(array: np.ndarray, dtype) -> np.ndarray:
    # IDX readers return read-only buffers; torch must not alias (and warn about) them
    array = np.ascontiguousarray(array, dtype=dtype)
    return array if array.flags.writeable else array.copy()


def _tensors(x: np.ndarray, y: np.ndarray, device: torch.device | str):
    return (
        torch.as_tensor(_writable(x, np.float32), device=device),
        torch.as_tensor(_writable(y, np.int64), device=device),
    )


def fixed_split(n: int, n_test: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Sorted train and test indices of ``n`` samples, ``n_test`` of them for testing."""
    order = np.random.default_rng(seed).permutation(n)
    return np.sort(order[n_test:]), np.sort(order[:n_test])


def check_labels(
    name: str,
    labels: np.ndarray,
    num_classes: int,
    source: str,
    fix: str = "replace the dataset files with intact copies",
) -> None:
    """Raise DatasetError if a label of ``source`` lies outside ``[0, num_classes)``.

    Caught here, a corrupt label file is one line naming it; caught later, it would be an
    index error deep inside a loss or a bincount.
    """
    labels = np.asarray(labels)
    if labels.size == 0:
        return
    bad = np.flatnonzero((labels < 0) | (labels >= num_classes))
    if len(bad):
        raise DatasetError(
            f"{name}: label {labels.flat[bad[0]]} at position {bad[0]} of {source} is outside "
            f"[0, {num_classes}) ({len(bad)} such labels); {fix}"
        )


def read_data_file(name: str, path: Path) -> bytes:
    """The bytes of the data file ``path``; a FIFO, a device or a folder in its place is
    refused at once (reading one would wait for a writer forever).

    Raises
    ------
    DatasetError
        Not a regular file, or unreadable.
    """
    try:
        return read_file(path)
    except CorruptRunError as error:
        raise DatasetError(f"{name}: {error}; put the data file there") from None
    except OSError as error:
        raise DatasetError(f"{name}: cannot read {path} ({error.strerror or error})") from None


def require_regular_files(name: str, folder: Path) -> None:
    """Refuse a FIFO, a device or a socket among the files of ``folder`` and below, before
    a reader that opens them blindly (torchvision, scikit-learn) waits on one forever."""
    if not folder.is_dir():
        return
    for path in sorted(folder.rglob("*")):
        try:
            mode = path.stat().st_mode
        except OSError:
            continue  # a dangling link: the reader reports the missing file
        if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
            raise DatasetError(
                f"{name}: {path} is {file_kind(mode)}, not a regular file; put the data file there"
            )


def require_data_dir(name: str, data_dir: str | None, expected: str) -> Path:
    """``data_dir`` as a Path; DatasetError naming ``expected`` if it is unset or absent."""
    if data_dir is None:
        raise DatasetError(f"{name} needs --data-dir DIR holding {expected}")
    directory = Path(data_dir)
    if not directory.is_dir():
        raise DatasetError(
            f"{name}: data folder {directory} does not exist; "
            f"pass --data-dir DIR holding {expected}"
        )
    return directory


def normalise_images(images: np.ndarray, mean, std) -> np.ndarray:
    """uint8 ``(N, H, W, C)`` images to float32 ``(N, C, H, W)``, normalised per channel."""
    scaled = images.astype(np.float32) / 255.0
    mean = np.asarray(mean, dtype=np.float32).reshape(1, 1, 1, -1)
    std = np.asarray(std, dtype=np.float32).reshape(1, 1, 1, -1)
    return np.ascontiguousarray(((scaled - mean) / std).transpose(0, 3, 1, 2))


def make_dataset(
    name: str,
    x_train: np.ndarray,
    y_train: np.ndarray,
    x_test: np.ndarray,
    y_test: np.ndarray,
    num_classes: int,
    device,
    domains_train: np.ndarray | None = None,
    domains_test: np.ndarray | None = None,
    **meta,
) -> Dataset:
    """A :class:`Dataset` on ``device`` from numpy arrays; labels are range-checked and
    an empty split is refused (files holding too few samples: nothing to train on or to
    evaluate, which would otherwise surface as empty means and divisions by zero)."""
    for split, labels in (("training", y_train), ("test", y_test)):
        if len(labels) == 0:
            raise DatasetError(
                f"{name}: its {split} split is empty ({len(y_train)} training and "
                f"{len(y_test)} test samples); the files hold too few samples"
            )
    check_labels(name, y_train, num_classes, "the training split")
    check_labels(name, y_test, num_classes, "the test split")
    train_inputs, train_labels = _tensors(x_train, y_train, device)
    test_inputs, test_labels = _tensors(x_test, y_test, device)

    def as_ids(ids: np.ndarray | None) -> np.ndarray | None:
        return None if ids is None else np.asarray(ids, dtype=np.int64)

    return Dataset(
        name,
        train_inputs,
        train_labels,
        test_inputs,
        test_labels,
        num_classes,
        as_ids(domains_train),
        as_ids(domains_test),
        dict(meta),
    )
