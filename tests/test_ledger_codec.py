"""The ack ledger's stored forms, without a server: heads, pointers' format check, chunks, keys."""

import json

import pytest

from nats_spark.errors import ConfigurationError
from nats_spark.spark.ledger import (
    LEDGER_FORMAT,
    EntryHead,
    EntryState,
    decode_chunk,
    encode_chunk,
    key_token,
    name_of,
)

KEY = "lin.3.m1"


def test_head_round_trip_carries_the_format():
    head = EntryHead(EntryState.SEALED, "a1", ["lin.3.m1.a1.0"], 7, 42, "pin1")
    data = head.to_bytes()
    assert json.loads(data)["format"] == LEDGER_FORMAT
    assert EntryHead.from_bytes(data, KEY) == head


def test_head_without_format_is_read_as_format_one():
    # what releases before the format number wrote
    old = b'{"state":"open","attempt":"a1","chunks":[],"count":0,"max_seq":0,"pin":null}'
    assert EntryHead.from_bytes(old, KEY) == EntryHead(EntryState.OPEN, "a1")


def test_newer_head_format_is_refused_with_one_line():
    newer = json.loads(EntryHead().to_bytes())
    newer["format"] = LEDGER_FORMAT + 1
    with pytest.raises(ConfigurationError) as failure:
        EntryHead.from_bytes(json.dumps(newer).encode(), KEY)
    message = str(failure.value)
    assert "\n" not in message
    assert KEY in message and f"format {LEDGER_FORMAT + 1}" in message
    assert "new checkpoint location" in message


@pytest.mark.parametrize("count", [0, 1, 4096])
def test_chunk_round_trip(count):
    replies = [f"$JS.ACK.s.c.1.{n}.{n}.1700000000000000000.0".encode() for n in range(count)]
    assert decode_chunk(encode_chunk(replies)) == (replies if count else [])


@pytest.mark.parametrize("name", ["m1", "a-b_c=", "_hidden", "dots.in.name", "ünï", "x y"])
def test_key_token_round_trip(name):
    token = key_token(name)
    assert "." not in token and " " not in token
    assert name_of(token) == name
