"""The in-memory ledger bucket keeps the contract of the real one (tests/bucket_contract.py): each
case runs against both (the memory one in the fast lane, a JetStream KV bucket on the test server
in the slow one). The real bucket's requests (`KvRequests`) answer as nats-py's `KeyValue` does,
markers an operator's `nats kv del` or `purge` left and the server's refusals included."""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any

import pytest
from bucket_contract import CASES, Case, run_contract
from memory_bucket import MemoryBucket
from nats.js.errors import (
    APIError,
    BadRequestError,
    InvalidKeyError,
    KeyWrongLastSequenceError,
)
from nats.js.kv import KeyValue

from nats_spark.client import NatsClient
from nats_spark.errors import ConfigurationError
from nats_spark.jetstream.kv_requests import kv_write_prefix
from nats_spark.loop import Blocking, run_sync
from nats_spark.spark.group_source.ledger import Ledger


@pytest.mark.unit
@pytest.mark.parametrize("case", CASES, ids=lambda case: case.__name__)
def test_memory_bucket(case: Case) -> None:
    run_sync(case(MemoryBucket()))


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.__name__)
def test_kv_bucket(case: Case, client: Blocking[NatsClient], unique: str) -> None:
    run_contract(client.target, f"L{unique}", [case])


def outcome(call: Awaitable[object]) -> Any:
    """What a KV call returned (an entry as its value and revision), or the error it raised."""
    try:
        found = run_sync(call)
    except APIError as error:
        return type(error), str(error), getattr(error, "op", None)
    return (found.value, found.revision) if isinstance(found, KeyValue.Entry) else found


def test_reads_and_refusals_are_nats_pys(client: Blocking[NatsClient], unique: str) -> None:
    """Each read and each refused write answers as nats-py's `KeyValue` does on the same keys: a
    value, a missing key, markers left by a delete and a purge, a wrong last revision."""
    name = f"L{unique}"
    kv = run_sync(Ledger.bucket(client.target, name, create=True))
    theirs = run_sync(client.target.js.key_value(name))
    try:
        written = run_sync(kv.put("a.1", b"x"))
        run_sync(kv.put("a.2", b""))
        for key in ("a.3", "a.4"):
            run_sync(kv.create(key, b"gone"))
        run_sync(theirs.delete("a.3"))  # as `nats kv del` leaves it
        run_sync(theirs.purge("a.4"))
        for key in ("a.1", "a.2", "a.3", "a.4", "never"):
            assert outcome(kv.get(key)) == outcome(theirs.get(key)), key
        assert outcome(kv.get("a.3"))[2] == "DEL"
        for key, last in (("a.1", written + 1), ("a.1", 0), ("never", 7)):
            ours = outcome(kv.update(key, b"y", last))
            assert ours == outcome(theirs.update(key, b"y", last=last)), (key, last)
            assert ours[0] is KeyWrongLastSequenceError
        assert outcome(kv.create("a.1", b"y")) == outcome(theirs.create("a.1", b"y"))
    finally:
        run_sync(client.target.js.delete_key_value(name))


def test_a_key_with_a_marker_is_created_again(client: Blocking[NatsClient], unique: str) -> None:
    """A key an operator deleted or purged has a marker as its last message: `create` writes on
    the marker's revision, as nats-py's does; `update` on 0 is refused."""
    name = f"L{unique}"
    kv = run_sync(Ledger.bucket(client.target, name, create=True))
    theirs = run_sync(client.target.js.key_value(name))
    try:
        for key, remove in (("a.1", theirs.delete), ("a.2", theirs.purge)):
            run_sync(kv.create(key, b"x"))
            run_sync(remove(key))
            with pytest.raises(KeyWrongLastSequenceError):
                run_sync(kv.update(key, b"y", 0))
            revision = run_sync(kv.create(key, b"again"))
            entry = run_sync(kv.get(key))
            assert (entry.value, entry.revision) == (b"again", revision)
            with pytest.raises(KeyWrongLastSequenceError):
                run_sync(kv.create(key, b"twice"))
    finally:
        run_sync(client.target.js.delete_key_value(name))


def test_other_refusals_are_nats_pys(client: Blocking[NatsClient], unique: str) -> None:
    """A write the stream refuses for another reason raises nats-py's error for it, a write to
    a deleted bucket names the fix, a key that is no KV key is refused before it is sent."""
    name = f"L{unique}"
    run_sync(client.target.js.create_key_value(bucket=name, history=1, max_value_size=8))
    kv = run_sync(Ledger.bucket(client.target, name, create=False))
    theirs = run_sync(client.target.js.key_value(name))
    for write in (kv.put("a.1", b"x" * 9), kv.create("a.1", b"x" * 9)):
        ours = outcome(write)
        assert ours == outcome(theirs.put("a.1", b"x" * 9))
        assert ours[0] is BadRequestError
    for key in ("", ".a", "a.", "a b", "a.*", "a.>"):
        with pytest.raises(InvalidKeyError):
            run_sync(kv.get(key))
        with pytest.raises(InvalidKeyError):
            run_sync(kv.put(key, b"x"))
    run_sync(client.target.js.delete_key_value(name))
    for gone in (lambda: kv.put("a.1", b"x"), lambda: kv.update("a.1", b"x", 0)):
        with pytest.raises(ConfigurationError, match="does not exist"):
            run_sync(gone())


@pytest.mark.unit
def test_kv_writes_go_below_the_api_prefix_behind_a_domain_or_an_import() -> None:
    assert kv_write_prefix("$JS.API") == ""
    for prefix in ("$JS.hub.API", "JS.A.API"):
        assert kv_write_prefix(prefix) == f"{prefix}."
