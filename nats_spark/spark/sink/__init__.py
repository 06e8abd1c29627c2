"""Writes with format `nats` (batch and streaming): rows published to JetStream with message ids
made of where they come from, so a re-run stores nothing twice."""
