"""Messages of chosen subscriptions handed raw to a callback: the one place that patches nats-py.

nats-py's parser passes every message to `Client._process_msg`, which parses the headers, builds
a `Msg`, queues it and wakes a waiter: most of the cost per message of a pull inbox or a PubAck
inbox. For subscriptions routed here those steps are skipped; every other subscription is served
as before.
"""

from __future__ import annotations

from collections.abc import Callable

from nats.aio.client import Client as NATS
from nats.aio.subscription import Subscription

from nats_spark.errors import NatsSparkError

_ROUTES = "_nats_spark_raw_routes"
RawHandler = Callable[[bytes, bytes, bytes, "bytes | None"], None]


def _raw_routes(nc: NATS) -> dict[int, RawHandler]:
    """Subscriptions (by sid) of `nc` whose messages go raw to a handler instead of a `Msg`."""
    routes: dict[int, RawHandler] | None = nc.__dict__.get(_ROUTES)
    if routes is None:
        process_msg = getattr(nc, "_process_msg", None)
        if process_msg is None:
            raise NatsSparkError(
                "this nats-py has no Client._process_msg, which raw routes hook into; install "
                "nats-py 2.x (tested with 2.16)"
            )
        routes = {}

        async def route(
            sid: int, subject: bytes, reply: bytes, data: bytes, headers: bytes | None
        ) -> None:
            handler = routes.get(sid)
            if handler is None:
                await process_msg(sid, subject, reply, data, headers)
            else:
                handler(subject, reply, data, headers)

        nc._process_msg = route  # type: ignore[method-assign]
        setattr(nc, _ROUTES, routes)
    return routes


def route_raw(nc: NATS, subscription: Subscription, handler: RawHandler) -> None:
    """Hand `subscription`'s messages to `handler(subject, reply, data, headers)`."""
    _raw_routes(nc)[subscription._id] = handler


def unroute_raw(nc: NATS, subscription: Subscription) -> None:
    _raw_routes(nc).pop(subscription._id, None)
