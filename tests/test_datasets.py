"""Dataset loaders: the real mnist-10k files, and tiny fake folder layouts for the others."""

from __future__ import annotations

import gzip
import pickle
import struct
from pathlib import Path

import numpy as np
import pytest
import torch

from stratify.data import datasets
from stratify.data.datasets import DATASETS, load_dataset, read_idx
from stratify.errors import DatasetError

MNIST_10K_CLASS_COUNTS = (980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009)


# ---------------------------------------------------------------------------- file builders


def write_idx(path: Path, array: np.ndarray) -> Path:
    """Write a uint8 IDX file (gzipped if the name ends in .gz)."""
    array = np.asarray(array, dtype=np.uint8)
    raw = struct.pack(">HBB", 0, 8, array.ndim) + struct.pack(">" + "I" * array.ndim, *array.shape)
    raw += array.tobytes()
    path.parent.mkdir(parents=True, exist_ok=True)
    with (gzip.open if path.suffix == ".gz" else open)(path, "wb") as handle:
        handle.write(raw)
    return path


def fake_mnist_arrays(n_train: int = 24, n_test: int = 12, seed: int = 0):
    rng = np.random.default_rng(seed)
    return (
        rng.integers(0, 256, size=(n_train, 28, 28), dtype=np.uint8),
        np.arange(n_train, dtype=np.uint8) % 10,
        rng.integers(0, 256, size=(n_test, 28, 28), dtype=np.uint8),
        np.arange(n_test, dtype=np.uint8) % 10,
    )


def write_fake_mnist(folder: Path, suffix: str = ".gz", **kwargs) -> tuple[np.ndarray, ...]:
    arrays = fake_mnist_arrays(**kwargs)
    stems = (
        "train-images-idx3-ubyte",
        "train-labels-idx1-ubyte",
        "t10k-images-idx3-ubyte",
        "t10k-labels-idx1-ubyte",
    )
    for stem, array in zip(stems, arrays):
        write_idx(folder / f"{stem}{suffix}", array)
    return arrays


