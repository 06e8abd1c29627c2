"""The `nats-pcg` command line, end to end against the test server (in-process via `main`)."""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from certs import make_pki
from spark_helpers import (
    api,
    assert_exactly_once,
    consumer_info,
    key_for,
    kv,
    make_stream,
    payloads,
    publish,
    publish_one,
    run_query,
    source,
    static_group,
    static_stream,
    wait_until,
)

from nats_spark.cli import build_parser, main, settings_from_args
from nats_spark.loop import run_sync
from nats_spark.pcg import admin
from nats_spark.pcg.consumers import (
    PRIORITY_GROUP,
    ensure_group_consumer,
    member_consumer,
    partition_consumer,
    read_stream,
)
from nats_spark.pcg.partitioning import partition_for
from nats_spark.pcg.store import GroupKind, load_group


@pytest.fixture
def cli(nats_url, capsys):
    """Run `nats-pcg --server <test server> ...`; returns (exit code, stdout, stderr)."""

    def run(*args: str) -> tuple[int, str, str]:
        code = main(["--server", nats_url, *args])
        out, err = capsys.readouterr()
        return code, out, err

    return run


def ok(result: tuple[int, str, str]) -> str:
    code, out, err = result
    assert (code, err) == (0, ""), out
    return out


def one_line_error(result: tuple[int, str, str], pattern: str) -> str:
    code, out, err = result
    assert code == 1 and out == ""
    assert err.startswith("nats-pcg: error: ") and err.count("\n") == 1, err
    assert re.search(pattern, err), err
    return err


def pin_member(client, stream: str, consumer: str) -> None:
    """Pull once as the member's instance, so that the server pins it."""
    puller = client.pull_consumer(stream, consumer, group=PRIORITY_GROUP)
    assert run_sync(puller.fetch(1, expires=1)).messages
    assert puller.pin_id
    run_sync(puller.close())


def test_static_commands(cli, client, unique):
    stream = static_stream(client, unique, 4)
    out = ok(cli("static", "create", "balanced", stream, "g", "4", "m1", "m2", "--filter", ">"))
    assert out == f"created static consumer group g on stream {stream}\n"
    ok(cli("static", "create", "mapped", stream, "h", "2", "a:1", "b:0"))
    assert kv(client, GroupKind.STATIC).get(f"{stream}.h").value == (
        b'{"max_members":2,"member_mappings":[{"member":"a","partitions":[1]},'
        b'{"member":"b","partitions":[0]}]}'
    )

    assert ok(cli("static", "ls", stream)) == "g\nh\n"
    assert json.loads(ok(cli("static", "list", stream, "--json"))) == {
        "kind": "static",
        "stream": stream,
        "groups": ["g", "h"],
    }
    info = json.loads(ok(cli("static", "info", stream, "g", "--json")))
    assert info["config"] == {"max_members": 4, "filters": [">"], "members": ["m1", "m2"]}
    assert info["members"] == [
        {"member": "m1", "partitions": [0, 1], "active": False},
        {"member": "m2", "partitions": [2, 3], "active": False},
    ]
    text = ok(cli("static", "info", stream, "h"))
    assert f"Static consumer group h on stream {stream}" in text
    assert re.search(r"^partitions: +2$", text, re.M)
    assert re.search(r"^membership: +mapped$", text, re.M)
    assert "MEMBER  PARTITIONS  ACTIVE\na       1           no\nb       0           no\n" in text

    assert ok(cli("static", "active", stream, "g")) == "no active members in g\n"
    one_line_error(cli("static", "step-down", stream, "g", "m1"), "has no consumer 'g-m1'")

    entry = run_sync(admin.static_info(client.target, stream, "g"))
    run_sync(ensure_group_consumer(client.target, member_consumer(entry, "m1")))
    publish_one(client, f"{unique}.{key_for(1, 4)}", b"x")
    pin_member(client, stream, "g-m1")
    assert ok(cli("static", "active", stream, "g")) == "m1\n"
    text = ok(cli("static", "member-info", stream, "g", "m1"))
    assert re.search(r"^pinned: +yes$", text, re.M)
    assert re.search(rf"^consumer: +{stream} > g-m1$", text, re.M)
    assert re.search(r"^ack pending: +1$", text, re.M)
    assert "stepped down" in ok(cli("static", "sd", stream, "g", "m1"))
    member = json.loads(ok(cli("static", "minfo", stream, "g", "m1", "--json")))
    assert member.pop("last_active")  # the time of the delivery above
    assert member == {
        "member": "m1",
        "in_membership": True,
        "active": True,  # no instance pulls, but the message it took is ack-pending
        "state": "holding",
        "pinned": False,
        "partitions": [0, 1],
        "stream": stream,
        "consumer": "g-m1",
        "num_pending": 0,
        "num_ack_pending": 1,
        "num_waiting": 0,
    }
    text = ok(cli("static", "member-info", stream, "g", "m2"))
    assert "warning: member m2 is in the membership but has no running instance" in text

    out = ok(cli("static", "delete", stream, "g"))
    assert out == f"deleted static consumer group g on stream {stream}; deleted consumers: g-m1\n"
    assert api(client).consumer_names(stream) == []
    one_line_error(cli("static", "info", stream, "g"), "consumer group 'g' on stream .* not found")
    ok(cli("static", "rm", stream, "h"))
    assert ok(cli("static", "ls", stream)) == f"no static consumer groups on stream {stream}\n"


