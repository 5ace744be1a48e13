"""FedBR: its contrastive loss, max step, pseudo-data and round on hand-checkable cases."""

import copy
import json
import math

import numpy as np
import pytest
import torch
from conftest import assert_refused_in_one_line
from engines import CLASSES, FEATURES, tiny_engine
from torch import nn

from stratify.baselines import fedbr as fedbr_module
from stratify.baselines.fedbr import (
    FedBR,
    FedBROptions,
    LocalObjective,
    contrastive_loss,
    mixture,
    projection_head,
    random_sample_means,
    soft_cross_entropy,
)
from stratify.cli.main import main
from stratify.config import TrainConfig
from stratify.errors import ConfigError
from stratify.experiment import build_experiment
from stratify.method import ClientUpdate
from stratify.run import Run


class TinyNet(nn.Module):
    """``head(embed(x))`` on 4 features: the layout FedBR needs."""

    def __init__(self, seed=0):
        super().__init__()
        torch.manual_seed(seed)
        self.body = nn.Sequential(nn.Linear(FEATURES, 5), nn.ReLU())
        self.head = nn.Linear(5, CLASSES)

    def embed(self, x):
        return self.body(x)

    def forward(self, x):
        return self.head(self.embed(x))


#: two clients holding 6 and 10 samples whose labels cycle through every class
EVERY_LABEL = [list(range(CLASSES))] * 2


# -- the math ------------------------------------------------------------------------------


def test_contrastive_loss_on_fixed_feature_vectors():
    pseudo, global_, local = (
        torch.tensor([[1.0, 0.0]]),
        torch.tensor([[1.0, 0.0]]),
        torch.tensor([[0.0, 1.0]]),
    )
    # cos(pseudo, global) = 1, cos(pseudo, local) = 0: L = -log(e^2 / (e^2 + e^0))
    loss = contrastive_loss(pseudo, global_, local, 0.5, 0.5)
    assert loss.item() == pytest.approx(math.log(1 + math.exp(-2.0)), abs=1e-6)  # 0.126928
    # τ1 = 1 halves the positive term: -log(e^1 / (e^1 + 1))
    assert contrastive_loss(pseudo, global_, local, 1.0, 0.5).item() == pytest.approx(
        math.log(1 + math.exp(-1.0)), abs=1e-6
    )
    # both cosines 1/√2 with equal temperatures: f1 = f2, L = log 2; the loss is a mean
    pseudo2 = torch.tensor([[1.0, 1.0]])
    both = contrastive_loss(
        torch.cat([pseudo, pseudo2]),
        torch.cat([global_, global_]),
        torch.cat([local, local]),
        0.5,
        0.5,
    )
    assert both.item() == pytest.approx(
        (math.log(1 + math.exp(-2.0)) + math.log(2.0)) / 2, abs=1e-6
    )


def test_each_pair_of_l_con_has_its_own_temperature():
    # cos(pseudo, global) = 1 and cos(pseudo, local) = 3/5 (a 3-4-5 triangle), τ1 = 1 and
    # τ2 = 0.2: L = −log(e^(1/1) / (e^(1/1) + e^(0.6/0.2))) = log(1 + e^(3 − 1))
    pseudo, global_, local = (
        torch.tensor([[1.0, 0.0]]),
        torch.tensor([[1.0, 0.0]]),
        torch.tensor([[3.0, 4.0]]),
    )
    expected = math.log(1 + math.exp(2.0))  # 2.126928
    assert contrastive_loss(pseudo, global_, local, 1.0, 0.2).item() == pytest.approx(expected)
    # swapped: log(1 + e^(0.6/1 − 1/0.2)) = log(1 + e^(−4.4))
    assert contrastive_loss(pseudo, global_, local, 0.2, 1.0).item() == pytest.approx(
        math.log(1 + math.exp(-4.4))
    )
    # a client's objective passes --positive-temperature and --negative-temperature on
    objective, _ = make_objective()
    objective.projection = nn.Identity()
    objective.options = FedBROptions(positive_temperature=1.0, negative_temperature=0.2).for_mode(
        "batch"
    )
    assert objective.contrast(pseudo, global_, local).item() == pytest.approx(expected)


