"""The registry of federated algorithms, agent side: the ``ClientAlgorithm`` class of each name a
round may announce (``RoundAnnouncement.algorithm``); the coordinator's halves are in
``coordinator/strategies/registry.py`` under the same names.

Each client file registers its class with :func:`register_client`, which declares its
compatibility: ``dp`` (``off``, and ``on`` when the class keeps the DP contract of
``edge_agent/algorithms/base.py``) and ``payloads`` (what its update carries: ``weights``,
``delta``, ``control``, ``prototypes``). Announced names are an open set: a round of a name not
registered here is refused with a reason in the agent's status (``LocalWorker.refusal``), never
dropped as malformed. Third parties register an ``Entry`` under ``edgefl.client_algorithms``.
"""

from __future__ import annotations

from edge_agent.algorithms.base import ClientAlgorithm
from protocol.registry import Entry, Registry

CLIENT_ALGORITHMS: Registry[type[ClientAlgorithm]] = Registry("client algorithm", "edgefl.client_algorithms")


def register_client(cls: type[ClientAlgorithm], *, summary: str, payloads: tuple[str, ...]) -> Entry[type[ClientAlgorithm]]:
    """Register ``cls`` under ``cls.name``; the "settings" it reads are the round ``params`` of its ``params_model``."""
    params = tuple(field.alias or name for name, field in cls.params_model.model_fields.items())
    return CLIENT_ALGORITHMS.register(cls.name, cls, summary=summary, settings=params,
                                      dp=("off", "on") if cls.dp_compatible else ("off",), payloads=payloads)
