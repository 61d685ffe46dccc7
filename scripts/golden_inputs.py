"""The fixed inputs of the golden vectors (scripts/make_golden_vectors.py): ids, keys, timestamps, a tiny
model and the built-in task's layouts, and the collector with the sidecars' JSON forms of decoded fields.

Published test keys and fixed values only: the vectors must come out byte for byte the same on every run.
"""

from __future__ import annotations

import hashlib
import math
from typing import Any

import numpy as np
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from protocol.messages import Message, TaskRef
from protocol.security.signing import SigningKey
from protocol.topics import Topics
from protocol.wire import encode_message

FEDERATION, RUN_ID, SESSION, AGENT = "greenhouse", "3f9a1c2b7d4e", "c0ffee123456", "agent-1"
FAMILY, TASK = "mlp_tiny", TaskRef(name="golden", version="1")
TIMESTAMP = 1767225600.25  # 2026-01-01T00:00:00.25Z
EPOCH = 1767225600250
"""The run's epoch: the coordinator's wall clock in milliseconds when the run started."""
OLD_RUN_ID, OLD_EPOCH = "0a1d0a1d0a1d", EPOCH - 86_400_000
"""A run of the same coordinator key a day earlier, whose messages are replayed."""
AGENT_EPOCH = 1767225590125
"""The agent process's epoch (its start, in milliseconds)."""
COORDINATOR_SEED = hashlib.sha256(b"edgefl golden vectors: coordinator key").digest()
"""A published test key: never use it for anything but these vectors."""
INT8_SEED = 7
CHUNK_MAX_MESSAGE_BYTES = 384
TRANSFER_ID = "0123456789abcdef"
SITE = "site-1"
SITE_SEED = hashlib.sha256(b"edgefl golden vectors: site key").digest()
"""A published test key of a site aggregator: never use it for anything but these vectors."""

DIGITS_LAYOUTS: dict[str, tuple[tuple[str, tuple[int, ...]], ...]] = {
    "cnn_large": (("features.0.weight", (32, 1, 3, 3)), ("features.0.bias", (32,)), ("features.1.weight", (32,)),
                  ("features.1.bias", (32,)), ("features.3.weight", (64, 32, 3, 3)), ("features.3.bias", (64,)),
                  ("features.4.weight", (64,)), ("features.4.bias", (64,)), ("features.7.weight", (128, 64, 3, 3)),
                  ("features.7.bias", (128,)), ("features.8.weight", (128,)), ("features.8.bias", (128,)),
                  ("features.12.weight", (64, 512)), ("features.12.bias", (64,)), ("head.weight", (10, 64)),
                  ("head.bias", (10,))),
    "cnn_small": (("features.0.weight", (16, 1, 3, 3)), ("features.0.bias", (16,)), ("features.1.weight", (16,)),
                  ("features.1.bias", (16,)), ("features.4.weight", (32, 16, 3, 3)), ("features.4.bias", (32,)),
                  ("features.5.weight", (32,)), ("features.5.bias", (32,)), ("features.9.weight", (64, 128)),
                  ("features.9.bias", (64,)), ("head.weight", (10, 64)), ("head.bias", (10,))),
    "mlp_tiny": (("features.1.weight", (64, 64)), ("features.1.bias", (64,)), ("features.3.weight", (64, 64)),
                 ("features.3.bias", (64,)), ("head.weight", (10, 64)), ("head.bias", (10,))),
}
"""The built-in digits task's float32 arrays per family, as ``edge-agent tasks --card digits`` printed them when
these vectors were made: written out so that making the vectors needs no torch, and stays fixed."""

TOPICS = Topics(FEDERATION)


def jsonable(value: Any) -> Any:
    """A decoded field as the sidecar writes it (see the module docstring)."""
    if isinstance(value, np.ndarray):
        return {"ndarray": {"dtype": value.dtype.str, "shape": list(value.shape),
                            "data": [v.item() for v in value.reshape(-1)]}}
    if isinstance(value, (bytes, bytearray, memoryview)):
        return {"bin": bytes(value).hex()}
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError("sidecars hold finite floats only")
    return value


def fields_of(message: Message) -> dict[str, Any]:
    return jsonable(message.model_dump(mode="python"))


def coordinator_key() -> SigningKey:
    return SigningKey(Ed25519PrivateKey.from_private_bytes(COORDINATOR_SEED))


def model_weights() -> dict[str, np.ndarray]:
    """A tiny model in state-dict order: two float32 tensors and a 0-d int64 counter (BatchNorm's)."""
    return {
        "fc.weight": np.array([[0.5, -0.25], [0.125, 1.0], [-2.0, 0.0625]], dtype="<f4"),
        "fc.bias": np.array([0.25, -0.5, 0.75], dtype="<f4"),
        "bn.num_batches_tracked": np.array(12, dtype="<i8"),
    }


def model_delta() -> dict[str, np.ndarray]:
    return {
        "fc.weight": np.array([[0.03125, -0.5], [0.0078125, 0.25], [-0.125, 0.0]], dtype="<f4"),
        "fc.bias": np.array([-0.0625, 0.375, 0.015625], dtype="<f4"),
        "bn.num_batches_tracked": np.array(4, dtype="<i8"),
    }


def layout_preimage(arrays: dict[str, np.ndarray]) -> str:
    """What ``protocol.tasks.layout_fingerprint`` hashes, spelled out for other implementations."""
    return "".join(f"{name}:{a.dtype.str}:{py_tuple(a.shape)};" for name, a in arrays.items())


def digest_preimage(groups: list[tuple[str, dict[str, np.ndarray]]]) -> bytes:
    """What ``protocol.digest.digest_arrays`` hashes, spelled out for other implementations."""
    out = b""
    for group, arrays in groups:
        out += f"[{group}]".encode()
        for name, a in arrays.items():
            out += f"{name}:{a.dtype.str}:{py_tuple(a.shape)};".encode() + a.tobytes(order="C")
    return out


def py_tuple(shape: tuple[int, ...]) -> str:
    """A shape written like Python writes a tuple: ``()``, ``(3,)``, ``(3, 2)``."""
    return "(" + ", ".join(str(d) for d in shape) + ("," if len(shape) == 1 else "") + ")"


class Vectors:
    """Collects vectors: name -> (payload, sidecar)."""

    def __init__(self) -> None:
        self.items: dict[str, tuple[bytes, dict[str, Any]]] = {}

    def add(self, name: str, payload: bytes, topic: str, retain: bool, description: str,
            fields: dict[str, Any] | None, **extra: Any) -> bytes:
        """``fields``: what decoding must produce; None for a payload that must be rejected."""
        head = {"file": f"{name}.msgpack"} | ({"kind": fields["kind"]} if fields is not None else {})
        sidecar = {**head, "topic": topic, "qos": 1, "retain": retain, "size_bytes": len(payload),
                   "description": description, **extra} | ({"fields": fields} if fields is not None else {})
        self.items[name] = (payload, sidecar)
        return payload

    def message(self, name: str, message: Message, topic: str, retain: bool, description: str, **extra: Any) -> bytes:
        return self.add(name, encode_message(message), topic, retain, description, fields_of(message), **extra)
