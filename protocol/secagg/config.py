"""What every party of one secure-aggregation round agrees on before it starts.

The coordinator announces it (roster, vector length, graph seed, degree, threshold, PRG); each party
derives the same neighbours and the same context digest, which salts every derived key so that
nothing from one round can be replayed in another.
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass, field

from protocol.secagg.graph import default_degree, default_threshold, neighbours
from protocol.secagg.prg import PRGS, PrgName


@dataclass(frozen=True)
class RoundConfig:
    round_id: int
    roster: tuple[str, ...]  # the selected agents, sorted, unique: position = index here
    n_params: int  # ring elements per masked vector
    graph_seed: bytes  # 32 bytes of public randomness, drawn after the roster is fixed
    degree: int = 0  # 0: default_degree(len(roster))
    threshold: int = 0  # 0: default_threshold(degree)
    prg: PrgName = "chacha20"
    context: bytes = field(init=False, repr=False)
    graph: tuple[frozenset[int], ...] = field(init=False, repr=False)
    _positions: dict[str, int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        n = len(self.roster)
        if n < 2 or list(self.roster) != sorted(set(self.roster)):
            raise ValueError("the roster needs at least two agents, sorted and unique")
        if self.n_params < 1 or len(self.graph_seed) != 32 or self.prg not in PRGS:
            raise ValueError("n_params >= 1, a 32-byte graph seed and a known PRG are required")
        degree = self.degree or default_degree(n)
        threshold = self.threshold or default_threshold(degree)
        if not 1 <= threshold <= degree:
            raise ValueError(f"threshold {threshold} needs 1..{degree} (the degree)")
        object.__setattr__(self, "degree", degree)
        object.__setattr__(self, "threshold", threshold)
        object.__setattr__(self, "graph", tuple(neighbours(n, degree, self.graph_seed)))
        object.__setattr__(self, "_positions", {agent: i for i, agent in enumerate(self.roster)})
        digest = hashlib.sha256(b"edgefl/secagg/v1/round")
        digest.update(struct.pack("<QQII", self.round_id, self.n_params, degree, threshold))
        digest.update(self.prg.encode() + b"\0" + self.graph_seed)
        for agent in self.roster:
            encoded = agent.encode()
            digest.update(struct.pack("<I", len(encoded)) + encoded)
        object.__setattr__(self, "context", digest.digest())

    def position(self, agent: str) -> int:
        """The roster position of ``agent``; KeyError for an agent not selected for this round."""
        return self._positions[agent]

    def selected(self, agent: str) -> bool:
        return agent in self._positions

    def neighbours_of(self, agent: str) -> frozenset[str]:
        return frozenset(self.roster[v] for v in self.graph[self.position(agent)])
