"""Connection settings (server lists, auth, clear failures, no leaks) and the sync facade."""

from __future__ import annotations

import asyncio
import json
import os
import pickle
import select
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from spark_helpers import assert_works, refusal

from chaos.proxy import free_port
from nats_spark import loop
from nats_spark.cli import build_parser, settings_from_args
from nats_spark.client import NatsClient
from nats_spark.connect import connect
from nats_spark.connection import ConnectionSettings, parse_servers, redact_url
from nats_spark.errors import ConfigurationError
from nats_spark.jetstream.pull import PullConsumer
from nats_spark.loop import Blocking, event_loop, run_sync
from nats_spark.server import EmbeddedServer
from nats_spark.spark.group_source.options import parse_options

USER, PASSWORD, TOKEN = "alice", "pw-Zq81x", "tok-Hk27y"


@pytest.fixture(scope="module")
def password_server() -> Iterator[EmbeddedServer]:
    with EmbeddedServer(extra_args=["--user", USER, "--pass", PASSWORD]) as server:
        yield server


@pytest.fixture(scope="module")
def token_server() -> Iterator[EmbeddedServer]:
    with EmbeddedServer(extra_args=["--auth", TOKEN]) as server:
        yield server


def _with_credentials(url: str, credentials: str) -> str:
    return url.replace("nats://", f"nats://{credentials}@")


@pytest.mark.unit
def test_parse_servers_comma_list() -> None:
    assert parse_servers(" h1:4222, nats://h2:4223 ,,tls://h3:1,ws://h4:2 , wss://h5:3") == (
        "nats://h1:4222",
        "nats://h2:4223",
        "tls://h3:1",
        "ws://h4:2",
        "wss://h5:3",
    )
    assert parse_servers("nats://u:p@h:1") == ("nats://u:p@h:1",)


@pytest.mark.unit
def test_parse_servers_rejects_bad_input_without_leaking() -> None:
    with pytest.raises(ConfigurationError, match="no NATS server given"):
        parse_servers(" , ")
    with pytest.raises(ConfigurationError) as caught:
        parse_servers("nats://h:1,http://bob:hunter2@h:2")
    assert "unknown scheme" in str(caught.value)
    assert "hunter2" not in str(caught.value)
    assert "http://***@h:2" in str(caught.value)


@pytest.mark.unit
def test_redact_url() -> None:
    assert redact_url("nats://u:secret@h:1") == "nats://***@h:1"
    assert redact_url("tls://tok@h:1") == "tls://***@h:1"
    assert redact_url("nats://h:1") == "nats://h:1"


def with_password() -> ConnectionSettings:
    return ConnectionSettings(
        servers=(_with_credentials("nats://h:1", f"{USER}:{PASSWORD}"), "nats://h:2"),
        user=USER,
        password=PASSWORD,
    )


def with_token() -> ConnectionSettings:
    return ConnectionSettings(servers=(_with_credentials("nats://h:1", TOKEN),), token=TOKEN)


@pytest.mark.unit
@pytest.mark.parametrize("make", [with_password, with_token], ids=["password", "token"])
def test_repr_and_str_never_show_secrets(make: Callable[[], ConnectionSettings]) -> None:
    settings = make()
    for text in (repr(settings), str(settings), settings.described(), f"{settings!r}"):
        assert PASSWORD not in text and TOKEN not in text, text


@pytest.mark.unit
def test_repr_names_the_user_and_redacts_urls() -> None:
    shown = repr(with_password())
    assert "user='alice'" in shown
    assert "nats://***@h:1" in shown and "nats://h:2" in shown


@pytest.mark.unit
def test_settings_pickle_round_trip() -> None:
    settings = ConnectionSettings(servers=("nats://h:1",), user=USER, password=PASSWORD, name="x")
    assert pickle.loads(pickle.dumps(settings)) == settings


@pytest.mark.unit
@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({"password": "p"}, "password given without user"),
        ({"user": "u", "token": "t"}, "both token and user"),
        ({"tls_cert": __file__}, "tlsCert and tlsKey go together"),
        ({"nkey_seed": "/no/such/seed.nk"}, "nkeySeed file /no/such/seed.nk does not exist"),
        ({"creds": "/no/such/user.creds"}, "creds file /no/such/user.creds does not exist"),
        ({"connect_timeout": 0}, "^option connectTimeout must be positive; give e.g. 5s$"),
        ({"retry_timeout": -1}, "^option retryTimeout must be positive; give e.g. 60s$"),
    ],
)
def test_invalid_settings(kwargs: dict[str, object], expected: str) -> None:
    with pytest.raises(ConfigurationError, match=expected):
        ConnectionSettings(**kwargs)  # type: ignore[arg-type]


