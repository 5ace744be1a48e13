"""The stream's model interface (docs/streaming.md, "The model"): the learner holds a
StreamModel and never asks which kind it is; the NumPy and the torch implementation
answer every question of the protocol alike."""

from __future__ import annotations

import ast
import math
from pathlib import Path

import numpy as np
import pytest
import torch

import stratify.stream
from stratify.nn.models import build_model
from stratify.stream.buffers import ClientBuffers
from stratify.stream.config import StreamConfig
from stratify.stream.features import StreamFeatures
from stratify.stream.mlp import NumpyMLP
from stratify.stream.model import StreamModel
from stratify.stream.numpy_model import NumpyStreamModel
from stratify.stream.step import SingleSampleStep
from stratify.stream.torch_model import TorchStreamModel

STREAM = Path(stratify.stream.__file__).parent
#: what the learner must not know: the model implementations and the kinds they wrap
MODEL_KINDS = {
    "NumpyMLP",
    "NumpyStreamModel",
    "TorchStreamModel",
    "MLPArrays",
    "MLP",
    "Module",
    "Tensor",
    "ndarray",
}
MODEL_MODULES = {"numpy_model", "torch_model", "mlp", "classifier"}
HIDDEN = (8, 5)
FEATURES = 6


def names_in(node: ast.AST) -> set[str]:
    """Every name and attribute an expression mentions."""
    found = set()
    for part in ast.walk(node):
        if isinstance(part, ast.Name):
            found.add(part.id)
        elif isinstance(part, ast.Attribute):
            found.add(part.attr)
    return found


def test_the_learner_never_asks_which_kind_of_model_it_holds():
    """No isinstance (or type() comparison) on a model kind and no import of an implementation in
    stratify/stream/learner.py, which stays under 400 lines."""
    source = (STREAM / "learner.py").read_text()
    assert len(source.splitlines()) <= 400
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            if node.func.id in ("isinstance", "issubclass") and len(node.args) == 2:
                assert not names_in(node.args[1]) & MODEL_KINDS, ast.unparse(node)
        if isinstance(node, ast.Compare):  # type(x) is K
            assert not names_in(node) & MODEL_KINDS, ast.unparse(node)
        if isinstance(node, ast.ImportFrom):
            module = (node.module or "").rsplit(".", 1)[-1]
            assert module not in MODEL_MODULES, f"the learner imports {node.module}"
        if isinstance(node, ast.Import):
            assert not {a.name.rsplit(".", 1)[-1] for a in node.names} & MODEL_MODULES
    assert '"numpy"' not in source and '"torch"' not in source  # no kind names compared


def protocol_members() -> set[str]:
    members = set(StreamModel.__annotations__)
    members |= {name for name in vars(StreamModel) if not name.startswith("_")}
    return members


@pytest.mark.parametrize("kind", [NumpyStreamModel, TorchStreamModel])
def test_both_models_have_every_member_of_the_protocol(kind):
    model = pair(scale="none")[0 if kind is NumpyStreamModel else 1]
    assert isinstance(model, kind)
    missing = {name for name in protocol_members() if not hasattr(model, name)}
    assert missing == set()


def never(*args: object) -> None:
    raise AssertionError("the features fix their shape by hand here")


def features_of(scale: str) -> StreamFeatures:
    features = StreamFeatures(StreamConfig(secure=False, scale=scale), "cpu", never, never)
    features.fix((FEATURES,))
    return features


def pair(scale: str = "running", arrays: bool = False) -> tuple[NumpyStreamModel, TorchStreamModel]:
    """The NumPy model and a torch model of the same weights, standardising through the
    same statistics; the torch one predicts with torch unless ``arrays``."""
    features = features_of(scale)
    rng = np.random.default_rng(1)
    for _ in range(30):
        features.update(rng.normal(3.0, 2.0, FEATURES).astype(np.float32))
    network = NumpyMLP.build(FEATURES, 4, HIDDEN, seed=1)
    network.storage *= 4.0  # larger weights: predictions that differ between samples
    twin = build_model("mlp", (FEATURES,), 4, hidden=HIDDEN)
    twin.load_state_dict({name: torch.from_numpy(v) for name, v in network.state_dict().items()})
    torch_model = TorchStreamModel(twin, "cpu", features)
    if not arrays:
        torch_model.arrays = None
    return NumpyStreamModel(network, features), torch_model


