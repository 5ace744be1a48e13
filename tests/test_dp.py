"""Differential privacy for the updates (issue 54, docs/architecture.md "Differential
privacy"): the clipping and noise by hand, the accounting against Opacus's formulas, and
runs whose every message leaving a client is clipped per sample and noised, with the ε
of their summary the accountant's for the uses they made. Every defence check is run on
the plain trainer too, which must fail it."""

from __future__ import annotations

import importlib.util
import json
import math

import numpy as np
import pytest
import torch
from torch import nn

# looked up, not imported: importing Opacus costs most of a second in every process that
# collects the suite, and the accounting imports it where it is used
if importlib.util.find_spec("opacus") is None:
    pytest.skip("Opacus is not installed (the privacy extra)", allow_module_level=True)

from conftest import assert_refused_in_one_line  # noqa: E402

from stratify.client import LocalTrainer, PrivateTrainer  # noqa: E402
from stratify.config import TrainConfig, dp_settings  # noqa: E402
from stratify.errors import ConfigError  # noqa: E402
from stratify.experiment import build_experiment  # noqa: E402
from stratify.privacy.accounting import (  # noqa: E402
    DPSettings,
    calibrate_noise,
    epsilon_spent,
)
from stratify.privacy.dp import add_noise, clip_gradient, clip_per_sample  # noqa: E402
from stratify.run import Run  # noqa: E402

FAST = {"repeat_count": 40}  # 400 steps per epoch on digits, each sample used at most once


def config(tmp_path=None, name="run", **changes):
    values = dict(
        dataset="digits",
        partition="classes:2",
        clients=10,
        epochs=2,
        lr=0.05,
        secure=False,
        options=dict(FAST),
        out=None if tmp_path is None else str(tmp_path / name),
    )
    values.update(changes)
    return TrainConfig(**values)


# -- the pure functions -------------------------------------------------------------------


def test_clip_gradient_by_hand():
    # ‖(3, 4)‖ = 5 over two tensors: scaled by 1/5 to norm 1; a small one is kept
    clipped = clip_gradient([torch.tensor([3.0]), torch.tensor([[4.0]])], 1.0)
    assert torch.allclose(clipped[0], torch.tensor([0.6]))
    assert torch.allclose(clipped[1], torch.tensor([[0.8]]))
    small = clip_gradient([torch.tensor([0.3, 0.4])], 1.0)
    assert torch.allclose(small[0], torch.tensor([0.3, 0.4]))
    assert torch.allclose(
        clip_gradient([torch.tensor([6.0, 8.0])], 2.0)[0], torch.tensor([1.2, 1.6])
    )


def test_clip_per_sample_by_hand():
    # samples (3, 4 | 0) and (0.3, 0.4 | 0): the first scaled by 1/5, the second kept
    weight = torch.tensor([[3.0, 4.0], [0.3, 0.4]])
    bias = torch.zeros(2, 1)
    summed = clip_per_sample([weight, bias], 1.0)
    assert torch.allclose(summed[0], torch.tensor([0.6 + 0.3, 0.8 + 0.4]))
    assert torch.equal(summed[1], torch.zeros(1))


def test_noise_has_the_scale_sigma_c_and_follows_its_seed():
    zeros = [torch.zeros(200_000)]

    def draw(seed, sigma=2.0, clip=0.5):
        generator = torch.Generator().manual_seed(seed)
        return add_noise(zeros, sigma, clip, generator)[0]

    noise = draw(0)
    assert abs(float(noise.std()) - 1.0) < 0.01  # σC = 2 × 0.5
    assert abs(float(noise.mean())) < 0.01
    assert torch.equal(draw(0), noise) and not torch.equal(draw(1), noise)
    assert torch.equal(draw(0, sigma=0.0), zeros[0])


def opacus_formula(sigma: float, delta: float, uses: int) -> float:
    """Opacus's RDP → (ε, δ) conversion written out: ``uses`` Gaussian mechanisms without
    subsampling have RDP ``uses·α/(2σ²)`` at order α; ε is the minimum over its orders of
    ``rdp − (log δ + log α)/(α − 1) + log((α − 1)/α)``."""
    orders = [1 + x / 10.0 for x in range(1, 100)] + list(range(12, 64))
    return min(
        uses * a / (2 * sigma**2)
        - (math.log(delta) + math.log(a)) / (a - 1)
        + math.log((a - 1) / a)
        for a in orders
    )


