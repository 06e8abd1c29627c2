"""The ack ledger's stored forms, without a server: heads, pointers' format check, chunks, keys,
the ack subjects rebuilt from an entry, the size of a planned input partition, and what the
driver's view of the entries names for a task to ack and dedupe."""

import json
import pickle

import pytest
from spark_helpers import format_one_chunk, parse_reply

from nats_spark.connection import ConnectionSettings
from nats_spark.errors import ConfigurationError
from nats_spark.jetstream.acks import ACK, IN_PROGRESS, ack_commands, ack_prefix
from nats_spark.spark.group_source.driver.driver_ledger import DriverEntry, DriverLedger
from nats_spark.spark.group_source.ledger import (
    ARROW_FROM,
    LEDGER_FORMAT,
    EntryDeliveries,
    EntryHead,
    EntryState,
    chunk_deliveries,
    decode_chunk,
    encode_chunk,
    key_token,
    name_of,
)
from nats_spark.spark.group_source.slot_partition import UNBOUNDED, SlotPartition, SlotReading

pytestmark = pytest.mark.unit

KEY = "lin.3.m1"
V1 = b"$JS.ACK.S.c1"
V2 = b"$JS.ACK.hub.ACCHASH.S.c1"


def test_head_round_trip_carries_the_format():
    head = EntryHead(EntryState.SEALED, "a1", ["lin.3.m1.a1.0"], 7, 42, "pin1", "$JS.ACK.S.c")
    data = head.to_bytes()
    assert json.loads(data)["format"] == LEDGER_FORMAT == 3
    assert EntryHead.from_bytes(data, KEY) == head


def test_head_without_format_is_read_as_format_one():
    # what releases before the format number wrote
    old = b'{"state":"open","attempt":"a1","chunks":[],"count":0,"max_seq":0,"pin":null}'
    assert EntryHead.from_bytes(old, KEY) == EntryHead(EntryState.OPEN, "a1", format=1)


def test_newer_head_format_is_refused_with_one_line():
    newer = json.loads(EntryHead().to_bytes())
    newer["format"] = LEDGER_FORMAT + 1
    with pytest.raises(ConfigurationError) as failure:
        EntryHead.from_bytes(json.dumps(newer).encode(), KEY)
    message = str(failure.value)
    assert "\n" not in message
    assert KEY in message and f"format {LEDGER_FORMAT + 1}" in message
    assert "new checkpoint location" in message


def replies(prefix: bytes, seqs: list[int], delivered: int = 1) -> list[bytes]:
    return [b"%b.%d.%d.%d.1700000000000000000.5" % (prefix, delivered, s, s - 9) for s in seqs]


@pytest.mark.parametrize(
    "seqs",
    [[], [10], list(range(10, 4106)), [10, 18, 19, 400, 401, 7, 9_000_000_000]],
    ids=["empty", "one", "in-order", "gaps-and-back"],
)
def test_deliveries_round_trip(seqs):
    taken = EntryDeliveries.from_replies(replies(V1, seqs, delivered=3))
    found = decode_chunk(encode_chunk(taken), V1)
    assert found == (taken if seqs else EntryDeliveries(V1))


def test_in_order_deliveries_take_under_a_byte_each():
    # the bound is 4 B per message in the bucket, heads and KV overhead included
    taken = EntryDeliveries.from_replies(replies(V1, list(range(1, 4097))))
    assert len(encode_chunk(taken)) < 4096 // 20


def test_format_one_chunk_is_read_as_deliveries():
    old = replies(V1, [5, 6, 9])
    head = EntryHead(EntryState.SEALED, "a1", ["c"], 3, 9, format=1)
    found = chunk_deliveries(format_one_chunk(old), head)
    assert found.stream_seq == [5, 6, 9] and found.consumer_seq == [-4, -3, 0]
    assert found.prefix == V1


@pytest.mark.parametrize("prefix", [V1, V2], ids=["v1", "v2"])
def test_rebuilt_ack_subjects_name_the_same_delivery(prefix):
    sent = replies(prefix, [5, 6, 9], delivered=2)
    assert ack_prefix(sent[0]) == prefix
    commands = b"".join(EntryDeliveries.from_replies(sent).ack_commands()).split(b"\r\n")
    assert commands[1::2] == [b"+ACK"] * 3
    rebuilt = [command.split(b" ")[1] for command in commands[0::2] if command]
    assert len(rebuilt[0].split(b".")) == len(sent[0].split(b"."))  # 9 or 11 tokens
    for original, again in zip(sent, rebuilt, strict=True):
        a, b = parse_reply(original), parse_reply(again)
        assert (a.stream, a.consumer, a.delivered, a.stream_seq, a.consumer_seq) == (
            b.stream,
            b.consumer,
            b.delivered,
            b.stream_seq,
            b.consumer_seq,
        )


