"""Reads of a whole stream with format `nats` (batch and streaming): ranges of stream sequences,
planned on the driver, read by executors without consumers or acks, with filter pushdown."""
