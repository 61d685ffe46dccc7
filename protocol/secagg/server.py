"""The server's side of a SecAgg+ round: relays keys and sealed bundles, sums masked inputs as they
arrive (it keeps the running sum, never an agent's vector), then removes the masks.

Sets, as in Bonawitz et al.: U1 advertised, U2 shared (bundles relayed), U3 uploaded a masked input
(the survivors), U4 answered the unmasking request. The self-mask of every survivor is rebuilt from
its neighbours' shares; for every agent that shared but did not upload, its mask private key is
rebuilt and the pairwise masks its surviving neighbours added are removed. Once U3 is fixed, a late
upload is refused: its sender's key may already be revealed, and its self-mask never will be.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import numpy as np

from protocol.secagg import shamir
from protocol.secagg.config import RoundConfig
from protocol.secagg.errors import SecAggAborted, SecAggRefused
from protocol.secagg.keys import KEY_BYTES, KeyPair, agree, clamped, mask_seed
from protocol.secagg.messages import BUNDLE_BYTES, Advertisement, UnmaskRequest, UnmaskResponse, seed_commitment
from protocol.secagg.prg import add_mask
from protocol.secagg.recovery import Opened, Recovered, Share, recover

STAGES = ("advertise", "share", "mask", "unmask", "done")
_PROBE = KeyPair.generate()
"""A key of the server's own, to try an advertised key with: agreeing with a low-order point raises."""


def _agreeable(public: bytes) -> bool:
    try:
        agree(_PROBE.private, public)
    except ValueError:
        return False
    return True