def test_user_and_password(password_server: EmbeddedServer) -> None:
    assert_works(ConnectionSettings(servers=(password_server.url,), user=USER, password=PASSWORD))
    url = _with_credentials(password_server.url, f"{USER}:{PASSWORD}")
    assert_works(ConnectionSettings(servers=(url,)))


@pytest.mark.parametrize("how", ["fields", "url", "none"])
def test_wrong_password_is_refused_without_leaking(
    password_server: EmbeddedServer, how: str
) -> None:
    wrong = "wrong-Pw93"
    if how == "fields":
        settings = ConnectionSettings(servers=(password_server.url,), user=USER, password=wrong)
    elif how == "url":
        url = _with_credentials(password_server.url, f"{USER}:{wrong}")
        settings = ConnectionSettings(servers=(url,))
    else:
        settings = ConnectionSettings(servers=(password_server.url,))
    message = refusal(settings)
    assert "refused the credentials" in message
    assert f"127.0.0.1:{password_server.port}" in message
    assert wrong not in message and PASSWORD not in message


def test_secrets_from_the_environment_and_files(
    password_server: EmbeddedServer, token_server: EmbeddedServer, tmp_path, monkeypatch
) -> None:
    """Secrets kept off the command line: the source's options and the CLI's flags read them
    from NATS_* variables or from files."""
    monkeypatch.setenv("NATS_USER", USER)
    monkeypatch.setenv("NATS_PASSWORD", PASSWORD)
    options = {"servers": password_server.url, "stream": "S", "group": "g"}
    assert_works(parse_options(options).connection)
    assert_works(
        settings_from_args(
            build_parser().parse_args(["-s", password_server.url, "static", "ls", "S"])
        )
    )
    monkeypatch.delenv("NATS_USER")
    monkeypatch.delenv("NATS_PASSWORD")
    secret = tmp_path / "token"
    secret.write_text(TOKEN + "\n")
    options = {"servers": token_server.url, "stream": "S", "group": "g", "tokenFile": str(secret)}
    assert_works(parse_options(options).connection)
    argv = ["-s", token_server.url, "--token-file", str(secret), "static", "ls", "S"]
    assert_works(settings_from_args(build_parser().parse_args(argv)))


def token_settings(server: EmbeddedServer, token: str, where: str) -> ConnectionSettings:
    """`token` as the option (`where` "option") or in the URL."""
    if where == "option":
        return ConnectionSettings(servers=(server.url,), token=token)
    return ConnectionSettings(servers=(_with_credentials(server.url, token),))


@pytest.mark.parametrize("where", ["option", "url"])
def test_token(token_server: EmbeddedServer, where: str) -> None:
    assert_works(token_settings(token_server, TOKEN, where))
    wrong = "tok-wrong-55"
    message = refusal(token_settings(token_server, wrong, where))
    assert "refused the credentials" in message
    assert wrong not in message and TOKEN not in message


@pytest.mark.unit
def test_unreachable_server() -> None:
    port = free_port()  # nobody listens on it
    message = refusal(ConnectionSettings(servers=(f"nats://127.0.0.1:{port}",)))
    assert f"cannot connect to NATS at nats://127.0.0.1:{port}" in message
    assert "no server answered" in message


@pytest.mark.unit
def test_server_that_never_answers_names_connect_timeout() -> None:
    with socket.socket() as silent:  # accepts connections, never sends nats-server's INFO
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        url = f"nats://127.0.0.1:{silent.getsockname()[1]}"
        message = refusal(ConnectionSettings(servers=(url,), connect_timeout=0.3))
    assert "\n" not in message
    assert f"cannot connect to NATS at {url}: no server answered in time" in message, message
    assert message.endswith("or raise the option connectTimeout"), message


@pytest.mark.parametrize("option", ["nkey_seed", "creds"])
def test_nkey_auth_without_nkeys_package_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, nats_url: str, option: str
) -> None:
    seed = tmp_path / "user.nk"
    seed.write_text("SU-not-a-real-seed\n")
    monkeypatch.setitem(sys.modules, "nkeys", None)  # makes `import nkeys` fail
    settings = ConnectionSettings(servers=(nats_url,), **{option: str(seed)})
    with pytest.raises(ConfigurationError, match="need the nkeys package"):
        run_sync(connect(settings))


def test_reconnect_policy_is_restored_after_connect(settings: ConnectionSettings) -> None:
    nc = run_sync(connect(settings))
    try:
        assert nc.is_connected
        assert nc.options["max_reconnect_attempts"] == settings.max_reconnect_attempts
        assert nc.options["name"] == "nats-spark-tests"
    finally:
        run_sync(nc.close())


