"""Where each dataset's files come from: what a loader needs under the data folder, whether
it is there, and the download of the datasets that can be fetched (``stratify data``).

Downloads use torchvision's downloader (:func:`torchvision.datasets.utils.download_url`)
with torchvision's mirrors and MD5 checksums for MNIST, Fashion-MNIST and CIFAR-10/100;
``mnist-10k`` (and the MNIST variants made from it) fetch the two MNIST test files. Every
download goes to a temporary folder inside the data folder and is renamed into place only
once every file is complete and matches its checksum, so nothing is ever half written; the
temporary folder is removed whatever happens. Without a network the download is one
:class:`~stratify.errors.DatasetError` line (docs/architecture.md, "Getting data").
"""

from __future__ import annotations

import errno
import functools
import http.client
import os
import shutil
import socket
import stat
import sys
import tempfile
import urllib.error
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from stratify.data.datasets.folders import DIGITS_DG_DOMAINS, PACS_DOMAINS
from stratify.data.datasets.tabular import COVTYPE_BINARY_FILES, COVTYPE_FILES
from stratify.errors import DatasetError

#: seconds a download waits for a connection or for data before it gives up on a mirror
NETWORK_TIMEOUT = 60

#: what a download raises when it cannot reach a mirror or the transfer breaks off
NETWORK_ERRORS = (urllib.error.URLError, TimeoutError, ConnectionError, http.client.HTTPException)

#: one required file or folder, as the alternative paths (relative to the data folder)
#: any one of which will do, e.g. a gzipped IDX file or its extracted copy
Entry = tuple[str, ...]


def idx(folder: str, stem: str) -> Entry:
    return (f"{folder}/{stem}.gz", f"{folder}/{stem}")


MNIST_TEST = ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")
MNIST_ALL = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", *MNIST_TEST)


@dataclass(frozen=True)
class Resource:
    """One file to download: its name, its MD5 and the mirrors (URL prefixes) serving it."""

    filename: str
    md5: str
    mirrors: tuple[str, ...]


@dataclass(frozen=True)
class Source:
    """What dataset ``name`` needs under the data folder, and how to get it.

    Parameters
    ----------
    files : str
        The files, as the user reads them (``mnist/t10k-…-ubyte.gz``).
    layouts : tuple of tuple of Entry
        The layouts the loader reads, in the order it tries them; the files are present
        when every entry of one layout exists. The first is where a download puts them.
    how : str
        How to get the files by hand (for datasets that cannot be downloaded), or where
        the download fetches them from.
    download : callable, optional
        ``download(folder)`` writes the first layout under ``folder`` (an empty temporary
        folder), every file checked against its checksum; ``None``: placed by hand.
    moves : tuple of str
        The files or folders (relative paths) the download produces, renamed into the
        data folder once it is complete.
    kind : str
        ``"files"``, or ``"bundled"``/``"generated"`` for data that needs no folder.
    checksums : tuple of (str, str)
        ``(relative path, MD5)`` of the files a download places, as published: a file
        already there is checked against it before it counts as present.
    """

    files: str
    layouts: tuple[tuple[Entry, ...], ...] = ()
    how: str = ""
    download: Callable[[Path], None] | None = None
    moves: tuple[str, ...] = ()
    kind: str = "files"
    checksums: tuple[tuple[str, str], ...] = ()


# -- downloads -----------------------------------------------------------------------------


def host(url: str) -> str:
    return url.split("//", 1)[-1].split("/", 1)[0]


@contextmanager
def transient_progress() -> Iterator[None]:
    """torchvision's progress bar, drawn only on a terminal and cleared when the file is
    done, so that a failed download leaves its one error line alone on stderr."""
    import torchvision.datasets.utils as utils

    bar = utils.tqdm
    utils.tqdm = functools.partial(bar, leave=False, disable=not sys.stderr.isatty())  # type: ignore[assignment]
    try:
        yield
    finally:
        utils.tqdm = bar  # type: ignore[assignment]


def fetch(resource: Resource, folder: Path) -> None:
    """Download ``resource`` into ``folder`` from the first mirror that serves it intact.

    Raises
    ------
    DatasetError
        No mirror could be reached or served a file with the right checksum.
    """
    from torchvision.datasets.utils import check_integrity, download_url

    problems, unreachable = [], 0
    for mirror in resource.mirrors:
        try:
            with transient_progress():
                download_url(
                    mirror + resource.filename, str(folder), resource.filename, resource.md5
                )
        except NETWORK_ERRORS as error:
            problems.append(f"{host(mirror)}: {getattr(error, 'reason', error)}")
            unreachable += 1
            continue
        except RuntimeError:  # torchvision: "File not found or corrupted."
            problems.append(f"{host(mirror)}: its MD5 is not {resource.md5}")
            continue
        if check_integrity(str(folder / resource.filename), resource.md5):
            return
        problems.append(f"{host(mirror)}: its MD5 is not {resource.md5}")
    offline = " (no network?)" if unreachable == len(resource.mirrors) else ""
    raise DatasetError(f"cannot download {resource.filename}{offline}: {'; '.join(problems)}")


