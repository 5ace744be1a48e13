"""Image-folder datasets: Tiny ImageNet, and the multi-domain PACS and Digits-DG.

The domain id of PACS and Digits-DG is the position of the domain in ``*_DOMAINS``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from stratify.data.datasets.base import (
    Dataset,
    dataset_loader,
    fixed_split,
    make_dataset,
    normalise_images,
    read_data_file,
    require_data_dir,
)
from stratify.errors import DatasetError
from stratify.options import DatasetOptions, dataset_option, inherit
from stratify.validation import check_fits_in_memory

IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
HALF, HALF_STD = (0.5, 0.5, 0.5), (0.5, 0.5, 0.5)

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp")


def _image_files(folder: Path, suffixes: tuple[str, ...] = IMAGE_SUFFIXES) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.is_file() and p.suffix.lower() in suffixes)


def _read_images(paths: list[Path], size: int, name: str) -> np.ndarray:
    """Decode image files as RGB, resized to ``size x size``: uint8 ``(N, size, size, 3)``."""
    from PIL import Image

    # the uint8 pixels, then their float32 normalised copy
    check_fits_in_memory(
        len(paths) * size * size * 3 * (1 + 4),
        f"{name}: {len(paths):,} images of {size}x{size} pixels (-o image_size={size})",
        "use a smaller -o image_size",
    )
    images = np.empty((len(paths), size, size, 3), dtype=np.uint8)
    for position, path in enumerate(paths):
        try:
            with Image.open(path) as image:
                rgb = image.convert("RGB")
                if rgb.size != (size, size):
                    rgb = rgb.resize((size, size), Image.Resampling.BILINEAR)
                images[position] = np.asarray(rgb)
        except (OSError, ValueError, SyntaxError) as error:  # PIL raises all three on bad files
            raise DatasetError(
                f"{name}: cannot read image {path} ({error}); replace it with an intact copy "
                "or delete it"
            ) from None
    return images


@dataclass
class ImageFolderOptions(DatasetOptions):
    """The option of every image-folder dataset: the side images are resized to."""

    image_size: int = dataset_option(64, "Side of the square images, in pixels.", minimum=1)


@dataset_loader("tiny-imagenet", ImageFolderOptions)
def load_tiny_imagenet(data_dir: str | None, device, seed: int, *, image_size: int) -> Dataset:
    """Tiny ImageNet from ``<data-dir>/tiny-imagenet-200/`` (the official zip, extracted).

    Training images are ``train/<wnid>/images/*.JPEG``; the labelled ``val`` split
    (``val/images/*.JPEG`` with ``val/val_annotations.txt``) is the test set. Classes are
    the sorted wnids of ``train/``.
    """
    layout = (
        "tiny-imagenet-200/train/<wnid>/images/*.JPEG and tiny-imagenet-200/val/images/*.JPEG "
        "with val/val_annotations.txt"
    )
    root = require_data_dir("tiny-imagenet", data_dir, layout) / "tiny-imagenet-200"
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
    text = read_data_file("tiny-imagenet", annotations).decode("utf-8", errors="replace")
    for line_number, line in enumerate(text.splitlines(), start=1):
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
    return make_dataset(
        "tiny-imagenet",
        normalise_images(
            _read_images(train_paths, image_size, "tiny-imagenet"), IMAGENET_MEAN, IMAGENET_STD
        ),
        np.asarray(train_labels),
        normalise_images(
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
    directory = require_data_dir(name, data_dir, layout)
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


def _test_domain_option(domains: tuple[str, ...]) -> str | None:
    return dataset_option(
        None,
        "Domain held out as the test set (leave-one-domain-out); default: a fixed split.",
        kind=str,
        choices=domains,
    )


@dataclass
class PACSOptions(ImageFolderOptions):
    test_domain: str | None = _test_domain_option(PACS_DOMAINS)


@dataclass
class DigitsDGOptions(ImageFolderOptions):
    image_size: int = inherit(32)
    test_domain: str | None = _test_domain_option(DIGITS_DG_DOMAINS)


@dataset_loader("pacs", PACSOptions)
def load_pacs(
    data_dir: str | None, device, seed: int, *, image_size: int, test_domain: str | None
) -> Dataset:
    """PACS from ``<data-dir>/pacs/<domain>/<class>/*.{jpg,png}``, resized to ``image_size``.

    Domains (``domains_train``/``domains_test`` ids): 0 art_painting, 1 cartoon, 2 photo,
    3 sketch. By default all images are split 80/20 with a fixed seed; with
    ``test_domain="sketch"`` (say) that domain is the test set and the others train
    (leave-one-domain-out, the usual domain-generalisation protocol).
    """
    layout = "pacs/{art_painting,cartoon,photo,sketch}/<class>/*.jpg|*.png"
    root = _domain_root("pacs", data_dir, ("pacs", "PACS"), layout, PACS_DOMAINS)
    domain_folders = [root / d for d in PACS_DOMAINS]
    class_names = _class_names(domain_folders)
    class_of = {c: i for i, c in enumerate(class_names)}
    paths, labels, domain_ids = _collect(list(enumerate(domain_folders)), class_of)
    if not paths:
        raise DatasetError(f"pacs: no images in {root}; expected {layout}")
    images = normalise_images(_read_images(paths, image_size, "pacs"), HALF, HALF_STD)
    if test_domain is None:
        train, test = fixed_split(len(paths), len(paths) // 5, seed=9991)
    else:
        held_out = domain_ids == PACS_DOMAINS.index(test_domain)
        train, test = np.flatnonzero(~held_out), np.flatnonzero(held_out)
        if len(test) == 0:
            raise DatasetError(f"pacs: no images in {root / test_domain}; expected {layout}")
    return make_dataset(
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


@dataset_loader("digits-dg", DigitsDGOptions)
def load_digits_dg(
    data_dir: str | None, device, seed: int, *, image_size: int, test_domain: str | None
) -> Dataset:
    """Digits-DG from ``<data-dir>/digits-dg/<domain>/{train,val}/<class>/*.png``.

    Domains: 0 mnist, 1 mnist_m, 2 svhn, 3 syn; images become RGB ``image_size`` squares.
    By default ``train/`` folders train and ``val/`` folders test; with ``test_domain``
    all images of that domain test and all images of the other domains train.
    """
    layout = "digits-dg/{mnist,mnist_m,svhn,syn}/{train,val}/<class>/*.png"
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
        return normalise_images(_read_images(paths, image_size, "digits-dg"), HALF, HALF_STD)

    return make_dataset(
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
