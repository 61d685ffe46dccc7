"""Splitting large payloads for brokers that cap message size, and putting them back.

A payload over ``max_message_bytes`` travels as several :class:`Chunk` messages on the same
topic. The receiver's :class:`Reassembler` holds a bounded number of partial transfers,
expires stale ones, and verifies the digest of the whole before handing it on.
"""

from __future__ import annotations

import hashlib
import math
import secrets
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from protocol.digest import digest_bytes
from protocol.errors import ProtocolError, Reason
from protocol.limits import DecodeLimits
from protocol.messages import Chunk, Message, Signed
from protocol.security.signing import SigningKey
from protocol.security.trust import OPEN, Received, Trust, accept, decode_trusted
from protocol.wire import decode_message, encode_message

M = TypeVar("M", bound=Message)

CHUNK_OVERHEAD_BYTES = 320
"""Upper bound on a Chunk's envelope around its data (ids, digest, counters, key id and signature)."""
CHUNK_DOMAIN = b"edgefl-chunk-v1\x00"


def split_payload(payload: bytes, max_message_bytes: int | None, signer: SigningKey | None = None,
                  channel: str = "") -> list[bytes]:
    """``[payload]`` when it fits (or ``max_message_bytes`` is None or 0: no cap), else the
    encoded chunks that carry it, each signed by ``signer`` (if given) for ``channel``: the topic
    the payload would have whole (``chunk_statement``)."""
    if not max_message_bytes or len(payload) <= max_message_bytes:
        return [payload]
    piece = max_message_bytes - CHUNK_OVERHEAD_BYTES
    if piece <= 0:
        raise ValueError(f"max_message_bytes {max_message_bytes} leaves no room for chunk data")
    count = math.ceil(len(payload) / piece)
    transfer_id = secrets.token_hex(8)
    digest = digest_bytes(payload)
    view = memoryview(payload)
    out = []
    for i in range(count):
        chunk = Chunk(transfer_id=transfer_id, index=i, count=count, total_bytes=len(payload), digest=digest,
                      data=bytes(view[i * piece:(i + 1) * piece]))
        if signer is not None:
            chunk = chunk.model_copy(update={"key_id": signer.public_key.key_id,
                                             "signature": signer.sign(chunk_statement(channel, chunk))})
        out.append(encode_message(chunk))
    return out


def chunk_statement(channel: str, chunk: Chunk) -> bytes:
    """What a chunk's signature covers: its channel (the topic its whole message would have, which names the agent
    or family and the round, so a chunk replayed onto another transfer's topic does not verify), its header, its
    index and the SHA-256 of its data."""
    return (CHUNK_DOMAIN + channel.encode() + b"\x00" + chunk.transfer_id.encode()
            + struct.pack("<IIQ", chunk.index, chunk.count, chunk.total_bytes) + chunk.digest.encode()
            + hashlib.sha256(chunk.data).digest())


def verify_chunk(chunk: Chunk, channel: str, trust: Trust, owner: str | None = None) -> str | None:
    """The signer of ``chunk`` on ``channel`` as ``trust`` allows (None: not verified: no keys, or unsigned where
    signatures are not required); raises ProtocolError for an unsigned chunk where they are, one signed with a key
    not trusted, a signature that does not verify, or a signer other than ``owner`` (the topic's agent)."""
    if trust.lookup is None:
        return None
    if chunk.signature is None or chunk.key_id is None:
        if trust.required:
            raise ProtocolError(Reason.UNSIGNED, "an unsigned chunk")
        return None
    found = trust.lookup(chunk.key_id)
    if found is None:
        raise ProtocolError(Reason.UNKNOWN_SIGNER, f"a chunk signed with key {chunk.key_id}, which is not trusted here")
    signer, key = found
    key.verify(chunk_statement(channel, chunk), chunk.signature)
    if owner is not None and signer != owner:
        raise ProtocolError(Reason.BAD_SIGNATURE, f"a chunk on {owner}'s topic signed by {signer}'s key")
    return signer


@dataclass
class _Transfer:
    count: int
    total_bytes: int
    digest: str
    started: float
    rank: int
    """The round its message is of (on its topic): the lowest-ranked transfer is evicted first."""
    touched: int
    """When its last chunk came, in chunks received (the least recently touched transfer is evicted first)."""
    last: float
    """When its last chunk came, by the clock (an idle transfer expires)."""
    pieces: dict[int, bytes] = field(default_factory=dict)
    size: int = 0


def receive(payload: bytes, source: str, expect: type[M], reassembler: Reassembler,
            limits: DecodeLimits, trust: Trust = OPEN, channel: str = "", rank: int = 0) -> Received[M] | None:
    """A message of kind ``expect`` that may come whole or in chunks, signed or not (as ``trust``
    allows; a chunk signed by ``source``'s key for ``channel``), or None while chunks of it are still
    missing. Raises only ProtocolError."""
    message = decode_message(payload, (expect, Signed, Chunk), limits)
    if isinstance(message, Chunk):
        verify_chunk(message, channel, trust, source)
        if message.total_bytes > limits.max_payload_bytes:  # what it joins into would be refused: hold none of it
            raise ProtocolError(Reason.TOO_LARGE, f"a chunked transfer of {message.total_bytes} bytes, over the "
                                                  f"{limits.max_payload_bytes} a message may have")
        whole = reassembler.add(source, message, rank)
        if whole is None:
            return None
        return decode_trusted(whole, expect, limits, trust)
    return accept(message, len(payload), expect, limits, trust)