def write_image(path: Path, size: int = 8, seed: int = 0, mode: str = "RGB") -> None:
    from PIL import Image

    rng = np.random.default_rng(seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    shape = (size, size, 3) if mode == "RGB" else (size, size)
    Image.fromarray(rng.integers(0, 256, size=shape, dtype=np.uint8), mode).save(path)


# ---------------------------------------------------------------------------- registry


def test_registry_has_every_dataset():
    assert set(DATASETS) == {
        "digits",
        "synthetic",
        "mnist-10k",
        "mnist",
        "fashion-mnist",
        "cifar10",
        "cifar100",
        "covtype",
        "covtype-binary",
        "tiny-imagenet",
        "pacs",
        "digits-dg",
        "rotated-mnist",
        "colored-mnist",
    }


def test_unknown_dataset_names_the_choices():
    with pytest.raises(DatasetError, match="unknown dataset 'nope'; choose one of .*mnist-10k"):
        load_dataset("nope")


@pytest.mark.parametrize(
    "name",
    [
        "mnist-10k",
        "mnist",
        "fashion-mnist",
        "cifar10",
        "cifar100",
        "covtype",
        "covtype-binary",
        "tiny-imagenet",
        "pacs",
        "digits-dg",
        "rotated-mnist",
        "colored-mnist",
    ],
)
def test_file_datasets_without_data_dir_say_what_to_pass(name):
    with pytest.raises(DatasetError, match="--data-dir"):
        load_dataset(name, data_dir=None)


@pytest.mark.parametrize(
    "name",
    [
        "mnist",
        "fashion-mnist",
        "cifar10",
        "cifar100",
        "covtype",
        "covtype-binary",
        "tiny-imagenet",
        "pacs",
        "digits-dg",
    ],
)
def test_file_datasets_in_an_empty_folder_name_the_expected_files(name, tmp_path):
    expected = {
        "mnist": "train-images-idx3-ubyte",
        "fashion-mnist": "fashion-mnist",
        "cifar10": "cifar-10-batches-py",
        "cifar100": "cifar-100-python",
        "covtype": "covtype.data.gz",
        "covtype-binary": "covtype.libsvm.binary",
        "tiny-imagenet": "tiny-imagenet-200",
        "pacs": "pacs",
        "digits-dg": "digits-dg",
    }[name]
    with pytest.raises(DatasetError) as caught:
        load_dataset(name, data_dir=str(tmp_path))
    message = str(caught.value)
    assert expected in message and "\n" not in message and message.startswith(name)


def test_missing_data_folder_is_reported(tmp_path):
    with pytest.raises(DatasetError, match="does not exist"):
        load_dataset("pacs", data_dir=str(tmp_path / "absent"))


# ---------------------------------------------------------------------------- mnist-10k (real)


@pytest.mark.data
def test_mnist_10k_real_files_counts_split_and_determinism(shared_data_dir):
    # shared_data_dir (tests/conftest.py) skips without the files, fails if STRATIFY_REQUIRE_DATA=1
    data_dir = shared_data_dir
    first = load_dataset("mnist-10k", data_dir=str(data_dir))
    assert first.x_train.shape == (8000, 1, 28, 28) and first.x_test.shape == (2000, 1, 28, 28)
    assert first.x_train.dtype == torch.float32 and first.y_train.dtype == torch.int64
    assert first.num_classes == 10 and first.domains_train is None
    all_labels = np.concatenate([first.y_train.numpy(), first.y_test.numpy()])
    assert tuple(np.bincount(all_labels, minlength=10)) == MNIST_10K_CLASS_COUNTS
    second = load_dataset("mnist-10k", data_dir=str(data_dir), seed=123)  # split is fixed
    assert torch.equal(first.y_train, second.y_train) and torch.equal(first.x_test, second.x_test)


def test_read_idx_rejects_a_truncated_file(tmp_path):
    path = write_idx(tmp_path / "images.gz", np.zeros((4, 28, 28)))
    path.write_bytes(gzip.compress(gzip.decompress(path.read_bytes())[:100]))
    with pytest.raises(DatasetError, match="cannot read .*images.gz"):
        read_idx(path)


# ---------------------------------------------------------------------------- mnist, fashion


def test_mnist_from_gzipped_idx_files_in_the_mnist_folder(tmp_path):
    train_images, train_labels, _, test_labels = write_fake_mnist(tmp_path / "mnist")
    dataset = load_dataset("mnist", data_dir=str(tmp_path))
    assert dataset.x_train.shape == (24, 1, 28, 28) and dataset.x_test.shape == (12, 1, 28, 28)
    assert dataset.y_train.tolist() == train_labels.tolist()
    assert dataset.y_test.tolist() == test_labels.tolist()
    expected = (train_images[3] / 255.0 - datasets.MNIST_MEAN) / datasets.MNIST_STD
    assert np.allclose(dataset.x_train[3, 0].numpy(), expected, atol=1e-5)


def test_mnist_and_fashion_from_the_torchvision_layout(tmp_path):
    write_fake_mnist(tmp_path / "MNIST" / "raw", suffix="")
    write_fake_mnist(tmp_path / "FashionMNIST" / "raw", suffix="", seed=1)
    mnist = load_dataset("mnist", data_dir=str(tmp_path))
    fashion = load_dataset("fashion-mnist", data_dir=str(tmp_path))
    assert mnist.x_train.shape == fashion.x_train.shape == (24, 1, 28, 28)
    assert not torch.equal(mnist.x_train, fashion.x_train)


def test_mnist_with_a_corrupt_file_is_a_dataset_error(tmp_path):
    write_fake_mnist(tmp_path / "mnist")
    (tmp_path / "mnist" / "train-labels-idx1-ubyte.gz").write_bytes(b"not a gzip file")
    with pytest.raises(DatasetError, match="cannot read"):
        load_dataset("mnist", data_dir=str(tmp_path))


def test_mnist_with_mismatched_counts_is_a_dataset_error(tmp_path):
    write_fake_mnist(tmp_path / "mnist")
    write_idx(tmp_path / "mnist" / "train-labels-idx1-ubyte.gz", np.zeros(5))
    with pytest.raises(DatasetError, match="expected \\(N, 28, 28\\) images and N labels"):
        load_dataset("mnist", data_dir=str(tmp_path))


# ---------------------------------------------------------------------------- cifar


def write_fake_cifar10(root: Path, per_batch: int = 4) -> None:
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        batch = {
            "data": rng.integers(0, 256, size=(per_batch, 3072), dtype=np.uint8),
            "labels": list(range(per_batch)),
        }
        (folder / name).write_bytes(pickle.dumps(batch))
    meta = {"label_names": [str(i) for i in range(10)]}
    (folder / "batches.meta").write_bytes(pickle.dumps(meta))


def test_cifar10_through_torchvision_on_fake_batches(tmp_path, monkeypatch):
    import torchvision.datasets.cifar

    write_fake_cifar10(tmp_path)
    # the fake batches cannot match torchvision's md5 sums; everything else is the real path
    monkeypatch.setattr(torchvision.datasets.cifar, "check_integrity", lambda *a, **k: True)
    dataset = load_dataset("cifar10", data_dir=str(tmp_path))
    assert dataset.x_train.shape == (20, 3, 32, 32) and dataset.x_test.shape == (4, 3, 32, 32)
    assert dataset.y_test.tolist() == [0, 1, 2, 3] and dataset.num_classes == 10


def test_cifar10_with_corrupt_batches_is_a_dataset_error(tmp_path):
    write_fake_cifar10(tmp_path)  # the md5 check fails on these files
    with pytest.raises(DatasetError, match="missing or corrupt files in .*cifar-10-batches-py"):
        load_dataset("cifar10", data_dir=str(tmp_path))


# ---------------------------------------------------------------------------- covtype


@pytest.mark.parametrize("name", ["covtype/covtype.data.gz", "covtype.data"])
def test_covtype_reads_the_table_standardises_relabels_and_splits(tmp_path, name):
    rng = np.random.default_rng(0)
    features = rng.integers(0, 3000, size=(100, 54))
    features[:, 0] = 1  # a constant column must not divide by zero
    targets = np.arange(100) % 7 + 1
    text = "\n".join(",".join(map(str, row)) for row in np.column_stack([features, targets]))
    path = tmp_path / name
    path.parent.mkdir(parents=True, exist_ok=True)
    data = (text + "\n").encode()
    path.write_bytes(gzip.compress(data) if name.endswith(".gz") else data)
    dataset = load_dataset("covtype", data_dir=str(tmp_path))
    assert dataset.x_train.shape == (80, 54) and dataset.x_test.shape == (20, 54)
    assert dataset.num_classes == 7
    assert set(dataset.y_train.tolist()) | set(dataset.y_test.tolist()) == set(range(7))
    assert torch.allclose(dataset.x_train[:, 1:].mean(0), torch.zeros(53), atol=1e-5)
    assert torch.allclose(dataset.x_train[:, 1:].std(0, unbiased=False), torch.ones(53), atol=1e-4)
    assert torch.all(dataset.x_train[:, 0] == 0)


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (b"1,2,3\n", "rows of 3 values"),
        (b"\xff\xfe garbage\n", "cannot read"),
        (("1," * 54 + "9\n").encode(), "outside 1..7"),
    ],
)
def test_a_damaged_covtype_table_is_one_line(tmp_path, content, reason):
    (tmp_path / "covtype.data").write_bytes(content)
    with pytest.raises(DatasetError, match=reason):
        load_dataset("covtype", data_dir=str(tmp_path))


