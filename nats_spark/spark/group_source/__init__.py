"""The `nats-pcg` source: partitioned consumer groups and priority-group consumers, acked after
commit. Driver: offsets, targets, planner, offset reader, ledger; executors: slot reads."""
