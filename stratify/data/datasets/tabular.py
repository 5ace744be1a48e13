"""Tabular data: Covertype (581,012 samples, 54 features, 7 classes; and LIBSVM's
binary version), parsed from text."""

from __future__ import annotations

import gzip
import io
import zlib

import numpy as np

from stratify.data.datasets.base import (
    Dataset,
    dataset_loader,
    fixed_split,
    make_dataset,
    read_data_file,
    require_data_dir,
)
from stratify.errors import DatasetError

#: File names of the original covertype table (UCI), in the order they are looked for.
COVTYPE_FILES = ("covtype.data.gz", "covtype.data")
#: columns of a covertype row: 54 features and the cover type (1..7)
COVTYPE_COLUMNS = 55


@dataset_loader("covtype")
def load_covtype(data_dir: str | None, device, seed: int) -> Dataset:
    """Forest covertype (7 classes) from the original table, ``covtype.data[.gz]`` in
    ``data_dir/covtype/`` or ``data_dir``: 55 comma-separated integers a row.

    The table is parsed as text: no pickle (scikit-learn's ``covertype/samples_py3``
    cache is one, and unpickling a crafted file runs code) is ever read. Labels 1..7
    become 0..6; a fixed 80/20 split; features standardised with the training split's
    mean and standard deviation (so no test statistics leak into training).
    """
    directory = require_data_dir("covtype", data_dir, "covtype/covtype.data[.gz]")
    candidates = [
        folder / name for folder in (directory / "covtype", directory) for name in COVTYPE_FILES
    ]
    path = next((candidate for candidate in candidates if candidate.exists()), None)
    if path is None:
        raise DatasetError(
            f"covtype: none of {', '.join(COVTYPE_FILES)} in {directory / 'covtype'} or "
            f"{directory}; get covtype.data.gz from the UCI Machine Learning Repository "
            "(Covertype)"
        )
    data = read_data_file("covtype", path)
    try:
        if path.suffix == ".gz":
            data = gzip.decompress(data)
        table = np.loadtxt(io.BytesIO(data), delimiter=",", dtype=np.int64, ndmin=2)
    except (OSError, EOFError, ValueError, zlib.error) as error:
        reason = str(error).splitlines()[0][:120] if str(error) else type(error).__name__
        raise DatasetError(f"covtype: cannot read {path} ({reason})") from None
    if table.shape[1] != COVTYPE_COLUMNS or not len(table):
        raise DatasetError(
            f"covtype: {path} has rows of {table.shape[1]} values, not {COVTYPE_COLUMNS}"
        )
    features = table[:, :-1].astype(np.float32)
    labels = table[:, -1] - 1
    if labels.min() < 0 or labels.max() > 6:
        raise DatasetError(f"covtype: {path} has cover types outside 1..7")
    return standardised_split("covtype", features, labels, 7, test_share=5, device=device)


def standardised_split(
    name: str, features: np.ndarray, labels: np.ndarray, num_classes: int, test_share: int, device
) -> Dataset:
    """A fixed split (``1 / test_share`` of the samples for testing, independent of the run's
    seed) with features standardised by the training split's mean and standard
    deviation, so no test statistics leak into training."""
    train, test = fixed_split(len(features), len(features) // test_share, seed=581012)
    mean = features[train].mean(axis=0)
    std = features[train].std(axis=0)
    std[std == 0] = 1.0  # constant columns stay zero instead of dividing by zero
    standardised = (features - mean) / std
    return make_dataset(
        name,
        standardised[train],
        labels[train],
        standardised[test],
        labels[test],
        num_classes,
        device,
    )


#: File names of the LIBSVM binary covertype, in the order they are looked for.
COVTYPE_BINARY_FILES = tuple(
    f"covtype.libsvm.binary{scale}{compression}"
    for scale in (".scale", "")
    for compression in ("", ".bz2")
)


@dataset_loader("covtype-binary")
def load_covtype_binary(data_dir: str | None, device, seed: int) -> Dataset:
    """NIID-Bench's COVTYPE, which the Stratify paper uses: LIBSVM's binary covertype
    (581,012 samples, 54 features, 2 classes), not scikit-learn's 7-class one.

    Reads the first of :data:`COVTYPE_BINARY_FILES` found in ``data_dir/covtype/`` or
    ``data_dir`` (``.bz2`` is read compressed). Labels 1/2 become 0/1; a fixed 75/25
    split (NIID-Bench's test share); features standardised with the training split's
    mean and standard deviation, as for ``covtype``.
    """
    directory = require_data_dir(
        "covtype-binary", data_dir, "covtype/covtype.libsvm.binary[.scale][.bz2]"
    )
    candidates = [
        folder / name
        for folder in (directory / "covtype", directory)
        for name in COVTYPE_BINARY_FILES
    ]
    path = next((candidate for candidate in candidates if candidate.is_file()), None)
    if path is None:
        raise DatasetError(
            f"covtype-binary: none of {', '.join(COVTYPE_BINARY_FILES)} in {directory / 'covtype'} "
            f"or {directory}; get it from the LIBSVM binary datasets page"
        )
    from sklearn.datasets import load_svmlight_file

    try:
        sparse_features, raw_labels = load_svmlight_file(str(path), n_features=54)
    except (ValueError, OSError, EOFError) as error:
        raise DatasetError(f"covtype-binary: cannot read {path} ({error})") from None
    values = np.unique(raw_labels)
    if len(values) != 2:
        raise DatasetError(
            f"covtype-binary: {path} has labels {values.tolist()[:5]}, expected two classes"
        )
    labels = (raw_labels == values[1]).astype(np.int64)
    features = np.asarray(sparse_features.toarray(), dtype=np.float32)
    return standardised_split("covtype-binary", features, labels, 2, test_share=4, device=device)
