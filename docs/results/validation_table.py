"""One CSV row per seed run folder: the last epoch's validation and test accuracy
(docs/results/defaults-digits.md).

Arguments are ``LABEL=FOLDER`` pairs, each FOLDER made by ``stratify train --seeds …
--validation 0.1 --out FOLDER``; the rate of a row is read from its config.json::

    .venv/bin/python docs/results/validation_table.py fedavg=/tmp/dg/lr-0.01 …
"""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

from stratify.runfiles import read_records


def main(arguments: list[str]) -> None:
    writer = csv.writer(sys.stdout)
    writer.writerow(["method", "lr", "seed", "epochs", "validation_accuracy", "test_accuracy"])
    for argument in arguments:
        label, folder = argument.split("=", 1)
        for seed_folder in sorted(Path(folder).glob("seed-*")):
            config = json.loads((seed_folder / "config.json").read_text())
            last = read_records(seed_folder)[-1]
            writer.writerow(
                [
                    label,
                    config["resolved"]["lr"],
                    config["seed"],
                    last["epoch"],
                    last["validation_accuracy"],
                    last["test_accuracy"],
                ]
            )


if __name__ == "__main__":
    main(sys.argv[1:])
