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
from protocol.messages import Chunk, Message, Signed
from protocol.security.trust import OPEN, Received, Trust, accept, decode_trusted
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
            limits: DecodeLimits, trust: Trust = OPEN) -> Received[M] | None:
    """A message of kind ``expect`` that may come whole or in chunks, signed or not (as ``trust``
    allows), or None while chunks of it are still missing. Raises only ProtocolError."""
    message = decode_message(payload, (expect, Signed, Chunk), limits)
    if isinstance(message, Chunk):
        whole = reassembler.add(source, message)
        if whole is None:
            return None
        return decode_trusted(whole, expect, limits, trust)
    return accept(message, len(payload), expect, limits, trust)


class Reassembler:
    """Collects chunks per (source, transfer id); bounded in transfers, bytes and age."""

    def __init__(self, max_transfers: int = 64, max_bytes: int = 512 * 1024 * 1024,
                 timeout_s: float = 300.0, clock: Callable[[], float] = time.monotonic, *,
                 max_transfers_per_source: int = 2, max_bytes_per_source: int | None = None) -> None:
        self.max_transfers = max_transfers
        self.max_bytes = max_bytes
        self.max_transfers_per_source = max_transfers_per_source
        self.max_bytes_per_source = max_bytes if max_bytes_per_source is None else max_bytes_per_source
        """Quotas per sender, so that made-up senders cannot take the slots and bytes honest ones need."""
        self._per_source: dict[str, tuple[int, int]] = {}
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
            count, held = self._per_source.get(source, (0, 0))
            if len(self._transfers) >= self.max_transfers or count >= self.max_transfers_per_source:
                raise ProtocolError(Reason.BAD_CHUNK, f"too many transfers in flight (from {source}: {count})")
            if chunk.total_bytes > min(self.max_bytes, self.max_bytes_per_source):
                raise ProtocolError(Reason.TOO_LARGE, f"transfer of {chunk.total_bytes} bytes")
            transfer = _Transfer(chunk.count, chunk.total_bytes, chunk.digest, self.clock())
            self._transfers[key] = transfer
            self._account(source, 1, 0)
        elif (chunk.count, chunk.total_bytes, chunk.digest) != (transfer.count, transfer.total_bytes, transfer.digest):
            # This chunk goes, not the transfer: a transfer id is public (retained chunk topics can be read), so a
            # chunk that disagrees would otherwise let anyone who may publish there void a genuine transfer.
            raise ProtocolError(Reason.BAD_CHUNK, "chunk disagrees with its transfer's header")
        if chunk.index in transfer.pieces:
            return None  # a QoS 1 redelivery
        held_by_source = self._per_source.get(source, (0, 0))[1]
        if (transfer.size + len(chunk.data) > transfer.total_bytes or self._held_bytes + len(chunk.data) > self.max_bytes
                or held_by_source + len(chunk.data) > self.max_bytes_per_source):
            self._drop(key)
            raise ProtocolError(Reason.TOO_LARGE, "chunks exceed their declared size or the sender's quota")
        transfer.pieces[chunk.index] = chunk.data
        transfer.size += len(chunk.data)
        self._held_bytes += len(chunk.data)
        self._account(source, 0, len(chunk.data))
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
        self._account(key[0], -1, -transfer.size)

    def _account(self, source: str, transfers: int, size: int) -> None:
        count, held = self._per_source.get(source, (0, 0))
        count, held = count + transfers, held + size
        if count <= 0:
            self._per_source.pop(source, None)
        else:
            self._per_source[source] = (count, held)

    def _expire(self) -> None:
        cutoff = self.clock() - self.timeout_s
        for key in [k for k, t in self._transfers.items() if t.started < cutoff]:
            self._drop(key)
