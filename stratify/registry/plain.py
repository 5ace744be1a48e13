"""The plain registry: no encryption, same interface and placeholders as the CKKS one."""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from typing import Any

import numpy as np

from stratify.registry.base import LabelRegistry, RegistryResult, validate_client_labels
from stratify.registry.client_secrets import RegistrySecrets


class PlainRegistry(LabelRegistry):
    """Registry for ``--no-secure`` runs and for checking the CKKS protocols.

    Unique labels are discovered in client order (each client's labels in its encoding
    order: as its mapping lists them, or the secret order of ``secrets``), exactly as the
    encrypted protocols discover them. Deterministic: the same seed (or secrets) and input
    give the same result.

    Parameters
    ----------
    seed : int
        Seed of the placeholder permutation when there are no ``secrets``.
    secrets : RegistrySecrets, optional
        Clients' secrets, to give exactly the secure registry's result for the same ones.
    """

    name = "plain"

    def __init__(self, seed: int = 0, secrets: RegistrySecrets | None = None) -> None:
        super().__init__(seed=seed, secrets=secrets)
        self.discovered: dict[Hashable, int] = {}

    def register(
        self, client_labels: Sequence[Mapping[Any, int]], num_classes: int | None = None
    ) -> RegistryResult:
        validate_client_labels(client_labels)
        discovered: dict[Hashable, int] = {}
        for encoded in self.encoding_order(client_labels):
            for label in encoded:
                discovered.setdefault(label, len(discovered))
        placeholder_of_index = self.assign_placeholders(len(discovered))
        placeholder = {label: placeholder_of_index[i] for label, i in discovered.items()}
        client_maps = [{label: placeholder[label] for label in counts} for counts in client_labels]
        global_counts = np.zeros(len(discovered), dtype=np.int64)
        for counts, mapping in zip(client_labels, client_maps):
            for label, count in counts.items():
                global_counts[mapping[label]] += int(count)
        self.result = RegistryResult(len(discovered), client_maps, global_counts)
        self.discovered = discovered
        self.pending_counts = {}
        self.placeholder_of_index = placeholder_of_index
        return self.result

    def _discover(self, client: int, label: Any) -> int:
        return self.discovered.setdefault(label, len(self.discovered))

    def _count(
        self, client: int, placeholder: int, count: int, global_counts: np.ndarray
    ) -> np.ndarray:
        counts = np.zeros(len(self.placeholder_of_index), dtype=np.int64)
        counts[: len(global_counts)] = global_counts
        counts[placeholder] += count
        return counts
