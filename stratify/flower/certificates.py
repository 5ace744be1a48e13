"""The files a secured deployment needs, drawn on this machine (docs/flower.md,
"Deployed"): a certificate authority and the SuperLink's TLS certificate it signs, and a
SuperNode's authentication key pair (an elliptic-curve key in OpenSSH format, as
``flower-supernode --auth-supernode-private-key`` reads it and ``flwr supernode register``
takes its public half). Private keys are written 0600.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

#: how long the certificates hold: a test's deployment, or a trial by hand
VALID_DAYS = 30


@dataclass(frozen=True)
class TlsFiles:
    """A deployment's TLS files.

    Attributes
    ----------
    ca : Path
        The certificate authority's certificate (PEM): every SuperNode and the ``flwr``
        connection trust it (``--root-certificates``, ``root-certificates``).
    certificate : Path
        The SuperLink's certificate (PEM), signed by ``ca``, for ``host``.
    key : Path
        The SuperLink's private key (PEM, 0600).
    """

    ca: Path
    certificate: Path
    key: Path


def write_private(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path``, readable by its owner only from the start."""
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "wb") as file:
        file.write(data)


def _certificate(
    subject: str,
    key: ec.EllipticCurvePrivateKey,
    issuer: str,
    signer: ec.EllipticCurvePrivateKey,
    extensions: list[tuple[x509.ExtensionType, bool]],
) -> x509.Certificate:
    now = datetime.datetime.now(datetime.timezone.utc)
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
        .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer)]))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        # an hour back: a clock a little behind still accepts it
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=VALID_DAYS))
    )
    for extension, critical in extensions:
        builder = builder.add_extension(extension, critical=critical)
    return builder.sign(signer, hashes.SHA256())


def write_tls_files(folder: str | os.PathLike, host: str = "127.0.0.1") -> TlsFiles:
    """Draw a certificate authority and a SuperLink certificate for ``host`` it signs.

    Parameters
    ----------
    folder : path
        Where ``ca.crt``, ``server.pem`` and ``server.key`` go (created if missing).
    host : str
        The SuperLink's address as the SuperNodes and ``flwr`` reach it: an IP address
        or a host name (the certificate's subject alternative name).

    Returns
    -------
    TlsFiles
        The three files' paths.
    """
    root = Path(folder)
    root.mkdir(parents=True, exist_ok=True)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    authority = _certificate(
        "Stratify local CA",
        ca_key,
        "Stratify local CA",
        ca_key,
        [(x509.BasicConstraints(ca=True, path_length=0), True)],
    )
    try:
        name: x509.GeneralName = x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        name = x509.DNSName(host)
    server_key = ec.generate_private_key(ec.SECP256R1())
    server = _certificate(
        host,
        server_key,
        "Stratify local CA",
        ca_key,
        [
            (x509.BasicConstraints(ca=False, path_length=None), True),
            (x509.SubjectAlternativeName([name]), False),
        ],
    )
    files = TlsFiles(root / "ca.crt", root / "server.pem", root / "server.key")
    files.ca.write_bytes(authority.public_bytes(serialization.Encoding.PEM))
    files.certificate.write_bytes(server.public_bytes(serialization.Encoding.PEM))
    write_private(
        files.key,
        server_key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ),
    )
    return files


def write_node_key(path: str | os.PathLike) -> Path:
    """Draw a SuperNode's authentication key pair (NIST P-384, OpenSSH format).

    Parameters
    ----------
    path : path
        The private key's file (0600); the public key goes beside it, ``PATH.pub``.

    Returns
    -------
    Path
        The public key's file, for ``flwr supernode register``.
    """
    private = Path(path)
    key = ec.generate_private_key(ec.SECP384R1())
    write_private(
        private,
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.OpenSSH,
            serialization.NoEncryption(),
        ),
    )
    public = private.with_name(private.name + ".pub")
    public.write_bytes(
        key.public_key().public_bytes(
            serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
        )
    )
    return public


__all__ = ["TlsFiles", "write_node_key", "write_tls_files"]