def write_libsvm(path: Path, rows: list[tuple[int, dict[int, float]]]) -> None:
    """A LIBSVM text file: ``label index:value ...`` with 1-based feature indices."""
    lines = [
        f"{label} " + " ".join(f"{index}:{value:g}" for index, value in sorted(features.items()))
        for label, features in rows
    ]
    data = ("\n".join(lines) + "\n").encode()
    if path.suffix == ".bz2":
        import bz2

        data = bz2.compress(data)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


@pytest.mark.parametrize("name", ["covtype.libsvm.binary", "covtype.libsvm.binary.scale.bz2"])
def test_covtype_binary_reads_libsvm_files(tmp_path, name):
    # 40 samples: label 1 or 2, feature 1 = the sample number, feature 54 = label; sparse
    rows = [(1 + i % 2, {1: float(i), 54: float(1 + i % 2)}) for i in range(40)]
    write_libsvm(tmp_path / "covtype" / name, rows)
    dataset = load_dataset("covtype-binary", data_dir=str(tmp_path))
    assert dataset.num_classes == 2
    assert dataset.x_train.shape == (30, 54) and dataset.x_test.shape == (10, 54)  # 75/25
    labels = torch.cat([dataset.y_train, dataset.y_test])
    assert sorted(labels.tolist()) == [0] * 20 + [1] * 20  # labels 1/2 -> 0/1
    # feature 54 equals the label before standardising: after it, it still orders them
    for x, y in ((dataset.x_train, dataset.y_train), (dataset.x_test, dataset.y_test)):
        assert torch.equal(x[:, 53] > 0, y == 1)
    assert torch.allclose(dataset.x_train[:, 0].mean(), torch.tensor(0.0), atol=1e-5)
    assert torch.all(dataset.x_train[:, 1:53] == 0)  # absent features are zero columns
    again = load_dataset("covtype-binary", data_dir=str(tmp_path), seed=7)
    assert torch.equal(again.y_test, dataset.y_test)  # the split does not depend on seed