@pytest.mark.parametrize("sigma, uses", [(1.0, 1), (2.0, 5), (4.0, 30)])
def test_epsilon_is_the_unsubsampled_gaussian_composition(sigma, uses):
    assert epsilon_spent(sigma, 1e-5, uses) == pytest.approx(opacus_formula(sigma, 1e-5, uses))
    # more uses spend more; nothing used spends nothing
    assert epsilon_spent(sigma, 1e-5, uses + 1) > epsilon_spent(sigma, 1e-5, uses)
    assert epsilon_spent(sigma, 1e-5, 0) == 0.0


@pytest.mark.parametrize("epsilon", [1.0, 3.0, 8.0])
@pytest.mark.parametrize("uses", [1, 10])
def test_calibration_round_trip(epsilon, uses):
    sigma = calibrate_noise(epsilon, 1e-5, uses)
    spent = epsilon_spent(sigma, 1e-5, uses)
    assert spent <= epsilon
    assert spent > 0.97 * epsilon  # the smallest such σ, to the search's tolerance
    assert DPSettings(epsilon=epsilon).sigma(uses) == sigma
    assert DPSettings(noise_multiplier=0.7).sigma(uses) == 0.7


# -- the trainer: what leaves a client ------------------------------------------------


def tiny_data(scale: float = 50.0):
    generator = torch.Generator().manual_seed(0)
    x = scale * torch.randn(12, 5, generator=generator)
    y = torch.arange(12) % 3
    return x, y


def tiny_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(5, 4), nn.Tanh(), nn.Linear(4, 3))