# The sync facade: one loop per process, shared by threads, renewed after fork.


@pytest.mark.unit
def test_run_sync_from_many_threads_shares_one_loop() -> None:
    async def nap(n: int) -> tuple[int, int]:
        await asyncio.sleep(0.3)
        return n, id(asyncio.get_running_loop())

    started = time.monotonic()
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda n: run_sync(nap(n)), range(8)))
    assert time.monotonic() - started < 1.0  # the eight naps overlapped on the loop
    assert [n for n, _ in results] == list(range(8))
    assert {loop_id for _, loop_id in results} == {id(event_loop())}


def test_blocking_from_many_threads(
    client: Blocking[NatsClient], unique: str, settings: ConnectionSettings
) -> None:
    api = Blocking(client.api)
    name = f"FACADE_{unique}"
    api.create_stream({"name": name, "subjects": [f"{name}.>"], "storage": "memory"})
    try:
        js = Blocking(client.js)

        def publish_some(n: int) -> int:
            for i in range(20):
                js.publish(f"{name}.{n}", f"{n}-{i}".encode())
            return api.stream_info(name)["state"]["messages"]

        with ThreadPoolExecutor(8) as pool:
            seen = list(pool.map(publish_some, range(8)))
        assert max(seen) == 160 and api.stream_info(name)["state"]["messages"] == 160
        # Plain attributes and methods pass through unchanged.
        assert client.settings is settings
        assert isinstance(client.pull_consumer(name, "C"), PullConsumer)
    finally:
        api.delete_stream(name)


@pytest.mark.unit
def test_run_sync_propagates_errors_and_cancels_on_timeout() -> None:
    async def fail() -> None:
        raise KeyError("boom")

    with pytest.raises(KeyError, match="boom"):
        run_sync(fail())

    cancelled = threading.Event()

    async def hang() -> None:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    with pytest.raises(TimeoutError):
        run_sync(hang(), timeout=0.1)
    assert cancelled.wait(2)


def in_forked_child(work: Callable[[], Any], timeout: float = 20.0) -> Any:
    """Run `work` in an `os.fork()` child and return its JSON-able result, or fail the test."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report through the pipe and never return into pytest
        try:
            os.close(read_end)
            try:
                answer = {"ok": work()}
            except BaseException as error:
                answer = {"error": f"{type(error).__name__}: {error}"}
            os.write(write_end, json.dumps(answer).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    try:
        if not select.select([read_end], [], [], timeout)[0]:
            os.kill(pid, signal.SIGKILL)
            pytest.fail(f"the forked child did not answer within {timeout}s (deadlock?)")
        chunks = []
        while chunk := os.read(read_end, 65536):
            chunks.append(chunk)
    finally:
        os.close(read_end)
        os.waitpid(pid, 0)
    answer = json.loads(b"".join(chunks))
    assert "error" not in answer, answer.get("error")
    return answer["ok"]


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # 3.12+ warns on fork with threads
def test_forked_child_gets_its_own_working_loop(settings: ConnectionSettings) -> None:
    parent_loop = event_loop()
    assert run_sync(asyncio.sleep(0, "warm")) == "warm"  # the parent's loop thread is running

    def child() -> dict[str, Any]:
        # Several threads race to create the child's loop: exactly one loop and thread result.
        with ThreadPoolExecutor(8) as pool:
            loops = set(pool.map(lambda _: id(event_loop()), range(8)))
        loop_threads = [t for t in threading.enumerate() if t.name == "nats-spark-loop"]

        async def where() -> int:
            return os.getpid()

        async def jetstream() -> bool:
            client = await NatsClient.open(settings)
            try:
                return "limits" in await client.api.account_info()
            finally:
                await client.close()

        return {
            "fresh": event_loop() is not parent_loop,
            "loops": len(loops),
            "threads": len(loop_threads),
            "pid_ok": run_sync(where()) == os.getpid(),
            "jetstream": run_sync(jetstream(), timeout=10),
        }

    assert in_forked_child(child) == {
        "fresh": True,
        "loops": 1,
        "threads": 1,
        "pid_ok": True,
        "jetstream": True,
    }
    assert event_loop() is parent_loop  # the parent keeps its loop
    assert run_sync(asyncio.sleep(0, "still")) == "still"


@pytest.mark.unit
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_fork_while_the_loop_lock_is_held() -> None:
    # Another thread may be inside event_loop() when a process forks: the child must not hang.
    with loop._lock:
        assert in_forked_child(lambda: run_sync(asyncio.sleep(0, "ok")), timeout=5) == "ok"