def test_covtype_binary_trains_the_papers_mlp(tmp_path):
    from stratify.run import Run, TrainConfig

    rows = [(1 + i % 2, {1: float(i % 7), 2: float(1 + i % 2)}) for i in range(80)]
    write_libsvm(tmp_path / "covtype" / "covtype.libsvm.binary", rows)
    config = TrainConfig(
        dataset="covtype-binary",
        data_dir=str(tmp_path),
        partition="classes:1",
        clients=2,
        mlp_hidden="32,16,8",
        epochs=2,
        lr=0.1,
        secure=False,
        out=str(tmp_path / "run"),
    )
    run = Run(config)
    widths = [m.out_features for m in run.engine.model.modules() if isinstance(m, torch.nn.Linear)]
    assert widths == [32, 16, 8, 2]
    summary = run.train()
    assert summary["total_steps"] == 2 * 60  # 60 training samples, one step each per epoch
    assert summary["best_accuracy"] >= 0.9  # feature 2 is the label


def test_covtype_binary_refuses_a_file_with_other_labels(tmp_path):
    write_libsvm(tmp_path / "covtype.libsvm.binary", [(k, {1: 1.0}) for k in (1, 2, 3)])
    with pytest.raises(DatasetError, match="expected two classes"):
        load_dataset("covtype-binary", data_dir=str(tmp_path))
    (tmp_path / "covtype.libsvm.binary").write_text("1 notafeature\n")
    with pytest.raises(DatasetError, match="cannot read"):
        load_dataset("covtype-binary", data_dir=str(tmp_path))


# ---------------------------------------------------------------------------- tiny-imagenet


def write_fake_tiny_imagenet(root: Path) -> Path:
    base = root / "tiny-imagenet-200"
    for c, wnid in enumerate(("n01443537", "n01629819")):
        for i in range(3):
            write_image(base / "train" / wnid / "images" / f"{wnid}_{i}.JPEG", seed=10 * c + i)
    lines = []
    for i, wnid in enumerate(("n01629819", "n01443537")):
        write_image(base / "val" / "images" / f"val_{i}.JPEG", seed=100 + i)
        lines.append(f"val_{i}.JPEG\t{wnid}\t0\t0\t8\t8")
    (base / "val" / "val_annotations.txt").write_text("\n".join(lines) + "\n")
    return base


def test_tiny_imagenet_reads_train_folders_and_val_annotations(tmp_path):
    write_fake_tiny_imagenet(tmp_path)
    dataset = load_dataset("tiny-imagenet", data_dir=str(tmp_path), image_size=16)
    assert dataset.x_train.shape == (6, 3, 16, 16) and dataset.x_test.shape == (2, 3, 16, 16)
    assert dataset.y_train.tolist() == [0, 0, 0, 1, 1, 1] and dataset.y_test.tolist() == [1, 0]
    assert dataset.num_classes == 2 and dataset.meta["class_names"][0] == "n01443537"


def test_tiny_imagenet_with_a_corrupt_image_names_the_file(tmp_path):
    base = write_fake_tiny_imagenet(tmp_path)
    (base / "val" / "images" / "val_1.JPEG").write_bytes(b"\xff\xd8 truncated")
    with pytest.raises(DatasetError, match="cannot read image .*val_1.JPEG"):
        load_dataset("tiny-imagenet", data_dir=str(tmp_path))


