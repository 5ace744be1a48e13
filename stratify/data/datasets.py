"""Datasets, loaded once into tensors on the chosen device.

Every loader returns a :class:`Dataset`; ``load_dataset(name, ...)`` dispatches on the
registry ``DATASETS``. Nothing is downloaded: loaders read local files and raise
:class:`~stratify.errors.DatasetError` naming the files and layout they expect.

Names, the files each reads under ``--data-dir``, and its domains (if any):

- ``digits``: none (scikit-learn's bundled digits); ``synthetic``: none (generated).
- ``mnist-10k``: ``mnist/t10k-{images-idx3,labels-idx1}-ubyte[.gz]``.
- ``mnist`` / ``fashion-mnist``: the four IDX files in ``mnist/`` / ``fashion-mnist/``,
  or torchvision's ``MNIST/raw/`` / ``FashionMNIST/raw/``.
- ``cifar10`` / ``cifar100``: ``cifar-10-batches-py/`` / ``cifar-100-python/`` (fine labels).
- ``covtype``: ``covertype/`` (the cache of scikit-learn's ``fetch_covtype``).
- ``tiny-imagenet``: ``tiny-imagenet-200/{train,val}/...``.
- ``pacs``: ``pacs/<domain>/<class>/*.jpg|png``; domains = 4 styles.
- ``digits-dg``: ``digits-dg/<domain>/{train,val}/<class>/*.png``; domains = 4 sources.
- ``rotated-mnist`` / ``colored-mnist``: the files of ``mnist-10k`` (or ``base="mnist"``);
  domains = rotation angle / colour.

Images are normalised float32 ``(N, C, H, W)``; covtype is standardised ``(N, 54)``.
Fixed train/test splits never depend on ``seed``; the derived datasets draw their
angles and colours with it.
"""

from __future__ import annotations

import gzip
import pickle
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


def _writable(array: np.ndarray, dtype) -> np.ndarray:
    # IDX readers return read-only buffers; torch must not alias (and warn about) them
    array = np.ascontiguousarray(array, dtype=dtype)
    return array if array.flags.writeable else array.copy()


