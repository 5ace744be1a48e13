"""Counters of one registration: the work each role did and the bytes that travelled.

Both roles (:mod:`.roles`) update them and the protocol runs (:mod:`.protocols`) create
them, so they live apart from either.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class ProtocolStats:
    """Counters of one registration, for the benchmark and docs/privacy.md.

    Parameters
    ----------
    encryptions, decryptions, subtractions, additions : int
        Homomorphic work done by the key holder (first two) and the server.
    multiplications, maskings : int
        Blinded protocols: plaintext multiplications blinding a comparison, plaintext
        additions masking counts (both by the server).
    bytes_to_server, bytes_to_key_holder : int
        Serialized ciphertext bytes sent each way.
    max_decryption_error : float
        Largest distance of a decrypted value from the nearest integer.
    block_size : int
        Packed protocol: slots per block ``B`` (0 for naive).
    """

    encryptions: int = 0
    decryptions: int = 0
    subtractions: int = 0
    additions: int = 0
    multiplications: int = 0
    maskings: int = 0
    bytes_to_server: int = 0
    bytes_to_key_holder: int = 0
    max_decryption_error: float = 0.0
    block_size: int = 0
