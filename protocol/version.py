"""Versions that travel on the wire."""

SCHEMA_VERSION = 1
"""Bumped on any incompatible change to a message model; receivers reject other versions."""

SOFTWARE_VERSION = "0.1.0"
