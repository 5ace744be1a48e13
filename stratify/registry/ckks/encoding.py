"""Label codes and encryption parameters: what the clients encrypt, and how precisely.

Labels become integer codes with a keyed hash (HMAC-SHA256) the clients share and the
server never sees.

The blinded protocols use BFV on the same ring and moduli (:class:`BFVParameters`): their
arithmetic is exact modulo a prime ``t``, which is what lets a random factor hide a
difference completely (docs/architecture.md, "Privacy"). After the server's one
plaintext multiplication a ciphertext still decrypts exactly with ~22 bits of noise
budget to spare at the worst case (measured: every slot compared, codes at the top of
the range, U summed from 64 ciphertexts; it survives a further multiplication by 2^22,
not always by 2^23).

Precision (measured with the default parameters: ring degree 8192, moduli 60/40/60 bits,
scale 2^40): decrypting a difference of two label codes below ``2^30`` is off by at most
~5e-7 (the error grows with the largest value in the vector: ~1e-8 below 2^20, ~5e-4 at
2^40), so equality is ``|d| < 0.5``, a margin of about 10^6 over the error. Decrypted
values must also lie within 0.01 of an integer, which catches tampered ciphertexts and
parameters too small for the values.
"""

from __future__ import annotations

import hashlib
import hmac
import math
from collections.abc import Hashable
from dataclasses import dataclass

import numpy as np

from stratify.errors import RegistryError

#: Label codes lie in ``[0, LABEL_HASH_RANGE)``; CKKS separates codes this large by ~10^6
#: times its error, and 100 labels collide with probability ~5e-6 (a collision is raised).
LABEL_HASH_RANGE = 2**30
#: A decrypted difference is a match when its magnitude is below this (codes are integers).
MATCH_THRESHOLD = 0.5
#: Every decrypted value must be an integer up to this; CKKS error is ~1e-6 here.
INTEGER_TOLERANCE = 0.01
#: Largest global count accepted; counts are decrypted exactly far beyond this.
COUNT_LIMIT = 2**30
#: BFV plaintext modulus of the blinded protocols: the smallest prime above 2^31 that is
#: 1 mod 2 * 8192 (so vectors batch into slots). Above every code difference and count, so
#: ``l - u`` is 0 mod t only for equal codes and counts come out exact.
BLIND_PLAIN_MODULUS = 2_147_565_569
#: Zero slots that end every blinded ciphertext. The server never masks them and multiplies
#: them by non-zero factors, so they decrypt to 0 unless the ciphertext was tampered with
#: or made under another key (then each is 0 with probability 1/t).
CHECK_SLOTS = 2


@dataclass(frozen=True)
class CKKSParameters:
    """CKKS encryption parameters (only additions and subtractions are ever evaluated).

    Parameters
    ----------
    poly_modulus_degree : int
        Ring degree ``N``; a ciphertext has ``N / 2`` slots.
    coeff_mod_bit_sizes : tuple of int
        Bit sizes of the coefficient moduli; no multiplication means no extra levels.
    scale_bits : int
        ``log2`` of the encoding scale; sets the precision of decrypted values.
    """

    poly_modulus_degree: int = 8192
    coeff_mod_bit_sizes: tuple[int, ...] = (60, 40, 60)
    scale_bits: int = 40

    @property
    def slots(self) -> int:
        return self.poly_modulus_degree // 2


@dataclass(frozen=True)
class BFVParameters:
    """BFV parameters of the blinded protocols: the CKKS ring and moduli, exact arithmetic.

    Parameters
    ----------
    poly_modulus_degree : int
        Ring degree ``N``; a BFV ciphertext has ``N`` slots.
    coeff_mod_bit_sizes : tuple of int
        Bit sizes of the coefficient moduli (the CKKS chain: one plaintext multiplication
        fits with room to spare).
    plain_modulus : int
        Prime ``t = 1 mod 2N``; values are residues mod ``t``. Must exceed every code and
        count: a smaller ``t`` could make two different codes equal mod ``t``.
    """

    poly_modulus_degree: int = 8192
    coeff_mod_bit_sizes: tuple[int, ...] = (60, 40, 60)
    plain_modulus: int = BLIND_PLAIN_MODULUS

    def __post_init__(self) -> None:
        smallest = max(LABEL_HASH_RANGE, COUNT_LIMIT)
        if self.plain_modulus <= smallest:
            raise RegistryError(
                f"BFV plain modulus {self.plain_modulus} must exceed {smallest}, the range of "
                "label codes and counts"
            )

    @property
    def slots(self) -> int:
        return self.poly_modulus_degree


def label_bytes(label: Hashable) -> bytes:
    """Type-tagged canonical bytes of a label, the input of the keyed hash.

    Labels that are equal as dictionary keys (``1``, ``True``, ``1.0``, ``np.int64(1)``)
    give the same bytes, as :class:`PlainRegistry` treats them as one label; the type tag
    keeps ``1`` and ``"1"`` apart.

    Parameters
    ----------
    label : int, float, str, bytes or tuple of these
        A client's label.
    """
    if isinstance(label, (bool, int, np.integer)):
        return b"int:" + str(int(label)).encode()
    if isinstance(label, (float, np.floating)):
        value = float(label)
        if math.isnan(value):
            raise RegistryError("label NaN cannot be registered: it is not equal to itself")
        if value.is_integer():
            return b"int:" + str(int(value)).encode()
        return b"float:" + value.hex().encode()
    if isinstance(label, str):
        return b"str:" + label.encode("utf-8", "surrogatepass")
    if isinstance(label, bytes):
        return b"bytes:" + label
    if isinstance(label, tuple):
        # length-prefixed parts, so ("a", "bc") and ("ab", "c") differ
        parts = [label_bytes(part) for part in label]
        return b"tuple:" + b"".join(len(part).to_bytes(8, "big") + part for part in parts)
    raise RegistryError(
        f"label {label!r} of type {type(label).__name__} cannot be encoded; "
        "use ints, floats, strings, bytes or tuples of them"
    )


class KeyedLabelHash:
    """HMAC-SHA256 of :func:`label_bytes`, reduced into ``[0, hash_range)``.

    Parameters
    ----------
    key : bytes
        Secret shared by the clients (never by the server).
    hash_range : int
        Codes lie in ``[0, hash_range)``; a power of two keeps the reduction unbiased.
    """

    def __init__(self, key: bytes, hash_range: int = LABEL_HASH_RANGE) -> None:
        self.key = key
        self.hash_range = hash_range

    def __call__(self, label: Hashable) -> int:
        digest = hmac.new(self.key, label_bytes(label), hashlib.sha256).digest()
        return int.from_bytes(digest[:8], "big") % self.hash_range