def test_elastic_commands(cli, client, unique):
    stream = make_stream(client, f"S{unique}", [f"{unique}.>"])
    create = ["elastic", "create", stream, "g", "4", "--max-buffered-msgs", "100"]
    out = ok(cli(*create, "--filter", f"{unique}.*.*", "--partition-wildcards", "2"))
    assert out.endswith(f"(work-queue stream {stream}-g)\n")
    assert kv(client, GroupKind.ELASTIC).get(f"{stream}.g").value == (
        b'{"max_members":4,"partitioning_filters":[{"filter":"' + unique.encode() + b'.*.*",'
        b'"partitioning_wildcards":[2]}],"max_buffered_msg":100}'
    )
    assert api(client).stream_info(f"{stream}-g")["config"]["max_msgs"] == 100

    assert ok(cli("elastic", "add", stream, "g", "m2", "m1")) == "members of g: m2, m1\n"
    assert ok(cli("elastic", "add", stream, "g", "m3")) == "members of g: m2, m1, m3\n"
    assert ok(cli("elastic", "drop", stream, "g", "m3")) == "members of g: m2, m1\n"
    info = json.loads(ok(cli("elastic", "info", stream, "g", "--json")))
    assert info["work_queue_stream"] == f"{stream}-g"
    assert info["members"] == [
        {"member": "m2", "partitions": [2, 3], "active": False},
        {"member": "m1", "partitions": [0, 1], "active": False},
    ]
    text = ok(cli("elastic", "info", stream, "g"))
    assert re.search(rf"^filter: +{unique}\.\*\.\* \(partition by wildcards 2\)$", text, re.M)
    assert re.search(r"^max buffered msgs: +100$", text, re.M)
    assert re.search(r"^max buffered bytes: +unlimited$", text, re.M)

    out = ok(cli("elastic", "create-mapping", stream, "g", "a:0,1,2", "b:3"))
    assert out.endswith("MEMBER  PARTITIONS\na       0,1,2\nb       3\n")
    config = json.loads(ok(cli("elastic", "info", stream, "g", "--json")))["config"]
    assert "members" not in config
    assert config["member_mappings"] == [
        {"member": "a", "partitions": [0, 1, 2]},
        {"member": "b", "partitions": [3]},
    ]
    one_line_error(cli("elastic", "add", stream, "g", "c"), "uses member_mappings")
    one_line_error(cli("elastic", "cm", stream, "g", "a:0"), "partitions are not mapped")
    ok(cli("elastic", "delete-mapping", stream, "g"))
    assert json.loads(ok(cli("elastic", "ls", stream, "--json")))["groups"] == ["g"]
    assert json.loads(ok(cli("elastic", "info", stream, "g", "--json")))["members"] == []

    ok(cli("elastic", "add", stream, "g", "m1"))
    entry = run_sync(admin.elastic_info(client.target, stream, "g"))
    template = {"ack_wait": 30_000_000_000}  # outlives the test's inactive threshold
    run_sync(ensure_group_consumer(client.target, member_consumer(entry, "m1", template)))
    publish_one(client, f"{unique}.a.b", b"x")
    pin_member(client, f"{stream}-g", "m1")
    assert ok(cli("elastic", "active", stream, "g")) == "m1\n"
    member = json.loads(ok(cli("elastic", "member-info", stream, "g", "m1", "--json")))
    assert (member["active"], member["pinned"], member["partitions"]) == (True, True, [0, 1, 2, 3])
    ok(cli("elastic", "step-down", stream, "g", "m1"))
    assert json.loads(ok(cli("elastic", "minfo", stream, "g", "m1", "--json")))["pinned"] is False

    assert ok(cli("elastic", "delete", stream, "g")).endswith(f"deleted stream {stream}-g\n")
    assert f"{stream}-g" not in api(client).stream_names()
    one_line_error(cli("elastic", "delete", stream, "g"), "not found")


