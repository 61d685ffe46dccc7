"""One agent's side of a SecAgg+ round, as a state machine: advertise -> share -> mask -> unmask.

The agent's secrets never leave it in the clear: its self-mask seed b and its mask private key are
Shamir-shared to its neighbours inside encrypted bundles. It answers one unmasking request only,
and for each neighbour reveals the share of b (the neighbour survived) or of the key (it dropped),
never both, which is what keeps a late agent's input hidden (Bonawitz et al. 2017, section 4).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import numpy as np

from protocol.secagg import shamir
from protocol.secagg.config import RoundConfig
from protocol.secagg.errors import SecAggAborted
from protocol.secagg.keys import KEY_BYTES, KeyPair, agree, clamped, mask_seed, share_key_from
from protocol.secagg.messages import (
    Advertisement,
    UnmaskRequest,
    UnmaskResponse,
    open_bundle,
    seal_bundle,
    seed_commitment,
)
from protocol.secagg.prg import add_mask


class SecAggClient:
    def __init__(self, agent: str, config: RoundConfig) -> None:
        self.agent = agent
        self.config = config
        self.me = config.position(agent)
        self.stage = "advertise"
        self._encryption: KeyPair | None = None
        self._masking: KeyPair | None = None
        self._peers: dict[int, Advertisement] = {}  # neighbours that advertised, by position
        self._held: dict[int, tuple[np.ndarray, np.ndarray]] = {}  # neighbour -> (its b share, its key share)
        self._agreed: dict[int, bytes] = {}  # neighbour -> raw X25519 secret of the encryption keys (both directions)
        self._self_mask_seed = b""
        self.refused: dict[str, str] = {}  # neighbour -> why its share bundle did not open (its shares not held)

    def _enter(self, expected: str, following: str) -> None:
        if self.stage != expected:
            raise SecAggAborted(expected, f"{self.agent} is at stage {self.stage!r}, not {expected!r}")
        self.stage = following

    def advertise(self) -> Advertisement:
        """Stage 1: two fresh key pairs for this round."""
        self._enter("advertise", "share")
        self._encryption, self._masking = KeyPair.generate(), KeyPair.generate()
        self._self_mask_seed = os.urandom(32)
        return Advertisement(self.agent, self._encryption.public, self._masking.public,
                             seed_commitment(self.config.context, self._self_mask_seed))

    def share_keys(self, advertised: Mapping[str, Advertisement]) -> dict[str, bytes]:
        """Stage 2: from the neighbours' advertisements, encrypted share bundles keyed by recipient."""
        self._enter("share", "mask")
        assert self._encryption is not None and self._masking is not None
        mine = advertised.get(self.agent)
        if mine is None or (mine.encryption_key, mine.mask_key) != (self._encryption.public, self._masking.public):
            raise SecAggAborted("share", "the advertised keys do not include this agent's own")
        seen: set[bytes] = set()
        for agent, ad in advertised.items():
            fields = (ad.encryption_key, ad.mask_key, ad.self_mask_commitment)
            if ad.agent != agent or not all(isinstance(f, bytes) and len(f) == KEY_BYTES for f in fields):
                raise SecAggAborted("share", f"a malformed advertisement for {agent!r}")
            if ad.encryption_key in seen or ad.mask_key in seen:
                raise SecAggAborted("share", "two advertisements share a public key")
            seen.update((ad.encryption_key, ad.mask_key))
        roster = self.config.roster
        self._peers = {v: advertised[roster[v]] for v in sorted(self.config.graph[self.me]) if roster[v] in advertised}
        if len(self._peers) < self.config.threshold:
            raise SecAggAborted("share", f"{len(self._peers)} neighbours advertised keys, "
                                         f"fewer than the threshold {self.config.threshold}")
        holders = list(self._peers)
        shares = shamir.split([self._self_mask_seed, clamped(self._masking.private_bytes())],
                              np.array(holders) + 1, self.config.threshold)
        context = self.config.context
        bundles = {}
        for i, v in enumerate(holders):
            try:  # a low-order public key gives an all-zero secret: refused, not used
                self._agreed[v] = agree(self._encryption.private, self._peers[v].encryption_key)
            except ValueError as exc:
                raise SecAggAborted("share", f"{roster[v]!r}'s encryption key: {exc}") from exc
            key = share_key_from(self._agreed[v], context, self.me, v)
            bundles[roster[v]] = seal_bundle(key, context, self.me, v, shares[0, i], shares[1, i])
        return bundles

    def masked_input(self, values: np.ndarray, bundles: Mapping[str, bytes]) -> np.ndarray:
        """Stage 3: ``values`` (uint32, quantised) plus the self-mask and a pairwise mask with every
        neighbour whose bundle arrived (those, and only those, shared their secrets this round)."""
        self._enter("mask", "unmask")
        assert self._encryption is not None and self._masking is not None
        values = np.asarray(values)
        if values.dtype != np.uint32 or values.shape != (self.config.n_params,):
            raise SecAggAborted("mask", f"the input must be uint32[{self.config.n_params}], not "
                                        f"{values.dtype}{list(values.shape)}")
        context = self.config.context
        senders: set[int] = set()
        for sender, bundle in bundles.items():
            v = self.config.position(sender) if self.config.selected(sender) else -1
            if v not in self._peers:
                raise SecAggAborted("mask", f"a share bundle from {sender!r}, not an advertised neighbour")
            senders.add(v)
            key = share_key_from(self._agreed[v], context, v, self.me)  # agreed when sealing to v: v is a peer
            try:
                self._held[v] = open_bundle(key, context, v, self.me, bundle)
            except (ValueError, TypeError) as exc:
                # A neighbour's bad bundle costs it one holder of its shares, not this agent its round: the pairwise
                # mask is still added (the neighbour shared, so the server counts on it), its shares are not held.
                self.refused[sender] = str(exc)
        self._agreed.clear()  # the bundles are open: the encryption secrets have no further use
        if len(senders) < self.config.threshold:
            raise SecAggAborted("mask", f"{len(senders)} neighbours shared, fewer than the threshold "
                                        f"{self.config.threshold}: this agent's secrets could not be recovered")
        masked = values.copy()
        add_mask(masked, self._self_mask_seed, +1, self.config.prg)
        for v in sorted(senders):
            try:
                seed = mask_seed(self._masking.private, self._peers[v].mask_key, context, self.me, v)
            except ValueError as exc:
                raise SecAggAborted("mask", f"{self.config.roster[v]!r}'s mask key: {exc}") from exc
            add_mask(masked, seed, +1 if v > self.me else -1, self.config.prg)
        return masked

    def unmask(self, request: UnmaskRequest) -> UnmaskResponse:
        """Stage 4, answered once: for each neighbour that shared, the share the request entitles
        the server to (self-mask share if it survived, key share if it dropped)."""
        self._enter("unmask", "done")
        survivors = request.survivors
        if self.agent not in survivors:
            raise SecAggAborted("unmask", "the request says this agent's input is not in the sum")
        if not survivors <= set(self.config.roster):
            raise SecAggAborted("unmask", "the request names agents outside the roster")
        if len(survivors) < self.config.threshold:
            raise SecAggAborted("unmask", f"{len(survivors)} survivors, fewer than the threshold "
                                          f"{self.config.threshold}")
        roster = self.config.roster
        self_mask = {roster[v]: b for v, (b, _) in self._held.items() if roster[v] in survivors}
        keys = {roster[v]: k for v, (_, k) in self._held.items() if roster[v] not in survivors}
        self._held.clear()
        self._self_mask_seed = b""
        return UnmaskResponse(self.agent, self_mask, keys)