def test_soft_cross_entropy_and_the_projection_head():
    logits = torch.zeros(2, 4)
    assert soft_cross_entropy(logits, torch.full((2, 4), 0.25)).item() == pytest.approx(math.log(4))
    # a one-hot target is the ordinary cross-entropy
    logits = torch.tensor([[2.0, 0.0, -1.0]])
    target = torch.tensor([[0.0, 1.0, 0.0]])
    expected = torch.nn.functional.cross_entropy(logits, torch.tensor([1]))
    assert soft_cross_entropy(logits, target).item() == pytest.approx(expected.item())
    head = projection_head(7)
    widths = [
        (layer.in_features, layer.out_features) for layer in head if isinstance(layer, nn.Linear)
    ]
    assert widths == [(7, 14), (14, 14), (14, 7)]


def test_mixture_is_equation_4():
    pseudo_x = torch.tensor([[0.0, 0.0]])
    pseudo_y = torch.tensor([[0.5, 0.5]])
    x = torch.tensor([[2.0, 4.0], [6.0, 8.0]])
    y = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    mixed_x, mixed_y = mixture(pseudo_x, pseudo_y, x, y, torch.tensor([[1]]))
    assert mixed_x.tolist() == [[3.0, 4.0]] and mixed_y.tolist() == [[0.25, 0.75]]
    mixed_x, mixed_y = mixture(pseudo_x, pseudo_y, x, y, torch.tensor([[0, 1]]))
    torch.testing.assert_close(mixed_x, torch.tensor([[8 / 3, 4.0]]))
    torch.testing.assert_close(mixed_y, torch.tensor([[0.5, 0.5]]))


def test_random_sample_means_average_samples_of_one_client():
    # client 0 holds samples of value 1 and 3, client 1 of value 10 and 30
    x_train = torch.tensor([[1.0], [3.0], [10.0], [30.0]])
    clients = [np.array([0, 1]), np.array([2, 3])]
    means = random_sample_means(
        x_train, clients, count=50, samples_per_mean=2, rng=np.random.default_rng(0)
    )
    assert means.shape == (50, 1)
    values = set(means.reshape(-1).tolist())
    # a mean of two draws (with replacement) from one client, never a mix of clients
    assert values <= {1.0, 2.0, 3.0, 10.0, 20.0, 30.0}
    assert values & {1.0, 2.0, 3.0} and values & {10.0, 20.0, 30.0}


def make_objective(lr=0.1, momentum=0.0, mixture_size=None, seed=0):
    torch.manual_seed(seed)
    model = TinyNet(seed)
    global_model = copy.deepcopy(model).requires_grad_(False)
    projection = projection_head(5).requires_grad_(False)
    pseudo_x = torch.randn(4, FEATURES)
    pseudo_data = "rsm" if mixture_size is None else "mixture"
    options = FedBROptions(pseudo_data=pseudo_data, mixture_size=mixture_size).for_mode("batch")
    objective = LocalObjective(
        projection,
        global_model,
        pseudo_x,
        CLASSES,
        options,
        lr=lr,
        momentum=momentum,
        weight_decay=0.0,
        rng=np.random.default_rng(0),
    )
    return objective, model


def test_the_max_step_ascends_l_con_on_theta_only():
    objective, model = make_objective()
    x = torch.randn(4, FEATURES)
    # the local model has moved away from the global one, so L_con is not at a symmetric point
    with torch.no_grad():
        model.body[0].weight.add_(0.5)
    pseudo = model.embed(objective.pseudo_x).detach()
    global_ = objective.global_model.embed(objective.pseudo_x)
    local = model.embed(x).detach()
    objective.projection.requires_grad_(True)
    before = objective.contrast(pseudo, global_, local)
    gradient = torch.autograd.grad(before, list(objective.projection.parameters()))
    theta = [p.detach().clone() for p in objective.projection.parameters()]
    objective.projection.requires_grad_(False)

    objective.max_step(pseudo, global_, local)
    after = objective.contrast(pseudo, global_, local)
    # θ ← θ + η ∇θ L_con: gradient ascent, so L_con grows
    for old, new, grad in zip(theta, objective.projection.parameters(), gradient):
        torch.testing.assert_close(new.detach(), old + 0.1 * grad)
    assert after.item() > before.item()
    assert not any(p.requires_grad for p in objective.projection.parameters())


