"""Who the broker takes this agent for, checked so that it does not train in vain.

* At start: a broker that authenticates clients by certificate with Mosquitto's
  ``use_identity_as_username`` makes the certificate's Common Name the client's username (and,
  with ``use_username_as_clientid``, its client id), which the ACL's ``%c`` pins to
  ``agents/<CN>/#`` and ``updates/<CN>/#``. An agent whose id is not that CN still connects, but
  the broker refuses everything it publishes under its own id; so it refuses to start instead.
* While it runs: over MQTT 5 the broker's refusals are seen (``protocol.transport.acks``); after
  ``max_broker_denials`` of them the agent stops with ``EXIT_DENIED`` rather than keep training
  for updates that nobody receives.

Only the first certificate of ``cert_file`` counts (the client's own; intermediates follow it),
and of its subject only the first CN, as Mosquitto reads it.
"""

from __future__ import annotations

import logging
from pathlib import Path

from cryptography import x509
from cryptography.x509.oid import NameOID

from protocol.transport.acks import Denial

log = logging.getLogger(__name__)

EXIT_DENIED = 3
"""The agent's exit status once the broker refused ``max_broker_denials`` of its publishes or subscriptions."""


def certificate_identity(cert_file: str | Path) -> str:
    """The username Mosquitto's ``use_identity_as_username`` gives a client presenting ``cert_file``."""
    try:
        data = Path(cert_file).read_bytes()
    except OSError as exc:
        raise ValueError(f"cert_file {str(cert_file)!r} cannot be read: {exc.strerror}") from None
    try:
        certificate = x509.load_pem_x509_certificates(data)[0]
    except ValueError:
        raise ValueError(f"cert_file {str(cert_file)!r} holds no PEM certificate") from None
    names = certificate.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    if not names:
        raise ValueError(f"cert_file {str(cert_file)!r}: the certificate's subject has no Common Name (CN), which a "
                         "broker with use_identity_as_username takes as the client's username")
    value = names[0].value
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def check_certificate_identity(agent_id: str, cert_file: str | Path) -> None:
    """ValueError naming both identities unless ``cert_file``'s CN is ``agent_id``."""
    identity = certificate_identity(cert_file)
    if identity != agent_id:
        raise ValueError(
            f"agent id {agent_id!r} is not the identity of cert_file {str(cert_file)!r}, which is {identity!r} "
            f"(its CN): a broker with use_identity_as_username knows this client as {identity!r} and refuses what it "
            f"publishes as {agent_id!r}. Set agent_id to {identity!r} or use the certificate issued to {agent_id!r}; "
            "for a broker that maps certificates to identities otherwise, turn check_certificate_identity off")


def give_up(agent_id: str, denials: int, last: Denial) -> int:
    """Log why the agent stops after ``denials`` refusals (the last one ``last``); its exit status."""
    log.error("the broker refused %d publishes or subscriptions of agent %s (the last: %s): stopping rather than "
              "training for updates nobody receives. Check the broker's ACL, and that the broker knows this agent "
              "as %r (with client certificates: the certificate's CN); see docs/device-identity.md",
              denials, agent_id, last, agent_id)
    return EXIT_DENIED
