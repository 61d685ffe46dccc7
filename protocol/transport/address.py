"""Where the broker is and how to reach it: URL, credentials, TLS files, MQTT version.

``BrokerAddress`` is what both services build from their settings (``service_kit/broker.py``) and
what ``MqttLink`` connects with; the TLS file checks are shared by both settings models.
"""

from __future__ import annotations

import os
import ssl
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal
from urllib.parse import unquote, urlsplit

from pydantic import ValidationInfo

MqttVersion = Literal["auto", "5", "3.1.1"]
"""auto: MQTT 5, or 3.1.1 when the broker refuses 5 ("unsupported protocol version")."""
MQTT_VERSIONS: tuple[MqttVersion, ...] = ("auto", "5", "3.1.1")


@dataclass(frozen=True)
class BrokerAddress:
    host: str
    port: int
    tls: bool = False
    username: str | None = None
    password: str | None = None
    ca_file: str | None = None
    """PEM file of the CA(s) that signed the broker's certificate; None trusts the system's CAs."""
    cert_file: str | None = None
    """PEM file of this client's certificate (and chain), for brokers that require one; needs key_file."""
    key_file: str | None = None
    """PEM file of the private key of cert_file."""
    mqtt_version: MqttVersion = "auto"
    """The MQTT version to speak; auto falls back to 3.1.1 for a broker that refuses 5."""

    @classmethod
    def parse(cls, url: str) -> BrokerAddress:
        """``mqtt://[user[:password]@]host[:port]`` or ``mqtts://`` for TLS."""
        parts = urlsplit(url)
        if parts.scheme not in ("mqtt", "mqtts", "tcp", "ssl"):
            raise ValueError(f"broker URL {url!r} must start with mqtt:// (or tcp://), or mqtts:// (or ssl://) for TLS")
        if not parts.hostname:
            raise ValueError(f"broker URL {url!r} has no host")
        tls = parts.scheme in ("mqtts", "ssl")
        try:
            port = parts.port if parts.port is not None else (8883 if tls else 1883)
        except ValueError as exc:
            raise ValueError(f"broker URL {url!r}: {exc}") from None
        if port == 0:
            raise ValueError(f"broker URL {url!r}: port 0 names no port")
        return cls(
            host=parts.hostname,
            port=port,
            tls=tls,
            username=unquote(parts.username) if parts.username else None,
            password=unquote(parts.password) if parts.password else None,
        )

    def with_credentials(self, username: str | None, password: str | None) -> BrokerAddress:
        """This address, with credentials given apart (settings, a Secret) winning over the URL's."""
        return replace(self, username=username or self.username, password=password or self.password)

    def with_tls_files(self, ca_file: str | os.PathLike[str] | None = None,
                       cert_file: str | os.PathLike[str] | None = None,
                       key_file: str | os.PathLike[str] | None = None) -> BrokerAddress:
        """This address with a private CA and/or a client certificate; checked by ``check_tls_files``."""
        check_tls_files(self.tls, ca_file=ca_file, cert_file=cert_file, key_file=key_file)
        return replace(self, ca_file=_path_or_none(ca_file), cert_file=_path_or_none(cert_file),
                       key_file=_path_or_none(key_file))

    def with_mqtt_version(self, version: MqttVersion) -> BrokerAddress:
        if version not in MQTT_VERSIONS:
            raise ValueError(f"mqtt_version {version!r} is not one of {', '.join(MQTT_VERSIONS)}")
        return replace(self, mqtt_version=version)

    def __str__(self) -> str:  # never print the password
        return f"{'mqtts' if self.tls else 'mqtt'}://{self.host}:{self.port}"


def _path_or_none(path: str | os.PathLike[str] | None) -> str | None:
    return None if path is None else os.fspath(path)


def check_tls_file(name: str, path: str | os.PathLike[str] | None, tls: bool) -> None:
    """One of ca_file, cert_file, key_file: only with TLS, and a readable file; ValueError names it."""
    if path is None:
        return
    if not tls:
        raise ValueError(f"{name} is only used over TLS: the broker URL must start with mqtts:// (or ssl://)")
    if not os.path.exists(path):
        raise ValueError(f"{name} {os.fspath(path)!r} does not exist")
    if not os.path.isfile(path):
        raise ValueError(f"{name} {os.fspath(path)!r} is not a file")
    try:
        with open(path, "rb") as handle:
            handle.read(1)
    except OSError as exc:
        raise ValueError(f"{name} {os.fspath(path)!r} cannot be read: {exc.strerror}") from None


def tls_file_setting(cls: type, value: Path | None, info: ValidationInfo) -> Path | None:
    """Field validator for both services' ca_file, cert_file and key_file: a readable file, and only
    with an mqtts:// URL (``broker_url`` is declared before them, so it is validated first)."""
    url = info.data.get("broker_url")
    check_tls_file(str(info.field_name), value, BrokerAddress.parse(url).tls if url else True)
    return value


def check_tls_files(tls: bool, *, ca_file: str | os.PathLike[str] | None = None,
                    cert_file: str | os.PathLike[str] | None = None,
                    key_file: str | os.PathLike[str] | None = None) -> None:
    """The TLS files of a broker connection: each readable, only over TLS, a certificate with its key."""
    for name, path in (("ca_file", ca_file), ("cert_file", cert_file), ("key_file", key_file)):
        check_tls_file(name, path, tls)
    if (cert_file is None) != (key_file is None):
        raise ValueError("cert_file and key_file go together: a client certificate needs its private key")


def check_tls_contents(ca_file: str | os.PathLike[str] | None, cert_file: str | os.PathLike[str] | None,
                       key_file: str | os.PathLike[str] | None) -> None:
    """Load the files as the connection will (OpenSSL): a CA file that holds no certificate, or a certificate and
    key that are not PEM or not a pair, fail at start-up naming the setting, not at the first connection."""
    context = ssl.create_default_context()
    if ca_file is not None:
        try:
            context.load_verify_locations(cafile=os.fspath(ca_file))
        except (ssl.SSLError, ValueError) as exc:
            raise ValueError(f"ca_file {os.fspath(ca_file)!r} holds no usable PEM certificate ({exc})") from None
    if cert_file is not None and key_file is not None:
        try:
            context.load_cert_chain(os.fspath(cert_file), os.fspath(key_file))
        except (ssl.SSLError, ValueError) as exc:
            raise ValueError(f"cert_file {os.fspath(cert_file)!r} and key_file {os.fspath(key_file)!r} are not a PEM "
                             f"certificate and its private key ({exc})") from None
