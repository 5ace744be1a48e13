"""Label registries: real labels -> placeholders and global counts per placeholder."""

from stratify.registry.base import PROTOCOLS, LabelRegistry, RegistryResult
from stratify.registry.plain import PlainRegistry

__all__ = ["PROTOCOLS", "LabelRegistry", "RegistryResult", "PlainRegistry", "make_registry"]


def make_registry(secure: bool, seed: int = 0, protocol: str = "packed-blind") -> LabelRegistry:
    """The registry of ``--secure`` (encrypted, ``protocol`` one of :data:`PROTOCOLS`) or
    ``--no-secure`` (plain)."""
    if not secure:
        return PlainRegistry(seed=seed)
    from stratify.registry.ckks import CKKSRegistry

    return CKKSRegistry(seed=seed, protocol=protocol)
