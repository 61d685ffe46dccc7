"""The launcher's site bridge is deploy/mosquitto/site-bridge.conf's: the same topics, each in the same direction."""

from __future__ import annotations

from pathlib import Path

from launcher.sites import bridge_settings, bridge_topics

DEPLOYED = Path(__file__).resolve().parents[3] / "deploy" / "mosquitto" / "site-bridge.conf"


def test_the_launchers_bridge_carries_the_deployed_configs_topics() -> None:
    deployed = [line.strip() for line in DEPLOYED.read_text().splitlines() if line.startswith("topic ")]
    assert deployed == bridge_topics("FEDERATION")
    assert not [t for t in deployed if "/updates/" in t]  # agents' updates stay at the site


def test_the_bridge_points_at_the_root_with_a_persistent_session() -> None:
    lines = bridge_settings("f", "s2", "10.0.0.1", 1884).splitlines()
    assert {"address 10.0.0.1:1884", "remote_clientid site-s2-bridge", "cleansession false"} <= set(lines)
    assert "topic fl/f/sites/+/partials/# out 1" in lines and "topic fl/f/global/# in 1" in lines
