"""The clients' registry secrets: the label-hash key, the placeholder permutation and the
order in which each client encodes its labels (docs/architecture.md, "Privacy").

None of them may follow from the public run configuration: a server that knew the run's
``--seed`` could otherwise recompute the placeholders, and a key holder that saw a client's
labels in ascending order would rank them. A run draws one 256-bit secret from the OS's
CSPRNG (:func:`secrets.token_bytes`) and derives every key from it with HMAC-SHA256; the
permutations are Fisher-Yates shuffles driven by HMAC-SHA256 in counter mode under such a
key, so they are uniform to anyone without it and exact to anyone with it (``--resume``,
a rerun from the saved secrets). The run keeps the secret in its folder
(:data:`SECRETS_FILE`): in this simulation one process plays every party, while a
deployment keeps that file on the clients, each client holding only its own order key.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
from collections.abc import Iterator
from dataclasses import dataclass, field

from stratify.errors import CorruptRunError

#: the run folder's file of the clients' secrets (never sent to the server)
SECRETS_FILE = "client_secrets.json"
#: the mode of every secrets file the toolkit writes: its owner's to read, no one else's
SECRETS_MODE = 0o600
#: bytes of the run's secret
SECRET_BYTES = 32
#: version of :data:`SECRETS_FILE`'s layout
SECRETS_FORMAT = 1


def keyed_permutation(key: bytes, size: int) -> list[int]:
    """A permutation of ``range(size)``, uniform to whoever lacks ``key``.

    Fisher-Yates with each index drawn from HMAC-SHA256(``key``, counter) by rejection,
    so no index is more likely than another.

    Parameters
    ----------
    key : bytes
        The secret; the same key and size give the same permutation.
    size : int
        Number of items.
    """
    order = list(range(size))
    words = _keyed_words(key)
    for last in range(size - 1, 0, -1):
        bound = last + 1
        limit = 2**64 - 2**64 % bound  # words at or above it would favour small indices
        word = next(words)
        while word >= limit:
            word = next(words)
        other = word % bound
        order[last], order[other] = order[other], order[last]
    return order


def _keyed_words(key: bytes) -> Iterator[int]:
    """64-bit words of HMAC-SHA256(``key``, 0), HMAC-SHA256(``key``, 1), ..."""
    counter = 0
    while True:
        digest = hmac.new(key, counter.to_bytes(8, "big"), hashlib.sha256).digest()
        for start in range(0, len(digest), 8):
            yield int.from_bytes(digest[start : start + 8], "big")
        counter += 1


@dataclass(frozen=True)
class RegistrySecrets:
    """The clients' secrets of one run, derived from one random ``secret``.

    Parameters
    ----------
    secret : bytes
        :data:`SECRET_BYTES` random bytes (:meth:`draw`); left out of ``repr``, so a log
        or an error message never shows it.
    """

    secret: bytes = field(repr=False)

    @classmethod
    def draw(cls) -> RegistrySecrets:
        """Fresh secrets from the OS's CSPRNG."""
        return cls(secrets.token_bytes(SECRET_BYTES))

    def derive(self, purpose: bytes) -> bytes:
        """The key for ``purpose``: HMAC-SHA256 of the secret (independent keys)."""
        return hmac.new(self.secret, b"stratify registry:" + purpose, hashlib.sha256).digest()

    @property
    def hash_key(self) -> bytes:
        """The key of the clients' label hash (shared by the clients, not the server)."""
        return self.derive(b"label hash")

    def placeholders(self, num_unique: int) -> list[int]:
        """Placeholder of the i-th discovered unique label (shared by the clients)."""
        return keyed_permutation(self.derive(b"placeholders"), num_unique)

    def client_order(self, client: int, size: int) -> list[int]:
        """The order in which client ``client`` encodes its ``size`` labels: positions in
        its own list. A deployment's client draws its own; here each is derived from the
        secret, so a rerun encodes in the same order."""
        purpose = b"order of client " + str(client).encode() + b" of " + str(size).encode()
        return keyed_permutation(self.derive(purpose), size)

    def to_bytes(self) -> bytes:
        """The content of :data:`SECRETS_FILE`."""
        payload = {"format": SECRETS_FORMAT, "secret": self.secret.hex()}
        return (json.dumps(payload, indent=2) + "\n").encode()

    @classmethod
    def from_bytes(cls, data: bytes, where: str) -> RegistrySecrets:
        """Secrets saved by :meth:`to_bytes`.

        Raises
        ------
        CorruptRunError
            ``data`` is not such a file; ``where`` names it.
        """
        try:
            payload = json.loads(data.decode("utf-8"))
            secret = bytes.fromhex(payload["secret"])
            valid = payload["format"] == SECRETS_FORMAT and len(secret) == SECRET_BYTES
        except (ValueError, TypeError, KeyError, RecursionError):
            # RecursionError: a file nested past the interpreter's stack ("[" * 4000)
            valid = False
        if not valid:
            raise CorruptRunError(
                f"{where} does not hold the run's registry secrets (format {SECRETS_FORMAT}, "
                f"{SECRET_BYTES} bytes in hex)"
            )
        return cls(secret)