def idx_download(
    folder: str, resources: Sequence[tuple[str, str]], mirrors: Sequence[str], stems: Sequence[str]
) -> Callable[[Path], None]:
    """A download of the gzipped IDX files ``stems`` into ``<folder>/``, with the MD5s of
    torchvision's ``resources`` list."""
    checksums = dict(resources)

    def download(staging: Path) -> None:
        for stem in stems:
            name = f"{stem}.gz"
            fetch(Resource(name, checksums[name], tuple(mirrors)), staging / folder)

    return download


def idx_checksums(
    folder: str, resources: Sequence[tuple[str, str]], stems: Sequence[str]
) -> tuple[tuple[str, str], ...]:
    """The published MD5s of the gzipped IDX files ``stems`` under ``<folder>/``."""
    checksums = dict(resources)
    return tuple(
        (f"{folder}/{stem}.gz", checksums[f"{stem}.gz"])
        for stem in stems
        if f"{stem}.gz" in checksums
    )


def cifar_download(dataset_class: type) -> Callable[[Path], None]:
    """A download of torchvision's CIFAR archive (MD5-checked), extracted, with every
    extracted file checked against torchvision's MD5 too."""

    def download(staging: Path) -> None:
        from torchvision.datasets.utils import check_integrity, extract_archive

        url: str = dataset_class.url  # type: ignore[attr-defined]
        archive = dataset_class.filename  # type: ignore[attr-defined]
        mirror = url[: -len(archive)]
        fetch(Resource(archive, dataset_class.tgz_md5, (mirror,)), staging)  # type: ignore[attr-defined]
        extract_archive(str(staging / archive), str(staging))
        base = staging / dataset_class.base_folder  # type: ignore[attr-defined]
        meta = dataset_class.meta  # type: ignore[attr-defined]
        listed = [*dataset_class.train_list, *dataset_class.test_list]  # type: ignore[attr-defined]
        for name, md5 in [*listed, [meta["filename"], meta["md5"]]]:
            if not check_integrity(str(base / name), md5):
                raise DatasetError(f"cannot download {archive}: {name} inside it is not intact")

    return download


def _torchvision_sources() -> dict[str, Source]:
    """The sources whose files torchvision knows (mirrors and checksums read from it)."""
    from torchvision.datasets import CIFAR10, CIFAR100, MNIST, FashionMNIST

    mnist_10k = Source(
        files="mnist/t10k-{images-idx3,labels-idx1}-ubyte[.gz]",
        layouts=(tuple(idx("mnist", stem) for stem in MNIST_TEST),),
        how="the two MNIST test files, from torchvision's MNIST mirrors",
        download=idx_download("mnist", MNIST.resources, MNIST.mirrors, MNIST_TEST),
        moves=tuple(f"mnist/{stem}.gz" for stem in MNIST_TEST),
        checksums=idx_checksums("mnist", MNIST.resources, MNIST_TEST),
    )

    def full_idx(folder: str, torchvision_folder: str, dataset_class: type) -> Source:
        resources, mirrors = dataset_class.resources, dataset_class.mirrors  # type: ignore[attr-defined]
        return Source(
            files=f"{folder}/{{train,t10k}}-{{images-idx3,labels-idx1}}-ubyte[.gz] "
            f"(or torchvision's {torchvision_folder}/raw/)",
            layouts=(
                tuple(idx(folder, stem) for stem in MNIST_ALL),
                tuple((f"{torchvision_folder}/raw/{stem}",) for stem in MNIST_ALL),
            ),
            how=f"the four IDX files, from torchvision's {dataset_class.__name__} mirrors",
            download=idx_download(folder, resources, mirrors, MNIST_ALL),
            moves=tuple(f"{folder}/{stem}.gz" for stem in MNIST_ALL),
            checksums=idx_checksums(folder, resources, MNIST_ALL),
        )

    def cifar(dataset_class: type) -> Source:
        base = dataset_class.base_folder  # type: ignore[attr-defined]
        listed = [*dataset_class.train_list, *dataset_class.test_list]  # type: ignore[attr-defined]
        meta = dataset_class.meta  # type: ignore[attr-defined]
        names = [name for name, _ in listed] + [meta["filename"]]
        return Source(
            files=f"{base}/ ({', '.join(names)})",
            layouts=(tuple((f"{base}/{name}",) for name in names),),
            how=f"torchvision's {dataset_class.filename}, extracted",  # type: ignore[attr-defined]
            download=cifar_download(dataset_class),
            moves=(base,),
            checksums=tuple(
                (f"{base}/{name}", md5) for name, md5 in [*listed, (meta["filename"], meta["md5"])]
            ),
        )

    return {
        "mnist-10k": mnist_10k,
        "mnist": full_idx("mnist", "MNIST", MNIST),
        "fashion-mnist": full_idx("fashion-mnist", "FashionMNIST", FashionMNIST),
        "cifar10": cifar(CIFAR10),
        "cifar100": cifar(CIFAR100),
    }


