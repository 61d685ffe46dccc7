"""Secure aggregation, SecAgg+ (Bell et al., CCS 2020) over Bonawitz et al. (CCS 2017): the server
learns the sum of the agents' quantised updates and nothing else, and survives dropouts.

One job per module: ``keys`` (X25519 + HKDF), ``prg`` (seed -> ring elements), ``shamir`` (32-byte
secrets over GF(2^31-1)), ``graph`` (the sparse neighbour graph), ``quantise`` (floats <-> Z_2^32),
``config`` (what a round agrees on), ``messages`` (stage messages, sealed share bundles), ``client``
and ``server`` (the stages as state machines), ``simulate`` (a whole round in one process), ``wire`` (the
stage messages and the announcement's ``secure`` part), ``vector`` (what an agent masks, and the sum read back),
``ring`` (the ring Z_2^b a round's grid needs, int8's and fp16's included, and b bits an element on the wire).
Pure numpy and ``cryptography``; no transport, no torch.
"""

from protocol.secagg.client import SecAggClient
from protocol.secagg.config import RoundConfig
from protocol.secagg.errors import SecAggAborted, SecAggRefused
from protocol.secagg.quantise import Quantiser
from protocol.secagg.server import SecAggServer

__all__ = ["Quantiser", "RoundConfig", "SecAggAborted", "SecAggClient", "SecAggRefused", "SecAggServer"]
