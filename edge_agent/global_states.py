"""The global states an agent holds: its family's newest two, reassembled from signed chunks and checked
against the topic they came on; the agent keeps only those of the run it follows (``edge_agent.freshness``)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from protocol.limits import DecodeLimits
from protocol.messages import GlobalState
from protocol.security.trust import Trust
from protocol.topics import Topics
from protocol.transport.chunking import Reassembler, receive

STATE_LIMITS = DecodeLimits()
"""Global states carry whole models: the default (large) bounds."""

KEPT = 2
"""The newest states kept: the round's and the one before (an update may still be answering it)."""


class GlobalStates(Mapping[int, GlobalState]):
    """By round. ``assemble`` reads what arrives; ``keep`` holds a state the agent accepted."""

    def __init__(self, family: str, topics: Topics, trust: Trust) -> None:
        self.family = family
        self.topics = topics
        self.trust = trust
        self._reassembler = Reassembler(max_transfers=4, max_transfers_per_source=4)
        self._states: dict[int, GlobalState] = {}

    def assemble(self, round_number: int, payload: bytes) -> GlobalState | None:
        """The state published for ``round_number`` once whole (None: more chunks to come). Raises ProtocolError for
        a piece or a state that is refused."""
        received = receive(payload, "coordinator", GlobalState, self._reassembler, STATE_LIMITS, self.trust,
                           self.topic(round_number), round_number)
        return None if received is None else received.message

    def misfiled(self, state: GlobalState, round_number: int) -> str | None:
        """Why a state is not the one its topic names (None: it is)."""
        if state.round != round_number or state.family != self.family:
            return f"a state of {state.family} round {state.round} on {self.topic(round_number)}"
        return None

    def topic(self, round_number: int) -> str:
        return self.topics.global_state(self.family, round_number)

    def keep(self, state: GlobalState) -> None:
        self._states[state.round] = state
        for stale in sorted(self._states)[:-KEPT]:
            del self._states[stale]

    def forget_before(self, epoch: int) -> None:
        """A newer run: what older epochs published goes (else it would push out this run's states)."""
        self._states = {n: s for n, s in self._states.items() if s.epoch >= epoch}

    def __getitem__(self, round_number: int) -> GlobalState:
        return self._states[round_number]

    def __iter__(self) -> Iterator[int]:
        return iter(self._states)

    def __len__(self) -> int:
        return len(self._states)