def flat(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


@pytest.mark.parametrize("private", [True, False])
def test_one_sample_step_moves_the_model_by_at_most_lr_c(private):
    # with σ = 0 the clipping alone is seen: each one-sample step moves the model by at
    # most lr·C; the plain trainer's steps on these large inputs move it much more
    x, y = tiny_data()
    trainer = (
        PrivateTrainer(x, y, clip=0.1, noise_multiplier=0.0) if private else LocalTrainer(x, y)
    )
    model = tiny_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    moves = []
    for index in range(12):
        before = flat(model)
        trainer.single_sample_steps(model, optimizer, [index], 1.0)
        moves.append(float((flat(model) - before).norm()))
    if private:
        assert max(moves) <= 0.1 + 1e-6
        assert trainer.uses.tolist() == [1] * 12
    else:
        assert max(moves) > 0.5


def share_gradients(trainer, model, samples, clients):
    """What each client of a global batch sends: the batch gradient of each share alone."""
    sent = []
    for client in np.unique(clients):
        model.zero_grad(set_to_none=False)
        mine = clients == client
        trainer.batch_gradient(model, samples[mine], clients[mine], divisor=1)
        sent.append(torch.cat([p.grad.reshape(-1).clone() for p in model.parameters()]))
    return sent


@pytest.mark.parametrize("private", [True, False])
def test_a_share_is_its_clipped_per_sample_sum(private):
    # σ = 0: a share's message is Σ_i clip(g_i) (by a per-sample loop here), each sample
    # contributing at most C; the plain trainer sends the unclipped sum
    x, y = tiny_data()
    model = tiny_model()
    trainer = (
        PrivateTrainer(x, y, clip=1.0, noise_multiplier=0.0) if private else LocalTrainer(x, y)
    )
    samples, clients = np.arange(12), np.repeat([0, 1, 2], 4)
    sent = share_gradients(trainer, model, samples, clients)
    for client, message in enumerate(sent):
        expected = torch.zeros_like(message)
        for index in samples[clients == client]:
            model.zero_grad()
            nn.functional.cross_entropy(
                model(x[index : index + 1]), y[index : index + 1]
            ).backward()
            gradient = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
            expected += gradient * min(1.0, 1.0 / float(gradient.norm()))
        assert torch.allclose(message, expected, atol=1e-5) == private
        if private:
            assert float(message.norm()) <= 4 * 1.0 + 1e-5


def test_noised_shares_follow_the_noise_seed():
    x, y = tiny_data(1.0)
    samples, clients = np.arange(12), np.repeat([0, 1, 2], 4)

    def messages(seed):
        trainer = PrivateTrainer(x, y, clip=1.0, noise_multiplier=1.0, seed=seed)
        return torch.stack(share_gradients(trainer, tiny_model(), samples, clients))

    first, again, other = messages(0), messages(0), messages(1)
    assert torch.equal(first, again)
    # the noise, σC = 1 per coordinate, dwarfs the clipped sum (norm ≤ 4)
    difference = (first - other) / math.sqrt(2)
    assert abs(float(difference.std()) - 1.0) < 0.15


@pytest.mark.parametrize("private", [True, False])
def test_every_message_of_a_run_carries_noise(private):
    # a recorder wraps the trainer, as a client's outbox would: two batch-mode runs that
    # differ only in the noise's seed send different messages for the same shares
    def recorded(noise_seed):
        changes = {"mode": "batch", "epochs": 1, "options": {**FAST, "batch_labels": 8}}
        if private:
            changes["dp_noise"] = 1.0
        experiment = build_experiment(config(**changes))
        trainer = experiment.engine.context.trainer
        assert isinstance(trainer, PrivateTrainer) == private
        if private:
            trainer.seed = noise_seed  # each client's noise is keyed by it
            trainer.start_epoch(1)
        messages = []
        plain = trainer.batch_gradient

        def batch_gradient(model, samples, clients, fused=True, divisor=None):
            loss = plain(model, samples, clients, fused, divisor)
            messages.append(torch.cat([p.grad.reshape(-1).clone() for p in model.parameters()]))
            return loss

        trainer.batch_gradient = batch_gradient
        experiment.engine.run_epoch(1)
        return messages

    first, second = recorded(0), recorded(1)
    assert len(first) == len(second) > 10
    differ = [not torch.equal(a, b) for a, b in zip(first, second)]
    assert all(differ) if private else not any(differ)


@pytest.mark.parametrize("algorithm", ["fedavg", "scaffold"])
@pytest.mark.parametrize("mode, batch", [("batch", 16), ("single-sample", 1)])
def test_the_baselines_local_steps_are_noised_and_counted(algorithm, mode, batch):
    options = {"local_epochs": 2, "local_batch_size": batch}
    if mode == "single-sample":
        options["client_fraction"] = 0.2  # two clients a round: a short test
    changes = {"algorithm": algorithm, "mode": mode, "epochs": 2, "options": options}
    run = Run(config(dp_noise=1.5, **changes))
    summary = run.train()
    trainer = run.engine.context.trainer
    assert isinstance(trainer, PrivateTrainer) and trainer.uses_per_epoch == 2
    privacy = summary["privacy"]
    assert privacy["planned_uses"] == 4 and privacy["uses"] == int(trainer.uses.max())
    assert 2 <= privacy["uses"] <= 4
    assert privacy["epsilon"] == pytest.approx(epsilon_spent(1.5, 1e-5, privacy["uses"]))


# -- runs -----------------------------------------------------------------------------


def test_summary_reports_the_epsilon_of_the_uses_made(tmp_path):
    # 200 entries per label of fewer than 200 samples: every sample is used twice an epoch
    options = {"repeat_count": 200, "batch_labels": 16}
    changes = {"mode": "batch", "epochs": 1, "options": options}
    run = Run(config(tmp_path, dp_epsilon=3.0, dp_clip=0.5, **changes))
    summary = run.train()
    privacy = json.loads((tmp_path / "run" / "summary.json").read_text())["privacy"]
    assert privacy == summary["privacy"]
    trainer = run.engine.context.trainer
    # each sample's uses counted as they happened; the run planned for epochs × per epoch
    assert trainer.uses_per_epoch == 2
    assert privacy["uses"] == int(trainer.uses.max()) == trainer.uses_per_epoch
    assert privacy["planned_uses"] == privacy["uses"]
    sigma = calibrate_noise(3.0, 1e-5, privacy["planned_uses"])
    assert privacy["noise_multiplier"] == sigma
    assert privacy["epsilon"] == pytest.approx(epsilon_spent(sigma, 1e-5, privacy["uses"]))
    assert privacy["epsilon"] <= 3.0
    assert (privacy["delta"], privacy["clip"], privacy["target_epsilon"]) == (1e-5, 0.5, 3.0)
    config_json = json.loads((tmp_path / "run" / "config.json").read_text())
    assert (config_json["dp_epsilon"], config_json["dp_clip"]) == (3.0, 0.5)


def test_a_run_without_dp_is_unchanged():
    plain = config()
    assert dp_settings(plain) is None
    assert type(build_experiment(plain).engine.context.trainer) is LocalTrainer
    # its checkpoint settings are those of a run made before DP existed
    assert not any(key.startswith("dp_") for key in plain.comparable())
    assert "privacy" not in Run(config(epochs=1)).train()


def final_weights(out):
    return torch.load(out / "checkpoint.pt", weights_only=True)["model"]


def test_the_noise_seed_is_secret_unless_given():
    # two trainers of the same run settings draw different noise: the server, which knows
    # the run's --seed, cannot regenerate it; a given --dp-seed reproduces it
    x, y = tiny_data(1.0)
    draws = [PrivateTrainer(x, y).seed for _ in range(3)]
    assert len(set(draws)) == 3
    assert PrivateTrainer(x, y, seed=5).seed == 5
    assert dp_settings(config(dp_noise=1.0)).seed is None
    assert dp_settings(config(dp_noise=1.0, dp_seed=3)).seed == 3


def test_resume_with_dp_equals_the_uninterrupted_run(tmp_path):
    changes = {"mode": "batch", "epochs": 2, "dp_noise": 1.0, "dp_seed": 7}
    changes["options"] = {**FAST, "batch_labels": 16}
    straight = Run(config(tmp_path, "straight", **changes)).train()
    Run(config(tmp_path, "pieces", **{**changes, "epochs": 1})).train()
    pieces = Run(config(tmp_path, "pieces", **changes), resume=True).train()
    a, b = final_weights(tmp_path / "straight"), final_weights(tmp_path / "pieces")
    assert all(torch.equal(a[key], b[key]) for key in a)
    assert pieces["privacy"] == straight["privacy"]


@pytest.mark.parametrize(
    "changes, words",
    [
        ({"dp_epsilon": 0.0}, "--dp-epsilon takes a finite"),
        ({"dp_epsilon": float("inf")}, "--dp-epsilon takes a finite"),
        ({"dp_noise": -1.0}, "--dp-noise takes a finite"),
        ({"dp_epsilon": 3.0, "dp_delta": 1.0}, "--dp-delta takes a δ in (0, 1)"),
        ({"dp_epsilon": 3.0, "dp_clip": 0.0}, "--dp-clip takes a finite"),
        ({"dp_clip": 1.0}, "need --dp-epsilon E or --dp-noise SIGMA"),
        ({"dp_seed": 1}, "need --dp-epsilon E or --dp-noise SIGMA"),
        ({"dp_epsilon": 3.0, "dp_noise": 1.0}, "not both"),
        ({"dp_epsilon": 3.0, "algorithm": "sfl"}, "is not clipped per sample"),
        ({"dp_epsilon": 3.0, "mode": "batch", "model": "resnet20"}, "--norm bn couples"),
        (
            {"dp_epsilon": 3.0, "mode": "batch", "model": "resnet20", "norm": "sumbn"},
            "--norm sumbn couples",
        ),
        ({"dp_epsilon": 3.0, "options": {"compile": "on"}}, "--compile on skips"),
        (
            {"dp_epsilon": 3.0, "algorithm": "fedavg", "options": {"local_steps": 3}},
            "--local-steps draws",
        ),
    ],
)
def test_refusals(changes, words):
    values = {"options": {}, **changes}
    with pytest.raises(ConfigError) as refused:
        config(**values)
    assert words in str(refused.value)
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--dp-epsilon", "-1"], "--dp-epsilon takes a finite ε > 0"),
        (["--dp-noise", "1", "--dp-delta", "2"], "--dp-delta takes a δ in (0, 1)"),
        (["--dp-epsilon", "3", "--model", "resnet20", "--mode", "batch"], "--norm bn couples"),
        (["--dp-noise", "1", "--seeds", "0,1", "--vectorize", "2"], "--vectorize steps runs"),
    ],
)
def test_the_command_line_refuses_in_one_line(tmp_path, capsys, flags, message):
    out = tmp_path / "run"
    command = ["train", *flags, "--no-secure", "--out", str(out)]
    assert_refused_in_one_line(capsys, command, message, out)


