"""The compiled single-sample step against the eager loop it replaces.

One test compiles with inductor (a tiny MLP, 2 steps per call: about 10 s on a quiet
machine, instant from inductor's on-disk cache); the others use the ``aot_eager`` backend,
which captures the same graph without generating code, or no compile at all.
"""

import copy

import numpy as np
import pytest
import torch
from engines import tiny_engine

import stratify.compiled
from stratify.compiled import AUTO_COMPILE_AFTER_STEPS, CompileSwitch
from stratify.config import TrainConfig
from stratify.data.datasets import load_dataset
from stratify.errors import TrainingError
from stratify.experiment import build_experiment


@pytest.fixture(scope="module")
def tiny_data():
    # 3 classes x 13 repeats = 39 entries per epoch: an odd count leaves an eager tail
    return load_dataset(
        "synthetic", device="cpu", seed=0, n_train=240, n_test=30, num_features=6, num_classes=3
    )


def stratify_engine(data, compile, momentum=0.0, lr=0.05):
    """Single-sample Stratify on a 4-client split of ``data``, 13 repeats of each label."""
    return tiny_engine(
        None,
        dataset=data,
        mode="single-sample",
        lr=lr,
        seed=3,
        settings={
            "partition": "dirichlet:1.0",
            "clients": 4,
            "model": "mlp",
            "mlp_hidden": (12,),
            "options": {"compile": compile, "momentum": momentum, "repeat_count": 13},
        },
    )


def train(engine, epochs, steps_per_call=2):
    engine.strategy.steps_per_call = steps_per_call
    losses = [engine.run_epoch(epoch).train_loss for epoch in range(1, epochs + 1)]
    return losses, [p.detach().clone() for p in engine.model.parameters()]


def assert_same_weights(ours, theirs, atol):
    for mine, reference in zip(ours, theirs):
        assert torch.allclose(mine, reference, atol=atol), (mine - reference).abs().max()


@pytest.mark.compile
def test_compiled_step_trains_as_the_eager_loop(tiny_data, monkeypatch):
    # imported here, not at collection: torch._dynamo takes seconds to import
    import torch._dynamo.utils

    monkeypatch.setattr(stratify.compiled, "_SHARED", {})  # compile here, whatever ran before
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    eager_losses, eager = train(stratify_engine(tiny_data, "off"), epochs=2)
    compiled_losses, compiled = train(stratify_engine(tiny_data, "on"), epochs=2)
    assert_same_weights(compiled, eager, atol=1e-5)
    assert np.allclose(compiled_losses, eager_losses, rtol=1e-5)
    # one graph for every call of both epochs (lr and the indices are tensor inputs), and
    # a second model of the architecture reuses it
    train(stratify_engine(tiny_data, "on"), epochs=1)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] - graphs == 1


@pytest.mark.compile
def test_compiled_momentum_keeps_the_optimizer_state(tiny_data, monkeypatch):
    monkeypatch.setattr(stratify.compiled, "BACKEND", "aot_eager")
    eager_engine = stratify_engine(tiny_data, "off", momentum=0.5, lr=0.02)
    _, eager = train(eager_engine, epochs=2)
    # a compiled epoch, then an eager one: the eager epoch continues from the momentum
    # buffers the compiled step left in the optimizer
    engine = stratify_engine(tiny_data, "on", momentum=0.5, lr=0.02)
    train(engine, epochs=1, steps_per_call=3)
    engine.strategy.options.compile = "off"
    engine.run_epoch(2)
    ours = [p.detach() for p in engine.model.parameters()]
    assert_same_weights(ours, eager, atol=1e-5)
    for parameter, reference in zip(engine.model.parameters(), eager_engine.model.parameters()):
        mine = engine.strategy.optimizer.state[parameter]["momentum_buffer"]
        theirs = eager_engine.strategy.optimizer.state[reference]["momentum_buffer"]
        assert torch.allclose(mine, theirs, atol=1e-5)


def test_auto_compiles_once_the_run_is_long_and_resumes_at_the_same_point(tiny_data):
    engine = stratify_engine(tiny_data, "auto")
    strategy, context = engine.strategy, engine.context
    assert not strategy.uses_compiled_step(context)
    engine.run_epoch(1)
    assert strategy.steps_made == 39 and not strategy.uses_compiled_step(context)
    strategy.steps_made = AUTO_COMPILE_AFTER_STEPS
    assert strategy.uses_compiled_step(context)
    resumed = stratify_engine(tiny_data, "auto")
    resumed.strategy.load_state_dict(strategy.state_dict())
    assert resumed.strategy.uses_compiled_step(resumed.context)
    never = stratify_engine(tiny_data, "off")
    never.strategy.steps_made = 10 * AUTO_COMPILE_AFTER_STEPS
    assert not never.strategy.uses_compiled_step(never.context)


