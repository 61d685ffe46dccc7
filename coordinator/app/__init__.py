"""Wiring: the CLI, the service that connects the rooms and performs the I/O, the HTTP probes."""
