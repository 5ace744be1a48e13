"""Count Stratify's accuracy dips in finished run folders (docs/results/dips.md).

For every ``FOLDER/seed-N`` given (``stratify train --seeds … --out FOLDER``), one CSV
row: the schedule, the seed, the epochs after epoch 10 below 90% and below 97% test
accuracy, the lowest test accuracy after epoch 10 and at which epoch, the standard
deviation of the test accuracy over the epochs after 10 (points), the final accuracy and
the mean of the last five epochs; ``stratify tables`` renders them (the ``dips`` table)::

    .venv/bin/python docs/results/dip_counts.py constant=/tmp/seeds/constant \\
        inverse-epoch=/tmp/seeds/inverse > docs/results/dips-seeds.csv
"""

from __future__ import annotations

import csv
import statistics
import sys
from pathlib import Path

from stratify.runfiles import read_records

#: a dip: test accuracy below this after :data:`AFTER_EPOCH`
THRESHOLD = 0.90
#: a swing: an epoch after :data:`AFTER_EPOCH` below this (the runs end near 97–98%)
SWING = 0.97
AFTER_EPOCH = 10


def rows(label: str, folder: Path) -> list[dict[str, object]]:
    """One row per seed folder of ``folder``."""
    result = []
    for seed_folder in sorted(folder.glob("seed-*"), key=lambda p: int(p.name.split("-")[1])):
        records = read_records(seed_folder)
        late = [r for r in records if r["epoch"] > AFTER_EPOCH]
        lowest = min(late, key=lambda r: r["test_accuracy"]) if late else None
        result.append(
            {
                "schedule": label,
                "seed": int(seed_folder.name.split("-")[1]),
                "epochs": len(records),
                "dip_epochs": sum(r["test_accuracy"] < THRESHOLD for r in late),
                "swing_epochs": sum(r["test_accuracy"] < SWING for r in late),
                "lowest_after_10": None if lowest is None else lowest["test_accuracy"],
                "lowest_epoch": None if lowest is None else lowest["epoch"],
                "std_after_10": (
                    round(100 * statistics.stdev(r["test_accuracy"] for r in late), 2)
                    if len(late) > 1
                    else None
                ),
                "final": records[-1]["test_accuracy"],
                "last5_mean": round(statistics.fmean(r["test_accuracy"] for r in records[-5:]), 4),
            }
        )
    return result


def main(arguments: list[str]) -> None:
    writer = None
    for argument in arguments:
        label, folder = argument.split("=", 1)
        for row in rows(label, Path(folder)):
            if writer is None:
                writer = csv.DictWriter(sys.stdout, fieldnames=list(row))
                writer.writeheader()
            writer.writerow(row)


if __name__ == "__main__":
    main(sys.argv[1:])