def test_the_min_step_leaves_theta_fixed_and_descends_l_con_through_the_features():
    objective, model = make_objective()
    x = torch.randn(6, FEATURES)
    y = torch.tensor([0, 1, 2, 0, 1, 2])
    loss = objective(model, x, y)  # runs the max step, returns the min step's loss
    theta = [p.detach().clone() for p in objective.projection.parameters()]
    loss.backward()
    assert all(p.grad is None for p in objective.projection.parameters())  # θ is fixed
    assert all(p.grad is not None for p in model.parameters())
    # L_con alone: a small step of the features against its gradient lowers it
    pseudo = model.embed(objective.pseudo_x)
    paired = model.embed(x)[torch.arange(4) % 6]
    global_ = objective.global_model.embed(objective.pseudo_x)
    contrast = objective.contrast(pseudo, global_, paired)
    grads = torch.autograd.grad(contrast, list(model.body.parameters()))
    with torch.no_grad():
        for parameter, grad in zip(model.body.parameters(), grads):
            parameter.sub_(0.05 * grad)
        lower = objective.contrast(model.embed(objective.pseudo_x), global_, model.embed(x)[:4])
    assert lower.item() < contrast.item()
    assert all(torch.equal(a, b.detach()) for a, b in zip(theta, objective.projection.parameters()))


def test_the_min_step_loss_is_ce_plus_weighted_soft_ce_plus_weighted_l_con():
    objective, model = make_objective()
    objective.options = FedBROptions(pseudo_weight=0.0, contrast_weight=0.0).for_mode("batch")
    x = torch.randn(4, FEATURES)
    y = torch.tensor([0, 1, 2, 0])
    expected = torch.nn.functional.cross_entropy(model(x), y)
    assert objective(model, x, y).item() == pytest.approx(expected.item())
    objective.options = FedBROptions(pseudo_weight=2.0, contrast_weight=0.0).for_mode("batch")
    uniform = torch.full((4, CLASSES), 1 / CLASSES)
    soft = soft_cross_entropy(model(objective.pseudo_x), uniform)
    assert objective(model, x, y).item() == pytest.approx((expected + 2.0 * soft).item(), rel=1e-6)


# -- the strategy --------------------------------------------------------------------------


def test_a_round_runs_k_iterations_per_client_and_counts_theta_and_pseudo_data():
    strategy = FedBR(local_steps=3, local_batch_size=4)
    engine = tiny_engine(strategy, TinyNet(), (6, 10), client_labels=EVERY_LABEL, test_samples=5)
    first = engine.run_epoch(1)
    assert first.steps == 2 * 3 and first.transfers == 4
    theta_bytes = 4 * sum(p.numel() for p in strategy.projection.parameters())
    pseudo_bytes = 4 * FEATURES * 4  # |D_p| = batch 4, float32 samples of 4 features
    assert strategy.pseudo_x is not None and strategy.pseudo_x.shape == (4, FEATURES)
    model_traffic = first.transfers * engine.model_bytes
    # θ down and up per participant; D_p up once and down to both clients, in round 1 only
    assert first.bytes_sent == model_traffic + 2 * 2 * theta_bytes + 3 * pseudo_bytes
    second = engine.run_epoch(2)
    assert second.bytes_sent == model_traffic + 2 * 2 * theta_bytes


def test_defaults_follow_the_current_official_code():
    options = FedBROptions().for_mode("batch")
    # d382a37: plain SGD, K = 20 iterations of 64, RSM pseudo-data, one path at a time
    assert (options.local_momentum, options.local_weight_decay) == (0.0, 0.0)
    assert (options.local_steps, options.local_batch_size, options.local_epochs) == (20, 64, None)
    assert (options.pseudo_data, options.mixture_size, options.rsm_size) == ("rsm", None, 10)
    assert FedBROptions(pseudo_data="mixture").for_mode("batch").mixture_size == 1
    # the official rates by data set: 1e-3 on the 28×28 MNIST variants, 1e-2 otherwise
    assert FedBR().paper_lr("batch", "rotated-mnist") == FedBR().paper_lr("batch", "mnist-10k")
    assert FedBR().paper_lr("batch", "mnist-10k") == 1e-3
    assert (
        FedBR().paper_lr("batch", "digits")
        == FedBR().lr_for("batch", family="cifar", dataset="cifar10")
        == 1e-2
    )
    # on digits and the MNIST family its own rate, the defaults grids' best (the official
    # one is far below)
    assert FedBR().lr_for("batch", family="digits") == FedBR.card.rates.tuned["digits", "batch"]
    for dataset in ("mnist-10k", "rotated-mnist"):
        assert (
            FedBR().lr_for("batch", family="mnist", dataset=dataset)
            == FedBR.card.rates.tuned["mnist", "batch"]
        )
    config = TrainConfig(
        algorithm="fedbr",
        dataset="digits",
        partition="iid",
        clients=4,
        epochs=1,
        secure=False,
        mode="batch",
    )
    assert build_experiment(config).lr == FedBR.card.rates.tuned["digits", "batch"]
    # the docstring names the version each default follows
    for cited in ("d382a37", "3e24f7f", "plain SGD", "lr 1e-3 on 28×28 images", "RSM by default"):
        assert cited in fedbr_module.__doc__


