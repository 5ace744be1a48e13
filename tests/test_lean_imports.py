"""What the stream path needs loads without torch (issue 38: ``import torch`` alone costs
more memory than a whole stream may take), and the array checkpoint that lets a stream
save and resume without it (docs/architecture.md, "Run folder" and "Options")."""

from __future__ import annotations

import ast
import io
import json
import math
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

from stratify.common_options import CommonOptions
from stratify.config import TrainConfig
from stratify.errors import CheckpointError, ConfigError
from stratify.nn.catalog import MLP_HIDDEN, MODELS, mlp_weight_count
from stratify.nn.models import build_model
from stratify.runfolder import (
    ARRAY_TREE,
    array_checkpoint_bytes,
    checkpoint_bytes,
    is_array_checkpoint,
    read_checkpoint,
)
from stratify.stream.config import StreamConfig

ROOT = Path(__file__).resolve().parents[1]

#: the torch-free modules the stream path imports from outside stratify.stream
TORCH_FREE = (
    "stratify.runfolder",
    "stratify.runfiles",
    "stratify.common_options",
    "stratify.nn.catalog",
    "stratify.cli.flags",
    "stratify.cli.main",
    "stratify.registry.ckks",
)


def stream_config_imports() -> list[str]:
    """The stratify modules stratify/stream/config.py imports at module level, outside
    the stream package."""
    tree = ast.parse((ROOT / "stratify" / "stream" / "config.py").read_text())
    return [
        node.module
        for node in tree.body
        if isinstance(node, ast.ImportFrom)
        and node.module
        and node.module.startswith("stratify")
        and not node.module.startswith("stratify.stream")
    ]


def first_torch_importer(modules: list[str]) -> str:
    """Import ``modules`` in order in a fresh interpreter; the first after which torch is
    loaded, or ``""``."""
    script = (
        "import importlib, sys\n"
        "for name in sys.argv[1:]:\n"
        "    importlib.import_module(name)\n"
        "    if 'torch' in sys.modules:\n"
        "        print(name)\n"
        "        break\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, *modules], capture_output=True, text=True, check=True
    )
    return done.stdout.strip()


def test_the_stream_paths_modules_outside_the_stream_package_do_not_load_torch():
    modules = [*TORCH_FREE, *stream_config_imports()]
    assert "stratify.common_options" in modules and "stratify.nn.catalog" in modules
    assert first_torch_importer(modules) == ""


@pytest.mark.parametrize("module", ["stratify.stream.config", "stratify.cli.stream"])
def test_the_stream_command_does_not_load_torch(module):
    assert first_torch_importer([module]) == ""


def test_an_array_checkpoint_is_written_and_read_without_torch(tmp_path):
    script = (
        "import sys\nfrom pathlib import Path\nimport numpy as np\n"
        "from stratify.runfolder import array_checkpoint_bytes, read_checkpoint\n"
        "path = Path(sys.argv[1])\n"
        "path.write_bytes(array_checkpoint_bytes({'w': np.ones(3, np.float32)}))\n"
        "assert read_checkpoint(path)['w'].dtype == np.float32\n"
        "print('torch' in sys.modules)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "checkpoint.pt")],
        capture_output=True,
        text=True,
        check=True,
    )
    assert done.stdout.strip() == "False"


def test_the_mlps_weights_counted_without_torch_are_the_built_models():
    for shape, classes, hidden in [((20,), 5, None), ((1, 8, 8), 10, (7,)), ((3,), 1, (4, 2))]:
        model = build_model("mlp", shape, classes, hidden=hidden)
        built = sum(parameter.numel() for parameter in model.parameters())
        assert mlp_weight_count(shape, classes, hidden) == built
    assert build_model("mlp", (4,), 2).head.in_features == MLP_HIDDEN[-1]


def test_every_model_name_the_options_offer_builds():
    for owner in (CommonOptions, TrainConfig, StreamConfig):
        assert owner.__dataclass_fields__["model"].metadata["choices"] == tuple(MODELS)
    for name in MODELS:
        build_model(name, (3, 32, 32), 10, norm="gn" if name.startswith("resnet") else None)


def test_a_model_too_large_for_memory_is_refused_with_or_without_torch():
    weights = (10 + 1) * 10**6 + (10**6 + 1) * 2 * 10**6 + (2 * 10**6 + 1) * 1
    with pytest.raises(ConfigError, match=rf"--model mlp .*\({weights:,} weights\)"):
        StreamConfig(input_shape=(10,), mlp_hidden=(10**6, 2 * 10**6), num_classes=1)
    with pytest.raises(ConfigError, match="--model cnn for samples of shape 1,10000,10000"):
        StreamConfig(model="cnn", input_shape=(1, 10_000, 10_000), capacity=1)
    StreamConfig(model="cnn", input_shape=(1, 28, 28))


def state():
    """A nested state of every kind an array checkpoint stores."""
    return {
        "labels": [1, True, "a", None, 0, False, "1"],
        "floats": [0.1, -0.0, 1e308, 5e-324, math.inf, -math.inf, math.nan],
        "big": 2**70,
        "pair": (3, "b"),
        "nested": {"$array": {"$$x": [[], {}]}, "": "empty key"},
        "arrays": {
            "int64": np.arange(-3, 3, dtype=np.int64).reshape(2, 3),
            "float32": np.array([[np.nan, -np.inf, 1.5]], dtype=np.float32),
            "bool": np.array([True, False, True]),
            "uint8": np.arange(250, 256, dtype=np.uint8),
            "empty": np.zeros((0, 4), dtype=np.float32),
            "scalar": np.array(7, dtype=np.int64),
            "fortran": np.asfortranarray(np.arange(6.0).reshape(2, 3)),
        },
        "same array twice": [np.ones(2), np.ones(2)],
    }


