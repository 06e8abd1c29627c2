"""JetStream pieces nats-py lacks: raw API requests, status messages and pulls (priority groups)."""

from nats_spark.jetstream.api import JetStreamApi, StoredMessage
from nats_spark.jetstream.pull import FetchResult, PullConsumer, PullRequest, PullStatus

__all__ = [
    "FetchResult",
    "JetStreamApi",
    "PullConsumer",
    "PullRequest",
    "PullStatus",
    "StoredMessage",
]