# -- streams --------------------------------------------------------------------------


def stream_settings(**changes):
    from streams import SETTINGS

    return {**SETTINGS, "new_class": "random", "scale": "none", **changes}


@pytest.mark.parametrize("numpy_path", [True, False])
def test_a_private_stream_step_is_clipped_and_noised(numpy_path):
    # the NumPy path (a CPU MLP's views) and the torch one (any other model): with σ = 0
    # a step moves the model by at most lr·C, the plain step by more; with σ > 0 the
    # noise follows its seed
    from stratify.nn.models import MLP
    from stratify.stream.step import SingleSampleStep

    x = 40.0 * torch.randn(1, 6, generator=torch.Generator().manual_seed(0))

    def moved(clip=None, noise=0.0, seed=None):
        torch.manual_seed(0)
        if numpy_path:
            model = MLP((6,), 3, hidden=(8,))
        else:
            model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))
        step = SingleSampleStep(model, 1.0, 0.0, clip=clip, noise_multiplier=noise, seed=seed)
        assert (step.arrays is not None) == numpy_path
        before = flat_stream(step)
        with torch.no_grad():
            target = int(model(x).argmin())  # the least likely class: a large gradient
        step.step(x, target)
        return flat_stream(step) - before

    assert float(np.linalg.norm(moved(clip=0.1))) <= 0.1 + 1e-5
    assert float(np.linalg.norm(moved())) > 1.0
    assert not np.array_equal(moved(0.1, 1.0, seed=1), moved(0.1, 1.0, seed=2))
    assert np.array_equal(moved(0.1, 1.0, seed=1), moved(0.1, 1.0, seed=1))


