"""Diagnose Stratify's late accuracy dips at a constant rate (issue: "late dips").

Runs one single-sample Stratify run eagerly (``--compile off``, so every step goes through
the eager loop this script watches) and records, per step, the loss, the gradient norm,
the sample's label and the position in the epoch; per epoch, the test accuracy and loss
and the fraction of dead ReLU units (never positive on 1,000 training images). Writes
``dips-seed<N>.npz`` and prints one line per epoch and the largest steps of each epoch.

    STRATIFY_DATA_DIR=/work/shared/data nice -n 10 .venv/bin/python docs/results/dips.py \
        --seed 1 --epochs 30 --out /tmp/dips
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

import stratify.stratify as stratify_module
from stratify.config import TrainConfig
from stratify.run import EpochRecord, Run

STEPS: list[tuple[float, float, int]] = []
#: with --trace-every N: (step, test accuracy on the probe set) every N steps
TRACE: list[tuple[int, float]] = []
PROBE: dict[str, object] = {}


def watched_sgd(model, optimizer, x, y, indices, lr):  # noqa: ANN001, ANN201
    """single_sample_sgd (plain SGD) recording each step's loss, gradient norm and label."""
    parameters = [p for group in optimizer.param_groups for p in group["params"]]
    losses = []
    for index in indices:
        loss = F.cross_entropy(model(x[index : index + 1]), y[index : index + 1])
        gradients = torch.autograd.grad(loss, parameters)
        norm = torch.linalg.vector_norm(torch.stack([g.norm() for g in gradients]))
        with torch.no_grad():
            torch._foreach_add_(parameters, gradients, alpha=-lr)
        STEPS.append((float(loss.detach()), float(norm), int(y[index])))
        losses.append(loss.detach())
        every = PROBE.get("every")
        if every and len(STEPS) % every == 0:
            with torch.no_grad():
                predicted = model(PROBE["x"]).argmax(dim=1)
            TRACE.append((len(STEPS), float((predicted == PROBE["y"]).float().mean())))
    return losses


def dead_relu_fraction(model: torch.nn.Module, x: torch.Tensor) -> float:
    """Share of ReLU units (conv channels × positions, hidden units) never positive on ``x``."""
    outputs: list[torch.Tensor] = []
    hooks = [
        module.register_forward_hook(lambda m, i, o: outputs.append(o.detach()))
        for module in model.modules()
        if isinstance(module, torch.nn.ReLU)
    ]
    with torch.no_grad():
        model(x)
    for hook in hooks:
        hook.remove()
    dead = sum(int(((o > 0).sum(0) == 0).sum()) for o in outputs)
    return dead / sum(o[0].numel() for o in outputs)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--out", type=Path, default=Path("/tmp/dips"))
    parser.add_argument("--trace-every", type=int, default=0, help="probe accuracy every N steps")
    arguments = parser.parse_args()
    arguments.out.mkdir(parents=True, exist_ok=True)
    stratify_module.single_sample_sgd = watched_sgd
    config = TrainConfig(
        dataset="mnist-10k",
        data_dir=os.environ.get("STRATIFY_DATA_DIR"),
        partition="classes:5",
        clients=10,
        mode="single-sample",
        epochs=arguments.epochs,
        lr=arguments.lr,
        # the dips are the paper's constant rate's (Stratify's default is the decay)
        lr_schedule="constant",
        secure=False,
        seed=arguments.seed,
        device="cpu",
        options={"chunk": 5, "compile": "off"},
    )
    run = Run(config)
    probe = run.engine.context.x_train[:1000]
    PROBE.update(
        every=arguments.trace_every, x=run.dataset.x_test[:2000], y=run.dataset.y_test[:2000]
    )
    epochs: list[tuple[float, float, float, float, int]] = []

    def after_epoch(record: EpochRecord) -> None:
        dead = dead_relu_fraction(run.engine.model, probe)
        epochs.append((record.test_accuracy, record.test_loss, record.train_loss, dead, len(STEPS)))
        steps = np.array(STEPS[epochs[-2][4] if len(epochs) > 1 else 0 :])
        top = np.argsort(steps[:, 1])[-3:][::-1]
        print(
            f"epoch {record.epoch:2d} acc {record.test_accuracy:.4f} test loss "
            f"{record.test_loss:.3f} train loss {record.train_loss:.3f} dead {dead:.3f} "
            f"grad p50 {np.median(steps[:, 1]):.3f} p99.9 {np.quantile(steps[:, 1], 0.999):.2f} "
            f"max {steps[:, 1].max():.2f} top (step, norm, label) "
            + " ".join(f"({i}, {steps[i, 1]:.1f}, {int(steps[i, 2])})" for i in top),
            flush=True,
        )

    run.on_epoch = after_epoch
    run.train()
    np.savez(
        arguments.out / f"dips-seed{arguments.seed}.npz",
        steps=np.array(STEPS),
        epochs=np.array(epochs),
        trace=np.array(TRACE),
    )


if __name__ == "__main__":
    main()
