"""What every loader shares: the :class:`Dataset` tensors, split and tensor helpers, and the
declared, checked loader options.

A loader declares its options with :func:`dataset_loader`; every call, through
:func:`~stratify.data.datasets.load_dataset` or directly, converts and checks them before
any file is read, so a misspelt key, a wrong type or an out-of-range value is one
:class:`~stratify.errors.DatasetError` line naming the option, the value and what is valid.
"""

from __future__ import annotations

import functools
import math
import stat
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from stratify.errors import CorruptRunError, DatasetError
from stratify.runfolder import file_kind, read_file


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
# Loader options.


def _to_int(value: Any) -> int:
    if isinstance(value, (bool, np.bool_)):
        raise TypeError("a truth value is not a count")
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)) and float(value).is_integer():
        return int(value)
    if isinstance(value, str):
        return int(value.strip())
    raise TypeError(f"{type(value).__name__} is not an integer")


def _to_float(value: Any) -> float:
    if isinstance(value, (bool, np.bool_)):
        raise TypeError("a truth value is not a number")
    if isinstance(value, (int, float, np.integer, np.floating)):
        number = float(value)
    elif isinstance(value, str):
        number = float(value.strip())
    else:
        raise TypeError(f"{type(value).__name__} is not a number")
    if not math.isfinite(number):
        raise ValueError("not finite")
    return number


_TRUE, _FALSE = ("true", "yes", "on", "1"), ("false", "no", "off", "0")


def _to_bool(value: Any) -> bool:
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, np.integer)) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in _TRUE + _FALSE:
        return value.strip().lower() in _TRUE
    raise ValueError("not a truth value")


def _to_str(value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{type(value).__name__} is not text")
    return value


def _to_floats(value: Any) -> tuple[float, ...]:
    if isinstance(value, str):
        # the CLI's "-o angles=0,15,30" arrives as one string
        return tuple(_to_float(part) for part in value.split(",") if part.strip())
    if isinstance(value, (list, tuple, np.ndarray)):
        return tuple(_to_float(part) for part in np.ravel(np.asarray(value, dtype=object)))
    return (_to_float(value),)  # one angle given as a plain number


_CONVERTERS: dict[type, tuple[Callable[[Any], Any], str]] = {
    int: (_to_int, "a whole number"),
    float: (_to_float, "a number"),
    bool: (_to_bool, "true or false"),
    str: (_to_str, "text"),
    tuple: (_to_floats, "a list of numbers"),
}


@dataclass(frozen=True)
class Option:
    """One declared option of a dataset loader.

    Parameters
    ----------
    name : str
        Keyword of the loader (``-o name=value`` on the command line).
    kind : type
        ``int``, ``float``, ``bool``, ``str``, or ``tuple`` for a tuple of floats
        (comma-separated on the command line).
    default : object
        Value when the option is not given; ``None`` only for "not set".
    help : str
        One sentence on what the option does.
    minimum, maximum : float, optional
        Inclusive bounds of a number, or of every number of a tuple.
    choices : tuple of str
        The allowed values of a ``str`` option (empty: any text).
    """

    name: str
    kind: type
    default: Any
    help: str
    minimum: float | None = None
    maximum: float | None = None
    choices: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.kind not in _CONVERTERS:
            raise TypeError(f"option {self.name}: unsupported kind {self.kind!r}")

    def bounds(self) -> str:
        """The allowed range as text, e.g. ``"in [0, 1]"`` or ``">= 1"`` (empty: unbounded)."""
        low, high = self.minimum, self.maximum
        if low is not None and high is not None:
            return f"in [{low:g}, {high:g}]"
        if low is not None:
            return f">= {low:g}"
        if high is not None:
            return f"<= {high:g}"
        return ""

    def describe(self) -> str:
        """What values are valid, e.g. ``"a whole number >= 1"``."""
        if self.choices:
            return "one of " + ", ".join(self.choices)
        noun = "comma-separated numbers" if self.kind is tuple else _CONVERTERS[self.kind][1]
        return f"{noun} {self.bounds()}".strip()

    def parse(self, dataset: str, value: Any) -> Any:
        """``value`` (text from the CLI or a typed Python value) in this option's type.

        Raises
        ------
        DatasetError
            The value has the wrong type, is out of range or is not one of the choices.
        """
        if value is None and self.default is None:
            return None
        convert, noun = _CONVERTERS[self.kind]
        try:
            converted = convert(value)
        except (TypeError, ValueError):
            raise DatasetError(
                f"{dataset}: option {self.name}={value!r} is not {noun}; "
                f"{self.name} must be {self.describe()}"
            ) from None
        if self.choices and converted not in self.choices:
            raise DatasetError(
                f"{dataset}: unknown {self.name} {converted!r}; "
                f"choose one of {', '.join(self.choices)}"
            )
        numbers = converted if self.kind is tuple else (converted,)
        if self.kind is tuple and not numbers:
            raise DatasetError(
                f"{dataset}: option {self.name} is empty; give at least one number, e.g. "
                f"{self.name}={','.join(f'{d:g}' for d in self.default) or '0'}"
            )
        if self.kind in (int, float, tuple):
            for number in numbers:
                if (self.minimum is not None and number < self.minimum) or (
                    self.maximum is not None and number > self.maximum
                ):
                    raise DatasetError(
                        f"{dataset}: option {self.name}={number!r} is out of range; "
                        f"{self.name} must be {self.bounds()}"
                    )
        return converted


def check_options(
    dataset: str, declared: Mapping[str, Option], given: Mapping[str, Any]
) -> dict[str, Any]:
    """Every declared option's value: the given ones converted and checked, defaults else.

    Raises
    ------
    DatasetError
        A key that is not declared (naming the valid ones), or a bad value.
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
    values = {name: option.default for name, option in declared.items()}
    for key, value in given.items():
        values[key] = declared[key].parse(dataset, value)
    return values


class DatasetLoader:
    """A loader with its declared options; calling it checks the options, then loads.

    Made by :func:`dataset_loader`. ``loader(data_dir, device, seed, **options)`` calls the
    wrapped function with every declared option, given or default.

    Attributes
    ----------
    name : str
        Registry name of the dataset, used in error messages.
    options : dict of str to Option
        The declared options, in declaration order.
    seeded : bool
        Whether the data drawn depends on ``seed`` (generated data, random angles or
        colours); a fixed split does not, so one load serves every seed.
    """

    def __init__(
        self,
        name: str,
        options: tuple[Option, ...],
        load: Callable[..., Dataset],
        seeded: bool = False,
    ) -> None:
        self.name = name
        self.options = {option.name: option for option in options}
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
    name: str, *options: Option, seeded: bool = False
) -> Callable[[Callable[..., Dataset]], DatasetLoader]:
    """Decorate ``load(data_dir, device, seed, **options)`` as the loader of ``name``.

    The function receives every option of ``options`` by keyword, already converted and
    range-checked, so it declares them without defaults: the defaults live in ``options``.
    ``seeded`` declares that what it draws depends on ``seed``.
    """

    def decorate(load: Callable[..., Dataset]) -> DatasetLoader:
        return DatasetLoader(name, options, load, seeded=seeded)

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
