"""A deterministic simulation of the ack-ledger protocol: the real driver and task code against a
simulated JetStream, ledger bucket and Spark, under a seeded scheduler (see world.py)."""
