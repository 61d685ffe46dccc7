"""The agent's half of each federated algorithm, one file each, registering itself in
``CLIENT_ALGORITHMS`` (``registry.py``); importing this package registers the built-ins."""

from __future__ import annotations

from collections.abc import Mapping

from edge_agent.algorithms import fedavg, fedproto, fedprox, scaffold  # noqa: F401  (each registers itself)
from edge_agent.algorithms.base import ClientAlgorithm, RoundContext
from edge_agent.algorithms.registry import CLIENT_ALGORITHMS
from edge_agent.state import AgentStateDir
from protocol.errors import ProtocolError, Reason


def unknown_algorithm(name: str) -> str | None:
    """Why this agent cannot run rounds of algorithm ``name``, or None when it implements it."""
    if name in CLIENT_ALGORITHMS:
        return None
    return f"this agent does not implement algorithm {name!r} (it implements {', '.join(CLIENT_ALGORITHMS.names())})"


def build_client_algorithm(name: str, params: Mapping[str, float | int | bool], state: AgentStateDir,
                           context: RoundContext) -> ClientAlgorithm:
    problem = unknown_algorithm(name)
    if problem is not None:  # a round this agent cannot answer: it skips it, it does not die
        raise ProtocolError(Reason.SCHEMA, problem)
    return CLIENT_ALGORITHMS.get(name)(params, state, context)


__all__ = ["CLIENT_ALGORITHMS", "ClientAlgorithm", "RoundContext", "build_client_algorithm", "unknown_algorithm"]
