"""The clients' registry secrets (docs/architecture.md, "Privacy"), in two kinds:

- what the clients share (:class:`SharedSecrets`): the label-hash key and the placeholder
  permutation, derived from one 256-bit secret; the server never holds it, the key holder
  does (it is a client);
- what each client keeps to itself (:class:`OrderKey`): the key of the secret order in
  which it encodes its labels, drawn by that client and sent to no one, the key holder
  included. Were the key holder able to derive another client's order, it would undo it
  and rank the labels from the order of that client's match rows.

None of them may follow from the public run configuration: a server that knew the run's
``--seed`` could otherwise recompute the placeholders. Every secret comes from the OS's
CSPRNG (:func:`secrets.token_bytes`); the permutations are Fisher-Yates shuffles driven by
HMAC-SHA256 in counter mode under a key, so they are uniform to anyone without it and
exact to anyone with it (``--resume``, a rerun from the saved secrets).

In this simulation one process plays every party, so a run holds them all
(:class:`RegistrySecrets`: the shared secret and one order key per client, each client
reading only its own) and keeps them in one file of its folder (:data:`SECRETS_FILE`,
mode 0600). Over Flower they are apart, as in a deployment: the federation key file holds
the shared part, and each node draws its own order key (docs/flower.md, "The encrypted
registry").
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from stratify.errors import ConfigError, CorruptRunError

#: the run folder's file of the clients' secrets (never sent to the server)
SECRETS_FILE = "client_secrets.json"
#: the mode of every secrets file the toolkit writes: its owner's to read, no one else's
SECRETS_MODE = 0o600
#: bytes of the shared secret and of each order key
SECRET_BYTES = 32
#: version of :data:`SECRETS_FILE`'s layout: 2, the shared secret and one order key per
#: client; 1 (read, for --resume of older runs), one secret every order derived from
SECRETS_FORMAT = 2
#: the layout before per-client order keys
LEGACY_FORMAT = 1
#: version of a node's order-key file (:func:`node_order_key`)
ORDER_KEY_FORMAT = 1


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


def _derive(secret: bytes, purpose: bytes) -> bytes:
    """HMAC-SHA256 of ``secret`` for ``purpose``: independent keys from one secret."""
    return hmac.new(secret, b"stratify registry:" + purpose, hashlib.sha256).digest()


@dataclass(frozen=True)
class SharedSecrets:
    """What the clients share, never the server: the label-hash key and the placeholder
    permutation, both derived from one random ``secret``.

    Parameters
    ----------
    secret : bytes
        :data:`SECRET_BYTES` random bytes (:meth:`draw`); left out of ``repr``, so a log
        or an error message never shows it.
    """

    secret: bytes = field(repr=False)

    @classmethod
    def draw(cls) -> SharedSecrets:
        """A fresh shared secret from the OS's CSPRNG."""
        return cls(secrets.token_bytes(SECRET_BYTES))

    def derive(self, purpose: bytes) -> bytes:
        """The key for ``purpose``: HMAC-SHA256 of the secret (independent keys).

        Parameters
        ----------
        purpose : bytes
            What the key is for.
        """
        return _derive(self.secret, purpose)

    @property
    def hash_key(self) -> bytes:
        """The key of the clients' label hash (shared by the clients, not the server)."""
        return self.derive(b"label hash")

    def placeholders(self, num_unique: int) -> list[int]:
        """Placeholder of the i-th discovered unique label (shared by the clients).

        Parameters
        ----------
        num_unique : int
            Number of unique labels.
        """
        return keyed_permutation(self.derive(b"placeholders"), num_unique)


