"""The embedded amqtt broker's subscription table, made safe to walk while clients come and go.

amqtt 0.12 keeps ``Broker._subscriptions`` (topic filter -> list of (session, qos)) and walks it with awaits
inside the loop: in ``_handle_client_session`` (replaying retained messages to a client it is admitting) and in
``_run_broadcast`` (delivering one message). A client that subscribes or leaves meanwhile changes the dict, and
the walk fails with "dictionary changed size during iteration": the admitted client's session task dies (the
client has to connect again), or the rest of that delivery is lost; a list changed under a walk skips a subscriber.
Thirty clients connecting at once hit it 78 and 93 times in two runs of five waves; the demo's forked agents, which
come up within a fraction of a second of each other, hit it too (``tests/unit/launcher/test_embedded_broker.py``).

The table below iterates over snapshots, so each walk sees the table as it was when it began; writes go to the
real dict and lists as before. A walk may then deliver to a session that left during it, which amqtt already
handles for sessions that drop mid-delivery.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any


class SnapshotList(list):  # type: ignore[type-arg]
    """A list whose iteration runs over a copy taken when it starts."""

    def __iter__(self) -> Iterator[Any]:
        return iter(list.copy(self))


class SubscriptionTable(dict):  # type: ignore[type-arg]
    """A dict whose keys, values and items are snapshots, and whose list values are ``SnapshotList``s."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__()
        for key, value in dict(*args, **kwargs).items():
            self[key] = value

    def __setitem__(self, key: Any, value: Any) -> None:
        super().__setitem__(key, SnapshotList(value) if type(value) is list else value)

    def __iter__(self) -> Iterator[Any]:
        return iter(list(dict.keys(self)))

    def keys(self) -> list[Any]:  # type: ignore[override]
        return list(dict.keys(self))

    def values(self) -> list[Any]:  # type: ignore[override]
        return list(dict.values(self))

    def items(self) -> list[tuple[Any, Any]]:  # type: ignore[override]
        return list(dict.items(self))


def make_walks_safe(broker: object) -> None:
    """Swap ``broker``'s subscription table for a ``SubscriptionTable`` (before it starts); a TypeError if this
    amqtt has no such table, so that a version that moved it fails loudly instead of racing again."""
    table = getattr(broker, "_subscriptions", None)
    if not isinstance(table, dict):
        raise TypeError(f"{type(broker).__name__} has no _subscriptions dict: the amqtt workaround needs revisiting")
    broker._subscriptions = SubscriptionTable(table)  # type: ignore[attr-defined]