def test_rsm_keeps_the_pseudo_data_fixed_all_round():
    objective, model = make_objective()
    x = torch.randn(5, FEATURES)
    y = torch.tensor([0, 1, 2, 0, 1])
    first = objective.pseudo_batch(x, y)
    second = objective.pseudo_batch(torch.randn(5, FEATURES), y)
    for a, b in zip(first, second):
        assert torch.equal(a, b)
    assert torch.equal(first[0], objective.pseudo_x)
    torch.testing.assert_close(first[1], torch.full((4, CLASSES), 1 / CLASSES))


def test_local_epochs_replace_the_iteration_count():
    strategy = FedBR(local_epochs=2, local_batch_size=4)
    engine = tiny_engine(strategy, TinyNet(), (6, 10), client_labels=EVERY_LABEL, test_samples=5)
    # ceil(6/4) + ceil(10/4) = 5 batches per pass, 2 passes
    assert engine.run_epoch(1).steps == 10
    assert strategy.options.local_steps is None
    assert FedBROptions().for_mode("batch").local_steps == 20


def test_theta_is_averaged_with_the_aggregation_weights():
    strategy = FedBR()
    engine = tiny_engine(strategy, TinyNet(), (6, 10), client_labels=EVERY_LABEL, test_samples=5)
    states = []
    for value in (1.0, 3.0):
        state = {
            key: torch.full_like(v, value) for key, v in strategy.projection.state_dict().items()
        }
        states.append(state)
    model_state = engine.model.state_dict()
    updates = [
        ClientUpdate(client=k, num_samples=n, state=model_state, extra={"projection": states[k]})
        for k, n in enumerate((1, 3))
    ]
    strategy.aggregate(engine.context, None, updates)
    assert all(torch.all(v == 2.0) for v in strategy.projection.state_dict().values())
    strategy.options = FedBROptions(weighting="samples").for_mode("batch")
    strategy.aggregate(engine.context, None, updates)  # (1·1 + 3·3) / 4
    assert all(torch.all(v == 2.5) for v in strategy.projection.state_dict().values())


def test_each_client_takes_its_max_steps_on_its_own_copy_of_theta():
    strategy = FedBR(local_steps=2, local_batch_size=4)
    engine = tiny_engine(strategy, TinyNet(), (6, 10), client_labels=EVERY_LABEL, test_samples=5)
    context = engine.context
    context.epoch, context.lr = 1, 0.1
    strategy.configure_rounds(context, 1, np.random.default_rng(0))  # the pseudo-data
    theta = {key: value.clone() for key, value in strategy.projection.state_dict().items()}

    def client_1_theta():
        (update,) = strategy.local_round(context, [1], np.random.default_rng(5))
        return update.extra["projection"]

    alone = client_1_theta()
    strategy.local_round(context, [0], np.random.default_rng(6))
    after_client_0 = client_1_theta()
    # client 1 starts from the round's θ whatever client 0 did before it: the same draws
    # give the same θ
    assert all(torch.equal(alone[key], after_client_0[key]) for key in theta)
    assert any(not torch.equal(alone[key], theta[key]) for key in theta)  # it did move
    # and the server's θ changes only when the round is aggregated
    assert all(torch.equal(strategy.projection.state_dict()[key], theta[key]) for key in theta)


def test_models_without_features_and_a_linear_head_are_refused():
    torch.manual_seed(0)
    with pytest.raises(ConfigError, match="fedbr needs a model with features and a linear head"):
        tiny_engine(FedBR(), nn.Sequential(nn.Linear(FEATURES, CLASSES)), (6, 10))