def flat_stream(step):
    return np.concatenate(
        [np.array(as_array(p), dtype=np.float64).reshape(-1) for p in step.parameters]
    )


def as_array(value):
    return value.detach().numpy() if isinstance(value, torch.Tensor) else value


def test_a_private_stream_reports_the_epsilon_of_its_max_uses(tmp_path):
    from streams import event_line

    from stratify.stream.run import StreamRun

    rng = np.random.default_rng(0)
    source = tmp_path / "events.jsonl"
    source.write_text("".join(event_line(line, rng) + "\n" for line in range(120)))
    from stratify.stream import StreamConfig

    config = StreamConfig(
        source=str(source), out=str(tmp_path / "s"), **stream_settings(dp_epsilon=2.0)
    )
    run = StreamRun(config)
    summary = run.run()
    privacy = summary["privacy"]
    sigma = calibrate_noise(2.0, 1e-5, 3)  # --max-uses 3 in these settings
    assert privacy["noise_multiplier"] == sigma and privacy["uses"] == 3
    assert privacy["epsilon"] == pytest.approx(epsilon_spent(sigma, 1e-5, 3))
    assert privacy["epsilon"] <= 2.0
    assert summary["steps"] > 0
    # the steps that ran were the private ones
    step = run.learner.policy.step
    assert (step.clip, step.noise_multiplier) == (1.0, sigma)


@pytest.mark.parametrize(
    "changes, words",
    [
        ({"max_uses": None}, "DP needs --max-uses"),
        ({"algorithm": "fedavg-periodic"}, "apply to --algorithm stratify"),
        ({"new_class": "auto"}, "--new-class random"),
        ({"scale": "running"}, "--scale none"),
        ({"dp_delta": 0.0}, "--dp-delta takes a δ in (0, 1)"),
    ],
)
def test_stream_refusals(tmp_path, changes, words):
    from stratify.stream import StreamConfig

    with pytest.raises(ConfigError) as refused:
        StreamConfig(source="-", **stream_settings(dp_noise=1.0, **changes))
    assert words in str(refused.value)


def test_a_trainer_that_does_not_clip_is_refused_with_dp():
    # Flower's remote trainer, say: DP would otherwise be silently off
    plain = build_experiment(config())
    trainer = LocalTrainer(plain.dataset.x_train, plain.dataset.y_train)
    with pytest.raises(ConfigError, match="not available with LocalTrainer"):
        build_experiment(config(dp_noise=1.0), trainer=trainer)


def test_a_wrapped_private_trainer_is_calibrated():
    # a recorder around a private trainer (its ``inner``) gets the run's σ, as a bare one
    class Wrapper(LocalTrainer):
        def __init__(self, inner):
            super().__init__(inner.x_train, inner.y_train)
            self.inner = inner

    plain = build_experiment(config())
    inner = PrivateTrainer(plain.dataset.x_train, plain.dataset.y_train, noise_multiplier=0.0)
    build_experiment(config(dp_epsilon=3.0), trainer=Wrapper(inner))
    assert inner.noise_multiplier == calibrate_noise(3.0, 1e-5, 2 * inner.uses_per_epoch)
