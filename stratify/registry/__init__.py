"""Label registries: real labels -> placeholders and global counts per placeholder."""

from stratify.registry.base import PROTOCOLS, LabelRegistry, RegistryResult
from stratify.registry.client_secrets import (
    SECRETS_FILE,
    OrderKey,
    RegistrySecrets,
    SharedSecrets,
)
from stratify.registry.plain import PlainRegistry

__all__ = [
    "PROTOCOLS",
    "SECRETS_FILE",
    "LabelRegistry",
    "RegistryResult",
    "RegistrySecrets",
    "SharedSecrets",
    "OrderKey",
    "PlainRegistry",
    "make_registry",
]


def make_registry(
    secure: bool,
    seed: int = 0,
    protocol: str = "packed-blind",
    secrets: RegistrySecrets | None = None,
) -> LabelRegistry:
    """The registry of ``--secure`` (encrypted, ``protocol`` one of :data:`PROTOCOLS`) or
    ``--no-secure`` (plain).

    Parameters
    ----------
    secure : bool
        Encrypted or plain.
    seed : int
        The run's seed: the plain registry's placeholder permutation without ``secrets``.
    protocol : str
        The secure registry's protocol.
    secrets : RegistrySecrets, optional
        The clients' secrets; the secure registry draws fresh ones without them.
    """
    if not secure:
        return PlainRegistry(seed=seed, secrets=secrets)
    from stratify.registry.ckks import CKKSRegistry

    return CKKSRegistry(seed=seed, protocol=protocol, secrets=secrets)
