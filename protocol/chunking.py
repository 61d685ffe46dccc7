"""Splitting large payloads for brokers that cap message size, and putting them back.

A payload over ``max_message_bytes`` travels as several :class:`Chunk` messages on the same
topic. The receiver's :class:`Reassembler` holds a bounded number of partial transfers,
expires stale ones, and verifies the digest of the whole before handing it on.
"""

from __future__ import annotations

import math
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from protocol.digest import digest_bytes
from protocol.errors import ProtocolError, Reason
from protocol.limits import DecodeLimits
from protocol.messages import Chunk, Message
from protocol.wire import decode_message, encode_message

M = TypeVar("M", bound=Message)

CHUNK_OVERHEAD_BYTES = 256
"""Upper bound on a Chunk's envelope around its data (ids, digest, counters)."""


def split_payload(payload: bytes, max_message_bytes: int | None) -> list[bytes]:
    """``[payload]`` when it fits (or ``max_message_bytes`` is None or 0: no cap), else the
    encoded chunks that carry it."""
    if not max_message_bytes or len(payload) <= max_message_bytes:
        return [payload]
    piece = max_message_bytes - CHUNK_OVERHEAD_BYTES
    if piece <= 0:
        raise ValueError(f"max_message_bytes {max_message_bytes} leaves no room for chunk data")
    count = math.ceil(len(payload) / piece)
    transfer_id = secrets.token_hex(8)
    digest = digest_bytes(payload)
    view = memoryview(payload)
    return [
        encode_message(
            Chunk(transfer_id=transfer_id, index=i, count=count, total_bytes=len(payload), digest=digest,
                  data=bytes(view[i * piece:(i + 1) * piece]))
        )
        for i in range(count)
    ]


@dataclass
class _Transfer:
    count: int
    total_bytes: int
    digest: str
    started: float
    pieces: dict[int, bytes] = field(default_factory=dict)
    size: int = 0


def receive(payload: bytes, source: str, expect: type[M], reassembler: Reassembler,
            limits: DecodeLimits) -> tuple[M, int] | None:
    """A message of kind ``expect`` that may come whole or in chunks: (message, its size in
    bytes), or None while chunks of it are still missing. Raises only ProtocolError."""
    message = decode_message(payload, (expect, Chunk), limits)
    if isinstance(message, Chunk):
        whole = reassembler.add(source, message)
        if whole is None:
            return None
        return decode_message(whole, expect, limits), len(whole)
    assert isinstance(message, expect)
    return message, len(payload)


class Reassembler:
    """Collects chunks per (source, transfer id); bounded in transfers, bytes and age."""

    def __init__(self, max_transfers: int = 64, max_bytes: int = 512 * 1024 * 1024,
                 timeout_s: float = 300.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.max_transfers = max_transfers
        self.max_bytes = max_bytes
        self.timeout_s = timeout_s
        self.clock = clock
        self._transfers: dict[tuple[str, str], _Transfer] = {}
        self._held_bytes = 0

    def add(self, source: str, chunk: Chunk) -> bytes | None:
        """Store one chunk; return the whole payload once complete and verified.

        ``source`` is who sent it (the topic's agent id), so one sender cannot complete or
        poison another's transfer.
        """
        self._expire()
        key = (source, chunk.transfer_id)
        transfer = self._transfers.get(key)
        if transfer is None:
            if len(self._transfers) >= self.max_transfers:
                raise ProtocolError(Reason.BAD_CHUNK, "too many transfers in flight")
            if chunk.total_bytes > self.max_bytes:
                raise ProtocolError(Reason.TOO_LARGE, f"transfer of {chunk.total_bytes} bytes")
            transfer = _Transfer(chunk.count, chunk.total_bytes, chunk.digest, self.clock())
            self._transfers[key] = transfer
        elif (chunk.count, chunk.total_bytes, chunk.digest) != (transfer.count, transfer.total_bytes, transfer.digest):
            self._drop(key)
            raise ProtocolError(Reason.BAD_CHUNK, "chunk disagrees with its transfer's header")
        if chunk.index in transfer.pieces:
            return None  # a QoS 1 redelivery
        if transfer.size + len(chunk.data) > transfer.total_bytes or self._held_bytes + len(chunk.data) > self.max_bytes:
            self._drop(key)
            raise ProtocolError(Reason.TOO_LARGE, "chunks exceed their declared size")
        transfer.pieces[chunk.index] = chunk.data
        transfer.size += len(chunk.data)
        self._held_bytes += len(chunk.data)
        if len(transfer.pieces) < transfer.count:
            return None
        self._drop(key)
        payload = b"".join(transfer.pieces[i] for i in range(transfer.count))
        if len(payload) != transfer.total_bytes or digest_bytes(payload) != transfer.digest:
            raise ProtocolError(Reason.DIGEST_MISMATCH, "reassembled payload does not match its digest")
        return payload

    @property
    def in_flight(self) -> int:
        return len(self._transfers)

    def _drop(self, key: tuple[str, str]) -> None:
        transfer = self._transfers.pop(key)
        self._held_bytes -= transfer.size

    def _expire(self) -> None:
        cutoff = self.clock() - self.timeout_s
        for key in [k for k, t in self._transfers.items() if t.started < cutoff]:
            self._drop(key)
