"""The coordinator service: round engine, strategies, aggregation, checkpoints, metrics.

Imports no torch: its image stays small and it starts fast.
"""
