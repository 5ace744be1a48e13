"""The encrypted label registry: one interface over the four protocols, and result comparison."""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any

import numpy as np

from stratify.errors import RegistryError
from stratify.registry.base import (
    PROTOCOLS,
    LabelRegistry,
    RegistryResult,
    validate_client_labels,
)
from stratify.registry.ckks.encoding import (
    COUNT_LIMIT,
    BFVParameters,
    CKKSParameters,
    KeyedLabelHash,
)
from stratify.registry.ckks.protocols import (
    START_BLOCK_SIZE,
    _NaiveRun,
    _PackedRun,
    _ProtocolRun,
    packed_block_size,
)
from stratify.registry.ckks.roles import (
    BlindKeyHolder,
    BlindServer,
    KeyHolder,
    KeyHolderRole,
    Server,
    ServerRole,
)
from stratify.registry.ckks.stats import ProtocolStats
from stratify.registry.client_secrets import RegistrySecrets


class CKKSRegistry(LabelRegistry):
    """Encrypted placeholder registry (TenSEAL): ``naive`` or ``packed`` over CKKS, as the
    paper, or ``naive-blind`` or ``packed-blind``, where the server blinds comparisons and
    masks counts (BFV on the same ring) so that the key holder learns only match bits.

    Gives exactly :class:`~stratify.registry.plain.PlainRegistry`'s result for the same
    secrets and input, :meth:`register` and :meth:`add_label` alike: each client encodes
    its labels in a secret random order and the placeholders are a secret permutation
    (docs/architecture.md, "Privacy"), so neither the key holder nor the server receives
    anything in label order, and the run's seed does not determine the placeholders.
    :meth:`register` either completes or raises :class:`~stratify.errors.RegistryError`
    with :attr:`result`, :attr:`timings` and :attr:`stats` unchanged. :meth:`add_label`
    continues the last registration's protocol run (the same ``U`` and encrypted count
    totals, the same keys).

    Parameters
    ----------
    seed : int
        The run's seed, kept for reference: it is public, so nothing secret follows from it.
    protocol : {"packed-blind", "packed", "naive-blind", "naive"}
        How labels and counts are laid out in ciphertexts (``packed``: SIMD blocks;
        ``naive``: one value per ciphertext), and whether the server blinds (``-blind``).
    secrets : RegistrySecrets, optional
        The clients' secrets (encoding orders, placeholder permutation, hash key); default
        drawn afresh from the OS's CSPRNG. A run saves them to resume exactly.
    hash_key : bytes, optional
        Key of the clients' keyed label hash; default derived from ``secrets``.
    label_hash : callable, optional
        Replaces the keyed hash (``label -> int`` in ``[0, LABEL_HASH_RANGE)``); codes
        are range-checked.
    max_unique : int, optional
        Bound on the number of unique labels when ``num_classes`` is not given; sets the
        packed block size. Default: the clients' total label count, capped at the slots.
    parameters : CKKSParameters, optional
        Encryption parameters of ``naive`` and ``packed``.
    blind_parameters : BFVParameters, optional
        Encryption parameters of ``naive-blind`` and ``packed-blind``.
    blinding_seed : int, optional
        Seed of the server's blinding factors and count masks, for reproducible tests
        only: whoever knows it can undo the blinding. Default: the OS's CSPRNG.

    Attributes
    ----------
    timings : dict
        Seconds of the last registration: ``setup_s`` (key generation, when it happened
        in that call), ``unique_s``, ``mapping_s``, ``aggregation_s`` (client and server
        work both counted).
    stats : ProtocolStats or None
        Counters of the last registration and of the labels added since.
    """

    name = "ckks"

    def __init__(
        self,
        seed: int = 0,
        protocol: str = "packed-blind",
        *,
        secrets: RegistrySecrets | None = None,
        hash_key: bytes | None = None,
        label_hash: Callable[[Hashable], int] | None = None,
        max_unique: int | None = None,
        parameters: CKKSParameters | None = None,
        blind_parameters: BFVParameters | None = None,
        blinding_seed: int | None = None,
    ) -> None:
        super().__init__(seed=seed, secrets=secrets or RegistrySecrets.draw())
        if protocol not in PROTOCOLS:
            raise RegistryError(
                f"unknown registry protocol {protocol!r}; use one of {', '.join(PROTOCOLS)}"
            )
        if max_unique is not None and (int(max_unique) != max_unique or max_unique < 1):
            raise RegistryError(f"max_unique must be a positive integer, got {max_unique!r}")
        self.protocol = protocol
        self.blinded = protocol.endswith("-blind")
        #: how labels and counts sit in ciphertexts: "naive" or "packed"
        self.layout = protocol.removesuffix("-blind")
        self.name = f"bfv-{protocol}" if self.blinded else f"ckks-{protocol}"
        self.max_unique = max_unique
        self.parameters = parameters or CKKSParameters()
        self.blind_parameters = blind_parameters or BFVParameters()
        self.blinding_seed = blinding_seed
        assert self.secrets is not None  # drawn above when not given
        self.label_hash = label_hash or KeyedLabelHash(hash_key or self.secrets.hash_key)
        self.timings: dict[str, float] = {}
        self.stats: ProtocolStats | None = None
        self._roles: tuple[KeyHolderRole, ServerRole] | None = None
        self._run: _ProtocolRun | None = None

    def roles(self) -> tuple[KeyHolderRole, ServerRole]:
        """The key holder and the server, created on first use (key generation ~30 ms)."""
        if self._roles is None:
            if self.blinded:
                rng = (
                    None
                    if self.blinding_seed is None
                    else np.random.default_rng(self.blinding_seed)
                )
                blind = BlindKeyHolder(self.blind_parameters, self.label_hash)
                plain_modulus = self.blind_parameters.plain_modulus
                self._roles = (blind, BlindServer(blind.public_context(), plain_modulus, rng))
            else:
                key_holder = KeyHolder(self.parameters, self.label_hash)
                self._roles = (key_holder, Server(key_holder.public_context()))
        return self._roles

    def register(
        self, client_labels: Sequence[Mapping[Any, int]], num_classes: int | None = None
    ) -> RegistryResult:
        validate_client_labels(client_labels)
        if num_classes is not None and (
            isinstance(num_classes, bool)
            or not isinstance(num_classes, (int, np.integer))
            or num_classes < 1
        ):
            raise RegistryError(f"num_classes must be a positive integer, got {num_classes!r}")
        encoded = self.encoding_order(client_labels)  # what each client sends, in its order
        client_counts = [[int(count) for count in counts.values()] for counts in encoded]
        total_count = sum(map(sum, client_counts))
        if total_count > COUNT_LIMIT:
            raise RegistryError(
                f"{total_count} samples in all; the secure registry counts at most {COUNT_LIMIT}"
            )
        stats = ProtocolStats()
        start = time.perf_counter()
        key_holder, server = self.roles()
        setup_s = time.perf_counter() - start

        start = time.perf_counter()
        code_owner: dict[int, tuple[Hashable, int]] = {}
        codes = key_holder.encode(encoded, code_owner)  # each client hashes its own labels
        labels = [list(counts) for counts in encoded]
        unique_limit = num_classes if num_classes is not None else self.max_unique
        run: _ProtocolRun
        if self.layout == "naive":
            run = _NaiveRun(key_holder, server, codes, labels, unique_limit, stats, code_owner)
        else:
            block_size, unique_limit = packed_block_size(
                unique_limit, sum(map(len, codes)), key_holder.data_slots
            )
            run = _PackedRun(
                key_holder,
                server,
                codes,
                labels,
                unique_limit,
                stats,
                code_owner,
                block_size=block_size,
            )
        run.discover()
        unique_s = time.perf_counter() - start

        start = time.perf_counter()
        unique_indices = run.map_labels()
        placeholder_of_index = self.assign_placeholders(run.num_unique)
        client_placeholders = [
            [placeholder_of_index[index] for index in indices] for indices in unique_indices
        ]
        client_maps = []
        for counts, sent, placeholders in zip(client_labels, encoded, client_placeholders):
            mapped = dict(zip(sent, placeholders))
            client_maps.append({label: mapped[label] for label in counts})  # the caller's order
        mapping_s = time.perf_counter() - start

        start = time.perf_counter()
        global_counts = run.aggregate(client_placeholders, client_counts)
        aggregation_s = time.perf_counter() - start

        result = RegistryResult(run.num_unique, client_maps, global_counts)
        self.timings = {
            "setup_s": setup_s,
            "unique_s": unique_s,
            "mapping_s": mapping_s,
            "aggregation_s": aggregation_s,
        }
        self.stats = stats
        self.result = result
        self.pending_counts = {}
        self.placeholder_of_index = placeholder_of_index
        # later labels are bounded by what was declared, not by the packing of this call
        run.unique_limit = num_classes if num_classes is not None else self.max_unique
        self._run = run
        return result

    def _new_run(self) -> _ProtocolRun:
        """The protocol run of an empty registration, for labels added one at a time."""
        key_holder, server = self.roles()
        stats = ProtocolStats()
        if self.layout == "naive":
            return _NaiveRun(key_holder, server, [], [], self.max_unique, stats)
        block_size = min(self.max_unique or START_BLOCK_SIZE, key_holder.data_slots)
        return _PackedRun(key_holder, server, [], [], self.max_unique, stats, block_size=block_size)

    def _discover(self, client: int, label: Any) -> int:
        return self._discover_many(client, [label])[0]

    def _discover_many(self, client: int, labels: list[Any]) -> list[int]:
        return self._register(
            client, labels, lambda run, codes: run.add_labels(client, codes, labels)
        )

    def _place_many(self, client: int, labels: list[Any], new: list[bool]) -> list[int]:
        return self._register(
            client, labels, lambda run, codes: run.place_labels(client, codes, labels, new)
        )

    def _register(
        self,
        client: int,
        labels: list[Any],
        step: Callable[[_ProtocolRun, list[int]], list[int]],
    ) -> list[int]:
        """``step(run, codes)`` with ``labels``' codes on the protocol run of the last
        registration (an empty one when there is none), kept only if it goes through;
        the indices of ``labels`` in ``U``."""
        run = self._run if self._run is not None else self._new_run()
        owner = dict(run.code_owner)  # committed only once the labels are registered
        codes = [run.key_holder.encode_label(client, label, owner) for label in labels]
        indices = step(run, codes)
        run.code_owner = owner
        self._run = run
        self.stats = run.stats
        return indices

    def check_new_label(self, result: RegistryResult, client: int, label: Any, count: int) -> None:
        super().check_new_label(result, client, label, count)
        if count > COUNT_LIMIT - int(result.global_counts.sum()) - self.pending_total():
            raise RegistryError(
                f"client {client}: {count} more samples of {label!r} would make more than "
                f"the {COUNT_LIMIT} the secure registry counts"
            )

    def _count(
        self, client: int, placeholder: int, count: int, global_counts: np.ndarray
    ) -> np.ndarray:
        assert self._run is not None  # _discover ran first
        return self._run.add_count(client, placeholder, count, global_counts)

    def _count_many(
        self, counts: dict[int, dict[int, int]], global_counts: np.ndarray
    ) -> np.ndarray:
        if not isinstance(self._run, _PackedRun):  # naive: one total per placeholder
            return super()._count_many(counts, global_counts)
        return self._run.add_counts(counts)


def same_result(first: RegistryResult, second: RegistryResult) -> bool:
    """Whether two registrations are identical: placeholder count, every client map
    (labels and placeholders) and the global counts."""
    return (
        first.num_placeholders == second.num_placeholders
        and first.client_maps == second.client_maps
        and np.array_equal(first.global_counts, second.global_counts)
    )
