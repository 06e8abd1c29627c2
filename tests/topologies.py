"""Server topologies the deployment tests start: a hub and a leaf node in two JetStream domains,
and one server with accounts. Each server is a nats-server child on free loopback ports, with its
config file in the test's temporary folder."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

from spark_helpers import wait_until

from nats_spark.client import NatsClient
from nats_spark.connection import ConnectionSettings
from nats_spark.errors import NatsSparkError
from nats_spark.loop import run_sync
from nats_spark.server import EmbeddedServer

HUB_DOMAIN, LEAF_DOMAIN = "hub", "leaf"


def _started(stack: ExitStack, config: Path, text: str) -> EmbeddedServer:
    config.write_text(text)
    server = EmbeddedServer(config)
    stack.callback(server.cleanup)
    return server.start()


def _answers(settings: ConnectionSettings) -> bool:
    async def probe() -> bool:
        client = await NatsClient.open(settings)
        try:
            await client.api.account_info()
            return True
        except NatsSparkError:
            return False
        finally:
            await client.close()

    return run_sync(probe())


@contextmanager
def hub_and_leaf(folder: Path) -> Iterator[tuple[EmbeddedServer, EmbeddedServer]]:
    """A hub in JetStream domain `hub` and a leaf node of it in domain `leaf`, once the leaf
    reaches the hub's JetStream."""
    with ExitStack() as stack:
        hub = _started(
            stack,
            folder / "hub.conf",
            f'jetstream {{ domain: {HUB_DOMAIN} }}\nleafnodes {{ listen: "127.0.0.1:-1" }}\n',
        )
        leaf = _started(
            stack,
            folder / "leaf.conf",
            f"jetstream {{ domain: {LEAF_DOMAIN} }}\n"
            f'leafnodes {{ remotes: [ {{ url: "{hub.leafnode_url()}" }} ] }}\n',
        )
        through_leaf = ConnectionSettings(servers=(leaf.url,), domain=HUB_DOMAIN, retry_timeout=1)
        wait_until(lambda: _answers(through_leaf), 30, "the leaf node to reach the hub")
        yield hub, leaf


@contextmanager
def accounts(folder: Path, config: str) -> Iterator[EmbeddedServer]:
    """One server with the `accounts { ... }` block `config`."""
    with ExitStack() as stack:
        yield _started(stack, folder / "accounts.conf", config)
