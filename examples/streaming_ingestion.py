"""Online learning from a stream: each client receives its samples over time, in windows,
and the global model learns every window once with single-sample Stratify hops.

Optionally it first pre-trains on the first part of the data in batch mode (the hybrid
batch → stream use of the paper, §III-C). Run:

    python examples/streaming_ingestion.py --dataset digits --windows 8
    python examples/streaming_ingestion.py --dataset mnist-10k --data-dir ../shared/data \
        --pretrain-fraction 0.25 --windows 6
"""

from __future__ import annotations

import argparse

import numpy as np
import torch

from stratify.config import TrainConfig
from stratify.data.datasets import load_dataset
from stratify.data.partition import partition
from stratify.experiment import build_experiment
from stratify.federation import Federation
from stratify.nn.models import build_model
from stratify.registry import PlainRegistry
from stratify.stream import StreamLearner


def main(argv: list[str] | None = None) -> list[float]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="digits")
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--partition", default="classes:1")
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--windows", type=int, default=8)
    parser.add_argument("--pretrain-fraction", type=float, default=0.0)
    parser.add_argument("--pretrain-epochs", type=int, default=20)
    parser.add_argument("--lr", type=float, default=0.05, help="batch pre-training lr")
    parser.add_argument(
        "--stream-lr",
        type=float,
        default=None,
        help="single-sample lr [default: --lr, or --lr/5 after pre-training]",
    )
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    torch.manual_seed(args.seed)
    dataset = load_dataset(args.dataset, data_dir=args.data_dir)
    labels = dataset.train_labels
    clients = partition(labels, args.clients, args.partition, seed=args.seed)
    rng = np.random.default_rng(args.seed)
    clients = [rng.permutation(ix) for ix in clients]  # arrival order at each client
    model = build_model("cnn", dataset.input_shape, dataset.num_classes)

    if args.pretrain_fraction > 0:
        cut = [int(len(ix) * args.pretrain_fraction) for ix in clients]
        stored = [ix[:n] for ix, n in zip(clients, cut)]
        clients = [ix[n:] for ix, n in zip(clients, cut)]
        config = TrainConfig(
            dataset=args.dataset,
            mode="batch",
            lr=args.lr,
            lr_schedule="constant",
            seed=args.seed,
            secure=False,
            options={"batch_labels": 32, "momentum": 0.9},
        )
        router = build_experiment(
            config,
            dataset=dataset,
            federation=Federation(stored, labels),
            registry=PlainRegistry(seed=args.seed),
            model=model,
        ).router
        for epoch in range(1, args.pretrain_epochs + 1):
            router.run_epoch(epoch)
        print(
            f"pre-trained in batch mode on {sum(cut)} stored samples: "
            f"accuracy {router.evaluate()[0]:.4f}"
        )

    # a pre-trained model only needs small single-sample corrections
    stream_lr = args.stream_lr or (args.lr / 5 if args.pretrain_fraction > 0 else args.lr)
    learner = StreamLearner(model, dataset, lr=stream_lr, chunk=5, seed=args.seed)
    accuracies = []
    for window in range(args.windows):
        arrivals = [np.array_split(ix, args.windows)[window] for ix in clients]
        stats = learner.ingest(arrivals)
        accuracy, _ = learner.evaluate()
        accuracies.append(accuracy)
        print(
            f"window {window + 1}/{args.windows}: {stats.steps} samples learned, "
            f"{stats.transfers} transfers, accuracy {accuracy:.4f}"
        )
    return accuracies


if __name__ == "__main__":
    main()
