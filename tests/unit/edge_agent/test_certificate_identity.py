"""An agent with a client certificate starts only as the identity the broker will give it: the
certificate's CN (Mosquitto's use_identity_as_username); anything else fails at start-up naming both."""

from __future__ import annotations

import datetime
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from edge_agent.config import AgentSettings
from edge_agent.identity import EXIT_DENIED, certificate_identity, check_certificate_identity, give_up
from edge_agent.state import AgentStateDir
from protocol.transport.acks import Denial
from service_kit.settings import ConfigError, load_settings
from tests.tls import Issued, TestCA


@pytest.fixture(scope="module")
def ca(tmp_path_factory: pytest.TempPathFactory) -> TestCA:
    return TestCA(tmp_path_factory.mktemp("ca"))


@pytest.fixture(scope="module")
def rpi(ca: TestCA) -> Issued:
    return ca.client("rpi-9")


def tls(issued: Issued, ca: TestCA, **more: object) -> dict[str, object]:
    return {"broker_url": "mqtts://broker.example:8883", "ca_file": str(ca.cert_file),
            "cert_file": str(issued.cert_file), "key_file": str(issued.key_file), **more}


def test_the_identity_is_the_certificates_common_name(rpi: Issued) -> None:
    assert certificate_identity(rpi.cert_file) == "rpi-9"
    check_certificate_identity("rpi-9", rpi.cert_file)


def test_the_first_certificate_of_a_chain_file_is_the_clients(tmp_path: Path, ca: TestCA, rpi: Issued) -> None:
    chain = tmp_path / "chain.pem"
    chain.write_bytes(rpi.cert_file.read_bytes() + ca.cert_file.read_bytes())  # leaf, then its issuer
    assert certificate_identity(chain) == "rpi-9"


def test_another_agent_id_names_both_identities(rpi: Issued) -> None:
    with pytest.raises(ValueError, match=r"agent id 'phone-2' is not the identity of cert_file .*'rpi-9'") as raised:
        check_certificate_identity("phone-2", rpi.cert_file)
    assert "check_certificate_identity" in str(raised.value)  # how to turn it off, for other brokers


def test_a_file_without_a_certificate_or_common_name_is_refused(tmp_path: Path, ca: TestCA) -> None:
    not_pem = tmp_path / "not.pem"
    not_pem.write_text("hello")
    with pytest.raises(ValueError, match="holds no PEM certificate"):
        certificate_identity(not_pem)
    with pytest.raises(ValueError, match="cannot be read"):
        certificate_identity(tmp_path / "missing.pem")
    nameless = tmp_path / "nameless.pem"
    nameless.write_bytes(self_signed(x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "greenhouse")])))
    with pytest.raises(ValueError, match="has no Common Name"):
        certificate_identity(nameless)
    two = tmp_path / "two.pem"  # Mosquitto takes the first CN of the subject
    two.write_bytes(self_signed(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "rpi-1"),
                                           x509.NameAttribute(NameOID.COMMON_NAME, "rpi-2")])))
    assert certificate_identity(two) == "rpi-1"


def self_signed(subject: x509.Name) -> bytes:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now)
            .not_valid_after(now + datetime.timedelta(days=1)).sign(key, hashes.SHA256()))
    return cert.public_bytes(serialization.Encoding.PEM)


def test_settings_refuse_a_mismatch_at_start_naming_the_field(ca: TestCA, rpi: Issued) -> None:
    with pytest.raises(ConfigError, match=r"agent_id \(--agent-id / FL_AGENT_AGENT_ID\).*'phone-2'.*'rpi-9'"):
        load_settings(AgentSettings, None, tls(rpi, ca, agent_id="phone-2"))
    assert load_settings(AgentSettings, None, tls(rpi, ca, agent_id="rpi-9")).agent_id == "rpi-9"
    # A broker that maps certificates otherwise (e.g. the whole subject): the check can be turned off.
    relaxed = load_settings(AgentSettings, None, tls(rpi, ca, agent_id="phone-2", check_certificate_identity=False))
    assert relaxed.agent_id == "phone-2" and relaxed.certificate_identity() is None


def test_an_agent_without_an_id_takes_the_certificates_and_keeps_it(tmp_path: Path, ca: TestCA, rpi: Issued) -> None:
    settings = load_settings(AgentSettings, None, tls(rpi, ca, state_dir=str(tmp_path / "state")))
    assert settings.agent_id is None and settings.certificate_identity() == "rpi-9"
    state = AgentStateDir(tmp_path / "state")
    assert state.agent_id("rpi", settings.certificate_identity()) == "rpi-9"
    assert state.agent_id("rpi") == "rpi-9"  # kept
    # An id kept from before the certificate stays, and the check then names both.
    earlier = AgentStateDir(tmp_path / "earlier")
    kept = earlier.agent_id("phone")
    assert earlier.agent_id("phone", "rpi-9") == kept
    with pytest.raises(ValueError, match=f"'{kept}' is not the identity"):
        check_certificate_identity(kept, rpi.cert_file)


def test_giving_up_after_refusals_has_its_own_exit_status(caplog: pytest.LogCaptureFixture) -> None:
    last = Denial("publish", "fl/f/updates/phone-2/4", 0x87, "Not authorized")
    assert give_up("phone-2", 3, last) == EXIT_DENIED == 3
    assert "refused 3 publishes or subscriptions of agent phone-2" in caplog.text
    assert "Not authorized (0x87)" in caplog.text
