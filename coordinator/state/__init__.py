"""What a run keeps: round records, checkpoints, retained-topic bookkeeping, the rounds log, version digests."""
