"""Data sets an agent trains on, and the seeded partitioners used to simulate a fleet."""
