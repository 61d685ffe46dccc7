"""Fair intake: round times with and without a flood from senders nobody enrolled (the issue's setting).

    python bench/flood.py            # 8 rounds, 20 s deadline, 57,000 messages from 200 keys from round 4 on
    python bench/flood.py --quick    # 5 rounds, 3,000 messages from 50 keys from round 2 on: CI

Setting: an open broker (Mosquitto, its queue for the coordinator not capped, so the whole flood
reaches the coordinator), the coordinator with enrollment required, three enrolled phone agents
(real edge-agent processes on the digits task, one local epoch), every agent needed for a round.
Two runs in this session, each on a fresh broker and state directory: the baseline, without a
flood; then the same with bench/flooder.py (its own process) publishing the flood once round 4
(2 with --quick) is open, each message on a new made-up agent's topic and signed with one of
``--keys`` random keys, 10% of them updates, at the issue's rate (57,000 messages over three
rounds of 2.2 s: 8,600 per second), as QoS 0 packets written straight to the socket (a paho
client does not reach that rate here).

Table: per round, its duration (``duration_s`` in the coordinator's rounds.jsonl) in the baseline
and under the flood, their ratio and difference, the lag in both runs (from the round's last honest
update seen on the broker, by a subscriber to the three agents' update topics alone, to the
round's ``closed_at``: what the intake adds, where the duration also counts the agents' training
on cores the flood shares), and both outcomes. Then the flood as sent
(messages per second the flooder published, acknowledged by the broker) and as received (flood
messages the coordinator counted in ``fl_received_messages_total``, over the seconds from the
first publish until it had counted them all; /metrics polled every 0.25 s). Goals (the issue's):
the flood delays no round by more than a second and makes none miss its quorum. Every process
shares this machine's cores, the flooder's included. The script exits 0 whatever the results
(a MISS is printed, not raised).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion
from prometheus_client.parser import text_string_to_metric_families

from launcher.broker import MosquittoBroker, free_port
from launcher.fleet import AgentSpec, Fleet, FleetSpec
from protocol.topics import Topics
from protocol.transport.mqtt import BrokerAddress

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
FEDERATION = "flood"
UNCAPPED = "max_queued_messages 0\nmax_inflight_messages 1000\n"
DELAY_GOAL_S = 1.0
POLL_S = 0.25
KINDS = ("agent_status", "update")


@dataclass(frozen=True)
class Plan:
    rounds: int
    deadline_s: float
    count: int
    keys: int
    first: int
    """The flood starts once this round is open."""
    epochs: int
    """Local epochs of the digits task (rounds of under a second to a few seconds here, with the load)."""
    rate: float = 57_000 / (3 * 2.2)
    """Flood messages per second: the issue's."""


FULL = Plan(rounds=8, deadline_s=20.0, count=57_000, keys=200, first=4, epochs=35)
QUICK = Plan(rounds=5, deadline_s=20.0, count=3_000, keys=50, first=2, epochs=10)


@dataclass
class Run:
    rounds: list[dict[str, Any]] = field(default_factory=list)
    sent: dict[str, float] | None = None
    received_s: float | None = None
    """Seconds from the flood's first publish until the coordinator had counted every flood message."""
    counted: dict[str, float] = field(default_factory=dict)
    seen: dict[int, float] = field(default_factory=dict)
    """Round -> when its last honest update was seen on the broker (wall time)."""
    error: str | None = None


def fmt(number: float | None, spec: str) -> str:
    return "-".rjust(int(spec.split(".")[0])) if number is None else format(number, spec)