def sources() -> dict[str, Source]:
    """Every dataset of :data:`~stratify.data.datasets.DATASETS` -> its :class:`Source`."""
    found = _torchvision_sources()
    mnist_variant = Source(
        files=f"as mnist-10k: {found['mnist-10k'].files} (-o base=mnist: as mnist)",
        layouts=found["mnist-10k"].layouts,
        how="made from mnist-10k's files (the default base)",
        download=found["mnist-10k"].download,
        moves=found["mnist-10k"].moves,
        checksums=found["mnist-10k"].checksums,
    )
    covtype_table = tuple(
        f"{folder}{name}" for folder in ("covtype/", "") for name in COVTYPE_FILES
    )
    covtype_binary = tuple(
        f"{folder}{name}" for folder in ("covtype/", "") for name in COVTYPE_BINARY_FILES
    )
    return {
        "digits": Source("none: bundled with scikit-learn", kind="bundled"),
        "synthetic": Source("none: generated from the seed", kind="generated"),
        "mnist-10k": found["mnist-10k"],
        "mnist": found["mnist"],
        "fashion-mnist": found["fashion-mnist"],
        "cifar10": found["cifar10"],
        "cifar100": found["cifar100"],
        "covtype": Source(
            files="covtype/covtype.data[.gz]",
            layouts=((covtype_table,),),
            how="by hand: covtype.data.gz of the UCI Machine Learning Repository "
            "(Covertype) into DIR/covtype/ (scikit-learn's pickled cache is not read)",
        ),
        "covtype-binary": Source(
            files="covtype/covtype.libsvm.binary[.scale][.bz2]",
            layouts=((covtype_binary,),),
            how="by hand: covtype.libsvm.binary.scale.bz2 from the LIBSVM binary-class "
            "datasets page (covtype.binary) into DIR/covtype/",
        ),
        "tiny-imagenet": Source(
            files="tiny-imagenet-200/train/<wnid>/images/*.JPEG, "
            "tiny-imagenet-200/val/val_annotations.txt",
            layouts=(
                (("tiny-imagenet-200/train",), ("tiny-imagenet-200/val/val_annotations.txt",)),
            ),
            how="by hand: the official tiny-imagenet-200.zip (CS231n), unzipped into DIR",
        ),
        "pacs": Source(
            files="pacs/{" + ",".join(PACS_DOMAINS) + "}/<class>/*.jpg",
            layouts=tuple(
                tuple((f"{folder}/{domain}",) for domain in PACS_DOMAINS)
                for folder in ("pacs", "PACS")
            ),
            how="by hand: the PACS images (Li et al. 2017), one folder per domain and "
            "class, as DIR/pacs/<domain>/<class>/",
        ),
        "digits-dg": Source(
            files="digits-dg/{" + ",".join(DIGITS_DG_DOMAINS) + "}/{train,val}/<class>/*.png",
            layouts=tuple(
                tuple((f"{folder}/{domain}",) for domain in DIGITS_DG_DOMAINS)
                for folder in ("digits-dg", "digits_dg")
            ),
            how="by hand: Digits-DG (Zhou et al. 2020, as released with Dassl.pytorch), "
            "unzipped as DIR/digits-dg/<domain>/{train,val}/<class>/",
        ),
        "rotated-mnist": mnist_variant,
        "colored-mnist": mnist_variant,
    }


def source(name: str) -> Source:
    """The :class:`Source` of dataset ``name``; DatasetError naming the datasets if unknown."""
    known = sources()
    if name not in known:
        raise DatasetError(f"unknown dataset {name!r}; choose one of {', '.join(sorted(known))}")
    return known[name]


# -- presence ------------------------------------------------------------------------------


