"""The compose lab's two sites: each a Mosquitto bridged to the lab's root broker and a site aggregator.

Checked without running Docker: each site aggregator's command line is resolved by the real CLI and
settings class, its mounts and its broker agree with the site broker's start-up script, and that script
(run here with a stand-in for mosquitto) writes the site ACL and a bridge with the topics of
deploy/mosquitto/site-bridge.conf.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from pathlib import Path
from typing import Any

import pytest

from coordinator.app.cli import app as coordinator_app
from coordinator.settings import CoordinatorSettings
from coordinator.sites.settings import SiteSettings
from launcher.sites import bridge_topics
from tests.unit.deploy.test_device_deploy import (
    COMPOSE_DIR,
    DEPLOY,
    agents,
    compose,
    dockerfile_env,
    lab_env,
    mosquitto_conf,
    parse_args,
    resolve,
)


def sites(lab: dict[str, Any]) -> list[str]:
    return lab["services"]["broker"]["environment"]["LAB_SITES"].split()


def test_the_lab_has_two_sites_each_a_bridged_broker_and_an_aggregator() -> None:
    lab = compose()
    assert sites(lab) == ["site1", "site2"]
    enrolled = parse_args(coordinator_app, lab["services"]["enroll"]["command"])["agent_ids"]
    for site in sites(lab):
        broker, aggregator = lab["services"][f"{site}-broker"], lab["services"][site]
        assert broker["command"] == ["sh", "/mosquitto/start-site-broker.sh"]
        env = broker["environment"]
        assert env["LAB_SITE_ID"] == site and env["LAB_ROOT_HOST"] == "broker" and "broker" in broker["depends_on"]
        served = sorted(a["command"][a["command"].index("--agent-id") + 1] for a in agents(lab).values()
                        if f"mqtt://{site}-broker:1883" in a["command"])
        clients = env["LAB_CLIENTS"].split()
        assert served and clients[0] == "site-aggregator" and sorted(clients[1:]) == served
        assert aggregator["command"][0] == "site" and site in enrolled
        assert aggregator["depends_on"][f"{site}-broker"]["condition"] == "service_started"
        assert aggregator["depends_on"]["site-credentials"]["condition"] == "service_completed_successfully"
        assert aggregator["read_only"] and aggregator["cap_drop"] == ["ALL"]


def test_each_site_aggregator_resolves_to_its_site(monkeypatch: pytest.MonkeyPatch) -> None:
    lab = compose()
    root = resolve(CoordinatorSettings, coordinator_app, lab["services"]["coordinator"]["command"],
                   lab_env(lab["services"]["coordinator"], "FL_COORDINATOR_"), monkeypatch, {})
    image_state = Path(dockerfile_env(DEPLOY / "coordinator" / "Dockerfile")["FL_COORDINATOR_STATE_DIR"])
    acl_user = [line.split()[1] for line in (DEPLOY / "mosquitto" / "site-acl").read_text().splitlines()
                if line.startswith("user ")]
    for site in sites(lab):
        service = lab["services"][site]
        settings = resolve(SiteSettings, coordinator_app, service["command"], lab_env(service, "FL_SITE_"),
                           monkeypatch, {})
        assert settings.site_id == site and settings.federation == root.federation
        assert settings.broker_url == f"mqtt://{site}-broker:1883" and settings.broker_password is not None
        assert [settings.broker_username] == acl_user
        assert settings.max_update_bytes == root.max_update_bytes
        state_volume, bundle = service["volumes"]
        # Its own state on its own volume, where the image's user owns the directory.
        assert state_volume == f"{site}-state:{image_state.parent}" and settings.state_dir.parent == image_state.parent
        # Its key, the root's public key and a copy of the root's enrolled agents, all from its own enrollment
        # bundle: nothing of the root's state folder, where the root's signing key is.
        assert bundle["volume"]["subpath"] == f"enrolled/{site}" and bundle["read_only"]
        assert settings.signing_key_file == Path(bundle["target"]) / "agent_key.pem"
        assert settings.coordinator_key == Path(bundle["target"]) / "coordinator.pub"
        assert settings.enrolled_agents_file == Path(bundle["target"]) / "enrolled.json"
        copy = lab["services"]["site-credentials"]  # the copy comes after enrollment, into each site's bundle
        (script,) = copy["command"]
        assert site in script.split("for site in ", 1)[1].split(";", 1)[0].split()
        assert "/var/lib/edgefl/enrolled/$$site/" in script and "enroll" in copy["depends_on"]


def test_site_brokers_are_sized_as_the_root_broker() -> None:
    site_conf = mosquitto_conf(COMPOSE_DIR / "mosquitto" / "site-mosquitto.conf")
    root_conf = mosquitto_conf(COMPOSE_DIR / "mosquitto" / "mosquitto.conf")
    for key in ("max_queued_messages", "max_queued_bytes", "max_inflight_messages", "max_packet_size",
                "allow_anonymous", "use_username_as_clientid", "listener", "password_file", "acl_file"):
        assert site_conf[key] == root_conf[key], key


def test_the_site_broker_script_writes_the_site_acl_and_the_bridge(tmp_path: Path) -> None:
    if shutil.which("mosquitto_passwd") is None:
        pytest.skip("mosquitto_passwd is not installed (scripts/test.sh installs mosquitto)")
    lab = compose()
    broker = lab["services"]["site2-broker"]
    bin_dir, data, config = tmp_path / "bin", tmp_path / "data", tmp_path / "config"
    for d in (bin_dir, data, config):
        d.mkdir()
    (bin_dir / "mosquitto").write_text(f'#!/bin/sh\necho "$@" > {tmp_path}/mosquitto-args\n')
    (bin_dir / "mosquitto").chmod(stat.S_IRWXU)
    mounts = dict(v.split(":")[:2] for v in broker["volumes"])
    for source, target in mounts.items():
        if source.startswith(".") and target.startswith("/mosquitto/config/"):
            shutil.copy(COMPOSE_DIR / source, config / Path(target).name)
    env = {**{k: v for k, v in broker["environment"].items() if not v.startswith("${")},
           "PATH": f"{bin_dir}:{os.environ['PATH']}", "MOSQUITTO_DATA_DIR": str(data),
           "MOSQUITTO_CONFIG_DIR": str(config)}
    script = str(COMPOSE_DIR / "mosquitto" / "start-site-broker.sh")
    missing = subprocess.run(["sh", script], env=env, capture_output=True, text=True, timeout=60, check=False)
    assert missing.returncode != 0 and "LAB_BROKER_PASSWORD" in missing.stderr
    done = subprocess.run(["sh", script], env={**env, "LAB_BROKER_PASSWORD": "lab-password"},
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "mosquitto-args").read_text().split() == ["-c", str(data / "mosquitto.conf")]

    users = [line.split(":")[0] for line in (data / "passwd").read_text().splitlines()]
    assert users == broker["environment"]["LAB_CLIENTS"].split() and "lab-password" not in (data / "passwd").read_text()
    acl = (data / "acl").read_text()
    assert acl == (DEPLOY / "mosquitto" / "site-acl").read_text().replace("sites/SITE_ID/", "sites/site2/")
    assert "topic write fl/default/sites/site2/partials/#" in acl

    conf = (data / "mosquitto.conf").read_text()
    assert conf.startswith((COMPOSE_DIR / "mosquitto" / "site-mosquitto.conf").read_text())
    bridge = [line for line in conf.splitlines() if line and not line.startswith("#")]
    assert [line for line in bridge if line.startswith("topic ")] == bridge_topics("default")
    assert not any("updates" in line for line in bridge if line.startswith("topic "))
    assert {"connection root", "address broker:1883", "remote_clientid site-site2-bridge",
            "remote_username site2-bridge", "remote_password lab-password", "cleansession false"} <= set(bridge)
    # The root broker's ACL (start-broker.sh, LAB_SITES) has a block for exactly this bridge user.
    assert "site2" in sites(lab)
    assert stat.S_IMODE((data / "mosquitto.conf").stat().st_mode) == 0o600