@dataclass(frozen=True)
class OrderKey:
    """One client's own secret: the key of the order in which it encodes its labels.

    Parameters
    ----------
    key : bytes
        :data:`SECRET_BYTES` random bytes (:meth:`draw`), drawn by the client and sent to
        no one; left out of ``repr``.
    """

    key: bytes = field(repr=False)

    @classmethod
    def draw(cls) -> OrderKey:
        """A fresh order key from the OS's CSPRNG."""
        return cls(secrets.token_bytes(SECRET_BYTES))

    def order(self, size: int) -> list[int]:
        """The order in which the client encodes its ``size`` labels: positions in its own
        list (a permutation of ``range(size)``).

        Parameters
        ----------
        size : int
            Its number of labels.
        """
        return keyed_permutation(_derive(self.key, b"order of " + str(size).encode()), size)

    def to_bytes(self) -> bytes:
        """The content of a node's order-key file (:func:`node_order_key`)."""
        payload = {"format": ORDER_KEY_FORMAT, "order_key": self.key.hex()}
        return (json.dumps(payload, indent=2) + "\n").encode()

    @classmethod
    def from_bytes(cls, data: bytes, where: str) -> OrderKey:
        """An order key saved by :meth:`to_bytes`.

        Parameters
        ----------
        data : bytes
            The file's content.
        where : str
            The file, for the error message.

        Raises
        ------
        ConfigError
            ``data`` is not such a file.
        """
        try:
            payload = json.loads(data.decode("utf-8"))
            key = bytes.fromhex(payload["order_key"])
            valid = payload["format"] == ORDER_KEY_FORMAT and len(key) == SECRET_BYTES
        except (ValueError, TypeError, KeyError, RecursionError):
            valid = False
        if not valid:
            raise ConfigError(
                f"{where} is not a client's order-key file (format {ORDER_KEY_FORMAT}, "
                f"{SECRET_BYTES} bytes in hex)"
            )
        return cls(key)


@dataclass(frozen=True)
class LegacyOrderKey(OrderKey):
    """A client's order as format 1 derived it from the shared secret, which every client
    (the key holder included) could therefore compute: kept only so that a run folder of
    that format resumes exactly, and so that the tests can show the attack it allowed.

    Parameters
    ----------
    key : bytes
        The format-1 secret (the shared one).
    client : int
        The client whose order it derives.
    """

    client: int = 0

    def order(self, size: int) -> list[int]:
        purpose = b"order of client " + str(self.client).encode() + b" of " + str(size).encode()
        return keyed_permutation(_derive(self.key, purpose), size)


@dataclass(frozen=True)
class RegistrySecrets:
    """Every party's registry secrets, as this simulation's one process holds them: the
    clients' shared secret and each client's own order key.

    The registry hands client ``k`` only ``order_keys[k]``
    (:meth:`~stratify.registry.base.LabelRegistry.encoding_order`) and the key holder only
    the shared part (the label-hash key). A client that has no key yet draws its own from
    the OS's CSPRNG when it first encodes, as a deployment's client does.

    Parameters
    ----------
    shared : SharedSecrets
        What the clients share.
    order_keys : mapping of int to OrderKey
        Each client's own order key, by client number.
    """

    shared: SharedSecrets
    order_keys: Mapping[int, OrderKey] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        # a copy of the caller's mapping: keys drawn later (order_key) stay in this object
        if not isinstance(self.order_keys, _LegacyKeys):
            object.__setattr__(self, "order_keys", dict(self.order_keys))

    @classmethod
    def draw(cls, clients: int = 0) -> RegistrySecrets:
        """Fresh secrets: the shared secret and the order keys of ``clients`` clients.

        Parameters
        ----------
        clients : int
            Clients whose order keys to draw now (others draw theirs on first use).
        """
        return cls(SharedSecrets.draw(), {k: OrderKey.draw() for k in range(clients)})

    @classmethod
    def legacy(cls, secret: bytes) -> RegistrySecrets:
        """Format 1's secrets: every client's order derived from the one shared ``secret``.

        Parameters
        ----------
        secret : bytes
            The format-1 secret.
        """
        return cls(SharedSecrets(secret), _LegacyKeys(secret))

    @property
    def hash_key(self) -> bytes:
        """The key of the clients' label hash (:attr:`SharedSecrets.hash_key`)."""
        return self.shared.hash_key

    def placeholders(self, num_unique: int) -> list[int]:
        """Placeholder of the i-th discovered unique label (:meth:`SharedSecrets.placeholders`).

        Parameters
        ----------
        num_unique : int
            Number of unique labels.
        """
        return self.shared.placeholders(num_unique)

    def order_key(self, client: int) -> OrderKey:
        """Client ``client``'s own order key (drawn now if it has none).

        Parameters
        ----------
        client : int
            The client.
        """
        keys = self.order_keys
        if client not in keys:
            assert isinstance(keys, dict)
            keys[client] = OrderKey.draw()
        return keys[client]

    def client_order(self, client: int, size: int) -> list[int]:
        """The order in which client ``client`` encodes its ``size`` labels, from its own
        order key only.

        Parameters
        ----------
        client : int
            The client.
        size : int
            Its number of labels.
        """
        return self.order_key(client).order(size)

    @property
    def is_legacy(self) -> bool:
        """Format 1's secrets: the orders follow from the shared secret."""
        return isinstance(self.order_keys, _LegacyKeys)

    def to_bytes(self) -> bytes:
        """The content of :data:`SECRETS_FILE` (format 1 stays format 1)."""
        payload: dict[str, object]
        if self.is_legacy:
            payload = {"format": LEGACY_FORMAT, "secret": self.shared.secret.hex()}
        else:
            payload = {
                "format": SECRETS_FORMAT,
                "shared": self.shared.secret.hex(),
                "order_keys": [
                    self.order_keys[client].key.hex() for client in sorted(self.order_keys)
                ],
            }
        return (json.dumps(payload, indent=2) + "\n").encode()

    @classmethod
    def from_bytes(cls, data: bytes, where: str) -> RegistrySecrets:
        """Secrets saved by :meth:`to_bytes`: format 2, or format 1 (its orders derived
        from its one secret, as that format did, so an older run resumes exactly).

        Parameters
        ----------
        data : bytes
            The file's content.
        where : str
            The file, for the error message.

        Raises
        ------
        CorruptRunError
            ``data`` is not such a file.
        """
        try:
            payload = json.loads(data.decode("utf-8"))
            if payload["format"] == LEGACY_FORMAT:
                secret = bytes.fromhex(payload["secret"])
                if len(secret) == SECRET_BYTES:
                    return cls.legacy(secret)
            elif payload["format"] == SECRETS_FORMAT:
                shared = bytes.fromhex(payload["shared"])
                keys = [bytes.fromhex(key) for key in payload["order_keys"]]
                if len(shared) == SECRET_BYTES and all(len(k) == SECRET_BYTES for k in keys):
                    return cls(SharedSecrets(shared), dict(enumerate(map(OrderKey, keys))))
        except (ValueError, TypeError, KeyError, AttributeError, RecursionError):
            # RecursionError: a file nested past the interpreter's stack ("[" * 4000)
            pass
        raise CorruptRunError(
            f"{where} does not hold the run's registry secrets (format {SECRETS_FORMAT}: the "
            f"shared secret and each client's order key, {SECRET_BYTES} bytes in hex each)"
        )


