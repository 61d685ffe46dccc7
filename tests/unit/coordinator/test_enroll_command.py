"""``coordinator enroll``: a device's credentials, registered where a running coordinator looks."""

from __future__ import annotations

from pathlib import Path

from cryptography import x509
from cryptography.x509.oid import NameOID
from typer.testing import CliRunner

from coordinator.app.cli import app
from coordinator.fleet.enrollment import read_enrollment
from protocol.security.signing import PublicKey, SigningKey
from tests.tls import TestCA


def test_enroll_issues_keys_and_certificates_and_registers_them(tmp_path: Path) -> None:
    ca = TestCA(tmp_path / "ca")
    state, bundles = tmp_path / "state", tmp_path / "bundles"
    result = CliRunner().invoke(app, ["enroll", "rpi-1", "phone-2", "--state-dir", str(state), "--bundle-dir",
                                      str(bundles), "--ca-cert", str(ca.cert_file), "--ca-key", str(ca.key_file),
                                      "--max-samples", "500"])
    assert result.exit_code == 0, result.output
    enrolled = read_enrollment(state / "enrolled.json")
    coordinator = SigningKey.load(state / "coordinator_key.pem").public_key
    for agent_id in ("rpi-1", "phone-2"):
        folder = bundles / agent_id
        assert SigningKey.load(folder / "agent_key.pem").public_key == enrolled[agent_id].key
        assert enrolled[agent_id].max_samples == 500
        assert PublicKey.load(folder / "coordinator.pub") == coordinator
        cert = x509.load_pem_x509_certificate((folder / "client.crt").read_bytes())
        cert.verify_directly_issued_by(x509.load_pem_x509_certificate(ca.cert_file.read_bytes()))
        assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == agent_id
        assert (folder / "client.key").stat().st_mode & 0o777 == 0o600

    # Enrolling again keeps each device's key; a device that made its own key registers just that.
    again = CliRunner().invoke(app, ["enroll", "rpi-1", "--state-dir", str(state), "--bundle-dir", str(bundles)])
    assert again.exit_code == 0 and read_enrollment(state / "enrolled.json")["rpi-1"].key == enrolled["rpi-1"].key
    own = SigningKey.generate().public_key
    mine = CliRunner().invoke(app, ["enroll", "jetson-3", "--state-dir", str(state), "--bundle-dir", str(bundles),
                                    "--public-key", own.to_text()])
    assert mine.exit_code == 0 and read_enrollment(state / "enrolled.json")["jetson-3"].key == own
    assert not (bundles / "jetson-3" / "agent_key.pem").exists()


def test_enroll_refuses_half_a_ca_and_a_bad_key(tmp_path: Path) -> None:
    runner = CliRunner()
    half = runner.invoke(app, ["enroll", "a", "--state-dir", str(tmp_path), "--ca-cert", str(tmp_path / "x")])
    assert half.exit_code == 2 and "--ca-key" in half.output
    bad = runner.invoke(app, ["enroll", "a", "--state-dir", str(tmp_path), "--public-key", "ed25519:???"])
    assert bad.exit_code == 2 and "public" in bad.output
    assert not (tmp_path / "enrolled.json").exists()


def test_unusable_key_and_ca_files_stop_enroll_in_one_line_before_any_device_is_enrolled(tmp_path: Path) -> None:
    ca = TestCA(tmp_path / "ca")
    (tmp_path / "garbage.pem").write_text("garbage")
    state, bundles = tmp_path / "state", tmp_path / "bundles"
    common = ["enroll", "a", "--state-dir", str(state), "--bundle-dir", str(bundles)]
    cases = [
        (["--signing-key-file", str(tmp_path / "garbage.pem")], "signing key file"),
        (["--ca-cert", str(tmp_path / "missing.crt"), "--ca-key", str(ca.key_file)], "CA certificate"),
        (["--ca-cert", str(ca.cert_file), "--ca-key", str(tmp_path / "garbage.pem")], "CA key"),
        (["--ca-cert", str(ca.key_file), "--ca-key", str(ca.key_file)], "CA certificate"),  # a key, not a cert
    ]
    other = TestCA(tmp_path / "other")
    cases.append((["--ca-cert", str(ca.cert_file), "--ca-key", str(other.key_file)], "is not the key of CA"))
    (bundles / "b").mkdir(parents=True)
    (bundles / "b" / "agent_key.pem").write_text("garbage")  # the second device's kept key is unreadable
    cases.append((["b"], "agent_key.pem"))
    for extra, names in cases:
        result = CliRunner().invoke(app, [*common, *extra])
        assert result.exit_code == 2, (extra, result.output, result.exception)
        assert "error: cannot enroll:" in result.output and names in result.output, (extra, result.output)
        assert "Traceback" not in result.output
        assert not (state / "enrolled.json").exists(), extra