@pytest.mark.parametrize("count", [0, 1, 4096])
def test_chunk_round_trip(count):
    taken = EntryDeliveries.from_replies(replies(V2, list(range(1, count + 1))))
    head = EntryHead(prefix=V2.decode())
    assert chunk_deliveries(encode_chunk(taken), head) == (taken if count else EntryDeliveries(V2))


@pytest.mark.parametrize("name", ["m1", "a-b_c=", "_hidden", "dots.in.name", "ünï", "x y"])
def test_key_token_round_trip(name):
    token = key_token(name)
    assert "." not in token and " " not in token
    assert name_of(token) == name


def planned(gen: int, window_gens: int) -> SlotPartition:
    """An input partition of batch `gen` whose dedupe window spans `window_gens` batches of 8
    slots (what the driver hands a task: no sequence of any message)."""
    spans = tuple((f"m{i}", gen - window_gens, gen - 1) for i in range(8))
    return SlotPartition(
        reading=SlotReading(ConnectionSettings(), "nats-spark-ledger", 500, 1.0, False, True),
        pointer_key="query.S.g",
        lineage="0" * 32,
        gen=gen,
        slot="m1",
        stream="S",
        consumer="c1",
        priority_group="PCG",
        member="m1",
        partitioned=True,
        limit=1_000_000,
        pin_id=None,
        committed=(gen - 1,),
        dedupe=spans,
    )


def test_planned_partition_size_does_not_grow_with_messages_or_window():
    # no message's sequence travels in it: a window of 5,000 batches (of any size) is described
    # as wide as one of 2
    narrow = len(pickle.dumps(planned(gen=12_000_000, window_gens=2)))
    wide = len(pickle.dumps(planned(gen=12_000_000, window_gens=5_000)))
    assert narrow == wide < 1500


def driver_view(*entries: tuple[int, str, EntryState | None, int, int]) -> DriverLedger:
    """A driver's ledger holding (gen, slot, state or None for a head not read, count, max_seq)."""
    ledger = DriverLedger("S", "query.S.g")
    for gen, slot, state, count, max_seq in entries:
        head = None if state is None else EntryHead(state, count=count, max_seq=max_seq)
        ledger.entries[(gen, slot)] = DriverEntry(gen, slot, head)
    return ledger


def test_acks_due_are_the_committed_entries_not_acked_with_messages():
    ledger = driver_view(
        (1, "a", EntryState.ACKED, 5, 5),
        (2, "a", EntryState.SEALED, 5, 10),
        (2, "b", EntryState.SEALED, 0, 0),  # took nothing: nothing to ack
        (3, "a", None, 0, 0),  # not read yet: its task finds out
        (4, "a", EntryState.SEALED, 5, 20),  # not committed yet
    )
    assert ledger.acks_due(through=3) == {"a": (2, 3)}


def test_dedupe_spans_and_their_highest_sequence():
    ledger = driver_view(
        (1, "a", EntryState.ACKED, 5, 5),
        (3, "a", EntryState.SEALED, 5, 15),
        (2, "b", EntryState.SEALED, 5, 12),
        (4, "b", EntryState.OPEN, 5, 30),  # the batch being planned: not before it
    )
    spans = ledger.dedupe_spans(before=4, slots=["a", "b", "a"])
    assert spans == (("a", 1, 3), ("b", 2, 2))
    assert ledger.highest_seq(spans) == 15
    ledger.entries[(2, "b")].head = None
    assert ledger.highest_seq(spans) == UNBOUNDED  # an unread head could hold any


@pytest.mark.parametrize("kind", [ACK, IN_PROGRESS])
def test_rebuilt_commands_match_the_commands_of_the_subjects_in_blocks(kind):
    recorded = EntryDeliveries(V2, [5, 6, 9, 10, 2**40], [1, 2, 3, 4, 5], [1, 1, 2, 1, 7])
    commands = recorded.ack_commands(kind, block=2)
    assert commands == ack_commands(subjects_of(recorded), kind, block=2)
    assert len(commands) == 3
    assert EntryDeliveries(V1).ack_commands(kind) == []


@pytest.mark.parametrize("count", [ARROW_FROM - 1, ARROW_FROM, 3 * ARROW_FROM + 7])
def test_commands_formatted_in_python_or_by_arrow_are_the_same(count):
    """Below `ARROW_FROM` deliveries the commands are formatted in Python, from it by Arrow."""
    recorded = EntryDeliveries(
        V1,
        [2**40 + 3 * i for i in range(count)],
        list(range(1, count + 1)),
        [1 + i % 3 for i in range(count)],
    )
    commands = recorded.ack_commands(IN_PROGRESS, block=100)
    assert commands == ack_commands(subjects_of(recorded), IN_PROGRESS, block=100)
    assert len(commands) == -(-count // 100)


def subjects_of(recorded: EntryDeliveries) -> list[bytes]:
    return [
        b"%b.%d.%d.%d.0.0" % (recorded.prefix, *numbers)
        for numbers in zip(
            recorded.delivered, recorded.stream_seq, recorded.consumer_seq, strict=True
        )
    ]
