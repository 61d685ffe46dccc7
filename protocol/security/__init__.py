"""Signed envelopes and whom to trust: Ed25519 signing, enrolled-key lookup on receipt."""
