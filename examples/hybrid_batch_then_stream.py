"""Hybrid learning (the Stratify paper, §III-C): pre-train in batch mode on the data the
clients already store, then keep learning from a stream of new samples with single-sample
updates.

Each client's samples are shuffled; the first ``--pretrain-fraction`` of them are stored
and learned in batch mode (Stratify's global batches), the rest arrive afterwards, one
event at a time and interleaved across clients, through the streaming API. The stream
continues the pre-training's label registry, so every placeholder keeps its number.
Prints the test accuracy before and after the stream.

    python examples/hybrid_batch_then_stream.py
    python examples/hybrid_batch_then_stream.py --dataset mnist-10k --data-dir DIR

DIR holds mnist-10k's files: ``stratify data download mnist-10k --dir DIR`` puts them there.
"""

from __future__ import annotations

import argparse

import numpy as np

from stratify.config import TrainConfig
from stratify.data.datasets import load_dataset
from stratify.data.partition import partition
from stratify.experiment import build_experiment
from stratify.federation import Federation
from stratify.registry import make_registry
from stratify.stream import Event, StreamConfig, StreamLearner


def main(argv: list[str] | None = None) -> tuple[float, float]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="digits")
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--partition", default="dirichlet:0.5")
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--pretrain-fraction", type=float, default=0.3)
    parser.add_argument("--pretrain-epochs", type=int, default=10)
    parser.add_argument("--lr", type=float, default=0.05, help="batch pre-training lr")
    parser.add_argument(
        "--stream-lr", type=float, default=0.005, help="single-sample lr (small corrections)"
    )
    parser.add_argument("--capacity", type=int, default=50, help="samples per client buffer")
    parser.add_argument("--events", type=int, default=None, help="stop the stream after these")
    parser.add_argument("--no-secure", action="store_true", help="plain label registry")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    dataset = load_dataset(args.dataset, data_dir=args.data_dir, seed=args.seed)
    labels = dataset.train_labels
    rng = np.random.default_rng(args.seed)
    clients = [
        rng.permutation(indices)
        for indices in partition(labels, args.clients, args.partition, seed=args.seed)
    ]
    cut = [int(len(indices) * args.pretrain_fraction) for indices in clients]
    stored = [indices[:count] for indices, count in zip(clients, cut)]
    arriving = [(k, int(i)) for k, indices in enumerate(clients) for i in indices[cut[k] :]]
    order = [arriving[i] for i in rng.permutation(len(arriving))][: args.events]

    registry = make_registry(not args.no_secure, seed=args.seed)
    config = TrainConfig(
        dataset=args.dataset,
        mode="batch",
        lr=args.lr,
        lr_schedule="constant",
        seed=args.seed,
        options={"batch_labels": 32, "momentum": 0.9},
    )
    experiment = build_experiment(
        config, dataset=dataset, federation=Federation(stored, labels), registry=registry
    )
    for epoch in range(1, args.pretrain_epochs + 1):
        experiment.engine.run_epoch(epoch)
    before, _ = experiment.engine.evaluate()
    print(
        f"pre-trained in batch mode on {sum(cut)} stored samples "
        f"({args.pretrain_epochs} epochs): accuracy_before={before:.4f}",
        flush=True,
    )

    learner = StreamLearner(
        StreamConfig(
            lr=args.stream_lr,
            capacity=args.capacity,
            seed=args.seed,
            secure=not args.no_secure,
            input_shape=dataset.input_shape,
            scale="none",  # the pre-trained model learned the features as they are
        ),
        model=experiment.model,
        classes=list(range(dataset.num_classes)),
        registry=registry,
        clients=list(range(args.clients)),
    )
    test_labels = dataset.y_test.tolist()
    report = max(len(order) // 5, 1)
    for number, (client, index) in enumerate(order, start=1):
        learner.ingest(Event(client, int(labels[index]), dataset.x_train[index], number))
        if number % report == 0:
            accuracy = learner.test_accuracy(dataset.x_test, test_labels)
            print(
                f"stream: events={number} window_accuracy="
                f"{learner.prequential.window_accuracy:.4f} test_accuracy={accuracy:.4f}",
                flush=True,
            )
    after = learner.test_accuracy(dataset.x_test, test_labels)
    assert after is not None
    print(
        f"learned {len(order)} streamed samples one at a time: accuracy_before={before:.4f} "
        f"accuracy_after={after:.4f}"
    )
    return before, after


if __name__ == "__main__":
    main()