class SecAggServer:
    def __init__(self, config: RoundConfig) -> None:
        self.config = config
        self.stage = "advertise"
        self.advertised: dict[str, Advertisement] = {}  # U1
        self._keys: set[bytes] = set()  # the advertised public keys: each is one agent's
        self._bundles: dict[str, dict[str, bytes]] = {}  # U2: sender -> recipient -> bundle
        self._inbox: dict[str, dict[str, bytes]] = {}  # recipient -> sender -> bundle (senders whose shares it holds)
        self.survivors: frozenset[str] = frozenset()  # U3, fixed at close_masking
        self._uploaded: set[str] = set()
        self._total = np.zeros(config.n_params, dtype=np.uint32)
        self._responses: dict[str, UnmaskResponse] = {}  # U4
        self.recovered: frozenset[str] = frozenset()  # agents whose pairwise masks were removed
        self.withheld: dict[str, frozenset[str]] = {}  # survivor -> agents whose shares it held but did not reveal
        self.misfits: dict[str, frozenset[str]] = {}  # holder -> agents whose share it revealed off their polynomial
        self.unattributed: frozenset[str] = frozenset()  # agents opened with wrong shares whose holders are not certain
        self._opened: tuple[int, tuple[Recovered, Recovered] | None] | None = None  # (responses, ready()'s result)
        self._seed_cache: dict[str, Opened] = {}  # each agent's secret as last opened: ready() decodes only the new
        self._key_cache: dict[str, Opened] = {}

    @property
    def shared(self) -> frozenset[str]:
        return frozenset(self._bundles)

    @property
    def dropped(self) -> frozenset[str]:
        """Agents that shared but whose input is not in the sum (U2 minus U3)."""
        return self.shared - self.survivors

    def _expect(self, stage: str, what: str, sender: str) -> None:
        if self.stage != stage:
            late = STAGES.index(self.stage) > STAGES.index(stage)
            raise SecAggRefused(f"{what} from {sender!r} {'too late' if late else 'too early'}: "
                                f"the round is at stage {self.stage!r}")
        if not self.config.selected(sender):
            raise SecAggRefused(f"{what} from {sender!r}, not selected for this round")

    def _neighbours(self, agent: str, among: Iterable[str]) -> set[str]:
        return set(self.config.neighbours_of(agent)) & set(among)

    # Stage 1: advertise keys.
    def receive_advertisement(self, ad: Advertisement) -> None:
        self._expect("advertise", "an advertisement", ad.agent)
        if ad.agent in self.advertised:
            raise SecAggRefused(f"a second advertisement from {ad.agent!r}")
        fields = (ad.encryption_key, ad.mask_key, ad.self_mask_commitment)
        if not all(isinstance(f, bytes) and len(f) == KEY_BYTES for f in fields):
            raise SecAggRefused(f"an advertisement from {ad.agent!r} with a field not of {KEY_BYTES} bytes")
        # A key every neighbour would fail to agree with (a low-order point) or one already taken makes honest
        # neighbours abort; relayed, one agent would fail a round the others could finish.
        keys = (ad.encryption_key, ad.mask_key)
        if ad.encryption_key == ad.mask_key or not all(_agreeable(key) for key in keys):
            raise SecAggRefused(f"an advertisement from {ad.agent!r} with a key no neighbour can agree with")
        if self._keys & set(keys):
            raise SecAggRefused(f"an advertisement from {ad.agent!r} with another agent's public key")
        self.advertised[ad.agent] = ad
        self._keys.update(keys)

    def close_advertising(self) -> dict[str, dict[str, Advertisement]]:
        """U1 is fixed: for each agent of U1, the advertisements of its neighbours in U1 (and its own)."""
        self._require(len(self.advertised), "advertise", "agents advertised keys")
        self.stage = "share"
        return {agent: {peer: self.advertised[peer] for peer in self._neighbours(agent, self.advertised) | {agent}}
                for agent in self.advertised}

    # Stage 2: share keys.
    def receive_shares(self, sender: str, bundles: dict[str, bytes]) -> None:
        self._expect("share", "share bundles", sender)
        if sender not in self.advertised or sender in self._bundles:
            raise SecAggRefused(f"share bundles from {sender!r}, which did not advertise or already shared")
        # Every advertised neighbour must get one, or the pairwise masks would not cancel.
        if set(bundles) != self._neighbours(sender, self.advertised):
            raise SecAggRefused(f"share bundles from {sender!r} not addressed to exactly its advertised neighbours")
        if not all(isinstance(b, bytes) and len(b) == BUNDLE_BYTES for b in bundles.values()):
            raise SecAggRefused(f"a share bundle from {sender!r} not of {BUNDLE_BYTES} bytes")
        self._bundles[sender] = dict(bundles)

    def close_sharing(self) -> dict[str, dict[str, bytes]]:
        """U2 is fixed: for each agent of U2, the bundles addressed to it by other agents of U2."""
        self._require(len(self._bundles), "share", "agents shared keys")
        self.stage = "mask"
        self._inbox = {agent: {} for agent in self._bundles}
        for sender, bundles in self._bundles.items():
            for recipient, bundle in bundles.items():
                if recipient in self._inbox:
                    self._inbox[recipient][sender] = bundle
        return self._inbox

    # Stage 3: masked input.
    def expect_masked_input(self, sender: str) -> None:
        """Raises SecAggRefused unless a masked input of ``sender`` is taken now: the cheap checks, made before
        its wire form is unpacked."""
        self._expect("mask", "a masked input", sender)
        if sender not in self._bundles or sender in self._uploaded:
            raise SecAggRefused(f"a masked input from {sender!r}, which did not share or already uploaded")

    def receive_masked_input(self, sender: str, masked: np.ndarray) -> None:
        self.expect_masked_input(sender)
        if not isinstance(masked, np.ndarray) or masked.dtype != np.uint32 or masked.shape != (self.config.n_params,):
            raise SecAggRefused(f"a masked input from {sender!r} is not uint32[{self.config.n_params}]")
        np.add(self._total, masked, out=self._total)  # summed at once: no agent's vector is kept
        self._uploaded.add(sender)

    def close_masking(self) -> UnmaskRequest:
        """U3 is fixed. Aborts here, before any share is revealed, if the survivors cannot unmask."""
        self._require(len(self._uploaded), "mask", "agents uploaded a masked input")
        self.survivors = frozenset(self._uploaded)
        for agent in sorted(self.shared):
            holders = self._neighbours(agent, self._bundles[agent]) & self.survivors
            needed = agent in self.survivors or holders  # a dropped agent with no surviving neighbour added no mask
            if needed and len(holders) < self.config.threshold:
                raise SecAggAborted("mask", f"{agent!r} has {len(holders)} surviving neighbours holding its shares, "
                                            f"fewer than the threshold {self.config.threshold}")
        self.stage = "unmask"
        return UnmaskRequest(self.survivors)

    # Stage 4: unmasking.
    def receive_unmask_response(self, response: UnmaskResponse) -> None:
        sender = response.agent
        self._expect("unmask", "an unmasking response", sender)
        if sender not in self.survivors or sender in self._responses:
            raise SecAggRefused(f"an unmasking response from {sender!r}, not a survivor or a second one")
        # A survivor may hold back the shares of an agent whose bundle did not open for it (SecAggClient.refused):
        # fewer shares, never another kind of share than the request entitles the server to.
        held = set(self._inbox[sender])
        if not (set(response.self_mask_shares) <= held & self.survivors
                and set(response.key_shares) <= held - self.survivors):
            raise SecAggRefused(f"an unmasking response from {sender!r} that does not match the request")
        for share in (*response.self_mask_shares.values(), *response.key_shares.values()):
            if (not isinstance(share, np.ndarray) or share.dtype != np.uint32 or share.shape != (shamir.CHUNKS,)
                    or np.any(share >= shamir.P)):
                raise SecAggRefused(f"an unmasking response from {sender!r} with a malformed share")
        self._responses[sender] = response
        missing = held - set(response.self_mask_shares) - set(response.key_shares)
        if missing:
            self.withheld[sender] = frozenset(missing)

    def ready(self) -> bool:
        """Whether the responses so far open every secret the unmasking needs (tried once per new response, so a
        caller may ask on every tick); ``finish`` then uses what was opened. Lets a round close before its deadline
        without waiting for a silent survivor, and wait for more responses while a wrong share cannot be outvoted."""
        if self.stage != "unmask":
            return False
        if self._opened is None or self._opened[0] != len(self._responses):
            try:
                self._opened = (len(self._responses), self._open_secrets())
            except SecAggAborted:
                self._opened = (len(self._responses), None)
        return self._opened[1] is not None

    def _open_secrets(self) -> tuple[Recovered, Recovered]:
        """(the survivors' self-mask seeds, the mask keys of dropped agents whose pairwise masks are in the sum)."""
        self._require(len(self._responses), "unmask", "survivors answered the unmasking request")
        survivors, dropped = sorted(self.survivors), sorted(a for a in self.dropped if self._recoverable(a))
        context = self.config.context
        seeds = recover(self._revealed(survivors, lambda r: r.self_mask_shares), self.config.threshold,
                        lambda a, seed: seed_commitment(context, seed) == self.advertised[a].self_mask_commitment,
                        "self-mask seed", self._seed_cache)
        keys = recover(self._revealed(dropped, lambda r: r.key_shares), self.config.threshold,
                       lambda a, raw: raw == clamped(raw)
                       and KeyPair.from_private_bytes(raw).public == self.advertised[a].mask_key,
                       "mask key", self._key_cache)
        return seeds, keys

    def finish(self) -> np.ndarray:
        """The unmasked sum (uint32 ring elements) of the survivors' inputs."""
        if self.stage != "unmask":
            raise SecAggAborted("unmask", f"finish called at stage {self.stage!r}")
        opened = self._opened[1] if self._opened is not None and self._opened[0] == len(self._responses) else None
        seeds, keys = opened if opened is not None else self._open_secrets()
        context = self.config.context
        total = self._total.copy()
        for seed in seeds.secrets.values():
            add_mask(total, seed, -1, self.config.prg)
        for agent in keys.secrets:
            key = KeyPair.from_private_bytes(keys.secrets[agent])
            u = self.config.position(agent)
            for peer in self._neighbours(agent, self._bundles[agent]) & self.survivors:
                v = self.config.position(peer)
                try:
                    seed = mask_seed(key.private, self.advertised[peer].mask_key, context, u, v)
                except ValueError as exc:  # a low-order key from the peer
                    raise SecAggAborted("unmask", f"{peer!r}'s mask key: {exc}") from exc
                add_mask(total, seed, -1 if v < u else +1, self.config.prg)  # undo what the survivor added
        self.recovered = frozenset(keys.secrets)
        self.misfits = {holder: frozenset(seeds.misfits.get(holder, set()) | keys.misfits.get(holder, set()))
                        for holder in sorted(set(seeds.misfits) | set(keys.misfits))}
        self.unattributed = frozenset(seeds.unattributed | keys.unattributed)
        self.stage = "done"
        self._responses.clear()
        self._opened = None
        return total

    def _recoverable(self, agent: str) -> bool:
        return bool(self._neighbours(agent, self._bundles[agent]) & self.survivors)

    def _revealed(self, agents: list[str], pick: Callable[[UnmaskResponse], dict[str, np.ndarray]]
                  ) -> dict[str, list[Share]]:
        """The shares of each of ``agents``' secrets the responses revealed, with their holders' x coordinates."""
        found: dict[str, list[Share]] = {agent: [] for agent in agents}
        for holder, response in self._responses.items():
            for agent, share in pick(response).items():
                if agent in found:
                    found[agent].append((self.config.position(holder) + 1, holder, share))
        return found

    def _require(self, count: int, stage: str, what: str) -> None:
        if count < self.config.threshold:
            raise SecAggAborted(stage, f"{count} {what}, fewer than the threshold {self.config.threshold}")