def failing_backend(graph, example_inputs):
    raise RuntimeError("no C compiler here\nsecond line")


@pytest.mark.compile
def test_a_failed_compile_stops_on_and_falls_back_to_eager_in_auto(tiny_data, monkeypatch):
    monkeypatch.setattr(stratify.compiled, "BACKEND", failing_backend)
    with pytest.raises(TrainingError, match="--compile on: the compiled step failed") as error:
        train(stratify_engine(tiny_data, "on"), epochs=1)
    assert "\n" not in str(error.value)
    _, eager = train(stratify_engine(tiny_data, "off"), epochs=2)
    engine = stratify_engine(tiny_data, "auto")
    engine.strategy.steps_made = AUTO_COMPILE_AFTER_STEPS
    with pytest.warns(UserWarning, match="continuing eagerly"):
        engine.run_epoch(1)
    assert not engine.strategy.uses_compiled_step(engine.context)
    engine.run_epoch(2)
    # the failed call trained nothing: the run equals an eager one
    assert_same_weights([p.detach() for p in engine.model.parameters()], eager, atol=0)


# -- compiled local training of the single-sample baselines -------------------------------


def local_engine(data, algorithm, compile, **options):
    config = TrainConfig(
        dataset="digits",
        partition="dirichlet:0.5",
        clients=4,
        algorithm=algorithm,
        lr=0.01,
        seed=2,
        secure=False,
        options={"compile": compile, **options},
    )
    return build_experiment(config, dataset=data).engine


@pytest.mark.compile
@pytest.mark.parametrize(
    "algorithm, options",
    [("fedavg", {}), ("fedprox", {"mu": 0.5}), ("scaffold", {}), ("sfl", {"local_momentum": 0.5})],
)
def test_compiled_local_training_trains_as_the_eager_loop(algorithm, options, monkeypatch):
    """FedProx's proximal gradient, SCAFFOLD's correction, SFL's weight decay (and here a
    momentum) are part of the compiled step: a round (1,437 single-sample steps) ends
    where the eager loop ends it, within 1e-3 of how far the weights moved (the
    tolerance of ``bench steps``; float rounding, amplified by batch-of-one SGD)."""
    monkeypatch.setattr(stratify.compiled, "BACKEND", "aot_eager")
    data = load_dataset("digits", device="cpu")
    eager = local_engine(data, algorithm, "off", **options)
    compiled = local_engine(data, algorithm, "on", **options)
    start = [p.detach().clone() for p in eager.model.parameters()]
    ours, theirs = compiled.run_epoch(1), eager.run_epoch(1)
    assert (ours.steps, ours.transfers) == (theirs.steps, theirs.transfers)
    assert ours.train_loss == pytest.approx(theirs.train_loss, rel=1e-4)
    mine = [p.detach() for p in compiled.model.parameters()]
    reference = [p.detach() for p in eager.model.parameters()]
    difference = max(float((a - b).abs().max()) for a, b in zip(mine, reference))
    moved = max(float((b - a).abs().max()) for a, b in zip(start, reference))
    assert difference < 1e-3 * moved
    assert compiled.strategy.state_dict()["steps_made"] == 1437


def test_settings_the_compiled_step_cannot_express_train_eagerly_with_one_warning():
    data = load_dataset("digits", device="cpu")
    engine = local_engine(data, "fedavg", "on")
    trainer, model = engine.context.trainer, engine.model
    reference = copy.deepcopy(model)
    indices = np.arange(40)
    switch = CompileSwitch("on")
    with pytest.warns(UserWarning, match="local training runs eagerly: local batches of 4"):
        trainer.train(
            model,
            indices,
            epochs=1,
            batch_size=4,
            lr=0.1,
            rng=np.random.default_rng(0),
            compile=switch,
        )
    trainer.train(
        model, indices, epochs=1, batch_size=4, lr=0.1, rng=np.random.default_rng(1), compile=switch
    )
    assert len(trainer.warned) == 1
    trainer.train(reference, indices, epochs=1, batch_size=4, lr=0.1, rng=np.random.default_rng(0))
    trainer.train(reference, indices, epochs=1, batch_size=4, lr=0.1, rng=np.random.default_rng(1))
    assert_same_weights(list(model.parameters()), list(reference.parameters()), atol=0)


def test_inductor_options_this_torch_lacks_are_left_out():
    # torch.compile refuses an option its inductor does not know (torch 2.11 lacks
    # realize_cpu_opcount_threshold): the vectorised step must still compile there
    from stratify.compiled import known_inductor_options

    assert known_inductor_options({"max_autotune": False, "not_an_inductor_option": 1}) == {
        "max_autotune": False
    }
