"""Ack subjects parsed in bulk (`ack_numbers`), pure: the same numbers as one by one
(`parse_reply`), for both subject forms and any mix of them."""

from __future__ import annotations

import random

import pytest
from spark_helpers import parse_reply

from nats_spark.jetstream.subjects import AckNumbers, ack_numbers

pytestmark = pytest.mark.unit


def v1(seq: int, stream: str = "S", consumer: str = "C") -> bytes:
    numbers = f"{seq % 3 + 1}.{seq}.{seq + 5}.{1700 + seq}.{9 - seq % 9}"
    return f"$JS.ACK.{stream}.{consumer}.{numbers}".encode()


def v2(seq: int, tail: str = ".r4nd", domain: str = "hub") -> bytes:
    return (
        f"$JS.ACK.{domain}.ACCHASH.S.C.{seq % 3 + 1}.{seq}.{seq + 5}.{1700 + seq}.7{tail}".encode()
    )


def one_by_one(replies: list[bytes]) -> AckNumbers:
    parsed = [parse_reply(reply) for reply in replies]
    return AckNumbers(
        [d.delivered for d in parsed],
        [d.stream_seq for d in parsed],
        [d.consumer_seq for d in parsed],
        [d.timestamp_ns for d in parsed],
    )


@pytest.mark.parametrize(
    "replies",
    [
        [],
        [v1(1)],
        [v1(seq) for seq in range(1, 500)],
        [v2(seq) for seq in range(1, 50)],  # 12 tokens, as servers send them now
        [v2(seq, tail="") for seq in range(1, 50)],  # 11 tokens
        [v1(1), v2(2), v1(3), v2(4, tail="")],  # a mix: one by one
        [v1(1), v1(2, consumer="D")],  # another consumer's prefix
        [v1(1), b"$JS.ACK.S.C.x.y.1.2.3.4.5"],  # the same prefix, then a v2 subject
        [v2(1), v2(2, domain="other")],
    ],
)
def test_bulk_numbers_are_the_one_by_one_numbers(replies: list[bytes]) -> None:
    assert ack_numbers(replies) == one_by_one(replies)


def test_random_mixes() -> None:
    rng = random.Random(26)
    for _ in range(200):
        forms = [v1, v2, lambda s: v2(s, tail=""), lambda s: v1(s, stream="T")]
        weights = [rng.random() for _ in forms]
        replies = [rng.choices(forms, weights)[0](seq) for seq in range(rng.randint(1, 30))]
        assert ack_numbers(replies) == one_by_one(replies)


@pytest.mark.parametrize(
    "bad", [b"_INBOX.abc.1", b"$JS.ACK.S.C.1.2.3", b"$JS.ACK.S.C.one.2.3.4.5", b""]
)
def test_a_subject_that_is_no_ack_subject_is_refused(bad: bytes) -> None:
    with pytest.raises(ValueError):
        ack_numbers([v1(1), bad])
    with pytest.raises(ValueError):
        ack_numbers([bad, v1(1)])
