"""The wire contract between the coordinator and edge agents.

Message models, the msgpack codec with numpy arrays as an extension type, topic names,
chunking for brokers that cap message size, and the shared MQTT session helpers.
Imports neither torch nor either side of the federation.
"""

from protocol.errors import ProtocolError, Reason
from protocol.version import SCHEMA_VERSION, SOFTWARE_VERSION

__all__ = ["SCHEMA_VERSION", "SOFTWARE_VERSION", "ProtocolError", "Reason"]
