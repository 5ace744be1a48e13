"""Tabular data: Covertype (581,012 samples, 54 features, 7 classes) through scikit-learn."""

from __future__ import annotations

import pickle

import numpy as np

from stratify.data.datasets.base import (
    Dataset,
    dataset_loader,
    fixed_split,
    make_dataset,
    require_data_dir,
    require_regular_files,
)
from stratify.errors import DatasetError


@dataset_loader("covtype")
def load_covtype(data_dir: str | None, device, seed: int) -> Dataset:
    """Forest covertype via ``sklearn.datasets.fetch_covtype(data_home=data_dir)``, no download.

    Labels 1..7 become 0..6; a fixed 80/20 split; features standardised with the training
    split's mean and standard deviation (so no test statistics leak into training).
    """
    directory = require_data_dir(
        "covtype",
        data_dir,
        "covertype/samples_py3 and covertype/targets_py3 (scikit-learn's cache)",
    )
    from sklearn.datasets import fetch_covtype

    require_regular_files("covtype", directory / "covertype")
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
