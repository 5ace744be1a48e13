"""`stratify data list` and `stratify data download`, on files the tests write: no test
touches the network (the downloads are served by a fake ``urlopen``, or the network is
blocked at the socket)."""

from __future__ import annotations

import errno
import gzip
import hashlib
import io
import pickle
import socket
import struct
import tarfile
import urllib.error
import urllib.request

import numpy as np
import pytest

from stratify.cli.main import main
from stratify.data import sources
from stratify.data.datasets import load_dataset
from stratify.errors import DatasetError

MIRROR = "https://mirror.test/mnist/"


@pytest.fixture
def no_network(monkeypatch):
    """Every connection fails as on a machine without internet."""

    def blocked(*args, **kwargs):
        raise OSError(errno.ENETUNREACH, "network blocked by the test")

    monkeypatch.setattr(socket, "getaddrinfo", blocked)
    monkeypatch.setattr(socket.socket, "connect", blocked)


class Served:
    """A fake ``urllib.request.urlopen`` serving ``files`` (URL -> bytes); any other URL
    fails like an unreachable host. Records the URLs asked for."""

    def __init__(self, files: dict[str, bytes]) -> None:
        self.files = files
        self.asked: list[str] = []

    def __call__(self, request, *args, **kwargs):
        url = request.full_url if isinstance(request, urllib.request.Request) else request
        self.asked.append(url)
        if url not in self.files:
            raise urllib.error.URLError("unreachable in this test")
        response = io.BytesIO(self.files[url])
        response.url = url  # type: ignore[attr-defined]
        response.length = len(self.files[url])  # type: ignore[attr-defined]
        return response


def idx_gz(array: np.ndarray) -> bytes:
    header = struct.pack(">HBB", 0, 0x08, array.ndim) + struct.pack(
        ">" + "I" * array.ndim, *array.shape
    )
    return gzip.compress(header + array.astype(np.uint8).tobytes(), mtime=0)


def md5(data: bytes) -> str:
    return hashlib.md5(data).hexdigest()


def fake_mnist_test_files() -> dict[str, bytes]:
    """The two MNIST test files' names -> gzipped IDX bytes of the official shapes."""
    images = np.zeros((10000, 28, 28), dtype=np.uint8)
    labels = np.arange(10000) % 10
    images[np.arange(10000), labels, labels] = 255  # label l lights pixel (l, l)
    return {
        "t10k-images-idx3-ubyte.gz": idx_gz(images),
        "t10k-labels-idx1-ubyte.gz": idx_gz(labels),
    }


@pytest.fixture
def mnist_mirror(monkeypatch):
    """torchvision's MNIST mirrors and checksums replaced by a fake mirror of test files."""
    from torchvision.datasets import MNIST

    files = fake_mnist_test_files()
    resources = [(name, md5(data)) for name, data in files.items()]
    monkeypatch.setattr(MNIST, "mirrors", [MIRROR])
    monkeypatch.setattr(MNIST, "resources", resources)
    served = Served({MIRROR + name: data for name, data in files.items()})
    monkeypatch.setattr(urllib.request, "urlopen", served)
    return served, files


def run(capsys, *arguments: str) -> tuple[int, str, str]:
    try:
        main(list(arguments))
        code = 0
    except SystemExit as stop:
        code = int(stop.code or 0)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def row(output: str, dataset: str) -> str:
    (line,) = [line for line in output.splitlines() if line.startswith(f"│ {dataset} ")]
    return line


def test_download_without_network_is_one_line_and_writes_nothing(tmp_path, capsys, no_network):
    target = tmp_path / "new" / "data"
    code, out, err = run(capsys, "data", "download", "mnist-10k", "--dir", str(target))
    assert code == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("error: mnist-10k: cannot download t10k-images-idx3-ubyte.gz")
    assert "(no network?)" in lines[0] and "network blocked by the test" in lines[0]
    assert f"nothing was written to {target}" in lines[0]
    assert not target.exists()  # the folder it made for the download is gone again
    # a folder that was there keeps exactly what it held
    kept = tmp_path / "kept"
    kept.mkdir()
    (kept / "notes.txt").write_text("mine")
    code, _, err = run(capsys, "data", "download", "mnist-10k", "--dir", str(kept))
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert sorted(path.name for path in kept.iterdir()) == ["notes.txt"]


