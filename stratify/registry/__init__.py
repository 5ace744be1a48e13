"""Label registries: real labels -> placeholders and global counts per placeholder."""

from stratify.registry.base import LabelRegistry, RegistryResult
from stratify.registry.plain import PlainRegistry

__all__ = ["LabelRegistry", "RegistryResult", "PlainRegistry", "make_registry"]


def make_registry(secure: bool, seed: int = 0, protocol: str = "packed") -> LabelRegistry:
    """The registry of ``--secure`` (CKKS, ``protocol`` naive|packed) or ``--no-secure`` (plain)."""
    if not secure:
        return PlainRegistry(seed=seed)
    from stratify.registry.ckks import CKKSRegistry

    return CKKSRegistry(seed=seed, protocol=protocol)
