"""Another client of the query's plain consumer (the family of worlds `Setup.other_client`): what a
user runs beside the query on an `overflow` priority-group consumer (ADR-42), e.g. a service that
helps out when the query lags. It pulls in the group now and then, as a nats.py fetch does, with
an overflow pull's threshold or none (`min_pending`, `min_ack_pending`: served only while the
consumer's num_pending, or num_ack_pending, is at least that, nats-server's `nextWaiting` under
`PriorityOverflow`), and acks what it takes once it has processed it, as any client would.

What it takes is not the query's: the invariants (`Observed.taken_by_another`) judge only what the
live checkpoint committed, before or after the take, and leave out of the query's own checks what
this client acked.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from tests.simulation.jetstream import Consumer, Delivery, Server, SimClient, SimPullConsumer
from tests.simulation.scheduler import Participant, Scheduler


class OtherClient:
    def __init__(
        self,
        sched: Scheduler,
        server: Server,
        consumer: Consumer,
        rng: random.Random,
        took: Callable[[int, list[Delivery], Callable[[], bool]], None],
    ) -> None:
        self.sched = sched
        self.server = server
        self.consumer = consumer
        self.rng = rng  # its own draws, apart from the schedule's
        # hears each message it takes, with the deliveries before its own and how to ask
        # whether a later one went to someone else (asked at once: its own ran out of ack wait
        # before it took it; asked later: since)
        self.took = took
        # The threshold its pulls carry: none, or one of an overflow client's.
        self.min_pending, self.min_ack_pending = rng.choice(((0, 0), (0, 0), (2, 0), (0, 2)))
        self.participant: Participant | None = None

    def start(self, until: Callable[[], bool]) -> Participant:
        self.participant = self.sched.spawn("other client", "client", self._read(until))
        return self.participant

    async def _read(self, until: Callable[[], bool]) -> None:
        sched, rng, wait = self.sched, self.rng, self.consumer.ack_wait
        pulls = SimPullConsumer(SimClient(sched, self.server), self.consumer, None)
        while not until():
            await sched.sleep(rng.uniform(0.1, 1.0) * wait)
            pull = await pulls.pull(
                rng.choice((1, 4, 16)),
                expires=rng.uniform(0.1, 0.5) * wait,
                min_pending=self.min_pending,
                min_ack_pending=self.min_ack_pending,
            )
            async for chunk in pull:
                commands = []
                for reply in chunk.replies:
                    seq = int(reply.split(b".")[5])
                    sched.note(f"the other client takes {seq}")
                    self.took(seq, *self._deliveries_around(seq))
                    commands.append(b"PUB %b 4\r\n+ACK\r\n" % reply)
                await sched.point("the other client processes")
                self.server.publish_commands(b"".join(commands), self.participant)

    def _deliveries_around(self, seq: int) -> tuple[list[Delivery], Callable[[], bool]]:
        """The deliveries of `seq` before this client's last one, oldest first, and whether a
        delivery has come after it by the time that is asked: at the take, the client stalled
        between its delivery and its take past the ack wait, and the server delivered the
        message again meanwhile; later, also this client's ack lost in a restart."""
        deliveries = self.consumer.deliveries.get(seq, [])
        mine = max(i for i, d in enumerate(deliveries) if d.owner is self.participant)

        def delivered_again() -> bool:
            return mine < len(deliveries) - 1

        return deliveries[:mine], delivered_again