def test_download_places_the_checked_files_where_the_loader_reads_them(
    tmp_path, capsys, mnist_mirror
):
    served, files = mnist_mirror
    target = tmp_path / "data"
    code, out, err = run(capsys, "data", "list", "--data-dir", str(target))
    assert code == 0 and "missing" in row(out, "mnist-10k")
    code, out, err = run(capsys, "data", "download", "mnist-10k", "--dir", str(target))
    assert code == 0, err
    assert (target / "mnist" / "t10k-labels-idx1-ubyte.gz").read_bytes() == files[
        "t10k-labels-idx1-ubyte.gz"
    ]
    assert sorted(path.name for path in target.iterdir()) == ["mnist"]  # no staging left
    assert "mnist-10k: ready" in out
    code, out, _ = run(capsys, "data", "list", "--data-dir", str(target))
    assert "present" in row(out, "mnist-10k") and "present" in row(out, "colored-mnist")
    assert "missing" in row(out, "mnist")  # the training files are not there
    data = load_dataset("mnist-10k", data_dir=str(target))
    assert len(data.x_train) == 8000 and len(data.x_test) == 2000
    # a second download finds them and asks the mirror for nothing
    asked = len(served.asked)
    code, out, _ = run(capsys, "data", "download", "mnist-10k", "--dir", str(target))
    assert code == 0 and "already present" in out and len(served.asked) == asked


def test_a_file_with_the_wrong_checksum_is_never_placed(tmp_path, capsys, mnist_mirror):
    served, files = mnist_mirror
    served.files[MIRROR + "t10k-labels-idx1-ubyte.gz"] = b"not the labels"
    target = tmp_path / "data"
    target.mkdir()
    code, out, err = run(capsys, "data", "download", "mnist-10k", "--dir", str(target))
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "t10k-labels-idx1-ubyte.gz" in err and "MD5" in err and "no network" not in err
    # the images arrived intact, but without the labels nothing is renamed into place
    assert list(target.iterdir()) == []


def test_mnist_10k_downloads_the_official_test_files(monkeypatch, tmp_path):
    # the MD5s of the official MNIST test files (an independent reference: the issue's)
    fetched = []
    monkeypatch.setattr(sources, "fetch", lambda resource, folder: fetched.append(resource))
    with pytest.raises(DatasetError, match="the download lacks mnist/t10k-images"):
        sources.download("mnist-10k", tmp_path)  # nothing was really fetched
    assert [(r.filename, r.md5) for r in fetched] == [
        ("t10k-images-idx3-ubyte.gz", "9fb629c4189551a2d022fa330f9573f3"),
        ("t10k-labels-idx1-ubyte.gz", "ec29112dd5afa0611ce80d1b7f02629c"),
    ]
    assert list(tmp_path.iterdir()) == []


def cifar_archive() -> tuple[bytes, dict[str, str]]:
    """A CIFAR-10-shaped archive of tiny batches, and each member's MD5."""
    members, checksums = {}, {}
    for name in ["data_batch_1", "test_batch"]:
        batch = {
            b"data": np.zeros((2, 3072), dtype=np.uint8),
            b"labels": [0, 1],
            b"filenames": [b"a", b"b"],
        }
        members[name] = pickle.dumps(batch)
    members["batches.meta"] = pickle.dumps({"label_names": ["zero", "one"]})
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for name, data in members.items():
            info = tarfile.TarInfo(f"cifar-10-batches-py/{name}")
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
            checksums[name] = md5(data)
    return buffer.getvalue(), checksums


def test_cifar_download_extracts_checks_and_renames_the_folder(tmp_path, capsys, monkeypatch):
    from torchvision.datasets import CIFAR10

    archive, checksums = cifar_archive()
    url = "https://mirror.test/cifar/cifar-10-python.tar.gz"
    monkeypatch.setattr(CIFAR10, "url", url)
    monkeypatch.setattr(CIFAR10, "tgz_md5", md5(archive))
    monkeypatch.setattr(CIFAR10, "train_list", [["data_batch_1", checksums["data_batch_1"]]])
    monkeypatch.setattr(CIFAR10, "test_list", [["test_batch", checksums["test_batch"]]])
    meta = {"filename": "batches.meta", "key": "label_names", "md5": checksums["batches.meta"]}
    monkeypatch.setattr(CIFAR10, "meta", meta)
    monkeypatch.setattr(urllib.request, "urlopen", Served({url: archive}))
    target = tmp_path / "data"
    code, _, err = run(capsys, "data", "download", "cifar10", "--dir", str(target))
    assert code == 0, err
    assert sorted(path.name for path in target.iterdir()) == ["cifar-10-batches-py"]
    assert sorted(p.name for p in (target / "cifar-10-batches-py").iterdir()) == sorted(checksums)
    code, out, _ = run(capsys, "data", "list", "--data-dir", str(target))
    assert "present" in row(out, "cifar10") and "missing" in row(out, "cifar100")