class _LegacyKeys(dict):
    """Format 1's order keys: client ``k``'s derived from the shared secret on demand."""

    def __init__(self, secret: bytes) -> None:
        super().__init__()
        self.secret = secret

    def __missing__(self, client: int) -> OrderKey:
        return LegacyOrderKey(self.secret, client)

    def __contains__(self, client: object) -> bool:
        return isinstance(client, int)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _LegacyKeys) and other.secret == self.secret

    __hash__ = None  # type: ignore[assignment]


def write_secret_file(path: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` to ``path``, readable by its owner only from its creation (mode
    :data:`SECRETS_MODE` given to :func:`os.open`, not set after, so no moment exists
    when another user could open it).

    Parameters
    ----------
    path : path
        The file to create (replaced if it exists).
    data : bytes
        Its content.
    """
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, SECRETS_MODE)
    with os.fdopen(descriptor, "wb") as out:
        out.write(data)
    os.chmod(path, SECRETS_MODE)  # a file that existed keeps its mode under O_CREAT


def node_order_key(path: str | os.PathLike | None) -> OrderKey:
    """A node's own order key: read from ``path`` when it exists, else drawn from the OS's
    CSPRNG (and written to ``path``, mode 0600, when one is given, so that the node's run
    can be repeated). Without ``path`` it lives in the node's memory only.

    Parameters
    ----------
    path : path, optional
        The node-local order-key file (``--node-config order-key=PATH``).

    Raises
    ------
    ConfigError
        An unreadable or foreign file (one line naming it).
    """
    if path is None:
        return OrderKey.draw()
    file = Path(path)
    try:
        return OrderKey.from_bytes(file.read_bytes(), str(file))
    except FileNotFoundError:
        pass
    except OSError as error:
        raise ConfigError(
            f"cannot read the order-key file {file}: {error.strerror or error}"
        ) from None
    key = OrderKey.draw()
    try:
        write_secret_file(file, key.to_bytes())
    except OSError as error:
        raise ConfigError(
            f"cannot write the order-key file {file}: {error.strerror or error}"
        ) from None
    return key
