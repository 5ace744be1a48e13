"""A federation's key file: what the clients share before a secure run over Flower.

The encrypted registry's clients share, out of band (as they would receive TLS
certificates), the 256-bit shared secret
(:class:`~stratify.registry.client_secrets.SharedSecrets`: label-hash key and placeholder
permutation) and the schemes' contexts with their secret key (BFV for ``packed-blind``,
CKKS for ``packed``). Every node loads the file (``--node-config registry-keys=PATH``);
the server never does: the key-holder node sends it the public context (docs/flower.md,
"The encrypted registry"). The file holds no client's encoding order: each node draws its
own order key (:func:`~stratify.registry.client_secrets.node_order_key`), so the key
holder, which holds this file too, cannot undo another client's order.

``python -m stratify.flower.keys PATH`` writes a new one.
"""

from __future__ import annotations

import base64
import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

import tenseal as ts

from stratify.errors import ConfigError, StratifyError
from stratify.registry.ckks.encoding import BFVParameters, CKKSParameters, KeyedLabelHash
from stratify.registry.ckks.roles import BlindKeyHolder, KeyHolder, KeyHolderRole
from stratify.registry.client_secrets import SECRET_BYTES, SharedSecrets, write_secret_file

#: version of the key file's layout
KEYS_FORMAT = 1
#: the scheme of each protocol that runs over Flower
SCHEMES = {"packed-blind": "bfv", "packed": "ckks"}


@dataclass(frozen=True)
class FederationKeys:
    """The clients' shared keys of one federation.

    Parameters
    ----------
    secrets : SharedSecrets
        The clients' shared secret (no client's order key).
    contexts : dict
        Scheme (``"bfv"``, ``"ckks"``) -> its context serialized with the secret key; left
        out of ``repr``.
    """

    secrets: SharedSecrets
    contexts: dict[str, bytes] = field(repr=False)

    @classmethod
    def draw(cls) -> FederationKeys:
        """Fresh keys: a registry secret from the OS's CSPRNG and a context per scheme
        with the registry's default parameters."""
        secrets = SharedSecrets.draw()
        label_hash = KeyedLabelHash(secrets.hash_key)
        holders = {
            "bfv": BlindKeyHolder(BFVParameters(), label_hash),
            "ckks": KeyHolder(CKKSParameters(), label_hash),
        }
        return cls(secrets, {scheme: holder.secret_context() for scheme, holder in holders.items()})

    def key_holder(self, protocol: str) -> KeyHolderRole:
        """A client's encryption (and, on the key-holder node, decryption) for
        ``protocol``, with the shared context and the shared label hash."""
        label_hash = KeyedLabelHash(self.secrets.hash_key)
        context = ts.context_from(self.contexts[SCHEMES[protocol]])
        if SCHEMES[protocol] == "bfv":
            return BlindKeyHolder(BFVParameters(), label_hash, context=context)
        return KeyHolder(CKKSParameters(), label_hash, context=context)

    def to_bytes(self) -> bytes:
        """The key file's content (JSON)."""
        payload = {
            "format": KEYS_FORMAT,
            "secret": self.secrets.secret.hex(),
            "contexts": {
                scheme: base64.b64encode(context).decode()
                for scheme, context in self.contexts.items()
            },
        }
        return json.dumps(payload).encode()

    @classmethod
    def from_bytes(cls, data: bytes, where: str) -> FederationKeys:
        """Keys saved by :meth:`to_bytes`.

        Raises
        ------
        ConfigError
            ``data`` is not such a file; ``where`` names it.
        """
        try:
            payload = json.loads(data.decode("utf-8"))
            secret = bytes.fromhex(payload["secret"])
            contexts = {
                scheme: base64.b64decode(payload["contexts"][scheme], validate=True)
                for scheme in sorted(set(SCHEMES.values()))
            }
            valid = payload["format"] == KEYS_FORMAT and len(secret) == SECRET_BYTES
        except (ValueError, TypeError, KeyError):
            valid = False
        if not valid:
            raise ConfigError(
                f"{where} is not a federation key file (format {KEYS_FORMAT}); write one with "
                "python -m stratify.flower.keys PATH"
            )
        return cls(SharedSecrets(secret), contexts)


def write_federation_keys(path: str | os.PathLike) -> FederationKeys:
    """Draw a federation's keys and write them to ``path`` (readable by its owner only),
    for every client to load; returns them.

    Parameters
    ----------
    path : path
        The key file to create (replaced if it exists).
    """
    keys = FederationKeys.draw()
    write_secret_file(path, keys.to_bytes())  # created 0600, not made so after
    return keys


def read_federation_keys(path: str | os.PathLike) -> FederationKeys:
    """The keys :func:`write_federation_keys` wrote to ``path``.

    Raises
    ------
    ConfigError
        A missing, unreadable or foreign file (one line naming it).
    """
    try:
        data = Path(path).read_bytes()
    except OSError as error:
        raise ConfigError(
            f"cannot read the federation key file {path}: {error.strerror or error}"
        ) from None
    return FederationKeys.from_bytes(data, str(path))


def main(argv: list[str] | None = None) -> int:
    """``python -m stratify.flower.keys PATH``: write a federation's key file."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m stratify.flower.keys PATH", file=sys.stderr)
        return 2
    try:
        write_federation_keys(args[0])
    except (OSError, StratifyError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(f"wrote {args[0]}: give it to every client node, never to the server")
    return 0


if __name__ == "__main__":
    sys.exit(main())