def test_an_incomplete_extracted_folder_is_not_merged_into(tmp_path, capsys, no_network):
    (tmp_path / "cifar-10-batches-py").mkdir()
    (tmp_path / "cifar-10-batches-py" / "data_batch_1").write_bytes(b"x")
    code, _, err = run(capsys, "data", "download", "cifar10", "--dir", str(tmp_path))
    assert code == 2 and "exists but lacks" in err and "data_batch_2" in err
    assert [p.name for p in (tmp_path / "cifar-10-batches-py").iterdir()] == ["data_batch_1"]


@pytest.mark.parametrize(
    "name, message",
    [
        ("pacs", "pacs cannot be downloaded by stratify; by hand: the PACS images"),
        ("covtype", "covtype cannot be downloaded by stratify; by hand: covtype.data.gz"),
        ("digits", "digits cannot be downloaded by stratify; it needs no files"),
        ("nope", "unknown dataset 'nope'; choose one of"),
    ],
)
def test_datasets_that_cannot_be_downloaded_say_how_to_get_them(
    tmp_path, capsys, no_network, name, message
):
    code, _, err = run(capsys, "data", "download", name, "--dir", str(tmp_path / "d"))
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "d").exists()


def test_list_reads_the_environment_s_folder_and_names_what_is_lacking(
    tmp_path, capsys, monkeypatch
):
    (tmp_path / "mnist").mkdir()
    (tmp_path / "mnist" / "t10k-images-idx3-ubyte").write_bytes(b"")  # gzipped or not
    monkeypatch.setenv("STRATIFY_DATA_DIR", str(tmp_path))
    code, out, _ = run(capsys, "data", "list")
    assert code == 0 and f"{tmp_path} (from STRATIFY_DATA_DIR)" in out.replace("\n", " ")
    assert "missing" in row(out, "mnist-10k") and "lacks" in row(out, "mnist-10k")
    assert "bundled" in row(out, "digits")
    (tmp_path / "mnist" / "t10k-labels-idx1-ubyte.gz").write_bytes(b"")
    code, out, _ = run(capsys, "data", "list")
    assert "present" in row(out, "mnist-10k")


@pytest.mark.data
def test_list_says_present_for_the_shared_mnist_files(shared_data_dir, capsys):
    code, out, _ = run(capsys, "data", "list", "--data-dir", shared_data_dir)
    assert code == 0 and "present" in row(out, "mnist-10k")


def test_a_garbage_file_of_the_right_name_is_never_already_present(tmp_path, capsys, mnist_mirror):
    served, files = mnist_mirror
    target = tmp_path / "data"
    (target / "mnist").mkdir(parents=True)
    for name in files:
        (target / "mnist" / name).write_bytes(b"garbage!")  # 8 bytes, the right names
    code, out, err = run(capsys, "data", "download", "mnist-10k", "--dir", str(target))
    assert code == 2 and "already present" not in out
    assert "does not match its published MD5" in err and len(err.strip().splitlines()) == 1
    assert (target / "mnist" / "t10k-labels-idx1-ubyte.gz").read_bytes() == b"garbage!"
    # one good file and one bad: the bad one is still refused, nothing is placed
    (target / "mnist" / "t10k-images-idx3-ubyte.gz").write_bytes(files["t10k-images-idx3-ubyte.gz"])
    code, _, err = run(capsys, "data", "download", "mnist-10k", "--dir", str(target))
    assert code == 2 and "t10k-labels-idx1-ubyte.gz does not match" in err


@pytest.mark.parametrize(
    "command", [["data", "list", "--data-dir"], ["data", "download", "mnist-10k", "--dir"]]
)
def test_a_symlink_loop_as_the_data_folder_is_one_line(tmp_path, capsys, command):
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    code, _, err = run(capsys, *command, str(tmp_path / "a"))
    assert code == 2 and "a symlink loop" in err and len(err.strip().splitlines()) == 1
