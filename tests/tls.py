"""Throwaway certificate authorities and certificates for tests (cryptography's x509 API).

Nothing here is fit for production: keys are unencrypted files and live for a day.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class Issued:
    """A certificate and its key, as PEM files."""

    cert_file: Path
    key_file: Path


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _write_key(key: ec.EllipticCurvePrivateKey, path: Path) -> None:
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))
    path.chmod(0o600)


class TestCA:
    """A self-signed CA that issues server and client certificates into ``directory``."""

    __test__ = False  # not a pytest class

    def __init__(self, directory: Path, name: str = "edgefl test CA") -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.name = name
        self._key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.timezone.utc)
        self._cert = (
            x509.CertificateBuilder()
            .subject_name(_name(name)).issuer_name(_name(name))
            .public_key(self._key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=False, content_commitment=False, key_encipherment=False,
                                         data_encipherment=False, key_agreement=False, key_cert_sign=True,
                                         crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(self._key.public_key()), critical=False)
            .sign(self._key, hashes.SHA256())
        )
        slug = name.replace(" ", "-")
        self.cert_file = self.directory / f"{slug}.crt"
        self.cert_file.write_bytes(self._cert.public_bytes(serialization.Encoding.PEM))
        self.key_file = self.directory / f"{slug}.key"
        """The CA's own key, for tools under test that issue certificates with it."""
        _write_key(self._key, self.key_file)

    def _issue(self, common_name: str, stem: str, usage: x509.ObjectIdentifier,
               san: list[x509.GeneralName] | None) -> Issued:
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.timezone.utc)
        builder = (
            x509.CertificateBuilder()
            .subject_name(_name(common_name)).issuer_name(self._cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                                         data_encipherment=False, key_agreement=True, key_cert_sign=False,
                                         crl_sign=False, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(self._key.public_key()), critical=False)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        )
        if san:
            builder = builder.add_extension(x509.SubjectAlternativeName(san), critical=False)
        cert = builder.sign(self._key, hashes.SHA256())
        issued = Issued(self.directory / f"{stem}.crt", self.directory / f"{stem}.key")
        issued.cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        _write_key(key, issued.key_file)
        return issued

    def server(self, *hosts: str) -> Issued:
        """A broker certificate valid for ``hosts`` (DNS names or IP addresses)."""
        san: list[x509.GeneralName] = []
        for host in hosts:
            try:
                san.append(x509.IPAddress(ipaddress.ip_address(host)))
            except ValueError:
                san.append(x509.DNSName(host))
        return self._issue(hosts[0], f"server-{hosts[0]}", ExtendedKeyUsageOID.SERVER_AUTH, san)

    def client(self, common_name: str) -> Issued:
        """A client certificate whose CN is ``common_name`` (the broker's username with use_identity_as_username)."""
        return self._issue(common_name, f"client-{common_name}", ExtendedKeyUsageOID.CLIENT_AUTH, None)


def mtls_listener(port: int, ca: TestCA, server: Issued, acl: Path) -> str:
    """Mosquitto settings for one TLS listener on loopback that requires a client certificate from ``ca``,
    takes the certificate's CN as username and client id, and applies ``acl``."""
    return f"""
        listener {port} 127.0.0.1
        cafile {ca.cert_file}
        certfile {server.cert_file}
        keyfile {server.key_file}
        require_certificate true
        use_identity_as_username true
        use_username_as_clientid true
        allow_anonymous false
        acl_file {acl}
    """