def read_back(tmp_path, data):
    path = tmp_path / "checkpoint.pt"
    path.write_bytes(data)
    return read_checkpoint(path)


def same(left, right) -> bool:
    """Equal in value and in every type, NaN equal to NaN, arrays in dtype and shape."""
    if isinstance(left, np.ndarray):
        return (
            type(right) is np.ndarray
            and left.dtype == right.dtype
            and left.shape == right.shape
            and np.array_equal(left, right, equal_nan=left.dtype.kind == "f")
        )
    if type(left) is not type(right):
        return False
    if isinstance(left, dict):
        return left.keys() == right.keys() and all(same(left[k], right[k]) for k in left)
    if isinstance(left, list):
        return len(left) == len(right) and all(map(same, left, right))
    if isinstance(left, float):
        return math.copysign(1, left) == math.copysign(1, right) and (
            left == right or math.isnan(left) and math.isnan(right)
        )
    return left == right


def test_an_array_checkpoint_reads_back_what_was_written(tmp_path):
    written = state()
    data = array_checkpoint_bytes(written)
    assert is_array_checkpoint(data)
    back = read_back(tmp_path, data)
    expected = {**written, "pair": [3, "b"]}  # a tuple comes back as a list
    assert same(back, expected)
    assert back["labels"][:2] == [1, True] and type(back["labels"][1]) is bool
    assert back["arrays"]["int64"].flags.writeable
    assert array_checkpoint_bytes(written) == data  # the same state, the same bytes


@pytest.mark.parametrize(
    ("value", "where"),
    [
        (torch.zeros(2), r"state\['model'\]\[1\]\['w'\]: cannot store a torch.Tensor"),
        ({3: "c"}, r"state\['model'\]\[1\]\['w'\]: cannot store the int key 3"),
        (np.int64(3), r"cannot store a numpy.int64"),
        (np.array([object()]), r"cannot store an array of dtype object"),
        ({1, 2}, r"cannot store a builtins.set"),
    ],
)
def test_a_value_an_array_checkpoint_cannot_store_is_named(value, where):
    with pytest.raises(TypeError, match=where):
        array_checkpoint_bytes({"model": [0, {"w": value}]})


def test_a_torch_checkpoint_still_reads(tmp_path):
    back = read_back(tmp_path, checkpoint_bytes({"weights": torch.arange(3.0), "epoch": 2}))
    assert torch.equal(back["weights"], torch.arange(3.0)) and back["epoch"] == 2


def members(data: bytes) -> dict[str, bytes]:
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        return {name: archive.read(name) for name in archive.namelist()}


def archive(parts: dict[str, bytes], compression: int = zipfile.ZIP_STORED) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression) as made:
        for name, data in parts.items():
            made.writestr(name, data)
    return buffer.getvalue()


def pickled_npy(marker: Path) -> bytes:
    """A .npy of an object array whose unpickling would create ``marker``."""
    buffer = io.BytesIO()
    np.save(buffer, np.array([MakesFile(str(marker))], dtype=object), allow_pickle=True)
    return buffer.getvalue()


class MakesFile:
    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (Path.touch, (Path(self.path),))


def damaged(data: bytes, marker: Path) -> dict[str, bytes]:
    parts = members(data)
    tree = json.loads(parts[ARRAY_TREE])
    npy = parts["arrays/0.npy"]
    huge = io.BytesIO()
    header = {"descr": "<i8", "fortran_order": False, "shape": (10**9,)}
    np.lib.format.write_array_header_1_0(huge, header)
    return {
        "truncated early": data[:60],
        "truncated late": data[:-10],
        "a flipped byte": data[:200] + bytes([data[200] ^ 0xFF]) + data[201:],
        "the tree not JSON": archive({**parts, ARRAY_TREE: b"{not json"}),
        "an unknown version": archive(
            {**parts, ARRAY_TREE: json.dumps({**tree, "version": 9}).encode()}
        ),
        "an array missing": archive({ARRAY_TREE: parts[ARRAY_TREE]}),
        "a reference to no array": archive(
            {**parts, ARRAY_TREE: json.dumps({**tree, "state": {"x": {"$array": 99}}}).encode()}
        ),
        "an array shorter than its header": archive({**parts, "arrays/0.npy": npy[:-1]}),
        "an array claiming a huge shape": archive(
            {**parts, "arrays/0.npy": huge.getvalue() + npy[-48:]}
        ),
        "a compressed member": archive(parts, zipfile.ZIP_DEFLATED),
        "a pickled array": archive({**parts, "arrays/0.npy": pickled_npy(marker)}),
        "not a dict": archive({**parts, ARRAY_TREE: json.dumps({**tree, "state": [1]}).encode()}),
    }


def test_a_damaged_or_crafted_array_checkpoint_is_one_line_and_runs_nothing(tmp_path):
    marker = tmp_path / "code ran"
    data = array_checkpoint_bytes(state())
    for what, bad in damaged(data, marker).items():
        with pytest.raises(CheckpointError, match=r"^--resume: .*checkpoint\.pt is ") as caught:
            read_back(tmp_path, bad)
        assert "\n" not in str(caught.value), what
    assert not marker.exists()
