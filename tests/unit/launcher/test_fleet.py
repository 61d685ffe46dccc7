"""The launcher's copy of the device-to-family map (it must not import torch to start agents) matches the agents'."""

from __future__ import annotations

from edge_agent.profiles import PROFILES, get_profile
from launcher.fleet import DEVICES, FAMILY_OF


def test_family_of_matches_the_device_profiles() -> None:
    assert set(FAMILY_OF) == set(PROFILES)
    for device, family in FAMILY_OF.items():
        assert get_profile(device).family == family, device
    assert set(DEVICES) <= set(FAMILY_OF)