def test_elastic_create_partitioning_rules(cli, client, unique):
    stream = make_stream(client, f"S{unique}", [f"{unique}.>"])
    filters = ["--filter", f"{unique}.*", "--filter", f"{unique}.x.>"]
    one_line_error(
        cli("elastic", "create", stream, "g", "2", *filters, "--partition-wildcards", "1"),
        "2 --filter but 1 --partition-wildcards given",
    )
    one_line_error(
        cli("elastic", "create", stream, "g", "2", "--partition-wildcards", "1"),
        "--partition-wildcards given without --filter",
    )
    one_line_error(
        cli(
            "elastic",
            "create",
            stream,
            "g",
            "2",
            "--filter",
            f"{unique}.*",
            "--partition-wildcards=2",
        ),
        "wildcard index 2 does not fit",
    )
    bucket = kv(client, GroupKind.ELASTIC)
    ok(cli("elastic", "create", stream, "w", "2", *filters))  # whole subjects: null indexes
    assert bucket.get(f"{stream}.w").value == (
        b'{"max_members":2,"partitioning_filters":[{"filter":"' + unique.encode() + b'.*",'
        b'"partitioning_wildcards":null},{"filter":"' + unique.encode() + b'.x.\\u003e",'
        b'"partitioning_wildcards":null}]}'
    )
    wildcards = ["--partition-wildcards", "1", "--partition-wildcards", ""]
    ok(cli("elastic", "create", stream, "m", "2", *filters, *wildcards))
    assert json.loads(ok(cli("elastic", "info", stream, "m", "--json")))["config"][
        "partitioning_filters"
    ] == [
        {"filter": f"{unique}.*", "partitioning_wildcards": [1]},
        {"filter": f"{unique}.x.>", "partitioning_wildcards": None},
    ]
    ok(cli("elastic", "create", stream, "all", "3"))
    assert bucket.get(f"{stream}.all").value == b'{"max_members":3,"partitioning_filters":null}'


def test_usage_and_connection_errors(cli, capsys, unique, monkeypatch, nats_url):
    code, out, err = cli("static", "create", "mapped", "S", "g", "2", "m1-0,1")
    assert code == 2 and "invalid member mapping 'm1-0,1': use <member>:<partition>" in err
    bad_indexes = ["--filter", "a.*", "--partition-wildcards", "x"]
    code, _, err = cli("elastic", "create", "S", "g", "2", *bad_indexes)
    assert code == 2 and "invalid wildcard indexes 'x'" in err
    assert cli("static")[0] == 2
    assert cli("--user", "u", "--token", "t", "static", "ls", "S")[0] == 2
    assert main(["static", "--help"]) == 0
    capsys.readouterr()

    one_line_error(cli("static", "info", f"S{unique}", "nope"), "'nope' on stream .* not found")
    one_line_error(cli("--creds", "/nonexistent.creds", "static", "ls", "S"), "does not exist")
    one_line_error(cli("--server", "ftp://x", "static", "ls", "S"), "unknown scheme")
    assert main(["--server", "nats://127.0.0.1:1", "static", "ls", "S"]) == 1
    assert "cannot connect to NATS" in capsys.readouterr().err

    monkeypatch.setenv("NATS_URL", nats_url)  # the default server when --server is not given
    assert main(["static", "ls", f"S{unique}"]) == 0
    assert capsys.readouterr().out == f"no static consumer groups on stream S{unique}\n"


@pytest.mark.unit
def test_connection_flags_map_to_settings(tmp_path):
    pki = make_pki(tmp_path)  # real PEM files: settings load them
    ca, cert, key = pki.ca_cert, pki.client_cert, pki.client_key
    flags = ["--server", "a:4222,tls://b:4443", "--user", "u", "--password", "p"]
    flags += ["--tls-ca", str(ca), "--tls-cert", str(cert), "--tls-key", str(key)]
    args = build_parser().parse_args([*flags, "static", "ls", "S"])
    settings = settings_from_args(args)
    assert settings.servers == ("nats://a:4222", "tls://b:4443")
    assert (settings.user, settings.password, settings.token) == ("u", "p", None)
    assert (settings.tls_ca_cert, settings.tls_cert, settings.tls_key) == (
        str(ca),
        str(cert),
        str(key),
    )
    assert settings.name == "nats-pcg"
    args = build_parser().parse_args(["--server", "x:1", "--token", "t", "elastic", "ls", "S"])
    assert (settings_from_args(args).token, settings_from_args(args).user) == ("t", None)


