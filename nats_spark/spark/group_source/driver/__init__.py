"""What the `nats-pcg` source runs on the driver: which consumers a target names, the offsets,
the planner, the batch coordinator, the ack ledger as the driver keeps it and settles it."""