@pytest.mark.parametrize("arrays", [False, True])
def test_both_models_predict_alike(arrays):
    numpy_model, torch_model = pair(arrays=arrays)
    rng = np.random.default_rng(2)
    batch = rng.normal(3.0, 4.0, (64, FEATURES)).astype(np.float32)
    known = [2, 0, 3]
    for raw in batch:
        np.testing.assert_allclose(
            numpy_model.probabilities(raw, known),
            torch_model.probabilities(raw, known),
            rtol=1e-5,
            atol=1e-6,
        )
    np.testing.assert_array_equal(
        numpy_model.predict_rows(batch, known), torch_model.predict_rows(batch, known)
    )
    assert numpy_model.rows == torch_model.rows == 4 and numpy_model.is_mlp and torch_model.is_mlp


def test_both_models_grow_imprint_and_save_alike():
    """The same weights after widening the input and the classifier (the old rows kept,
    the new columns zero) and imprinting a row; the state under the same names."""
    numpy_model, torch_model = pair()
    raw = np.linspace(-1.0, 2.0, FEATURES).astype(np.float32)
    numpy_model.features.scaler.widen((FEATURES + 2,))  # one StreamFeatures for both
    for model in (numpy_model, torch_model):
        model.widen_input(FEATURES + 2)
        assert model.widen_classifier(6, seed=0)  # the replaced parameters
        model.imprint(4, np.concatenate([raw, [0.0, 0.0]]).astype(np.float32), [0, 1, 2])
        assert model.rows == 6
    mine, theirs = numpy_model.state_dict(), torch_model.state_dict()
    assert mine.keys() == theirs.keys()
    for name in mine:
        # rows 4 and 5 are drawn by each kind's own generator; row 4 is then imprinted
        rows = slice(None) if not name.startswith("head") else [0, 1, 2, 3, 4]
        np.testing.assert_allclose(mine[name][rows], theirs[name][rows], rtol=1e-5, atol=1e-6)
    assert not np.array_equal(mine["head.weight"][4], mine["head.weight"][5])


@pytest.mark.parametrize("kind", [0, 1])
def test_saved_weights_come_back_and_a_non_finite_weight_is_seen(kind):
    model = pair()[kind]
    before = model.state_dict()
    saved = model.save_weights()
    model.load_state_dict({name: np.full_like(value, np.inf) for name, value in before.items()})
    assert not model.finite([])
    model.restore_weights(saved)
    assert model.finite([])
    for name, value in model.state_dict().items():
        np.testing.assert_array_equal(value, before[name])
    if kind == 1:  # only torch steps leave their losses on the device
        assert not model.finite([torch.tensor(math.nan)])


@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_a_learning_step_is_the_same_step_on_either_model(momentum, monkeypatch):
    """``learn`` on the buffered sample: the NumPy model in NumPy, the torch model with
    autograd; the same loss and weights within float tolerance."""
    from stratify.stream import step as step_module

    numpy_model, torch_model = pair()
    buffers = ClientBuffers(4, (FEATURES,), "cpu")
    buffers.add_client()
    buffers.add_placeholder(0)
    slot = buffers.insert(0, np.arange(FEATURES, dtype=np.float32), 2, 0, 1)
    numpy_step = SingleSampleStep(numpy_model.network, lr=0.1, momentum=momentum)
    # autograd, not NumPy views of the torch MLP's weights
    monkeypatch.setattr(step_module.MLPArrays, "of", classmethod(lambda cls, model: None))
    torch_step = SingleSampleStep(torch_model.network, lr=0.1, momentum=momentum)
    for _ in range(3):
        mine = numpy_model.learn(numpy_step, buffers, slot)
        theirs = float(torch_model.learn(torch_step, buffers, slot))
        assert mine == pytest.approx(theirs, rel=1e-5)
    for name, value in numpy_model.state_dict().items():
        np.testing.assert_allclose(value, torch_model.state_dict()[name], rtol=1e-4, atol=1e-6)