def scrape(port: int) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(samples: dict, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def received(samples: dict) -> float:
    return sum(value(samples, "fl_received_messages_total", kind=kind) for kind in KINDS)


def rejected(samples: dict) -> dict[str, float]:
    return {reason: sum(value(samples, "fl_messages_rejected_total", kind=kind, reason=reason) for kind in KINDS)
            for reason in ("unknown_signer", "sender_backlog")}


def read_rounds(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def wait_rounds(fleet: Fleet, count: int, timeout_s: float) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        exited = not fleet.coordinator.running
        rounds = read_rounds(fleet.rounds_path)
        if len(rounds) >= count or exited:
            return rounds
        time.sleep(0.1)
    return read_rounds(fleet.rounds_path)


class UpdateWatch:
    """When the honest agents' updates appeared on the broker (wall time, by round): a subscriber to their
    update topics alone, so the flood does not hold up what it sees."""

    def __init__(self, url: str, agents: list[str]) -> None:
        self.seen: dict[int, float] = {}
        address = BrokerAddress.parse(url)
        self.client = paho.Client(callback_api_version=CallbackAPIVersion.VERSION2, client_id="update-watch",
                                  protocol=paho.MQTTv311)
        topics = Topics(FEDERATION)
        subscribed = threading.Event()
        self.client.on_connect = lambda c, u, f, rc, p: c.subscribe([(f"{topics.root}/updates/{a}/+", 1)
                                                                     for a in agents])
        self.client.on_subscribe = lambda c, u, mid, rcs, p: subscribed.set()
        self.client.on_message = self._on_message
        self.client.connect(address.host, address.port)
        self.client.loop_start()
        if not subscribed.wait(30):
            raise RuntimeError(f"could not subscribe on {url}")

    def _on_message(self, client: paho.Client, userdata: object, message: paho.MQTTMessage) -> None:
        number = int(message.topic.rsplit("/", 1)[1])
        self.seen[number] = max(self.seen.get(number, 0.0), time.time())

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


def run(plan: Plan, work: Path, flooded: bool) -> Run:
    """One run on a fresh broker; ``flooded``: with the flood from round ``plan.first`` on."""
    result = Run()
    port = free_port()
    total_rounds = plan.rounds + 1  # the final evaluation round too
    with MosquittoBroker(workdir=work / "broker", settings=UNCAPPED) as broker:
        agents = [AgentSpec(f"phone-{i}", "phone", i) for i in range(3)]
        fleet = Fleet(work / "run", broker.url, FleetSpec(agents=agents, alpha=1.0), {
            "rounds": plan.rounds, "round_deadline_s": plan.deadline_s, "min_available_agents": 3,
            "min_fit_agents": 3, "local_epochs": plan.epochs, "enrollment": "required", "http_port": port,
            "exit_when_finished": False}, federation=FEDERATION)  # up until the whole flood is counted
        watch = UpdateWatch(broker.url, [a.name for a in agents])
        try:
            with fleet:
                if flooded:
                    flood(plan, result, broker.url, port, fleet)
                result.rounds = wait_rounds(fleet, total_rounds, plan.rounds * plan.deadline_s + 300)
        finally:
            watch.close()
    result.seen = watch.seen
    if len(result.rounds) < total_rounds and result.error is None:
        result.error = f"{len(result.rounds)} of {total_rounds} rounds closed:\n{fleet.coordinator.log_tail(20)}"
    return result


def flood(plan: Plan, result: Run, url: str, port: int, fleet: Fleet) -> None:
    """Start the flooder once round ``plan.first`` is open; wait until the coordinator counted all of it."""
    wait_rounds(fleet, plan.first - 1, 300)  # round first opens when round first - 1 closes
    try:
        first = scrape(port)
    except OSError as exc:
        result.error = f"no /metrics before the flood: {exc}"
        first = {}
    before, rejected_before = received(first), rejected(first)
    started = time.monotonic()
    flooder = subprocess.Popen(
        [sys.executable, str(HERE / "flooder.py"), "--url", url, "--federation", FEDERATION, "--count",
         str(plan.count), "--keys", str(plan.keys), "--rate", f"{plan.rate:.1f}", "--updates", "0.1", "--raw"],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    while result.received_s is None and time.monotonic() - started < 600 and fleet.coordinator.running:
        try:
            samples = scrape(port)
        except OSError:
            break
        result.counted = {k: v - rejected_before[k] for k, v in rejected(samples).items()}
        if received(samples) - before >= plan.count:
            result.received_s = time.monotonic() - started
        time.sleep(POLL_S)
    out, err = flooder.communicate(timeout=600)
    if flooder.returncode == 0:
        result.sent = json.loads(out.strip().splitlines()[-1])
    else:
        result.error = f"the flooder exited with {flooder.returncode}: {err[-500:]}"


def lag(outcome: Run, record: dict[str, Any]) -> float | None:
    """Seconds from the round's last honest update on the broker to the round's close."""
    seen = outcome.seen.get(record["round"])
    return None if seen is None else record["closed_at"] - seen


def report(plan: Plan, baseline: Run, flooded: Run) -> None:
    print(f"{'round':>5}  {'task':<8}  {'baseline s':>10}  {'flood s':>8}  {'ratio':>5}  {'delay s':>7}  "
          f"{'lag base s':>10}  {'lag flood s':>11}  {'baseline':<13}  {'flood':<13}")
    worst: tuple[float, int] | None = None
    for base, hit in zip(baseline.rounds, flooded.rounds, strict=False):
        delay = hit["duration_s"] - base["duration_s"]
        worst = max(worst or (delay, base["round"]), (delay, base["round"]))
        lags = [lag(baseline, base), lag(flooded, hit)]
        print(f"{base['round']:>5}  {base.get('task', 'train'):<8}  {base['duration_s']:>10.2f}  "
              f"{hit['duration_s']:>8.2f}  {hit['duration_s'] / max(base['duration_s'], 1e-9):>5.2f}  "
              f"{delay:>+7.2f}  {fmt(lags[0], '10.2f')}  {fmt(lags[1], '11.2f')}  "
              f"{base['outcome']:<13}  {hit['outcome']:<13}")
    sent = flooded.sent or {}
    sent_count = int(sent.get("statuses", 0) + sent.get("updates", 0))
    print(f"flood: {sent_count:,} messages ({int(sent.get('statuses', 0)):,} statuses, "
          f"{int(sent.get('updates', 0)):,} updates) from {plan.keys} keys, from round {plan.first}, "
          f"paced at {plan.rate:,.0f} msg/s")
    seconds = sent.get("seconds")
    print(f"sent      {sent_count / seconds:>9,.0f} msg/s  ({seconds:.1f} s)" if seconds else "sent      -")
    print(f"received  {sent_count / flooded.received_s:>9,.0f} msg/s  ({flooded.received_s:.1f} s, counted by "
          f"the coordinator)" if flooded.received_s and sent_count else "received  - (not all counted)")
    print(f"rejected  {flooded.counted.get('unknown_signer', 0):,.0f} as unknown_signer, "
          f"{flooded.counted.get('sender_backlog', 0):,.0f} as sender_backlog")
    lags = {name: [x for x in (lag(o, r) for r in o.rounds) if x is not None]
            for name, o in (("baseline", baseline), ("flood", flooded))}
    print("lag       largest " + ", ".join(f"{max(v):.2f} s {k}" if v else f"- {k}" for k, v in lags.items())
          + " (round closed - its last honest update on the broker)")
    for name, outcome in (("baseline", baseline), ("flood", flooded)):
        if outcome.error:
            print(f"ERROR {name}: {outcome.error}")
    complete = len(flooded.rounds) == len(baseline.rounds) == plan.rounds + 1
    late = worst is not None and worst[0] <= DELAY_GOAL_S and complete
    print(f"{'PASS' if late else 'MISS'}  the flood delays no round by more than {DELAY_GOAL_S:.1f} s"
          + (f" (largest: {worst[0]:+.2f} s, round {worst[1]})" if worst else ""))
    missed = sum(r["outcome"] == "quorum_missed" for r in flooded.rounds)
    print(f"{'PASS' if missed == 0 and complete else 'MISS'}  no round misses its quorum under the flood "
          f"({missed} of {len(flooded.rounds)} missed)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="5 rounds, 3,000 messages from 50 keys: CI")
    parser.add_argument("--count", type=int, help="flood messages")
    parser.add_argument("--keys", type=int, help="signing keys the flood uses")
    args = parser.parse_args()
    plan = QUICK if args.quick else FULL
    plan = dataclasses.replace(plan, count=args.count or plan.count, keys=args.keys or plan.keys)
    with tempfile.TemporaryDirectory(prefix="flood-bench-") as tmp:
        baseline = run(plan, Path(tmp) / "baseline", False)
        flooded = run(plan, Path(tmp) / "flood", True)
    report(plan, baseline, flooded)


if __name__ == "__main__":
    main()