def test_tiny_imagenet_with_a_missing_val_image(tmp_path):
    base = write_fake_tiny_imagenet(tmp_path)
    (base / "val" / "images" / "val_0.JPEG").unlink()
    with pytest.raises(DatasetError, match="missing 1 images listed in"):
        load_dataset("tiny-imagenet", data_dir=str(tmp_path))


# ---------------------------------------------------------------------------- pacs, digits-dg


def write_fake_pacs(root: Path, per_class: int = 2) -> None:
    for d, domain in enumerate(datasets.PACS_DOMAINS):
        for c, name in enumerate(("dog", "horse")):
            for i in range(per_class):
                suffix = ".png" if domain == "sketch" else ".jpg"
                write_image(
                    root / "pacs" / domain / name / f"{i}{suffix}",
                    size=12,
                    seed=100 * d + 10 * c + i,
                )


def test_pacs_domains_classes_and_default_split(tmp_path):
    write_fake_pacs(tmp_path, per_class=5)  # 40 images
    dataset = load_dataset("pacs", data_dir=str(tmp_path), image_size=16)
    assert dataset.x_train.shape == (32, 3, 16, 16) and dataset.x_test.shape == (8, 3, 16, 16)
    assert dataset.num_classes == 2 and dataset.meta["class_names"] == ["dog", "horse"]
    assert dataset.domains_train.dtype == np.int64
    domains = np.concatenate([dataset.domains_train, dataset.domains_test])
    assert np.bincount(domains).tolist() == [10, 10, 10, 10]


def test_pacs_leave_one_domain_out(tmp_path):
    write_fake_pacs(tmp_path)
    dataset = load_dataset("pacs", data_dir=str(tmp_path), image_size=8, test_domain="sketch")
    assert set(dataset.domains_test.tolist()) == {3} and len(dataset.domains_test) == 4
    assert set(dataset.domains_train.tolist()) == {0, 1, 2}
    with pytest.raises(DatasetError, match="unknown test_domain 'clipart'"):
        load_dataset("pacs", data_dir=str(tmp_path), test_domain="clipart")


def test_pacs_missing_domain_and_corrupt_image(tmp_path):
    write_fake_pacs(tmp_path)
    (tmp_path / "pacs" / "cartoon" / "dog" / "0.jpg").write_bytes(b"garbage")
    with pytest.raises(DatasetError, match="cannot read image .*cartoon/dog/0.jpg"):
        load_dataset("pacs", data_dir=str(tmp_path), image_size=8)
    for path in sorted((tmp_path / "pacs" / "photo").rglob("*"), reverse=True):
        path.rmdir() if path.is_dir() else path.unlink()
    (tmp_path / "pacs" / "photo").rmdir()
    with pytest.raises(DatasetError, match="missing domain folder\\(s\\) photo"):
        load_dataset("pacs", data_dir=str(tmp_path))


def test_digits_dg_train_val_folders_and_domains(tmp_path):
    for d, domain in enumerate(datasets.DIGITS_DG_DOMAINS):
        for split, count in (("train", 2), ("val", 1)):
            for digit in ("0", "1", "2"):
                for i in range(count):
                    mode = "L" if domain == "mnist" else "RGB"
                    write_image(
                        tmp_path / "digits-dg" / domain / split / digit / f"{i}.png",
                        size=28,
                        seed=d * 100 + i,
                        mode=mode,
                    )
    dataset = load_dataset("digits-dg", data_dir=str(tmp_path))
    assert dataset.x_train.shape == (24, 3, 32, 32) and dataset.x_test.shape == (12, 3, 32, 32)
    assert np.bincount(dataset.domains_train).tolist() == [6, 6, 6, 6]
    assert sorted(set(dataset.y_test.tolist())) == [0, 1, 2]
    held_out = load_dataset("digits-dg", data_dir=str(tmp_path), test_domain="svhn")
    assert set(held_out.domains_test.tolist()) == {2} and len(held_out.domains_test) == 9
    assert len(held_out.domains_train) == 27


# ---------------------------------------------------------------------------- derived mnist


