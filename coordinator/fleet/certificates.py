"""Client certificates for enrolled devices, issued by the operator's CA (``coordinator enroll --ca-cert``).

A broker that authenticates devices by certificate (``require_certificate`` and
``use_identity_as_username``, see docs/device-identity.md) trusts any certificate its CA
signed, so enrolling a device this way needs no change to the broker: the certificate's
common name is the agent id, which the broker's ACL then pins to its own topics.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from cryptography.hazmat.primitives.asymmetric.types import PublicKeyTypes
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from service_kit.durable import atomic_write_bytes
from service_kit.startup import CannotStart


class CertificateAuthorityError(CannotStart):
    """The CA certificate or key given to ``coordinator enroll`` cannot sign: missing, unreadable or not PEM."""


@dataclass(frozen=True)
class IssuingCA:
    certificate: x509.Certificate
    key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey | ed25519.Ed25519PrivateKey


def load_issuing_ca(ca_cert_file: Path, ca_key_file: Path) -> IssuingCA:
    """The CA from its PEM certificate and unencrypted PEM key, checked before any device is enrolled."""
    try:
        certificate = x509.load_pem_x509_certificate(ca_cert_file.read_bytes())
    except (OSError, ValueError) as exc:
        raise CertificateAuthorityError(f"CA certificate {ca_cert_file}: {exc}") from None
    try:
        key = serialization.load_pem_private_key(ca_key_file.read_bytes(), password=None)
    except (OSError, ValueError, TypeError) as exc:  # TypeError: the key is encrypted
        raise CertificateAuthorityError(f"CA key {ca_key_file}: {exc}") from None
    if not isinstance(key, (ec.EllipticCurvePrivateKey, rsa.RSAPrivateKey, ed25519.Ed25519PrivateKey)):
        raise CertificateAuthorityError(f"CA key {ca_key_file} holds a {type(key).__name__}, not an EC, RSA or "
                                        "Ed25519 key")
    if _spki(key.public_key()) != _spki(certificate.public_key()):  # else brokers would refuse what it signs
        raise CertificateAuthorityError(f"CA key {ca_key_file} is not the key of CA certificate {ca_cert_file}")
    return IssuingCA(certificate, key)


def _spki(public_key: PublicKeyTypes) -> bytes:
    return public_key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)


def issue_client_certificate(ca: IssuingCA, agent_id: str, folder: Path, days: int = 365) -> tuple[Path, Path]:
    """Write ``client.crt`` (CN = ``agent_id``, client authentication only) and ``client.key`` into
    ``folder``; returns their paths."""
    ca_cert, ca_key = ca.certificate, ca.key
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, agent_id)]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .sign(ca_key, None if isinstance(ca_key, ed25519.Ed25519PrivateKey) else hashes.SHA256())
    )
    cert_file, key_file = folder / "client.crt", folder / "client.key"
    atomic_write_bytes(key_file, key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                   serialization.NoEncryption()))
    key_file.chmod(0o600)
    atomic_write_bytes(cert_file, cert.public_bytes(serialization.Encoding.PEM))
    return cert_file, key_file