def test_consume_prints_and_acks_count_messages(cli, client, unique):
    stream = static_stream(client, unique, 3)
    ok(cli("static", "create", "balanced", stream, "g", "3", "m1"))
    keys = [f"k{i}" for i in range(6)]
    for i, key in enumerate(keys):
        publish_one(client, f"{unique}.{key}", f"data {i}".encode())
    out = ok(cli("static", "consume", stream, "g", "m1", "--count", "6", "--timeout", "20"))
    expected = {f"[{partition_for([k], 3)}] {unique}.{k}: data {i}" for i, k in enumerate(keys)}
    assert len(out.splitlines()) == 6 and set(out.splitlines()) == expected
    info = api(client).consumer_info(stream, "g-m1")
    assert (info["num_pending"], info["num_ack_pending"], info["ack_floor"]["stream_seq"]) == (
        0,
        0,
        6,
    )


def test_consume_times_out_with_too_few_messages(cli, client, unique):
    stream = make_stream(client, f"S{unique}", [f"{unique}.>"])
    ok(
        cli(
            "elastic", "create", stream, "g", "2", f"--filter={unique}.*", "--partition-wildcards=1"
        )
    )
    ok(cli("elastic", "add", stream, "g", "m1"))
    publish_one(client, f"{unique}.only", b"lonely")
    code, out, err = cli("elastic", "join", stream, "g", "m1", "--count", "3", "--timeout", "2")
    assert out == f"[{partition_for(['only'], 2)}] {unique}.only: lonely\n"
    one_line_error((code, "", err), r"timed out after 2s with 1 of 3 messages")