@pytest.mark.data
def test_rotated_mnist_on_the_real_files(shared_data_dir):
    data_dir = shared_data_dir
    base = load_dataset("mnist-10k", data_dir=data_dir)
    rotated = load_dataset("rotated-mnist", data_dir=data_dir, seed=3)
    assert rotated.x_train.shape == (8000, 1, 28, 28)
    assert torch.equal(rotated.y_train, base.y_train)  # the same fixed split
    assert rotated.meta["angles"] == [0, 15, 30, 45, 60, 75]
    counts = np.bincount(rotated.domains_train, minlength=6)
    assert counts.sum() == 8000 and counts.min() > 1200  # each angle about 1/6
    upright = rotated.domains_train == 0
    assert torch.allclose(rotated.x_train[upright], base.x_train[upright], atol=1e-4)
    assert not torch.allclose(rotated.x_train[~upright], base.x_train[~upright], atol=1e-2)
    again = load_dataset("rotated-mnist", data_dir=data_dir, seed=3)
    other = load_dataset("rotated-mnist", data_dir=data_dir, seed=4)
    assert np.array_equal(again.domains_train, rotated.domains_train)
    assert not np.array_equal(other.domains_train, rotated.domains_train)


@pytest.mark.data
def test_colored_mnist_correlation_controls_the_colour(shared_data_dir):
    data_dir = shared_data_dir
    perfect = load_dataset("colored-mnist", data_dir=data_dir, correlation=1.0)
    labels = perfect.y_train.numpy()
    assert perfect.x_train.shape == (8000, 3, 28, 28) and perfect.num_classes == 10
    assert np.array_equal(perfect.domains_train, (labels >= 5).astype(np.int64))
    # the digit is drawn only in its colour's channel
    background = (0.0 - datasets.MNIST_MEAN) / datasets.MNIST_STD
    red = perfect.domains_train == 0
    assert torch.allclose(perfect.x_train[red, 1], torch.tensor(background))
    assert torch.all(perfect.x_train[red, 0].amax(dim=(1, 2)) > 1.0)
    none = load_dataset("colored-mnist", data_dir=data_dir, correlation=0.0)
    agreement = np.mean(none.domains_train == (labels >= 5))
    assert abs(agreement - 0.5) < 0.03
    half = load_dataset("colored-mnist", data_dir=data_dir, correlation=0.5, seed=1)
    assert abs(np.mean(half.domains_train == (labels >= 5)) - 0.75) < 0.03
    assert abs(np.mean(half.domains_test == (half.y_test.numpy() >= 5)) - 0.5) < 0.05
    binary = load_dataset("colored-mnist", data_dir=data_dir, binary_labels=True)
    assert binary.num_classes == 2 and set(binary.y_train.tolist()) == {0, 1}
    with pytest.raises(DatasetError, match="correlation must be in \\[0, 1\\]"):
        load_dataset("colored-mnist", data_dir=data_dir, correlation=1.5)


def test_derived_datasets_on_full_mnist_base(tmp_path):
    write_fake_mnist(tmp_path / "mnist")
    rotated = load_dataset("rotated-mnist", data_dir=str(tmp_path), base="mnist", angles=(0, 90))
    assert rotated.x_train.shape == (24, 1, 28, 28) and set(rotated.domains_train) <= {0, 1}
    turned = rotated.domains_train == 1
    raw = fake_mnist_arrays()[0][turned][0]
    expected = (np.rot90(raw) / 255.0 - datasets.MNIST_MEAN) / datasets.MNIST_STD
    assert np.allclose(rotated.x_train[turned][0, 0].numpy(), expected, atol=1e-4)
    colored = load_dataset("colored-mnist", data_dir=str(tmp_path), base="mnist")
    assert colored.x_test.shape == (12, 3, 28, 28)
    with pytest.raises(DatasetError, match="unknown base 'emnist'"):
        load_dataset("colored-mnist", data_dir=str(tmp_path), base="emnist")


# ---------------------------------------------------------------------------- options


def test_every_loader_declares_its_options():
    from stratify.data.datasets import dataset_options

    assert dataset_options("digits") == {} and dataset_options("mnist-10k") == {}
    assert list(dataset_options("colored-mnist")) == [
        "base",
        "correlation",
        "test_correlation",
        "binary_labels",
    ]
    correlation = dataset_options("colored-mnist")["correlation"]
    assert correlation.metadata["type"] is float and correlation.default == 0.9
    assert correlation.metadata["check"].describe() == "a number in [0, 1]"
    described = dataset_options("synthetic")["num_classes"].metadata["check"].describe()
    assert described == "a whole number >= 1"
    assert dataset_options("pacs")["test_domain"].metadata["choices"] == datasets.PACS_DOMAINS
    # an inherited option with its own default (digits-dg's 32-pixel images)
    assert dataset_options("pacs")["image_size"].default == 64
    assert dataset_options("digits-dg")["image_size"].default == 32
    with pytest.raises(DatasetError, match="unknown dataset 'nope'"):
        dataset_options("nope")


