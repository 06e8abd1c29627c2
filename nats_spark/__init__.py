"""nats-spark: Spark sources and sink for NATS JetStream (formats `nats-pcg` and `nats`)."""

__version__ = "0.1.0"