def test_installed_console_script(nats_url, client, unique):
    script = shutil.which("nats-pcg", path=os.path.dirname(sys.executable))
    assert script, "nats-pcg is not installed; run pip install -e ."
    stream = make_stream(client, f"S{unique}", [f"{unique}.>"])
    run_sync(admin.create_static(client.target, stream, "g", 2, ["a"]))
    done = subprocess.run(
        [script, "--server", nats_url, "static", "ls", stream, "--json"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["groups"] == ["g"]
    done = subprocess.run(
        [script, "--server", nats_url, "static", "info", stream, "missing"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.startswith("nats-pcg: error: ") and done.stderr.count("\n") == 1


def test_consume_fails_clearly_when_the_member_cannot_run_or_stops(cli, client, unique):
    stream = static_stream(client, unique, 2)
    ok(cli("static", "create", "balanced", stream, "g", "2", "m1"))
    one_line_error(
        cli("static", "consume", stream, "g", "stranger", "--count", "1", "--timeout", "2"),
        "member 'stranger' is not in static consumer group 'g'",
    )
    results = []
    consumer = threading.Thread(
        target=lambda: results.append(
            cli("static", "consume", stream, "g", "m1", "--count", "5", "--timeout", "20")
        )
    )
    consumer.start()
    joined = lambda: "g-m1" in api(client).consumer_names(stream)  # noqa: E731
    wait_until(joined, 10, "member m1 to join", every=0.05)
    run_sync(admin.delete_static(client.target, stream, "g"))
    consumer.join(20)
    [result] = results
    one_line_error(result, r"member m1 stopped after 0 of 5 messages \(was the group deleted\?\)")


def test_status_shows_every_member(cli, client, unique):
    stream = static_stream(client, unique, 4)
    ok(cli("static", "create", "balanced", stream, "g", "4", "m1", "m2"))
    lines = ok(cli("status", stream, "g")).splitlines()
    assert lines[0] == f"static group g on {stream}, no consumers yet (nothing has read it)"
    assert lines[-1] == "total: 0 pending, 0 ack pending"
    entry = run_sync(admin.static_info(client.target, stream, "g"))
    consumer = member_consumer(entry, "m1")
    run_sync(ensure_group_consumer(client.target, consumer))
    publish_one(client, f"{unique}.k1", b"x")
    pin_member(client, stream, consumer.name)
    lines = ok(cli("status", stream, "g")).splitlines()
    assert lines[0] == f"static group g on {stream}, member layout"
    assert lines[1].split() == [
        "MEMBER",
        "PARTITIONS",
        "CONSUMER",
        "STATE",
        "PENDING",
        "ACK",
        "PENDING",
        "LAST",
        "ACTIVE",
    ]
    m1 = next(line.split() for line in lines if line.startswith("m1"))
    m2 = next(line.split() for line in lines if line.startswith("m2"))
    assert m1[1:6] == ["0,1", "g-m1", "pinned", "0", "1"] and m1[6] != "-"
    assert m2[1:] == ["2,3", "g-m2", "no", "consumer", "-", "-", "-"]
    assert lines[-1] == "total: 0 pending, 1 ack pending"
    status = json.loads(ok(cli("status", stream, "g", "--json")))
    assert (status["kind"], status["layout"]) == ("static", "member")
    assert [m["state"] for m in status["members"]] == ["pinned", "no consumer"]
    assert status["lag"] == {
        "total": {"pending": 0, "ackPending": 1},
        "byMember": {"m1": {"pending": 0, "ackPending": 1}},  # m2 has no consumer
    }
    one_line_error(cli("status", stream, "nope"), "consumer group 'nope' on stream")


def test_status_shows_the_partition_layout_consumers(cli, client, unique):
    stream = static_stream(client, unique, 4)
    ok(cli("static", "create", "balanced", stream, "g", "4", "m1", "m2"))
    entry = run_sync(admin.static_info(client.target, stream, "g"))
    # A member consumer left behind by a move to the partition layout: not shown, not lag.
    run_sync(ensure_group_consumer(client.target, member_consumer(entry, "m1")))
    for p in (0, 3):
        run_sync(ensure_group_consumer(client.target, partition_consumer(entry, p)))
    for p in (0, 0, 3, 1):  # partition 1 has no consumer: its message is nobody's lag yet
        publish_one(client, f"{unique}.{key_for(p, 4)}", b"x")
    lines = ok(cli("status", stream, "g")).splitlines()
    assert lines[0] == f"static group g on {stream}, partition layout"
    assert lines[1].split()[:4] == ["PARTITION", "MEMBER", "CONSUMER", "STATE"]
    assert [line.split()[:6] for line in lines[2:6]] == [
        ["0", "m1", "g-partition-0", "idle", "2", "0"],
        ["1", "m1", "g-partition-1", "no", "consumer", "-"],
        ["2", "m2", "g-partition-2", "no", "consumer", "-"],
        ["3", "m2", "g-partition-3", "idle", "1", "0"],
    ]
    assert lines[6:] == ["total: 3 pending, 0 ack pending"]
    status = json.loads(ok(cli("status", stream, "g", "--json")))
    assert status["layout"] == "partition"
    assert [(p["partition"], p["member"], p["consumer"]) for p in status["partitions"]] == [
        (0, "m1", "g-partition-0"),
        (3, "m2", "g-partition-3"),
    ]
    assert status["lag"]["total"] == {"pending": 3, "ackPending": 0}
    assert set(status["lag"]["byMember"]) == {"m1", "m2"}  # from their partition consumers


def test_connection_flags_go_before_or_after_the_command(nats_url, client, capsys, unique):
    """Each command takes the connection flags on either side; one given before is not reset
    by the command's own parser."""
    stream = static_stream(client, unique, 2)
    for argv, code in (
        (["static", "create", "balanced", stream, "g", "2", "m1", "--server", nats_url], 0),
        (["static", "ls", stream, "-s", nats_url], 0),
        (["status", stream, "g", "--server", nats_url], 0),
        (["--server", nats_url, "static", "info", stream, "g"], 0),
        (["elastic", "--server", nats_url, "info", stream, "g"], 1),
    ):
        assert main(argv) == code, argv
        assert capsys.readouterr().err.count("not found") == code, argv  # not a connect error
    args = build_parser().parse_args(["--token", "t", "static", "ls", "S", "--server", "a:1"])
    assert (settings_from_args(args).token, settings_from_args(args).servers) == (
        "t",
        ("nats://a:1",),
    )
    assert main(["--user", "u", "static", "ls", "S", "--token", "t"]) == 2
    assert "--user and --token given; use one of them" in capsys.readouterr().err


def _parser_commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> set[str]:
    """Every command path the parser takes (`static create balanced`, `status`, ...), aliases
    left out (the first name of each subparser is its own)."""
    paths: set[str] = set()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            seen: set[int] = set()
            for name, sub in action.choices.items():
                if id(sub) not in seen:
                    seen.add(id(sub))
                    paths |= _parser_commands(sub, (*path, name))
    return paths or {" ".join(path)}


def _documented_commands() -> set[str]:
    """The command paths the CLI table of docs/cli.md names: the words of each code span in its
    first column before the first argument, `<kind>` read as both kinds."""
    text = (Path(__file__).parent.parent / "docs" / "cli.md").read_text()
    rows = [line for line in text.splitlines() if line.startswith("| `")]
    assert rows, "no CLI table in docs/cli.md"
    paths: set[str] = set()
    for row in rows:
        for span in re.findall(r"`([^`]+)`", row.split(" | ")[0]):
            words = list(
                itertools.takewhile(lambda w: w[0] not in "<[" or w == "<kind>", span.split())
            )
            kinds = ("static", "elastic") if words[0] == "<kind>" else (words[0],)
            paths |= {" ".join([kind, *words[1:]]) for kind in kinds}
    return paths


@pytest.mark.unit
def test_documented_cli_table_matches_the_parser(capsys):
    documented, parsed = _documented_commands(), _parser_commands(build_parser())
    assert documented == parsed, (
        f"in docs/cli.md only: {sorted(documented - parsed)}; "
        f"in the parser only: {sorted(parsed - documented)}"
    )
    for path in documented:
        assert main([*path.split(), "--help"]) == 0, path
    capsys.readouterr()


# --- Beside a nats-spark query, giving back, resetting a member, watching -----------------------


def _cli_process(nats_url: str, *args: str) -> subprocess.Popen:
    """`python -m nats_spark.cli --server <test server> ...` in a process of its own."""
    command = [sys.executable, "-m", "nats_spark.cli", "--server", nats_url, *args]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _held_member(client, unique: str, messages: int, size: int) -> str:
    """A static group g of m1 over a new 2-partition stream holding `messages` of `size` bytes
    (keys k0...), and m1's consumer with an ack wait far beyond a test: what a next instance
    gets at once was given back (NAK), not redelivered after its ack wait."""
    stream = static_stream(client, unique, 2)
    run_sync(admin.create_static(client.target, stream, "g", 2, ["m1"]))
    entry = run_sync(admin.static_info(client.target, stream, "g"))
    held = member_consumer(entry, "m1", {"ack_wait": 120_000_000_000})
    run_sync(ensure_group_consumer(client.target, held))
    for i in range(messages):
        publish_one(client, f"{unique}.k{i}", b"x" * size)
    return stream


def _next_instance_gets(client, stream: str, count: int) -> list[str]:
    """The subjects a next instance of m1 gets within 2 s."""
    puller = client.pull_consumer(stream, "g-m1", group=PRIORITY_GROUP)
    try:
        result = run_sync(puller.fetch(count, expires=2))
        return [msg.subject.rsplit(".", 1)[1] for msg in result.messages]
    finally:
        run_sync(puller.close())


@pytest.mark.parametrize("kind", ["static", "elastic"])
def test_consume_refuses_a_member_read_per_partition(cli, client, unique, kind):
    """A member whose partitions a query reads per partition: refused before anything is taken
    or created; another member of the group consumes."""
    if kind == "static":
        stream = static_stream(client, unique, 4)
        ok(cli("static", "create", "balanced", stream, "g", "4", "m1", "m2"))
    else:
        stream = make_stream(client, f"S{unique}", [f"{unique}.>"])
        ok(cli("elastic", "create", stream, "g", "4", f"--filter={unique}.*"))
        ok(cli("elastic", "add", stream, "g", "m1", "m2"))
    entry = run_sync(load_group(client.target, stream, "g"))
    for p in (0, 1):  # m1's partitions, as a partition-layout query leaves them
        run_sync(ensure_group_consumer(client.target, partition_consumer(entry, p)))
    for p in range(4):
        publish_one(client, f"{unique}.{key_for(p, 4)}", f"p{p}".encode())
    where = read_stream(entry)
    names = partition_consumer(entry, 0).name, partition_consumer(entry, 1).name
    one_line_error(
        cli(kind, "consume", stream, "g", "m1", "--count", "1", "--timeout", "5"),
        rf"partitions of member 'm1' of group 'g' are read per partition by a nats-spark query "
        rf"\(consumers {names[0]}, {names[1]} on stream {where}\).*consumerLayout=member",
    )
    assert member_consumer(entry, "m1").name not in api(client).consumer_names(where)
    out = ok(cli(kind, "consume", stream, "g", "m2", "--count", "2", "--timeout", "20"))
    assert sorted(line.split()[0] for line in out.splitlines()) == ["[2]", "[3]"]


@pytest.mark.spark
def test_consume_beside_a_spark_query_in_the_partition_layout(
    spark, cli, client, nats_url, unique, tmp_path
):
    """Issue 45's case: a query reads the group per partition; `consume` as one of its members
    is refused (it read again what the query committed, and left a consumer holding messages
    that made every later batch fail); the query reads on, every message exactly once."""
    stream, group = f"SP{unique}", "orders-etl"
    static_group(client, stream, group, ["m1", "m2"], partitions=4)
    publish(client, stream, 100)
    query = lambda: source(spark, nats_url, stream, group, ledgerBucket=f"L{unique}")  # noqa: E731
    _, error = run_query(query(), tmp_path)
    assert error is None, error
    one_line_error(
        cli("static", "consume", stream, group, "m1", "--count", "3", "--timeout", "10"),
        "read per partition by a nats-spark query",
    )
    assert f"{group}-m1" not in api(client).consumer_names(stream)
    publish(client, stream, 50, start=100)
    _, error = run_query(query(), tmp_path)
    assert error is None, error
    assert_exactly_once(payloads(spark, str(tmp_path / "out")), 150)


def test_consume_gives_back_what_it_holds_on_ctrl_c(nats_url, client, unique):
    stream = _held_member(client, unique, 300, 4000)
    process = _cli_process(nats_url, "static", "consume", stream, "g", "m1")
    try:
        # Its stdout unread, it blocks printing (a pipe holds 64 KB) with a pulled batch in hand.
        wait_until(
            lambda: consumer_info(client, stream, "g-m1")["num_ack_pending"] > 100,
            30,
            "the consumer to hold a batch",
        )
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
    assert (process.returncode, err) == (130, b"")
    printed = [line.split()[1].rsplit(".", 1)[1][:-1] for line in out.decode().splitlines()]
    assert printed and len(printed) < 300
    again = _next_instance_gets(client, stream, 300)
    assert sorted(printed + again) == sorted(f"k{i}" for i in range(300))


def test_consume_gives_back_what_it_holds_when_printing_fails(nats_url, client, unique):
    """`nats-pcg ... consume | head -1`: the message it could not print and the rest it took
    go back; one line says so."""
    stream = _held_member(client, unique, 300, 4000)
    process = _cli_process(
        nats_url, "static", "consume", stream, "g", "m1", "--count", "300", "--timeout", "20"
    )
    try:
        assert process.stdout is not None and process.stderr is not None
        assert process.stdout.readline()
        process.stdout.close()
        err = process.stderr.read().decode()
        process.wait(30)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 1
    assert err.startswith("nats-pcg: error: stopped after ") and err.count("\n") == 1, err
    assert "BrokenPipeError" in err and "given back" in err
    printed = int(err.split()[4])  # "... stopped after <n> message(s): ..."
    # It acked what it printed; a loaded server may still be reading those acks off the socket
    # the process closed at exit.
    wait_until(
        lambda: consumer_info(client, stream, "g-m1")["ack_floor"]["stream_seq"] == printed,
        10,
        f"the acks of the {printed} printed messages",
    )
    again = _next_instance_gets(client, stream, 300)
    assert sorted(again, key=lambda k: int(k[1:])) == [f"k{i}" for i in range(printed, 300)]


def test_member_reset_removes_a_member_consumer_no_instance_runs(cli, client, unique):
    stream = static_stream(client, unique, 2)
    ok(cli("static", "create", "balanced", stream, "g", "2", "m1"))
    entry = run_sync(admin.static_info(client.target, stream, "g"))
    run_sync(ensure_group_consumer(client.target, member_consumer(entry, "m1")))
    for i in range(3):
        publish_one(client, f"{unique}.k{i}", b"x")
    pin_member(client, stream, "g-m1")  # takes one message and holds the pin
    one_line_error(
        cli("static", "member-reset", stream, "g", "m1"),
        rf"consumer {stream} > g-m1 of member 'm1' of group 'g' is in use: an instance holds "
        r"its pin; stop that instance first, or force the reset \(--force\)",
    )
    ok(cli("static", "step-down", stream, "g", "m1"))
    text = ok(cli("static", "member-info", stream, "g", "m1"))
    assert re.search(r"^active: +yes$", text, re.M) and re.search(r"^state: +holding$", text, re.M)
    assert (
        f"warning: no instance pulls consumer {stream} > g-m1, yet it holds 1 message(s) "
        "ack-pending" in text
    )
    assert f"nats-pcg static member-reset {stream} g m1" in text
    out = ok(cli("static", "member-reset", stream, "g", "m1"))
    assert out.startswith(f"deleted consumer {stream} > g-m1 of member m1 (1 ack pending, 2 ")
    assert "g-m1" not in api(client).consumer_names(stream)
    one_line_error(cli("static", "memberreset", stream, "g", "m1"), "does not exist; nothing")

    run_sync(ensure_group_consumer(client.target, member_consumer(entry, "m1")))
    pin_member(client, stream, "g-m1")
    ok(cli("static", "member-reset", stream, "g", "m1", "--force"))
    assert "g-m1" not in api(client).consumer_names(stream)


def test_status_shows_member_consumers_holding_messages_beside_the_partition_layout(
    cli, client, unique
):
    stream = static_stream(client, unique, 2)
    ok(cli("static", "create", "balanced", stream, "g", "2", "m1", "m2"))
    entry = run_sync(admin.static_info(client.target, stream, "g"))
    for p in (0, 1):
        run_sync(ensure_group_consumer(client.target, partition_consumer(entry, p)))
    run_sync(ensure_group_consumer(client.target, member_consumer(entry, "m1")))
    publish_one(client, f"{unique}.{key_for(0, 2)}", b"x")
    pin_member(client, stream, "g-m1")  # takes it, as a stray instance beside the query would
    ok(cli("static", "step-down", stream, "g", "m1"))
    lines = ok(cli("status", stream, "g")).splitlines()
    assert lines[0] == f"static group g on {stream}, partition layout"
    assert [line.split()[:6] for line in lines[2:5]] == [
        ["0", "m1", "g-partition-0", "idle", "1", "0"],
        ["1", "m2", "g-partition-1", "idle", "0", "0"],
        ["0", "m1", "g-m1", "holding", "0", "1"],
    ]
    assert lines[5] == "total: 1 pending, 0 ack pending"  # the partition layout's lag
    assert lines[6].startswith(f"warning: no instance pulls consumer {stream} > g-m1, yet it")


def test_status_watch_redraws_with_the_lag_rate(cli, client, nats_url, unique):
    stream = static_stream(client, unique, 2)
    ok(cli("static", "create", "balanced", stream, "g", "2", "m1"))
    entry = run_sync(admin.static_info(client.target, stream, "g"))
    run_sync(ensure_group_consumer(client.target, member_consumer(entry, "m1")))
    frames = ok(cli("status", stream, "g", "--watch", "0.05", "--count", "2")).split("\n\n")
    assert len(frames) == 2
    for frame in frames:
        lines = frame.splitlines()
        assert lines[0].startswith(f"static group g on {stream}, member layout; ")
        assert lines[0].endswith(", every 0.05s (Ctrl-C stops)")
        assert lines[1].split()[-3:] == ["LAG/S", "LAST", "ACTIVE"]
    assert frames[0].splitlines()[2].split()[6] == "-"  # no rate before a second look
    assert frames[1].splitlines()[2].split()[6] == "+0"
    assert frames[1].splitlines()[-1] == "total: 0 pending, 0 ack pending, lag +0/s"
    documents = ok(cli("status", stream, "g", "--watch=0.05", "--count=2", "--json")).splitlines()
    assert [json.loads(d)["lagPerSecond"] for d in documents] == [None, 0]
    one_line_error(cli("status", stream, "g", "--watch", "0"), "--watch 0: give the seconds")
    one_line_error(cli("status", stream, "g", "--count", "2"), "--count 2: give the number")

    # Until Ctrl-C, the lag growing as messages arrive.
    process = _cli_process(nats_url, "status", stream, "g", "--watch", "0.2")
    try:
        assert process.stdout is not None
        totals = (line.decode() for line in process.stdout if line.startswith(b"total: "))
        assert next(totals) == "total: 0 pending, 0 ack pending\n"
        for i in range(20):
            publish_one(client, f"{unique}.k{i}", b"x")
        rates = []  # of the lag, up to the draw that shows every message
        for total in totals:
            rates += [int(rate) for rate in re.findall(r"lag ([+-]\d+)/s", total)]
            if total.startswith("total: 20 pending"):
                break
        assert max(rates) > 0, rates
        process.send_signal(signal.SIGINT)
        assert process.wait(30) == 130
    finally:
        if process.poll() is None:
            process.kill()