def digits_config(tmp_path, name, epochs, **options):
    return TrainConfig(
        algorithm="fedbr",
        dataset="digits",
        partition="dirichlet:0.5",
        clients=4,
        epochs=epochs,
        mode="batch",
        secure=False,
        out=str(tmp_path / name),
        options={"local_steps": 2, "local_batch_size": 16, **options},
    )


def metrics(path):
    rows = [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines()]
    for row in rows:
        row.pop("wall_seconds")
    return rows


def test_resume_is_exact_with_theta_and_the_pseudo_data_in_the_checkpoint(tmp_path):
    Run(digits_config(tmp_path, "straight", 3)).train()
    Run(digits_config(tmp_path, "pieces", 1)).train()
    Run(digits_config(tmp_path, "pieces", 3), resume=True).train()
    assert metrics(tmp_path / "pieces") == metrics(tmp_path / "straight")
    state = torch.load(tmp_path / "pieces" / "checkpoint.pt", weights_only=True)["strategy"]
    assert state["pseudo_x"].shape == (16, 1, 8, 8) and "0.weight" in state["projection"]


def test_train_cli_runs_fedbr(tmp_path, capsys):
    out = tmp_path / "cli"
    main(
        ["train", "--algorithm", "fedbr", "--mode", "batch", "--no-secure", "--epochs", "2"]
        + ["--clients", "4", "--partition", "iid", "--local-steps", "2", "--out", str(out)]
        + ["--pseudo-weight", "0.5", "--contrast-weight", "1", "--positive-temperature", "0.2"]
    )
    assert "best accuracy" in capsys.readouterr().out
    resolved = json.loads((out / "config.json").read_text())["resolved"]["options"]
    assert resolved["pseudo_weight"] == 0.5 and resolved["positive_temperature"] == 0.2
    assert resolved["local_steps"] == 2 and resolved["weighting"] == "equal"
    rows = metrics(out)
    assert [row["steps"] for row in rows] == [4 * 2, 4 * 2]


@pytest.mark.parametrize(
    "arguments, message",
    [
        (["--pseudo-weight", "-1"], "--pseudo-weight must be a non-negative"),
        (["--contrast-weight", "-0.5"], "--contrast-weight must be a non-negative"),
        (["--positive-temperature", "0"], "--positive-temperature must be a positive"),
        (["--negative-temperature", "-1"], "--negative-temperature must be a positive"),
        (["--rsm-size", "0"], "--rsm-size must be a positive integer"),
        (["--pseudo-data", "mixture", "--mixture-size", "0"], "--mixture-size must be a positive"),
        (["--mixture-size", "2"], "--mixture-size applies to --pseudo-data mixture"),
        (["--pseudo-data", "proxy"], "unknown --pseudo-data 'proxy'"),
        (["--local-steps", "0"], "--local-steps must be a positive integer"),
        (["--local-steps", "5", "--local-epochs", "2"], "--local-epochs and --local-steps both"),
        (["--mode", "single-sample"], "--algorithm fedbr runs in --mode batch, not single-sample"),
        (["--mu", "0.5"], "--mu does not apply to --algorithm fedbr"),
    ],
)
def test_bad_fedbr_options_are_one_line_exit_2(tmp_path, capsys, arguments, message):
    command = ["train", "--algorithm", "fedbr", "--no-secure", "--out", str(tmp_path / "x")]
    if "--mode" not in arguments:
        command += ["--mode", "batch"]
    assert_refused_in_one_line(capsys, [*command, *arguments], message, tmp_path / "x")


def test_the_mixture_mixes_each_pseudo_sample_with_local_samples_of_the_batch():
    objective, model = make_objective(mixture_size=1)
    x = torch.randn(5, FEATURES)
    y = torch.tensor([0, 1, 2, 0, 1])
    partners = np.random.default_rng(0).integers(0, 5, size=(4, 1))  # the objective's draws
    pseudo_x, pseudo_y, global_features = objective.pseudo_batch(x, y)
    expected = (objective.pseudo_x + x[partners[:, 0]]) / 2
    torch.testing.assert_close(pseudo_x, expected)
    one_hot = torch.nn.functional.one_hot(y[partners[:, 0]], CLASSES).float()
    torch.testing.assert_close(pseudo_y, (torch.full((4, CLASSES), 1 / CLASSES) + one_hot) / 2)
    # φ_g is applied to the mixed samples, not to the stored pseudo-data
    torch.testing.assert_close(global_features, objective.global_model.embed(expected))