def test_unknown_option_is_refused_naming_the_valid_ones():
    # refused before any file is read: no data_dir is needed to get this error
    with pytest.raises(DatasetError) as caught:
        load_dataset("colored-mnist", corelation=0.5)
    assert str(caught.value) == (
        "colored-mnist has no option 'corelation'; "
        "valid options: base, binary_labels, correlation, test_correlation"
    )
    with pytest.raises(DatasetError) as caught:
        load_dataset("digits", image_size=8)
    assert str(caught.value) == "digits has no option 'image_size'; digits takes no options"
    with pytest.raises(DatasetError, match="^mnist has no option 'seeds'; mnist takes no options"):
        datasets.load_mnist(seeds=3)  # a loader called directly checks its options too


@pytest.mark.parametrize(
    "name, options, message",
    [
        (
            "colored-mnist",
            {"correlation": "abc"},
            "colored-mnist: option correlation='abc' is not a number; "
            "correlation must be a number in [0, 1]",
        ),
        (
            "rotated-mnist",
            {"angles": "abc"},
            "rotated-mnist: option angles='abc' is not a list of numbers; "
            "angles must be comma-separated numbers",
        ),
        (
            "synthetic",
            {"n_train": 2.5},
            "synthetic: option n_train=2.5 is not a whole number; "
            "n_train must be a whole number >= 1",
        ),
        (
            "colored-mnist",
            {"binary_labels": "maybe"},
            "colored-mnist: option binary_labels='maybe' is not true or false; "
            "binary_labels must be true or false",
        ),
        (
            "colored-mnist",
            {"correlation": True},
            "colored-mnist: option correlation=True is not a number; "
            "correlation must be a number in [0, 1]",
        ),
        (
            "pacs",
            {"test_domain": 3},
            "pacs: option test_domain=3 is not text; "
            "test_domain must be one of art_painting, cartoon, photo, sketch",
        ),
    ],
)
def test_option_of_the_wrong_type_is_refused(name, options, message):
    with pytest.raises(DatasetError) as caught:
        load_dataset(name, **options)
    assert str(caught.value) == message


@pytest.mark.parametrize(
    "name, options, message",
    [
        (
            "synthetic",
            {"num_classes": "0"},
            "synthetic: option num_classes=0 is out of range; num_classes must be >= 1",
        ),
        (
            "synthetic",
            {"n_test": -4},
            "synthetic: option n_test=-4 is out of range; n_test must be >= 1",
        ),
        (
            "colored-mnist",
            {"correlation": 1.5},
            "colored-mnist: option correlation=1.5 is out of range; correlation must be in [0, 1]",
        ),
        (
            "colored-mnist",
            {"test_correlation": "-0.1"},
            "colored-mnist: option test_correlation=-0.1 is out of range; "
            "test_correlation must be in [0, 1]",
        ),
        (
            "pacs",
            {"image_size": 0},
            "pacs: option image_size=0 is out of range; image_size must be >= 1",
        ),
        (
            "rotated-mnist",
            {"angles": ""},
            "rotated-mnist: option angles is empty; give at least one number, "
            "e.g. angles=0,15,30,45,60,75",
        ),
        (
            "colored-mnist",
            {"base": "emnist"},
            "colored-mnist: unknown base 'emnist'; choose one of mnist-10k, mnist",
        ),
    ],
)
def test_option_out_of_range_is_refused(name, options, message):
    with pytest.raises(DatasetError) as caught:
        load_dataset(name, **options)
    assert str(caught.value) == message


def test_options_given_as_text_are_converted_with_the_declared_type():
    typed = load_dataset("synthetic", n_train=30, n_test=10, num_features=4, num_classes=3)
    text = load_dataset("synthetic", n_train="30", n_test="10", num_features="4", num_classes="3")
    assert text.x_train.shape == (30, 4) and text.num_classes == 3
    assert torch.equal(typed.x_train, text.x_train) and torch.equal(typed.y_test, text.y_test)


