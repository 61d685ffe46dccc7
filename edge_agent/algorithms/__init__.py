"""The agent's half of each federated algorithm, one file each."""

from __future__ import annotations

from collections.abc import Mapping

from edge_agent.algorithms.base import ClientAlgorithm
from edge_agent.algorithms.fedavg import FedAvgClient
from edge_agent.state import AgentStateDir

CLIENT_ALGORITHMS: dict[str, type[ClientAlgorithm]] = {
    FedAvgClient.name: FedAvgClient,
}


def build_client_algorithm(name: str, params: Mapping[str, float | int | bool], state: AgentStateDir) -> ClientAlgorithm:
    if name not in CLIENT_ALGORITHMS:
        raise ValueError(f"this agent does not implement algorithm {name!r}")
    return CLIENT_ALGORITHMS[name](params, state)


__all__ = ["ClientAlgorithm", "build_client_algorithm", "CLIENT_ALGORITHMS"]
