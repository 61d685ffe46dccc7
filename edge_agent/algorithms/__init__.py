"""The agent's half of each federated algorithm, one file each."""

from __future__ import annotations

from collections.abc import Mapping

from edge_agent.algorithms.base import ClientAlgorithm, RoundContext
from edge_agent.algorithms.fedavg import FedAvgClient
from edge_agent.algorithms.fedproto import FedProtoClient
from edge_agent.algorithms.fedprox import FedProxClient
from edge_agent.algorithms.scaffold import ScaffoldClient
from edge_agent.state import AgentStateDir
from protocol.errors import ProtocolError, Reason

CLIENT_ALGORITHMS: dict[str, type[ClientAlgorithm]] = {
    cls.name: cls for cls in (FedAvgClient, FedProxClient, ScaffoldClient, FedProtoClient)
}


def build_client_algorithm(name: str, params: Mapping[str, float | int | bool], state: AgentStateDir,
                           context: RoundContext) -> ClientAlgorithm:
    if name not in CLIENT_ALGORITHMS:  # a round this agent cannot answer: it skips it, it does not die
        raise ProtocolError(Reason.SCHEMA, f"this agent does not implement algorithm {name!r}")
    return CLIENT_ALGORITHMS[name](params, state, context)


__all__ = ["CLIENT_ALGORITHMS", "ClientAlgorithm", "RoundContext", "build_client_algorithm"]
