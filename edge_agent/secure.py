"""An agent's side of secure rounds (SecAgg+, ``RoundAnnouncement.secure``): its delta leaves masked.

On the announcement of a secure round whose roster holds this agent, it advertises two fresh key
pairs (training starts meanwhile); on the relayed keys it seals its secrets' shares for its
neighbours; once training is done and its inbox of neighbours' bundles has arrived it clips its
delta to the declared range, weighs it, quantises it to the round's grid and publishes it masked
(the low ``ring_bits`` bits of each element: int8's grid makes it 12 to 17 bits, not 32); on the unmasking
request it reveals, once, the shares the survivors list entitles the coordinator to. A check that
fails (``SecAggAborted``: under the threshold, a bad bundle, a request naming too few) ends its
part in the round: it sends nothing more, so its update is never revealed in the clear.

Under SCAFFOLD the control delta is masked after the delta (``protocol.secagg.vector``); under FedProto the
prototypes and their per-class counts are masked instead of a delta (``protocol.secagg.prototype_vector``). The worker
commits the agent's new variate when it builds the update, before any masking: an agent whose input
is not in the sum (it left the session, it was not among the survivors, or the round failed after)
would keep a variate the server never added. ``settled`` says, once per secure round it answered,
whether its input was counted: named among the survivors and the family's state advanced past that
round, as the next announcement shows (``settle``). A caller rolls the variate back on False. What it
must settle (the round, and whether the unmasking request named it) is kept in the state directory
(``PENDING``), so a restart before the next announcement does not lose it; an agent that restarts between
uploading and the unmasking request learns whether it was named from the request, if its broker session
delivers it after the restart (it cannot reveal, but its neighbours' shares rebuild its self-mask); one that
misses the request is settled as not named.

Called only from the agent's loop thread (``edge_agent.agent``), like the rest of its state.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable

from paho.mqtt.client import MQTTMessageInfo

from edge_agent.state import AgentStateDir
from protocol.limits import DecodeLimits
from protocol.messages import Message, RoundAnnouncement, Update
from protocol.secagg.client import SecAggClient
from protocol.secagg.config import RoundConfig
from protocol.secagg.errors import SecAggAborted
from protocol.secagg.messages import Advertisement, UnmaskRequest
from protocol.secagg.prototype_vector import encode_prototypes
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
from protocol.security.signing import PublicKey, single_key
from protocol.security.trust import Trust, decode_trusted
from protocol.topics import ParsedTopic, Topics
from protocol.wire import encode_message

log = logging.getLogger(__name__)

PENDING = "secagg-pending"
"""State-dir record of the secure round this agent answered and has not settled yet (survives a restart)."""
VANISH_WAIT_S = 30.0
VANISH_EXIT_CODE = 17
"""``secagg_vanish_after`` (tests only): how long the message may take to be acknowledged, and the exit status."""
_RELAY_LIMITS = DecodeLimits(max_payload_bytes=16 * 1024 * 1024, max_array_elements=1, max_total_elements=1)


class SecureParticipant:
    def __init__(self, agent_id: str, family: str, topics: Topics, publish: Callable[[str, bytes], MQTTMessageInfo],
                 seal: Callable[[bytes], bytes], audit: AgentStateDir | None = None,
                 settled: Callable[[str, int, bool], None] | None = None, vanish_after: str | None = None,
                 state: AgentStateDir | None = None) -> None:
        self.agent_id = agent_id
        self.family = family
        self.topics = topics
        self._publish = publish
        self._seal = seal
        self._audit = audit
        self._vanish_after = vanish_after
        """TESTS ONLY (``secagg_vanish_after``): the stage after whose message this process exits."""
        """TESTS/AUDITS ONLY (``secagg_audit``): the vector it masked is kept in its own state dir, never sent."""
        self.round: tuple[str, int] | None = None
        self.setup: SecureSetup | None = None
        self.session: SecureFamily | None = None
        self.client: SecAggClient | None = None
        self._inbox: dict[str, bytes] | None = None
        self._relay_trust: Trust | None = None
        """A site's session: who signs its relays (the site aggregator); None: the coordinator, as the agent trusts it."""
        self._update: Update | None = None
        self._settled = settled
        self._answered: tuple[str, int] | None = None
        """The secure round whose training answer this agent took, until ``settled`` is told its fate."""
        self._named = False
        """Whether that round's unmasking request named this agent a survivor (and it revealed)."""
        self._state = state
        pending = state.read_json(PENDING) if state is not None else None
        if pending is not None:  # a restart before the round was settled
            try:
                self._answered, self._named = (str(pending["run_id"]), int(pending["round"])), bool(pending["named"])
            except (KeyError, TypeError, ValueError, OverflowError) as exc:
                raise ValueError(f"{PENDING}.json in {state.root if state is not None else '?'} is malformed "
                                 f"({exc!r}); move it away") from None

    def subscriptions(self) -> list[tuple[str, int]]:
        return [(self.topics.secagg_relays_of(self.family), 1), (self.topics.secagg_inbox_of(self.agent_id), 1)]

    def begin(self, ann: RoundAnnouncement) -> None:
        """A secure round that names this agent: advertise its keys (once per round). Any later announcement
        settles the round this agent last answered securely (see ``settle``)."""
        self.settle(ann)
        if ann.secure is None or self.round == (ann.run_id, ann.round):
            return
        found = next(((site, session) for site, family, session in ann.secure.sessions()
                      if family == self.family and self.agent_id in session.roster), None)
        if found is None:
            return
        site, session = found
        self._reset()
        self.round, self.setup, self.session = (ann.run_id, ann.round), ann.secure, session
        key = ann.secure.sites[site].key if site is not None else None
        # A site's session is relayed by its site aggregator, whose key the root's signed announcement vouches for.
        self._relay_trust = Trust(single_key(site, PublicKey(key)), required=True) if site is not None and key else None
        try:
            config = RoundConfig(ann.round, tuple(session.roster), session.n_params, session.graph_seed,
                                 session.degree, session.threshold, ann.secure.prg)
            self.client = SecAggClient(self.agent_id, config)
        except ValueError as exc:  # a session no SecAgg+ round can run (a coordinator's bug, or another version's)
            log.warning("round %d: not taking part in the secure round: %s", ann.round, exc)
            self.client = None
            return
        ad = self.client.advertise()
        self._send("advertise", SecureAdvertise(run_id=ann.run_id, round=ann.round, family=self.family, keys=AdvertisedKeys(
            agent_id=self.agent_id, encryption_key=ad.encryption_key, mask_key=ad.mask_key,
            commitment=ad.self_mask_commitment)))

    def takes(self, update: Update) -> bool:
        """Whether ``update`` answers this agent's secure round (then it is masked here, never sent plain)."""
        if self.round != (update.run_id, update.round) or update.task != "train":
            return False
        self._answered, self._named = self.round, False
        self._keep_pending()
        if self.client is not None:
            self._update = update
            self._guarded(self._maybe_mask)
        return True  # a session that aborted sends nothing: its update must not leave in the clear

    def on_message(self, parsed: ParsedTopic, payload: bytes, trust: Trust) -> None:
        """A relayed stage message (keys, inbox, unmask); raises ProtocolError for one that does not decode."""
        if parsed.stage not in ("keys", "inbox", "unmask"):
            return
        message: Message = decode_trusted(payload, STAGE_MESSAGES[parsed.stage], _RELAY_LIMITS,
                                          self._relay_trust or trust).message
        if message.round != parsed.round:  # type: ignore[attr-defined]
            return  # a genuine relay republished on another round's topic: the signed round is what counts
        if isinstance(message, SecureUnmask) and message.family == self.family:
            self._note_survivors(message)
        if self.client is None or self.round != (message.run_id, message.round):  # type: ignore[attr-defined]
            return  # another round's, or a round this agent is not part of
        if isinstance(message, SecureKeys) and message.family == self.family:
            if self.client.stage == "share":  # a redelivered (QoS 1) or replayed copy after it: the first counted
                self._guarded(lambda: self._share(message))
        elif isinstance(message, SecureInbox) and message.agent_id == self.agent_id:
            self._inbox = dict(message.bundles)
            self._guarded(self._maybe_mask)
        elif isinstance(message, SecureUnmask) and message.family == self.family:
            self._guarded(lambda: self._reveal(message))

    def _guarded(self, step: Callable[[], None]) -> None:
        """Run a stage; one that aborts ends this agent's part in the round (nothing more is sent)."""
        try:
            step()
        except SecAggAborted as exc:
            log.warning("round %s: leaving the secure round: %s", self.round[1] if self.round else "?", exc)
            self.client = None

    def _share(self, message: SecureKeys) -> None:
        assert self.client is not None and self.round is not None
        ads = {k.agent_id: Advertisement(k.agent_id, k.encryption_key, k.mask_key, k.commitment)
               for k in message.advertised}
        bundles = self.client.share_keys(ads)
        self._send("shares", SecureShares(run_id=self.round[0], round=self.round[1], agent_id=self.agent_id,
                                          bundles=bundles))

    def _maybe_mask(self) -> None:
        if self.client is None or self._inbox is None or self._update is None:
            return
        assert self.round is not None and self.setup is not None and self.session is not None
        update, self._update = self._update, None
        try:
            if update.prototypes is not None:  # FedProto: per-class prototype sums and counts
                plain, ring = encode_prototypes(update.prototypes, update.prototype_counts, self.setup, self.session)
            else:  # under SCAFFOLD (the round declares control_clip) its control delta is masked after its delta
                plain, ring = encode_input(update.delta, self.setup, self.session, update.num_samples,
                                           update.control_delta or None)
        except ValueError as exc:
            raise SecAggAborted("mask", str(exc)) from exc
        masked = pack_masked(self.client.masked_input(ring, self._inbox), self.session)
        for sender, why in sorted(self.client.refused.items()):  # its shares are held back; the round goes on
            log.warning("round %d: %s's share bundle was refused: %s", self.round[1], sender, why)
        if self._audit is not None:
            self._audit.write_arrays(f"secagg-input-{self.round[1]}", {"plain": plain})
        m = update.metrics
        self._send("masked", SecureMasked(run_id=self.round[0], round=self.round[1], agent_id=self.agent_id,
                                          masked=masked, eval_loss=m.eval_loss, eval_accuracy=m.eval_accuracy,
                                          num_eval_samples=m.num_eval_samples, train_loss=m.train_loss))
        log.info("round %d: sent the masked input (%d values, clipped to +-%g, %d bits each)", self.round[1],
                 self.session.n_params - 1, self.setup.clip, self.session.ring_bits)

    def _reveal(self, message: SecureUnmask) -> None:
        assert self.client is not None and self.round is not None
        if self.client.stage != "unmask":
            raise SecAggAborted("unmask", "an unmasking request before this agent uploaded its masked input")
        response = self.client.unmask(UnmaskRequest(frozenset(message.survivors)))
        self._send("reveal", SecureReveal(run_id=self.round[0], round=self.round[1], agent_id=self.agent_id,
                                          self_mask_shares=response.self_mask_shares, key_shares=response.key_shares))
        self.client = None  # whether it was named is noted as the request came (``_note_survivors``)

    def _note_survivors(self, message: SecureUnmask) -> None:
        """Whether the unmasking request of the round this agent answered names it: its input is then in the sum (its
        self-mask rebuilt from its neighbours' shares if it cannot reveal), even when this process has no session
        left to reveal with (it restarted after uploading, or its session aborted after)."""
        if self._answered == (message.run_id, message.round) and not self._named:
            self._named = self.agent_id in message.survivors
            self._keep_pending()

    def settle(self, ann: RoundAnnouncement) -> None:
        """The first later announcement of the run tells whether the answered round's sum became the state: the
        family's state then dates from after it (a failed round leaves the state it started from). ``begin``
        calls it; a caller that gives ``begin`` only the rounds selecting this agent gives it the others, so
        that a round failed after its unmasking request is not taken for counted once a later one completed."""
        answered = self._answered
        if answered is None or ann.run_id != answered[0] or ann.round <= answered[1]:
            if answered is not None and ann.run_id != answered[0]:
                self._answered = None  # another run: its variates are another run's (keyed by run)
                self._keep_pending()
            return
        ref = ann.states.get(self.family)
        counted = self._named and ref is not None and ref.round > answered[1]
        if not counted:
            log.warning("round %d: this agent's masked input is not in the sum that was folded", answered[1])
        if self._settled is not None:  # before the pending mark goes: a crash while settling settles again
            self._settled(answered[0], answered[1], counted)
        self._answered, self._named = None, False
        self._keep_pending()

    def _keep_pending(self) -> None:
        if self._state is None:
            return
        if self._answered is None:
            self._state.remove(PENDING)
        else:
            self._state.write_json(PENDING, {"run_id": self._answered[0], "round": self._answered[1],
                                             "named": self._named})

    def _send(self, stage: str, message: Message) -> None:
        assert self.round is not None
        sent = self._publish(self.topics.secagg(self.agent_id, self.round[1], stage), self._seal(encode_message(message)))
        if stage == self._vanish_after:
            sent.wait_for_publish(VANISH_WAIT_S)
            log.warning("secagg_vanish_after %s: exiting now, as a device losing power", stage)
            os._exit(VANISH_EXIT_CODE)

    def _reset(self) -> None:
        self.round = self.setup = self.session = self.client = None
        self._inbox = self._update = self._relay_trust = None