def _tensors(x: np.ndarray, y: np.ndarray, device: torch.device | str):
    return (
        torch.as_tensor(_writable(x, np.float32), device=device),
        torch.as_tensor(_writable(y, np.int64), device=device),
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


# --------------------------------------------------------------------------------------
# Shared helpers for the file-based loaders below.


def _require_data_dir(name: str, data_dir: str | None, expected: str) -> Path:
    if data_dir is None:
        raise DatasetError(f"{name} needs --data-dir DIR holding {expected}")
    directory = Path(data_dir)
    if not directory.is_dir():
        raise DatasetError(
            f"{name}: data folder {directory} does not exist; "
            f"pass --data-dir DIR holding {expected}"
        )
    return directory


def _normalise_images(images: np.ndarray, mean, std) -> np.ndarray:
    """uint8 ``(N, H, W, C)`` images to float32 ``(N, C, H, W)``, normalised per channel."""
    scaled = images.astype(np.float32) / 255.0
    mean = np.asarray(mean, dtype=np.float32).reshape(1, 1, 1, -1)
    std = np.asarray(std, dtype=np.float32).reshape(1, 1, 1, -1)
    return np.ascontiguousarray(((scaled - mean) / std).transpose(0, 3, 1, 2))


def _make_dataset(
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


IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp")


def _image_files(folder: Path, suffixes: tuple[str, ...] = IMAGE_SUFFIXES) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.is_file() and p.suffix.lower() in suffixes)


def _read_images(paths: list[Path], size: int, name: str) -> np.ndarray:
    """Decode image files as RGB, resized to ``size x size``: uint8 ``(N, size, size, 3)``."""
    from PIL import Image

    images = np.empty((len(paths), size, size, 3), dtype=np.uint8)
    for position, path in enumerate(paths):
        try:
            with Image.open(path) as image:
                image = image.convert("RGB")
                if image.size != (size, size):
                    image = image.resize((size, size), Image.Resampling.BILINEAR)
                images[position] = np.asarray(image)
        except (OSError, ValueError, SyntaxError) as error:  # PIL raises all three on bad files
            raise DatasetError(
                f"{name}: cannot read image {path} ({error}); replace it with an intact copy "
                "or delete it"
            ) from None
    return images


# --------------------------------------------------------------------------------------
# MNIST and Fashion-MNIST (60,000 / 10,000 images).

FASHION_MEAN, FASHION_STD = 0.2860, 0.3530

_IDX_STEMS = (
    "train-images-idx3-ubyte",
    "train-labels-idx1-ubyte",
    "t10k-images-idx3-ubyte",
    "t10k-labels-idx1-ubyte",
)


def _full_mnist_arrays(name: str, data_dir: str | None, folder: str, torchvision_class: str):
    """Train/test uint8 images and labels of MNIST or Fashion-MNIST.

    Reads the four IDX files from ``<data-dir>/<folder>/`` (gzipped or not) when all are
    there, otherwise the torchvision layout ``<data-dir>/<torchvision_class>/raw/``.
    """
    expected = (
        f"{folder}/{{train,t10k}}-{{images-idx3,labels-idx1}}-ubyte[.gz] "
        f"or torchvision's {torchvision_class}/raw/ layout"
    )
    directory = _require_data_dir(name, data_dir, expected)
    found = [_find(directory / folder, stem) for stem in _IDX_STEMS]
    if all(path is not None for path in found):
        train_images, train_labels, test_images, test_labels = (read_idx(p) for p in found)
    else:
        import torchvision.datasets

        reader = getattr(torchvision.datasets, torchvision_class)
        try:
            train = reader(str(directory), train=True, download=False)
            test = reader(str(directory), train=False, download=False)
        except RuntimeError:
            missing = [stem for stem, path in zip(_IDX_STEMS, found) if path is None]
            raise DatasetError(
                f"{name}: missing {', '.join(missing)} in {directory / folder} and no "
                f"torchvision layout {directory / torchvision_class / 'raw'}; put the four "
                f"official IDX files (gzipped or not) in {directory / folder}"
            ) from None
        except (AssertionError, ValueError, TypeError, OSError) as error:
            raise DatasetError(
                f"{name}: cannot read {directory / torchvision_class / 'raw'} ({error}); "
                "replace the files with intact copies"
            ) from None
        train_images, train_labels = train.data.numpy(), train.targets.numpy()
        test_images, test_labels = test.data.numpy(), test.targets.numpy()
    for images, labels in ((train_images, train_labels), (test_images, test_labels)):
        if images.ndim != 3 or images.shape[1:] != (28, 28) or len(images) != len(labels):
            raise DatasetError(
                f"{name}: found {images.shape} images with {labels.shape} labels in {directory}, "
                "expected (N, 28, 28) images and N labels; use the official IDX files"
            )
    return train_images, train_labels, test_images, test_labels


def load_mnist(data_dir: str | None = None, device="cpu", seed: int = 0, **_) -> Dataset:
    """Full MNIST (60,000 train / 10,000 test) from ``<data-dir>/mnist/`` or ``MNIST/raw/``."""
    train_images, train_labels, test_images, test_labels = _full_mnist_arrays(
        "mnist", data_dir, "mnist", "MNIST"
    )
    return _make_dataset(
        "mnist",
        normalise_mnist(train_images),
        train_labels,
        normalise_mnist(test_images),
        test_labels,
        10,
        device,
    )


def load_fashion_mnist(data_dir: str | None = None, device="cpu", seed: int = 0, **_) -> Dataset:
    """Fashion-MNIST from ``<data-dir>/fashion-mnist/`` or torchvision's ``FashionMNIST/raw/``."""
    train_images, train_labels, test_images, test_labels = _full_mnist_arrays(
        "fashion-mnist", data_dir, "fashion-mnist", "FashionMNIST"
    )

    def normalise(images: np.ndarray) -> np.ndarray:
        return _normalise_images(images[..., None], FASHION_MEAN, FASHION_STD)

    return _make_dataset(
        "fashion-mnist",
        normalise(train_images),
        train_labels,
        normalise(test_images),
        test_labels,
        10,
        device,
    )


# --------------------------------------------------------------------------------------
# CIFAR-10 / CIFAR-100 through torchvision (python pickles, md5-checked by torchvision).

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
    directory = _require_data_dir(name, data_dir, expected)
    import torchvision.datasets

    reader = getattr(torchvision.datasets, torchvision_class)
    try:
        train = reader(str(directory), train=True, download=False)
        test = reader(str(directory), train=False, download=False)
    except RuntimeError:
        raise DatasetError(
            f"{name}: missing or corrupt files in {directory / folder}; expected {files} "
            "(extract the official python-version archive into --data-dir)"
        ) from None
    except (OSError, EOFError, ValueError, KeyError, pickle.UnpicklingError) as error:
        raise DatasetError(
            f"{name}: cannot read {directory / folder} ({error}); replace it with the official "
            "python-version archive, extracted"
        ) from None
    return _make_dataset(
        name,
        _normalise_images(np.asarray(train.data), mean, std),
        np.asarray(train.targets),
        _normalise_images(np.asarray(test.data), mean, std),
        np.asarray(test.targets),
        num_classes,
        device,
        class_names=list(train.classes),
    )


def load_cifar10(data_dir: str | None = None, device="cpu", seed: int = 0, **_) -> Dataset:
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


def load_cifar100(data_dir: str | None = None, device="cpu", seed: int = 0, **_) -> Dataset:
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


# --------------------------------------------------------------------------------------
# Covertype (tabular, 581,012 samples, 54 features, 7 classes) through scikit-learn.


def load_covtype(data_dir: str | None = None, device="cpu", seed: int = 0, **_) -> Dataset:
    """Forest covertype via ``sklearn.datasets.fetch_covtype(data_home=data_dir)``, no download.

    Labels 1..7 become 0..6; a fixed 80/20 split; features standardised with the training
    split's mean and standard deviation (so no test statistics leak into training).
    """
    directory = _require_data_dir(
        "covtype",
        data_dir,
        "covertype/samples_py3 and covertype/targets_py3 (scikit-learn's cache)",
    )
    from sklearn.datasets import fetch_covtype

    try:
        bunch = fetch_covtype(data_home=str(directory), download_if_missing=False)
    except OSError:
        raise DatasetError(
            f"covtype: no scikit-learn cache in {directory / 'covertype'}; run "
            f"sklearn.datasets.fetch_covtype(data_home={str(directory)!r}) once on a machine "
            "with internet access and copy the folder here"
        ) from None
    except (EOFError, ValueError, KeyError, pickle.UnpicklingError) as error:
        raise DatasetError(
            f"covtype: cannot read {directory / 'covertype'} ({error}); "
            "delete it and fetch it again"
        ) from None
    features = np.asarray(bunch.data, dtype=np.float32)
    labels = np.asarray(bunch.target, dtype=np.int64) - 1
    if features.ndim != 2 or len(features) != len(labels) or labels.min() < 0 or labels.max() > 6:
        raise DatasetError(
            f"covtype: {directory / 'covertype'} holds unexpected data (features {features.shape}, "
            "labels outside 1..7); delete it and fetch it again"
        )
    train, test = _split(len(features), len(features) // 5, seed=581012)
    mean = features[train].mean(axis=0)
    std = features[train].std(axis=0)
    std[std == 0] = 1.0  # constant columns stay zero instead of dividing by zero
    standardised = (features - mean) / std
    return _make_dataset(
        "covtype",
        standardised[train],
        labels[train],
        standardised[test],
        labels[test],
        7,
        device,
    )


# --------------------------------------------------------------------------------------
# Tiny ImageNet (200 classes, 100,000 train / 10,000 val images, 64x64).

IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
HALF, HALF_STD = (0.5, 0.5, 0.5), (0.5, 0.5, 0.5)


def load_tiny_imagenet(
    data_dir: str | None = None, device="cpu", seed: int = 0, image_size: int = 64, **_
) -> Dataset:
    """Tiny ImageNet from ``<data-dir>/tiny-imagenet-200/`` (the official zip, extracted).

    Training images are ``train/<wnid>/images/*.JPEG``; the labelled ``val`` split
    (``val/images/*.JPEG`` with ``val/val_annotations.txt``) is the test set. Classes are
    the sorted wnids of ``train/``.
    """
    layout = (
        "tiny-imagenet-200/train/<wnid>/images/*.JPEG and tiny-imagenet-200/val/images/*.JPEG "
        "with val/val_annotations.txt"
    )
    root = _require_data_dir("tiny-imagenet", data_dir, layout) / "tiny-imagenet-200"
    train_root, annotations = root / "train", root / "val" / "val_annotations.txt"
    if not train_root.is_dir() or not annotations.is_file():
        raise DatasetError(f"tiny-imagenet: {root} is missing or incomplete; expected {layout}")
    wnids = sorted(p.name for p in train_root.iterdir() if (p / "images").is_dir())
    if not wnids:
        raise DatasetError(f"tiny-imagenet: no class folders in {train_root}; expected {layout}")
    class_of = {wnid: position for position, wnid in enumerate(wnids)}
    train_paths: list[Path] = []
    train_labels: list[int] = []
    for wnid in wnids:
        files = _image_files(train_root / wnid / "images")
        train_paths += files
        train_labels += [class_of[wnid]] * len(files)
    test_paths: list[Path] = []
    test_labels: list[int] = []
    for line_number, line in enumerate(annotations.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        fields = line.split("\t")
        if len(fields) < 2 or fields[1] not in class_of:
            raise DatasetError(
                f"tiny-imagenet: {annotations} line {line_number} is not "
                "'<file><TAB><wnid>...' with a wnid from train/; "
                "replace the file with the official one"
            )
        test_paths.append(root / "val" / "images" / fields[0])
        test_labels.append(class_of[fields[1]])
    missing = [p for p in test_paths if not p.is_file()]
    if missing or not train_paths or not test_paths:
        if missing:
            what = f"{len(missing)} images listed in {annotations} (e.g. {missing[0]})"
        else:
            what = "training images" if not train_paths else "validation images"
        raise DatasetError(f"tiny-imagenet: missing {what}; expected {layout}")
    return _make_dataset(
        "tiny-imagenet",
        _normalise_images(
            _read_images(train_paths, image_size, "tiny-imagenet"), IMAGENET_MEAN, IMAGENET_STD
        ),
        np.asarray(train_labels),
        _normalise_images(
            _read_images(test_paths, image_size, "tiny-imagenet"), IMAGENET_MEAN, IMAGENET_STD
        ),
        np.asarray(test_labels),
        len(wnids),
        device,
        class_names=wnids,
    )


# --------------------------------------------------------------------------------------
# Multi-domain folders: PACS and Digits-DG. The domain id is the position in *_DOMAINS.

PACS_DOMAINS = ("art_painting", "cartoon", "photo", "sketch")
DIGITS_DG_DOMAINS = ("mnist", "mnist_m", "svhn", "syn")


def _class_names(folders: list[Path]) -> list[str]:
    names = {
        p.name for folder in folders if folder.is_dir() for p in folder.iterdir() if p.is_dir()
    }
    # numeric folder names ("0".."9") sort as numbers so that label i is the digit i
    return sorted(names, key=lambda n: (0, int(n), "") if n.isdigit() else (1, 0, n))


def _domain_root(
    name: str, data_dir: str | None, folders: tuple[str, ...], layout: str, domains: tuple[str, ...]
) -> Path:
    directory = _require_data_dir(name, data_dir, layout)
    root = next((directory / f for f in folders if (directory / f).is_dir()), None)
    if root is None:
        raise DatasetError(f"{name}: no folder {folders[0]} in {directory}; expected {layout}")
    missing = [d for d in domains if not (root / d).is_dir()]
    if missing:
        raise DatasetError(
            f"{name}: missing domain folder(s) {', '.join(missing)} in {root}; expected {layout}"
        )
    return root


def _collect(folders_by_domain: list[tuple[int, Path]], class_of: dict[str, int]):
    """(paths, labels, domain ids) of the images in ``<folder>/<class>/`` for each folder."""
    paths: list[Path] = []
    labels: list[int] = []
    domain_ids: list[int] = []
    for domain_id, folder in folders_by_domain:
        if not folder.is_dir():
            continue
        for class_name, label in class_of.items():
            if (folder / class_name).is_dir():
                files = _image_files(folder / class_name)
                paths += files
                labels += [label] * len(files)
                domain_ids += [domain_id] * len(files)
    return paths, np.asarray(labels, dtype=np.int64), np.asarray(domain_ids, dtype=np.int64)


def _check_test_domain(name: str, test_domain: str | None, domains: tuple[str, ...]) -> None:
    if test_domain is not None and test_domain not in domains:
        raise DatasetError(
            f"{name}: unknown test_domain {test_domain!r}; choose one of {', '.join(domains)}"
        )


def load_pacs(
    data_dir: str | None = None,
    device="cpu",
    seed: int = 0,
    image_size: int = 64,
    test_domain: str | None = None,
    **_,
) -> Dataset:
    """PACS from ``<data-dir>/pacs/<domain>/<class>/*.{jpg,png}``, resized to ``image_size``.

    Domains (``domains_train``/``domains_test`` ids): 0 art_painting, 1 cartoon, 2 photo,
    3 sketch. By default all images are split 80/20 with a fixed seed; with
    ``test_domain="sketch"`` (say) that domain is the test set and the others train
    (leave-one-domain-out, the usual domain-generalisation protocol).
    """
    layout = "pacs/{art_painting,cartoon,photo,sketch}/<class>/*.jpg|*.png"
    _check_test_domain("pacs", test_domain, PACS_DOMAINS)
    root = _domain_root("pacs", data_dir, ("pacs", "PACS"), layout, PACS_DOMAINS)
    domain_folders = [root / d for d in PACS_DOMAINS]
    class_names = _class_names(domain_folders)
    class_of = {c: i for i, c in enumerate(class_names)}
    paths, labels, domain_ids = _collect(list(enumerate(domain_folders)), class_of)
    if not paths:
        raise DatasetError(f"pacs: no images in {root}; expected {layout}")
    images = _normalise_images(_read_images(paths, image_size, "pacs"), HALF, HALF_STD)
    if test_domain is None:
        train, test = _split(len(paths), len(paths) // 5, seed=9991)
    else:
        held_out = domain_ids == PACS_DOMAINS.index(test_domain)
        train, test = np.flatnonzero(~held_out), np.flatnonzero(held_out)
        if len(test) == 0:
            raise DatasetError(f"pacs: no images in {root / test_domain}; expected {layout}")
    return _make_dataset(
        "pacs",
        images[train],
        labels[train],
        images[test],
        labels[test],
        len(class_names),
        device,
        domain_ids[train],
        domain_ids[test],
        class_names=class_names,
        domain_names=list(PACS_DOMAINS),
        num_domains=len(PACS_DOMAINS),
    )


def load_digits_dg(
    data_dir: str | None = None,
    device="cpu",
    seed: int = 0,
    image_size: int = 32,
    test_domain: str | None = None,
    **_,
) -> Dataset:
    """Digits-DG from ``<data-dir>/digits-dg/<domain>/{train,val}/<class>/*.png``.

    Domains: 0 mnist, 1 mnist_m, 2 svhn, 3 syn; images become RGB ``image_size`` squares.
    By default ``train/`` folders train and ``val/`` folders test; with ``test_domain``
    all images of that domain test and all images of the other domains train.
    """
    layout = "digits-dg/{mnist,mnist_m,svhn,syn}/{train,val}/<class>/*.png"
    _check_test_domain("digits-dg", test_domain, DIGITS_DG_DOMAINS)
    root = _domain_root(
        "digits-dg", data_dir, ("digits-dg", "digits_dg"), layout, DIGITS_DG_DOMAINS
    )
    split_folders = [root / d / s for d in DIGITS_DG_DOMAINS for s in ("train", "val")]
    class_names = _class_names(split_folders)
    class_of = {c: i for i, c in enumerate(class_names)}
    if test_domain is None:
        train_set = [(i, root / d / "train") for i, d in enumerate(DIGITS_DG_DOMAINS)]
        test_set = [(i, root / d / "val") for i, d in enumerate(DIGITS_DG_DOMAINS)]
    else:
        held = DIGITS_DG_DOMAINS.index(test_domain)
        both = [
            (i, root / d / s) for i, d in enumerate(DIGITS_DG_DOMAINS) for s in ("train", "val")
        ]
        train_set = [(i, f) for i, f in both if i != held]
        test_set = [(i, f) for i, f in both if i == held]
    train_paths, y_train, d_train = _collect(train_set, class_of)
    test_paths, y_test, d_test = _collect(test_set, class_of)
    if not train_paths or not test_paths:
        raise DatasetError(
            f"digits-dg: no {'training' if not train_paths else 'test'} images in {root}; "
            f"expected {layout}"
        )

    def read(paths: list[Path]) -> np.ndarray:
        return _normalise_images(_read_images(paths, image_size, "digits-dg"), HALF, HALF_STD)

    return _make_dataset(
        "digits-dg",
        read(train_paths),
        y_train,
        read(test_paths),
        y_test,
        len(class_names),
        device,
        d_train,
        d_test,
        class_names=class_names,
        domain_names=list(DIGITS_DG_DOMAINS),
        num_domains=len(DIGITS_DG_DOMAINS),
    )


# --------------------------------------------------------------------------------------
# Derived MNIST variants for feature skew and spurious correlation.

MNIST_BASES = ("mnist-10k", "mnist")


def _mnist_base(name: str, base: str, data_dir: str | None):
    """uint8 train/test images and labels of the base dataset of a derived MNIST variant."""
    if base == "mnist-10k":
        images, labels = mnist_10k_arrays(data_dir)
        train, test = _split(len(images), 2000, seed=10000)  # the same split as mnist-10k
        return images[train], labels[train], images[test], labels[test]
    if base == "mnist":
        return _full_mnist_arrays("mnist", data_dir, "mnist", "MNIST")
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


def load_rotated_mnist(
    data_dir: str | None = None,
    device="cpu",
    seed: int = 0,
    base: str = "mnist-10k",
    angles: tuple[float, ...] = ROTATION_ANGLES,
    **_,
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
    if not angles:
        raise DatasetError("rotated-mnist: angles is empty; give at least one angle, e.g. 0,45")
    train_images, y_train, test_images, y_test = _mnist_base("rotated-mnist", base, data_dir)
    rng = np.random.default_rng(seed)
    d_train = rng.integers(0, len(angles), size=len(train_images))
    d_test = rng.integers(0, len(angles), size=len(test_images))
    table = np.asarray(angles)

    def prepare(images: np.ndarray, domain_ids: np.ndarray) -> np.ndarray:
        rotated = rotate_images(images, table[domain_ids])
        return ((rotated - MNIST_MEAN) / MNIST_STD)[:, None, :, :]

    return _make_dataset(
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


def load_colored_mnist(
    data_dir: str | None = None,
    device="cpu",
    seed: int = 0,
    base: str = "mnist-10k",
    correlation: float = 0.9,
    test_correlation: float = 0.0,
    binary_labels: bool = False,
    **_,
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
    for option, value in (("correlation", correlation), ("test_correlation", test_correlation)):
        if not 0.0 <= float(value) <= 1.0:
            raise DatasetError(f"colored-mnist: {option} must be in [0, 1], got {value}")
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
    return _make_dataset(
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


DATASETS: dict[str, Callable[..., Dataset]] = {
    "digits": load_digits,
    "synthetic": load_synthetic,
    "mnist-10k": load_mnist_10k,
    "mnist": load_mnist,
    "fashion-mnist": load_fashion_mnist,
    "cifar10": load_cifar10,
    "cifar100": load_cifar100,
    "covtype": load_covtype,
    "tiny-imagenet": load_tiny_imagenet,
    "pacs": load_pacs,
    "digits-dg": load_digits_dg,
    "rotated-mnist": load_rotated_mnist,
    "colored-mnist": load_colored_mnist,
}


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
        Loader-specific options: ``n_train``, ``n_test``, ``num_features``,
        ``num_classes`` (synthetic); ``image_size`` (tiny-imagenet, pacs, digits-dg);
        ``test_domain`` (pacs, digits-dg: leave that domain out for testing);
        ``base`` (``"mnist-10k"`` or ``"mnist"``), ``angles`` (rotated-mnist);
        ``base``, ``correlation``, ``test_correlation``, ``binary_labels`` (colored-mnist).
        Options a loader does not know are ignored.

    Returns
    -------
    Dataset
        Tensors on ``device``; ``domains_train``/``domains_test`` for multi-domain data,
        with ``meta["num_domains"]`` and ``meta["domain_names"]``.

    Raises
    ------
    DatasetError
        Unknown name, missing or unreadable files, or an invalid option value.
    """
    if name not in DATASETS:
        raise DatasetError(f"unknown dataset {name!r}; choose one of {', '.join(sorted(DATASETS))}")
    return DATASETS[name](data_dir=data_dir, device=device, seed=seed, **options)