def check_data_folder(path: Path, flag: str) -> bool:
    """Whether the data folder ``path`` exists; one line for anything that cannot be one.

    Parameters
    ----------
    path : Path
        The folder the user named.
    flag : str
        The option that named it (``--data-dir``, ``--dir``).

    Raises
    ------
    DatasetError
        A symlink loop, a file, or a folder the OS refuses to look into.
    """
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return False
    except OSError as error:
        reason = "a symlink loop" if error.errno == errno.ELOOP else error.strerror or error
        raise DatasetError(f"{flag} {path} cannot be used: {reason}; give a folder") from None
    if not stat.S_ISDIR(mode):
        raise DatasetError(f"{flag} {path} is a file; give a folder")
    return True


def missing_entries(item: Source, data_dir: Path | None) -> list[str]:
    """The entries of ``item``'s closest layout that are not in ``data_dir`` (empty: all
    present; for data that needs no files, always empty)."""
    if item.kind != "files":
        return []
    best: list[str] | None = None
    for layout in item.layouts:
        gaps = [
            entry[0]
            for entry in layout
            if data_dir is None or not any((data_dir / path).exists() for path in entry)
        ]
        if best is None or len(gaps) < len(best):
            best = gaps
    return best or []


def check_published(name: str, item: Source, directory: Path) -> None:
    """Refuse files already in ``directory`` that a download would place but that do not
    match their published checksum (a damaged or foreign file of the right name).

    Raises
    ------
    DatasetError
        One line naming the files, with what to do.
    """
    from torchvision.datasets.utils import check_integrity

    bad = [
        relative
        for relative, md5 in item.checksums
        if (directory / relative).exists() and not check_integrity(str(directory / relative), md5)
    ]
    if bad:
        raise DatasetError(
            f"{name}: {', '.join(str(directory / relative) for relative in bad)} does not match "
            "its published MD5; move it away and download again"
        )


def status(item: Source, data_dir: Path | None) -> str:
    """``"present"``, ``"missing"``, or the kind of data that needs no files."""
    if item.kind != "files":
        return item.kind
    return "missing" if missing_entries(item, data_dir) else "present"


# -- download ------------------------------------------------------------------------------


def download(name: str, directory: Path) -> list[Path]:
    """Download dataset ``name``'s files into ``directory`` (created if absent).

    The files land in a temporary folder inside ``directory``, are checked against their
    checksums, and only then renamed into place; files already there are kept.

    Returns
    -------
    list of Path
        What was placed (empty when every file was already present).

    Raises
    ------
    DatasetError
        A dataset that cannot be downloaded (with how to get it), an unusable or
        incomplete target, or a download that failed (no network, a bad checksum), in
        one line; nothing is left in ``directory`` then.
    """
    item = source(name)
    if item.download is None:
        detail = item.how if item.kind == "files" else f"it needs no files ({item.files})"
        raise DatasetError(f"{name} cannot be downloaded by stratify; {detail}")
    exists = check_data_folder(directory, "--dir")
    if status(item, directory) == "present":
        check_published(name, item, directory)
        return []
    for move in item.moves:
        target = directory / move
        if target.is_dir():  # an extracted folder that lacks files: never merged into
            missing = ", ".join(missing_entries(item, directory))
            raise DatasetError(
                f"{target} exists but lacks {missing}; move it away (or complete it by hand) "
                "and download again"
            )
    if exists:
        check_published(name, item, directory)
    created = not exists
    directory.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".stratify-download-{name}-", dir=directory))
    placed = []
    previous_timeout = socket.getdefaulttimeout()
    try:
        socket.setdefaulttimeout(NETWORK_TIMEOUT)
        try:
            item.download(staging)
        except DatasetError as error:
            raise DatasetError(
                f"{name}: {error}; nothing was written to {directory}. Download on a "
                f"machine with internet (stratify data download {name} --dir DIR) and copy "
                f"{item.files} into {directory}"
            ) from None
        incomplete = [move for move in item.moves if not (staging / move).exists()]
        if incomplete:
            raise DatasetError(
                f"{name}: the download lacks {', '.join(incomplete)}; nothing was written to "
                f"{directory}"
            )
        for move in item.moves:
            target = directory / move
            if target.exists():
                continue  # present already (e.g. MNIST's test files beside the training files)
            target.parent.mkdir(parents=True, exist_ok=True)
            (staging / move).rename(target)
            placed.append(target)
    finally:
        socket.setdefaulttimeout(previous_timeout)
        shutil.rmtree(staging, ignore_errors=True)
        if created and not placed:
            shutil.rmtree(directory, ignore_errors=True)
    return placed
