"""FedAvg on the agent: plain local SGD; the update is the weight delta."""

from __future__ import annotations

from edge_agent.algorithms.base import ClientAlgorithm
from edge_agent.algorithms.registry import register_client


class FedAvgClient(ClientAlgorithm):
    name = "fedavg"
    dp_compatible = True  # no extra terms: DP-SGD covers everything it sends


register_client(FedAvgClient, summary="plain local SGD; sends the weight delta", payloads=("weights", "delta"))