class Reassembler:
    """Collects chunks per (source, transfer id and header); bounded in transfers, bytes, age and idleness.

    A chunk's header (count, size, digest) is part of its transfer's key: a transfer id is public (retained chunk
    topics can be read), so a forged chunk reusing one with another header starts a transfer of its own, which never
    completes, rather than decide the genuine one's header when it happens to arrive first.

    When a bound is reached the transfer of the oldest round (``rank``), then the least recently touched, makes room
    (a source's own, for its own bounds): transfers left incomplete, on purpose or not, cannot keep out the ones
    still arriving, and a sender's old transfers replayed (signed, but stale) cannot push out its newest. Served
    fairly (the coordinator's inbox takes senders in turn), a transfer in progress is touched at least once
    per turn, so it is never the least recently touched while others arrive."""

    def __init__(self, max_transfers: int = 64, max_bytes: int = 512 * 1024 * 1024,
                 timeout_s: float = 300.0, clock: Callable[[], float] = time.monotonic, *,
                 max_transfers_per_source: int = 2, max_bytes_per_source: int | None = None,
                 idle_timeout_s: float = 60.0) -> None:
        self.max_transfers = max_transfers
        self.max_bytes = max_bytes
        self.max_transfers_per_source = max_transfers_per_source
        self.max_bytes_per_source = max_bytes if max_bytes_per_source is None else max_bytes_per_source
        """Quotas per sender, so that made-up senders cannot take the slots and bytes honest ones need."""
        self._per_source: dict[str, tuple[int, int]] = {}
        self.timeout_s = timeout_s
        self.idle_timeout_s = idle_timeout_s
        self.clock = clock
        self._transfers: dict[tuple[str, str, int, int, str], _Transfer] = {}
        self._held_bytes = 0
        self._received = 0

    def add(self, source: str, chunk: Chunk, rank: int = 0) -> bytes | None:
        """Store one chunk; return the whole payload once complete and verified.

        ``source`` is who sent it (the topic's agent id), so one sender cannot complete or
        poison another's transfer.
        """
        self._expire()
        self._received += 1
        key = (source, chunk.transfer_id, chunk.count, chunk.total_bytes, chunk.digest)
        transfer = self._transfers.get(key)
        if transfer is None:
            if chunk.total_bytes > min(self.max_bytes, self.max_bytes_per_source):
                raise ProtocolError(Reason.TOO_LARGE, f"transfer of {chunk.total_bytes} bytes")
            if self._per_source.get(source, (0, 0))[0] >= self.max_transfers_per_source:
                self._evict(key, same_source=True)
            if len(self._transfers) >= self.max_transfers:
                self._evict(key)
            now = self.clock()
            transfer = _Transfer(chunk.count, chunk.total_bytes, chunk.digest, now, rank, self._received, now)
            self._transfers[key] = transfer
            self._account(source, 1, 0)
        if chunk.index in transfer.pieces:
            return None  # a QoS 1 redelivery
        size = len(chunk.data)
        if transfer.size + size > transfer.total_bytes:  # this chunk goes, not the transfer (its header is public)
            raise ProtocolError(Reason.TOO_LARGE, "a chunk past its transfer's declared size")
        while self._per_source.get(source, (0, 0))[1] + size > self.max_bytes_per_source and self._evict(key, True):
            pass
        while self._held_bytes + size > self.max_bytes and self._evict(key):
            pass
        if self._per_source.get(source, (0, 0))[1] + size > self.max_bytes_per_source or \
                self._held_bytes + size > self.max_bytes:
            self._drop(key)
            raise ProtocolError(Reason.TOO_LARGE, "chunks exceed the sender's quota or what may be held")
        transfer.touched, transfer.last = self._received, self.clock()
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

    def in_flight_of(self, source: str) -> int:
        return self._per_source.get(source, (0, 0))[0]

    def _drop(self, key: tuple[str, str, int, int, str]) -> None:
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

    def _evict(self, keep: tuple[str, str, int, int, str], same_source: bool = False) -> bool:
        """Drop the oldest round's least recently touched transfer other than ``keep`` (of ``keep``'s source only, if
        ``same_source``); False when there is none."""
        others = [(t.rank, t.touched, k) for k, t in self._transfers.items()
                  if k != keep and (not same_source or k[0] == keep[0])]
        if not others:
            return False
        self._drop(min(others)[2])
        return True

    def _expire(self) -> None:
        now = self.clock()
        for key in [k for k, t in self._transfers.items()
                    if t.started < now - self.timeout_s or t.last < now - self.idle_timeout_s]:
            self._drop(key)
