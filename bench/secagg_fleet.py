"""Light agents that answer secure rounds through the SecAgg+ stages over MQTT, for bench/secagg_mqtt.py.

A subclass of lightfleet.py's ``LightFleet`` (many agents per process, a few connections): plain
rounds are answered as there, secure ones (``RoundAnnouncement.secure``) as ``edge_agent/secure.py``
does, with the real protocol code (``protocol.secagg``: X25519 keys, Shamir shares in sealed bundles,
ChaCha20 masks over the round's grid, the low ``ring_bits`` bits on the wire). Every agent keeps its
own ``SecAggClient``; its messages are encoded for it (no template patching: each masked input is
different). The agents' work runs one after another on the fleet's thread, so a round's wall time
here includes n agents' work in series, which real devices do in parallel: ``cpu_s`` (thread CPU
per agent, encoding included) is the per-device figure.

Deltas are seeded per (round, agent index modulo VARIANTS) and alike in a plain and a secure run
(``delta``), every agent claims 100 samples (weight 1 under the secure cap), and ``drops`` makes
an agent vanish after a stage ("advertise", "share" or "mask"); in a plain round an agent that
vanishes before masking sends nothing, one that vanishes after masking sends its update.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
from lightfleet import VARIANTS, LightFleet, Publisher, _placeholder

from protocol.limits import DEFAULT_LIMITS
from protocol.messages import AgentStatus, GlobalState, RoundAnnouncement, TrainMetrics, Update
from protocol.secagg.client import SecAggClient
from protocol.secagg.config import RoundConfig
from protocol.secagg.errors import SecAggAborted
from protocol.secagg.messages import Advertisement, UnmaskRequest
from protocol.secagg.vector import encode_input, pack_masked
from protocol.secagg.wire import (
    STAGE_MESSAGES,
    AdvertisedKeys,
    SecureAdvertise,
    SecureFamily,
    SecureInbox,
    SecureKeys,
    SecureMasked,
    SecureReveal,
    SecureSetup,
    SecureShares,
    SecureUnmask,
)
from protocol.security.trust import OPEN, decode_trusted
from protocol.version import SOFTWARE_VERSION
from protocol.wire import encode_message

SAMPLES = 100
SCALE = 0.001  # the deltas' standard deviation


class SecureLightFleet(LightFleet):
    def __init__(self, url: str, federation: str, count: int, num_params: int, drops: dict[str, str],
                 **kwargs: Any) -> None:
        super().__init__(url, federation, count, num_params, **kwargs)
        self.drops = drops
        self.index = {agent: i for i, agent in enumerate(self.ids)}
        self.variant = {agent: i % VARIANTS for p in self.publishers for i, agent in enumerate(self.share[p.name])}
        """Which of the round's deltas an agent sends: lightfleet's plain path picks the template by the
        agent's place among its connection's agents, and the secure path follows it."""
        self.publisher_of = {agent: p for p in self.publishers for agent in self.share[p.name]}
        self.cpu_s: dict[str, float] = {}
        """Per agent: CPU seconds of its train round's work (its stages, or encoding its update)."""
        self.bytes_up: dict[str, int] = {}
        self.kept: dict[int, GlobalState] = {}
        """Every global state heard, by round (the bench reads the applied mean from two of them)."""
        self._secure: tuple[RoundAnnouncement, SecureSetup, SecureFamily] | None = None
        self._clients: dict[str, SecAggClient] = {}
        self._deltas: dict[int, dict[int, dict[str, np.ndarray]]] = {}

    def delta(self, round_number: int, variant: int) -> dict[str, np.ndarray]:
        """The round's delta of ``variant``, drawn once per round (read-only): the stand-in for what training
        produced, which a device has in hand in a plain and a secure round alike, so drawing it is nobody's cost."""
        drawn = self._deltas.get(round_number)
        if drawn is None:  # one round's at a time (plain_mean may ask from another thread: at worst, drawn again)
            drawn = {}
            self._deltas = {round_number: drawn}
        if variant not in drawn:
            rng = np.random.default_rng([self.seed, round_number, variant])
            drawn[variant] = {n: SCALE * rng.standard_normal(s, dtype=np.float32) for n, s in self.layout.items()}
            for array in drawn[variant].values():
                array.flags.writeable = False
        return drawn[variant]

    # -- plain rounds: lightfleet's path, with these deltas and these dropouts --------------------
    def _status(self, agent_id: str, index: int) -> bytes:
        return encode_message(AgentStatus(
            agent_id=agent_id, state="online", device="cpu", family=self.family, num_samples=SAMPLES,
            num_eval_samples=20, version=SOFTWARE_VERSION, timestamp=time.time(), session=self.session,
            task_ref=self.task, layout=self.fingerprint))

    def _templates(self, ann: RoundAnnouncement, state: GlobalState | None) -> list[bytes]:
        if state is None or ann.task != "train":
            return super()._templates(ann, state)
        self.cpu_s.clear(), self.bytes_up.clear()  # count the train round's work only
        out = []
        for variant in range(VARIANTS):
            delta = self.delta(ann.round, variant)
            start = time.thread_time()
            update = Update(run_id=ann.run_id, agent_id=_placeholder(self.ids[0]), round=ann.round, task=ann.task,
                            task_ref=self.task, family=self.family, base_digest=state.digest, num_samples=SAMPLES,
                            metrics=TrainMetrics(train_loss=0.4, duration_s=0.01, steps=1),
                            delta=delta)
            out.append(encode_message(update))
            self.cpu_s[f"variant-{variant}"] = time.thread_time() - start  # one agent's encoding
        return out

    def _send(self, publisher: Publisher, round_number: int, templates: list[bytes], mine: list[tuple[int, str]],
              sizes: list[int]) -> None:
        staying = [(i, a) for i, a in mine if self.drops.get(a) not in ("advertise", "share")]
        super()._send(publisher, round_number, templates, staying, sizes)
        for i, agent in staying:
            self.bytes_up[agent] = len(templates[i % len(templates)])

    # -- secure rounds ----------------------------------------------------------------------------
    def _on_connect(self, client: Any, userdata: object, flags: object, reason: object, props: object) -> None:
        super()._on_connect(client, userdata, flags, reason, props)
        client.subscribe([(self.topics.secagg_relays_of(self.family), 1), (self.topics.secagg_inbox_of("+"), 1)])

    def _on_message(self, topic: str, payload: bytes) -> None:
        parsed = self.topics.parse(topic)
        if parsed.kind in ("secagg_relay", "secagg_inbox"):
            try:
                self._stage(parsed.stage or "inbox", payload)
            except SecAggAborted as exc:
                self.stats.errors.append(f"{topic}: {exc}")
            return
        super()._on_message(topic, payload)
        if parsed.kind == "global_state" and parsed.round is not None and parsed.round in self._states:
            self.kept[parsed.round] = self._states[parsed.round]

    def _maybe_answer(self) -> None:
        ann = self._announcement
        if ann is None or ann.secure is None or (ann.run_id, ann.round) in self._answered:
            return super()._maybe_answer()
        session = ann.secure.families.get(self.family)
        if session is None:
            return None
        self._answered.add((ann.run_id, ann.round))
        self.stats.rounds_answered.append(ann.round)
        self._secure, self._clients = (ann, ann.secure, session), {}
        self.cpu_s.clear(), self.bytes_up.clear()  # count the train round's work only
        config = RoundConfig(ann.round, tuple(session.roster), session.n_params, session.graph_seed,
                             session.degree, session.threshold, ann.secure.prg)
        out: dict[str, list[tuple[str, bytes]]] = {}
        for agent in session.roster:
            if agent not in self.index:
                continue
            start = time.thread_time()
            client = self._clients[agent] = SecAggClient(agent, config)
            ad = client.advertise()
            keys = AdvertisedKeys(agent_id=agent, encryption_key=ad.encryption_key, mask_key=ad.mask_key,
                                  commitment=ad.self_mask_commitment)
            self._emit(out, ann.round, agent, "advertise", SecureAdvertise(run_id=ann.run_id, round=ann.round, family=self.family,
                                                            keys=keys), start)
        self._publish(out)
        return None

    def _stage(self, stage: str, payload: bytes) -> None:
        if self._secure is None:
            return
        ann, setup, session = self._secure
        message = decode_trusted(payload, STAGE_MESSAGES[stage], DEFAULT_LIMITS, OPEN).message
        if getattr(message, "run_id", None) != ann.run_id or getattr(message, "round", None) != ann.round:
            return
        out: dict[str, list[tuple[str, bytes]]] = {}
        if isinstance(message, SecureKeys):
            ads = {k.agent_id: Advertisement(k.agent_id, k.encryption_key, k.mask_key, k.commitment)
                   for k in message.advertised}
            for agent, client in self._clients.items():
                if self.drops.get(agent) == "advertise" or client.stage != "share":
                    continue
                start = time.thread_time()
                bundles = client.share_keys(ads)
                self._emit(out, ann.round, agent, "shares", SecureShares(run_id=ann.run_id, round=ann.round, agent_id=agent,
                                                          bundles=bundles), start)
        elif isinstance(message, SecureInbox):
            agent, client = message.agent_id, self._clients.get(message.agent_id)
            if client is None or self.drops.get(agent) in ("advertise", "share") or client.stage != "mask":
                return
            delta = self.delta(ann.round, self.variant[agent])
            start = time.thread_time()
            _, ring = encode_input(delta, setup, session, SAMPLES)
            masked = pack_masked(client.masked_input(ring, message.bundles), session)
            self._emit(out, ann.round, agent, "masked", SecureMasked(run_id=ann.run_id, round=ann.round, agent_id=agent,
                                                      masked=masked, train_loss=0.4), start)
        elif isinstance(message, SecureUnmask):
            survivors = frozenset(message.survivors)
            for agent, client in self._clients.items():
                if agent not in survivors or self.drops.get(agent) or client.stage != "unmask":
                    continue
                start = time.thread_time()
                response = client.unmask(UnmaskRequest(survivors))
                self._emit(out, ann.round, agent, "reveal", SecureReveal(
                    run_id=ann.run_id, round=ann.round, agent_id=agent, self_mask_shares=response.self_mask_shares,
                    key_shares=response.key_shares), start)
        self._publish(out)

    def _emit(self, out: dict[str, list[tuple[str, bytes]]], round_number: int, agent: str, stage: str,
              message: Any, start: float) -> None:
        """Encode one agent's message; its CPU since ``start`` (its stage's work and this encoding) is its own."""
        payload = encode_message(message)
        self.cpu_s[agent] = self.cpu_s.get(agent, 0.0) + time.thread_time() - start
        self.bytes_up[agent] = self.bytes_up.get(agent, 0) + len(payload)
        out.setdefault(self.publisher_of[agent].name, []).append((self.topics.secagg(agent, round_number, stage), payload))

    def _publish(self, out: dict[str, list[tuple[str, bytes]]]) -> None:
        """Send a stage's encoded messages, each connection's from its own worker thread."""
        for publisher in self.publishers:
            batch = out.get(publisher.name)
            if batch:
                publisher.jobs.put(lambda p, batch=batch: [p.publish(t, b) for t, b in batch])


def plain_mean(fleet: SecureLightFleet, round_number: int, agents: list[str]) -> dict[str, np.ndarray]:
    """The float64 mean of ``agents``' deltas of ``round_number`` (every one weighs the same)."""
    deltas = [fleet.delta(round_number, fleet.variant[a]) for a in agents]
    return {n: np.mean([d[n].astype(np.float64) for d in deltas], axis=0) for n in fleet.layout}