def test_text_angles_and_flags_on_a_fake_mnist(tmp_path):
    write_fake_mnist(tmp_path / "mnist")
    text = load_dataset("rotated-mnist", data_dir=str(tmp_path), base="mnist", angles="0, 90")
    typed = load_dataset("rotated-mnist", data_dir=str(tmp_path), base="mnist", angles=(0, 90))
    assert text.meta["angles"] == [0.0, 90.0] and torch.equal(text.x_train, typed.x_train)
    one = load_dataset("rotated-mnist", data_dir=str(tmp_path), base="mnist", angles=45)
    assert one.meta["angles"] == [45.0] and set(one.domains_train) == {0}
    binary = load_dataset("colored-mnist", data_dir=str(tmp_path), base="mnist", binary_labels="1")
    assert binary.num_classes == 2


# ---------------------------------------------------------------------------- corrupt files


def compressible_idx_gz(path: Path) -> Path:
    # mostly zeros, so gzip really deflates it and a flipped byte lands in coded data
    images = np.zeros((4, 28, 28), dtype=np.uint8)
    images[:, 10:18, 10:18] = 200
    return write_idx(path, images)


def test_a_flipped_byte_anywhere_in_a_gzipped_idx_file_names_the_file(tmp_path):
    path = compressible_idx_gz(tmp_path / "t10k-images-idx3-ubyte.gz")
    intact = path.read_bytes()
    # past the gzip header (10 bytes, then the file name gzip.open stores): deflate data
    # (zlib.error, EOFError) and the CRC/size trailer (BadGzipFile)
    assert intact[3] & 0x08  # FNAME flag
    for position in range(intact.index(b"\0", 10) + 1, len(intact)):
        corrupt = bytearray(intact)
        corrupt[position] ^= 0xFF
        path.write_bytes(bytes(corrupt))
        with pytest.raises(DatasetError) as caught:
            read_idx(path)
        message = str(caught.value)
        assert message.startswith(f"cannot read {path}: ") and "\n" not in message, position


def test_mnist_with_a_corrupt_gzip_stream_is_one_dataset_error(tmp_path):
    import zlib

    write_fake_mnist(tmp_path / "mnist")
    path = compressible_idx_gz(tmp_path / "mnist" / "train-images-idx3-ubyte.gz")
    corrupt = bytearray(path.read_bytes())
    corrupt[corrupt.index(b"\0", 10) + 1] ^= 0xFF  # the first byte of deflate data
    path.write_bytes(bytes(corrupt))
    with pytest.raises(zlib.error):  # the case that used to escape as a traceback
        gzip.decompress(bytes(corrupt))
    with pytest.raises(DatasetError, match="^cannot read .*train-images-idx3-ubyte.gz: "):
        load_dataset("mnist", data_dir=str(tmp_path))


@pytest.mark.parametrize("layout", ["mnist", "MNIST/raw"])
def test_out_of_range_label_byte_names_the_label_file(tmp_path, layout):
    suffix = ".gz" if layout == "mnist" else ""
    arrays = fake_mnist_arrays()
    labels = arrays[1].copy()
    labels[5] = 12
    write_fake_mnist(tmp_path / layout, suffix=suffix)
    write_idx(tmp_path / layout / f"train-labels-idx1-ubyte{suffix}", labels)
    with pytest.raises(DatasetError) as caught:
        load_dataset("mnist", data_dir=str(tmp_path))
    message = str(caught.value)
    assert message.startswith(
        f"mnist: label 12 at position 5 of {tmp_path / layout / 'train-labels-idx1-ubyte'}"
    )
    assert "outside [0, 10)" in message and "\n" not in message


def test_out_of_range_label_of_any_loader_is_a_dataset_error(tmp_path, monkeypatch):
    import torchvision.datasets.cifar

    write_fake_cifar10(tmp_path, per_batch=12)  # labels 0..11 but 10 classes
    monkeypatch.setattr(torchvision.datasets.cifar, "check_integrity", lambda *a, **k: True)
    with pytest.raises(DatasetError, match=r"^cifar10: label 10 at position 10 of the training"):
        load_dataset("cifar10", data_dir=str(tmp_path))
