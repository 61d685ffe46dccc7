"""The rendered chart, run locally: its broker and its coordinator start from the manifests.

The bundled Mosquitto starts from the rendered ConfigMap (mosquitto.conf and the ACL), its
password file made by the rendered init container's script from the rendered Secrets; the
coordinator starts with the rendered container's command, arguments and environment. The
only changes are the ones a laptop forces (see tests/integration/pod.py): volumes are
directories, Services are 127.0.0.1 on free ports, and mosquitto keeps the local user.
"""

from __future__ import annotations

import getpass
from pathlib import Path

import pytest
import yaml

from launcher.broker import free_port, wait_for_port
from protocol.messages import CoordinatorStatus
from tests.chart import FULLNAME, render
from tests.integration.pod import LocalPod
from tests.integration.wire import WireRecorder, decode_wire, http_status, wait_until

pytestmark = pytest.mark.integration

VALUES = {
    "federation": "chart-local",
    "broker": {"password": "coordinator-password"},
    "mosquitto": {"agents": [{"username": "jetson-0", "password": "jetson-0-password"}]},
}


def test_rendered_broker_and_coordinator_start_and_answer_their_probes(tmp_path: Path) -> None:
    rendered = render(VALUES)
    coordinator_spec = rendered.get("Deployment", FULLNAME)["spec"]["template"]["spec"]
    config = yaml.safe_load(rendered.get("ConfigMap", FULLNAME)["data"]["coordinator.yaml"])
    service = rendered.get("Service", f"{FULLNAME}-mosquitto")["spec"]["ports"][0]
    broker_port, http_port = free_port(), free_port()

    broker = LocalPod(rendered, rendered.get("Deployment", f"{FULLNAME}-mosquitto")["spec"]["template"]["spec"],
                      tmp_path / "mosquitto", rewrite={f"listener {service['port']}\n": f"listener {broker_port} 127.0.0.1\n"},
                      append={"mosquitto.conf": f"user {getpass.getuser()}\n"})
    coordinator = LocalPod(rendered, coordinator_spec, tmp_path / "coordinator", rewrite={
        config["broker_url"]: f"mqtt://127.0.0.1:{broker_port}",
        f"http_port: {config['http_port']}\n": f"http_port: {http_port}\n",
    })
    try:
        # The init container hashes every password: none is left in clear text.
        broker.run_init_containers()
        passwd = (broker.volume("auth") / "passwd").read_text().splitlines()
        assert [line.split(":")[0] for line in passwd] == ["coordinator", "jetson-0"]
        assert all(line.split(":", 1)[1].startswith("$7$") for line in passwd)
        assert "password" not in "".join(passwd)
        mosquitto = broker.start("mosquitto")
        assert wait_for_port("127.0.0.1", broker_port, 15), broker.log("mosquitto")

        process = coordinator.start("coordinator")
        c = coordinator.container("coordinator")
        ports = {p["name"]: p["containerPort"] for p in c["ports"]}
        assert ports["http"] == config["http_port"]
        for kind in ("startupProbe", "livenessProbe", "readinessProbe"):
            probe = c[kind]["httpGet"]
            assert ports[probe["port"]] == config["http_port"]
            url = f"http://127.0.0.1:{http_port}{probe['path']}"
            wait_until(lambda url=url: http_status(url) == 200 or process.poll() is not None, 90, f"{kind} {url}")
            assert process.poll() is None, coordinator.log("coordinator")
            assert http_status(url) == 200

        # Ready means connected with the Secret's credentials through the rendered ACL: an
        # agent (its password from the agents Secret) reads the coordinator's retained status.
        watcher = WireRecorder(f"mqtt://jetson-0:jetson-0-password@127.0.0.1:{broker_port}",
                               "fl/chart-local/coordinator/status", client_id="jetson-0")
        watcher.start()
        try:
            wait_until(lambda: bool(watcher.snapshot()), 20, "the coordinator's retained status")
        finally:
            watcher.stop()
        status = decode_wire(watcher.snapshot()[0].payload, CoordinatorStatus)
        assert (status.federation, status.state) == ("chart-local", "online")

        # The checkpoint lands on the PVC's volume.
        state = Path(coordinator.localize(config["state_dir"]))
        assert state.is_relative_to(coordinator.volume("state")) and (state / "checkpoint.msgpack").exists()

        # `helm test`: the hook pod's own command, against the Service (here the local port).
        hook = rendered.get("Pod", f"{FULLNAME}-test")
        svc_port = rendered.get("Service", FULLNAME)["spec"]["ports"][0]["port"]
        tester = LocalPod(rendered, hook["spec"], tmp_path / "hook",
                          rewrite={f"http://{FULLNAME}:{svc_port}": f"http://127.0.0.1:{http_port}"})
        result = tester.run("check", timeout_s=120)
        assert result.returncode == 0, result.stdout + result.stderr
        assert "metrics exported" in result.stdout

        # SIGTERM (what the kubelet sends) stops it cleanly within the grace period.
        process.terminate()
        assert process.wait(coordinator_spec["terminationGracePeriodSeconds"]) == 0, coordinator.log("coordinator")
        assert mosquitto.poll() is None
    finally:
        coordinator.stop()
        broker.stop()
